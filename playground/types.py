"""Engine data types shared by every backend (dataclasses, JSON-friendly)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from playground.events import JobPhase, Progress
from playground.run_request import RunParameters, RunRequest, SourceOverrides

__all__ = ["Endpoint", "Job", "RunParameters", "RunRequest", "SourceOverrides"]


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
