"""The pure logic behind the widgets: no ipywidgets, no torch, testable on its own.

- :class:`JobState` folds a job's event stream into what the monitor shows.
- :class:`Coalescer` takes events from a reader thread and hands snapshots to a render
  callback at most ``max_rate`` times a second, keeping every progress point.
- :class:`FormModel` turns a blueprint's parameter schema into form fields and form values
  into validated params (the engine's :class:`~playground.errors.ParameterError` per field).
- :func:`attachable_jobs` / :func:`replay` are the reattach path after a reload.
- :func:`visitor_text`, :func:`progress_line`, :func:`metric_rows`: what a visitor reads (no paths,
  no command lines, metrics humanised).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from playground import api
from playground.api import Blueprint, format_duration, progress_line
from playground.errors import UserError
from playground.events import ClusterEvent, Event, JobPhase, Log, Metric, Phase, Progress, Queued
from playground.types import Job, RunParameters

# ---------------------------------------------------------------------------------------------
# Job state and coalescing


@dataclass
class Snapshot:
    """What one UI update shows. ``new_points`` are the progress points since the last update."""

    phase: JobPhase
    reason: str
    latest: Progress | None
    new_points: list[Progress]
    total_points: int
    log_tail: list[str]
    cluster_events: list[ClusterEvent]
    metrics: dict[str, float]
    events_seen: int
    queue_position: int | None = None  # while waiting for a training slot (1 = next)
    estimated_wait_seconds: float | None = None
    queued_at: float | None = None  # when that estimate was made (the Queued event's time): the page counts down

    @property
    def fraction(self) -> float:
        if self.phase == JobPhase.SUCCEEDED:
            return 1.0
        return self.latest.fraction if self.latest else 0.0


class JobState:
    """A job's history folded from its events (thread-safe: one writer, one reader).

    The log tail interleaves the trainer's own lines with one readable line per progress point,
    phase change and queue move, so it stays live while the trainer only reports numbers.
    """

    def __init__(self, log_tail: int = 200) -> None:
        self._lock = threading.Lock()
        self.phase = JobPhase.PENDING
        self.reason = ""
        self.points: list[Progress] = []
        self.logs: deque[str] = deque(maxlen=log_tail)
        self.cluster_events: list[ClusterEvent] = []
        self.metrics: dict[str, float] = {}
        self.events_seen = 0
        self.queue_position: int | None = None
        self.estimated_wait_seconds: float | None = None
        self.queued_at: float | None = None
        self._delivered = 0

    def apply(self, event: Event) -> None:
        with self._lock:
            self.events_seen += 1
            if isinstance(event, Progress):
                self.points.append(event)
                self.logs.append(progress_line(event, page=True))
                self.queue_position = None
            elif isinstance(event, Phase):
                if event.phase != self.phase or event.reason != self.reason:
                    self.logs.append(f"→ {event.phase}" + (f": {event.reason}" if event.reason else ""))
                self.phase, self.reason = event.phase, event.reason
                if event.phase != JobPhase.PENDING:
                    self.queue_position = None
            elif isinstance(event, Queued):
                position = event.position if event.position > 0 else None
                if position is not None and position != self.queue_position:
                    waiting = queue_text(position, event.estimated_wait_seconds)
                    self.logs.append(f"waiting for a training slot: {waiting}")
                self.queue_position, self.estimated_wait_seconds = position, event.estimated_wait_seconds
                self.queued_at = event.time
            elif isinstance(event, Log):
                self.logs.append(event.line if event.source in ("trainer", "") else f"[{event.source}] {event.line}")
            elif isinstance(event, ClusterEvent):
                self.cluster_events.append(event)
            elif isinstance(event, Metric):
                self.metrics[event.name] = event.value

    def snapshot(self) -> Snapshot:
        """The current state plus the points not handed out by an earlier snapshot."""
        with self._lock:
            new = self.points[self._delivered :]
            self._delivered = len(self.points)
            return Snapshot(
                phase=self.phase,
                reason=self.reason,
                latest=self.points[-1] if self.points else None,
                new_points=new,
                total_points=len(self.points),
                log_tail=list(self.logs),
                cluster_events=list(self.cluster_events[-20:]),
                metrics=dict(self.metrics),
                events_seen=self.events_seen,
                queue_position=self.queue_position,
                estimated_wait_seconds=self.estimated_wait_seconds,
                queued_at=self.queued_at,
            )


class Coalescer:
    """Apply a fast event stream to the UI at most ``max_rate`` times per second.

    A producer (the thread reading ``backend.events(..., follow=True)``) calls :meth:`push`
    for every event; a flusher thread calls ``render(snapshot)`` when something changed and
    at least ``1 / max_rate`` seconds have passed since the previous render. Every progress
    point reaches exactly one snapshot's ``new_points``, so nothing is dropped from the chart.
    Render errors are kept in :attr:`error` (never printed: this runs off the main thread).
    """

    def __init__(
        self,
        render: Callable[[Snapshot], None],
        *,
        max_rate: float = 10.0,
        state: JobState | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.render = render
        self.interval = 1.0 / max_rate
        self.state = state or JobState()
        self.renders = 0
        self.error: BaseException | None = None
        self._clock, self._sleep = clock, sleep  # injectable: tests drive time by hand
        self._cond = threading.Condition()
        self._dirty = False
        self._closed = False
        self._last = -math.inf
        self._thread = threading.Thread(target=self._run, name="playground-coalescer", daemon=True)
        self._thread.start()

    def push(self, event: Event) -> None:
        self.state.apply(event)
        with self._cond:
            if not self._dirty:
                self._dirty = True
                self._cond.notify()

    def close(self, timeout: float | None = 5.0) -> None:
        """Flush what is left and stop the flusher thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._dirty and not self._closed:
                    self._cond.wait()
                if not self._dirty:
                    return
            while (wait := self._last + self.interval - self._clock()) > 0:
                self._sleep(wait)
            with self._cond:
                self._dirty = False
            snapshot = self.state.snapshot()
            self._last = self._clock()
            try:
                self.render(snapshot)
            except Exception as exc:  # shown by the widget, never printed from this thread
                self.error = exc
            self.renders += 1


