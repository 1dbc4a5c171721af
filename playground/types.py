"""Engine data types shared by every backend (dataclasses, JSON-friendly)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from playground.events import JobPhase, Progress


@dataclass(frozen=True)
class SourceOverrides:
    """Replace a blueprint's model or dataset source (a local stand-in, a mirror, a PVC path).

    A blueprint that needs a GPU may run on CPU when its model is overridden by a local
    directory: that is how the hub blueprints' code is tested on tiny stand-ins.
    """

    model: str | None = None
    dataset: str | None = None


@dataclass(frozen=True)
class TrainRequest:
    """What ``submit`` takes: a blueprint (catalog id, or absolute path of a YAML file) and validated parameters.

    Build one with :func:`playground.api.make_request`, which validates ``params``.
    """

    blueprint_id: str
    params: dict[str, Any]
    overrides: SourceOverrides = SourceOverrides()
    labels: dict[str, str] = field(default_factory=dict)  # free-form labels (session, ...)
    owner: str | None = None  # the visitor who owns the job (booth mode); None: an operator's job


@dataclass
class Job:
    """A training job as every backend reports it."""

    id: str
    blueprint_id: str
    backend: str
    phase: JobPhase
    params: dict[str, Any]
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    message: str = ""  # why it is in this phase (failing step, reason)
    progress: Progress | None = None  # the latest point
    metrics: dict[str, float] = field(default_factory=dict)
    model_dir: str | None = None  # finished, servable HF model directory (or storage URI)
    base_model: str | None = None  # the base model for side-by-side chat (dir, hf:// or URI)
    log_tail: list[str] = field(default_factory=list)  # last lines, kept when it fails
    labels: dict[str, str] = field(default_factory=dict)
    owner: str | None = None  # the visitor who owns it; None for operator (CLI) jobs
    queue_position: int | None = None  # while it waits for a training slot: 1 = next; None otherwise
    estimated_wait_seconds: float | None = None  # until it starts, while queued (None: unknown)
    expires_at: float | None = None  # a finished job's end of life (its TTL); the facade's cleanup deletes it then

    @property
    def done(self) -> bool:
        return self.phase.terminal

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["phase"] = str(self.phase)
        return data


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible base URL (ending in ``/v1``) and the model name to ask for."""

    url: str
    model: str
    job_id: str | None = None
    kind: str = "fine-tuned"  # or "base"
    backend: str = "local"
    name: str | None = None  # server / InferenceService name
    owner: str | None = None  # the visitor who owns the job it serves
    shared: bool = False  # booth mode: one base-model server shared by every visitor (only the operator stops it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
