"""The typed event stream shared by every backend, the CLI, the widgets and the notebooks.

The trainer prints one JSON object per line behind :data:`EVENT_PREFIX`, so logs stay
readable and any backend (a local child process, a TrainJob pod log) turns them back into
typed events with :func:`parse_line`. Lines without the prefix become :class:`Log` events.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

EVENT_PREFIX = "@@playground "


class JobPhase(StrEnum):
    """Job phases, the same for every backend."""

    PENDING = "Pending"
    INITIALIZING = "Initializing"
    TRAINING = "Training"
    EVALUATING = "Evaluating"  # the final held-out evaluation, after the last step
    SAVING = "Saving"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_PHASES


TERMINAL_PHASES = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED})


def _now() -> float:
    return time.time()


@dataclass(frozen=True)
class Phase:
    """The job entered ``phase`` (``reason`` says why, e.g. the failing step)."""

    phase: JobPhase
    reason: str = ""
    time: float = field(default_factory=_now)


# The method-specific training figures a Progress may carry (``Progress.metrics``), with the short label the
# CLI line and the page use. The chart draws the first of HEADLINE_METRICS a run reports beside its loss.
METRIC_LABELS: dict[str, str] = {
    "reward_margin": "margin",
    "preference_accuracy": "pref. accuracy",
    "chosen_reward": "chosen",
    "rejected_reward": "rejected",
    "mean_reward": "reward",
    "reward_std": "reward spread",
    "kl": "KL",
    "completion_length": "length",
}
HEADLINE_METRICS = ("mean_reward", "reward_margin")


@dataclass(frozen=True)
class Progress:
    """One training progress point. Optional figures are None when unknown."""

    step: int
    total_steps: int
    epoch: float = 0.0
    loss: float | None = None
    learning_rate: float | None = None
    tokens_per_second: float | None = None
    eta_seconds: float | None = None
    gpu_memory_bytes: int | None = None
    mfu: float | None = None
    # The method's own training figures over the window (DPO: reward_margin, preference_accuracy…;
    # GRPO: mean_reward, reward_std, kl, completion_length), the headline first (:data:`HEADLINE_METRICS`).
    metrics: dict[str, float] = field(default_factory=dict)
    time: float = field(default_factory=_now)

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.total_steps) if self.total_steps else 0.0


@dataclass(frozen=True)
class Log:
    """One log line from ``source`` (``trainer``, ``node-0``, ``dataset-initializer``...)."""

    source: str
    line: str
    time: float = field(default_factory=_now)


@dataclass(frozen=True)
class ClusterEvent:
    """A Kubernetes Event or queue decision (Unschedulable, ImagePullBackOff, admission)."""

    kind: str
    reason: str
    message: str
    time: float = field(default_factory=_now)


@dataclass(frozen=True)
class Queued:
    """The job waits for a training slot: ``position`` 1 is next; 0 means it just left the queue.

    Emitted whenever the position (or, materially, the estimate) changes while the job waits.
    ``estimated_wait_seconds`` is None when nothing is known to estimate from (e.g. a Kueue queue).
    """

    position: int
    estimated_wait_seconds: float | None = None
    time: float = field(default_factory=_now)


@dataclass(frozen=True)
class Metric:
    """An evaluation result, e.g. ``eval_exact_match`` or ``eval_loss``."""

    name: str
    value: float
    time: float = field(default_factory=_now)


Event = Phase | Progress | Log | ClusterEvent | Metric | Queued

_TYPES: dict[str, type] = {
    "phase": Phase,
    "progress": Progress,
    "log": Log,
    "cluster_event": ClusterEvent,
    "metric": Metric,
    "queued": Queued,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def event_to_dict(event: Event) -> dict[str, Any]:
    """JSON-ready dict with a ``type`` tag (used by ``--json`` outputs and the line protocol)."""
    data = asdict(event)
    if isinstance(event, Phase):
        data["phase"] = str(event.phase)
    return {"type": _NAMES[type(event)], **data}


def event_from_dict(data: dict[str, Any]) -> Event:
    """Inverse of :func:`event_to_dict`; unknown keys are ignored (forward compatible)."""
    kind = data.get("type")
    cls = _TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event type {kind!r}")
    allowed = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in allowed}
    if cls is Phase:
        kwargs["phase"] = JobPhase(kwargs["phase"])
    return cls(**kwargs)


def format_event_line(event: Event) -> str:
    """The single line the trainer prints for ``event``."""
    return EVENT_PREFIX + json.dumps(event_to_dict(event), separators=(",", ":"), allow_nan=False)


def parse_line(line: str, source: str = "trainer") -> Event:
    """Turn one output line back into an event; anything not ours is a :class:`Log`.

    The prefix may appear after a log decoration (e.g. a timestamp added by a pod runtime).
    """
    text = line.rstrip("\r\n")
    idx = text.find(EVENT_PREFIX)
    if idx >= 0:
        try:
            return event_from_dict(json.loads(text[idx + len(EVENT_PREFIX) :]))
        except (ValueError, TypeError, KeyError):
            pass
    return Log(source=source, line=text)