def follow_job(
    events: Iterable[Event],
    coalescer: Coalescer,
    *,
    stop: threading.Event | None = None,
    on_error: Callable[[BaseException], None] | None = None,
) -> None:
    """Pump ``events`` into ``coalescer`` until the stream ends (or ``stop`` is set), then flush."""
    try:
        for event in events:
            coalescer.push(event)
            if stop is not None and stop.is_set():
                break
    except Exception as exc:  # a dropped stream is shown, not raised in a thread
        if on_error:
            on_error(exc)
    finally:
        coalescer.close()


# ---------------------------------------------------------------------------------------------
# Reattach


def replay(events: Iterable[Event], state: JobState | None = None) -> JobState:
    """Fold a whole (finite) event history into a :class:`JobState`."""
    state = state or JobState()
    for event in events:
        state.apply(event)
    return state


def attachable_jobs(jobs: Iterable[Job]) -> list[Job]:
    """Jobs in the order a person wants them after a reload: running first, then newest first."""
    return sorted(jobs, key=lambda j: (j.done, -j.created_at))


def latest_running(jobs: Iterable[Job], blueprint_id: str | None = None) -> Job | None:
    """The newest job that is still running (optionally of one blueprint)."""
    for job in attachable_jobs(jobs):
        if not job.done and (blueprint_id is None or job.blueprint_id == blueprint_id):
            return job
    return None


# ---------------------------------------------------------------------------------------------
# Form model


MAX_INPUT_CHARS = 64  # a form value longer than this is refused before parsing (anything can arrive over a comm)


@dataclass(frozen=True)
class FieldSpec:
    """One form control derived from a blueprint parameter."""

    name: str
    kind: str  # int | float | bool | choice
    default: Any
    min: float | None = None
    max: float | None = None
    choices: tuple[Any, ...] = ()
    log_scale: bool = False
    help: str = ""

    @property
    def label(self) -> str:
        return self.name.replace("_", " ")

    @property
    def control(self) -> str:
        """The widget kind: numbers are typed into a Text box (no slider silently clamps a bad value)."""
        if self.kind == "bool":
            return "Checkbox"
        if self.kind == "choice":
            return "Dropdown"
        return "Text"

    @property
    def allowed(self) -> str:
        if self.kind in ("int", "float") and self.min is not None and self.max is not None:
            kind = "an integer" if self.kind == "int" else "a number"
            return f"{kind} from {format_param(self.min)} to {format_param(self.max)}"
        if self.kind == "choice":
            return "one of " + ", ".join(str(c) for c in self.choices)
        return ""


def format_param(value: Any) -> str:
    """A parameter value as a person types it: 300, 0.003, 1e-05, True."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:g}"
    return str(value)


@dataclass
class FormResult:
    params: dict[str, Any] = field(default_factory=dict)  # the values, for display and the plan
    errors: dict[str, str] = field(default_factory=dict)
    typed: RunParameters | None = None  # what a launch hands the engine: validated here, not again

    @property
    def ok(self) -> bool:
        return not self.errors


class FormModel:
    """The launch form's model: fields from the schema, validation by the engine.

    Values may be typed text, numbers or anything a client sends over a widget comm: each is
    checked by the blueprint's own parameter validation (the engine's one-line errors).
    """

    def __init__(self, blueprint: Blueprint) -> None:
        self.blueprint = blueprint
        self.fields = [
            FieldSpec(
                name=name,
                kind=spec.type,
                default=spec.coerce(name, spec.default),
                min=spec.min,
                max=spec.max,
                choices=tuple(spec.choices or ()),
                log_scale=spec.log_scale,
                help=spec.help,
            )
            for name, spec in blueprint.parameters.items()
        ]

    def defaults(self) -> dict[str, Any]:
        return {f.name: f.default for f in self.fields}

    def validate(self, values: Mapping[str, Any]) -> FormResult:
        """Validate every field on its own (so each error sits next to its field), then together: the engine's
        :func:`playground.api.parameters`, whose typed result a launch hands on as it is."""
        result = FormResult()
        cleaned: dict[str, Any] = {}
        for name, value in values.items():
            value = clean_number(value)
            if isinstance(value, str) and len(value) > MAX_INPUT_CHARS:
                result.errors[name] = f"parameter {name!r}: the value is too long ({len(value)} characters)"
                continue
            if isinstance(value, str) and not value.strip():
                result.errors[name] = f"parameter {name!r}: empty; allowed: {self._allowed(name)}"
                continue
            cleaned[name] = value
        typed, errors = api.parameters(self.blueprint, cleaned)
        result.errors.update(errors)
        if result.ok and typed is not None:
            result.typed, result.params = typed, typed.as_dict()
        return result

    def _allowed(self, name: str) -> str:
        spec = next((f for f in self.fields if f.name == name), None)
        return spec.allowed if spec is not None else "a known parameter"


def clean_number(value: Any) -> Any:
    """Round floats (e.g. 10**x) to 4 significant digits so 0.003 stays 0.003."""
    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return float(f"{value:.4g}")
    return value


# ---------------------------------------------------------------------------------------------
# What a visitor reads

_PATH = re.compile(r"(?<![\w:/.])(?:~|[A-Za-z]:)?(?:/[\w.@+%-]+){2,}/?")
_OPERATOR_ONLY = ("[supervisor]",)


def scrub_paths(text: str) -> str:
    """Absolute paths become ``…/last-part`` (a visitor never sees where files live)."""
    return _PATH.sub(lambda m: "…/" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


def visitor_text(line: str) -> str | None:
    """A log line as a visitor sees it: paths scrubbed; None for operator-only lines (command lines, pids)."""
    if line.lstrip().startswith(_OPERATOR_ONLY):
        return None
    return scrub_paths(line)


def queue_text(position: int, wait_seconds: float | None, since: float | None = None, now: float | None = None) -> str:
    """``position 2 in the queue · about 1:30 to wait``; with ``since`` (when the estimate was made) the wait counts
    down from it, to "any moment now"."""
    ahead = "next in line" if position == 1 else f"position {position} in the queue"
    if wait_seconds is None:
        return f"{ahead} · waiting for admission"
    if since is not None:
        wait_seconds -= max(0.0, (time.time() if now is None else now) - since)
        if wait_seconds < 1:
            return f"{ahead} · any moment now"
    return f"{ahead} · about {format_duration(wait_seconds, unknown='–')} to wait"


# name -> (label, kind): kind "percent", "loss", "seconds", "count", "number"
METRIC_LABELS: dict[str, tuple[str, str]] = {
    "eval_exact_match": ("Exact match on held-out examples", "percent"),
    "eval_accuracy": ("Accuracy on held-out examples", "percent"),
    "eval_loss": ("Loss on held-out examples", "loss"),
    "train_loss": ("Training loss (last steps)", "loss"),
    "train_seconds": ("Training time", "seconds"),
    "num_train_examples": ("Training examples", "count"),
    "num_eval_examples": ("Held-out examples", "count"),
    "steps": ("Optimizer steps", "count"),
    "parameters": ("Parameters", "count"),
    "base_eval_exact_match": ("Exact match, base model (before training)", "percent"),
}
OPERATOR_METRICS = ("world_size", "train_cpu_seconds", "wall_seconds", "resumed_from_step")


def format_metric(name: str, value: float) -> str:
    kind = METRIC_LABELS.get(name, ("", "number"))[1]
    if not math.isfinite(value):
        return str(value)
    if kind == "percent":
        return f"{value * 100:.1f} %"
    if kind == "loss":
        return f"{value:.3f}" if value == 0 or abs(value) >= 0.001 else f"{value:.1e}"  # not "0.000"
    if kind == "seconds":
        return format_duration(value, sub_minute=True)
    if kind == "count" or (float(value).is_integer() and abs(value) < 1e15):
        return f"{int(value):,}"
    return f"{value:.4g}"


def humanise(name: str) -> str:
    text = name.replace("_", " ").strip()
    return text[:1].upper() + text[1:]


# The page's headline, "before → after": (metric, what it measures, kind), most telling first.
HEADLINE_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("eval_exact_match", "held-out exact match", "percent"),
    ("eval_mean_reward", "held-out mean reward", "number"),
    ("eval_preference_accuracy", "held-out preference accuracy", "percent"),
)


def headline(metrics: Mapping[str, float], quality_metric: str | None = None) -> str:
    """``held-out exact match: base 0 % → fine-tuned 86 %``: the finished job's figure next to the base model's
    (``base_<metric>``), the blueprint's ``quality_metric`` when both are known; "" when no figure has both."""
    figures = sorted(HEADLINE_FIGURES, key=lambda figure: figure[0] != quality_metric)
    for name, label, kind in figures:
        base, tuned = metrics.get(f"base_{name}"), metrics.get(name)
        if isinstance(base, int | float) and isinstance(tuned, int | float):
            if not (math.isfinite(base) and math.isfinite(tuned)):
                continue
            shown = (lambda v: f"{v * 100:.0f} %") if kind == "percent" else (lambda v: f"{v:.2f}")
            return f"{label}: base {shown(base)} → fine-tuned {shown(tuned)}"
    return ""


def metric_rows(metrics: Mapping[str, float], *, operator: bool = False) -> list[tuple[str, str]]:
    """(label, value) rows: the known metrics first in a fixed order, then the rest by name."""
    known = [n for n in METRIC_LABELS if n in metrics]
    rest = sorted(n for n in metrics if n not in METRIC_LABELS and (operator or n not in OPERATOR_METRICS))
    return [(METRIC_LABELS.get(n, (humanise(n), ""))[0], format_metric(n, metrics[n])) for n in (*known, *rest)]


# ---------------------------------------------------------------------------------------------
# Where a blueprint can run


VISITOR_NOTE = "not available at this booth"  # what a stranger reads instead of the operator's advice


def blueprint_notes(
    blueprint: Blueprint, backend: str = "local", gpus: int | None = None, *, operator: bool = True
) -> list[str]:
    """Why ``blueprint`` cannot run as it is on ``backend`` here (empty: it can). For a booth visitor
    (``operator=False``) one plain line instead of the operator's advice (install this, set HF_TOKEN, use a cluster)."""
    if not operator:
        return [VISITOR_NOTE] if blueprint_notes(blueprint, backend, gpus) else []
    return api.blueprint_notes(blueprint, backend, gpus)


def error_text(exc: BaseException) -> str:
    """One line for a person: the engine's message for UserError, the type and message otherwise."""
    if isinstance(exc, UserError):
        return str(exc)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
