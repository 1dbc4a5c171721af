"""A Ray job read back (the ``ray`` backend): Ray's status and the job's log (the driver's output, which Ray Train
fills with the workers') as the trainer's phase, progress, metrics, failure and last lines."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from playground.backends.ray.logs import clean_line, ray_event, tail_lines
from playground.events import Event, JobPhase, Metric, Phase, Progress, parse_line
from playground.formatting import describe_event

LOG_TAIL_LINES = 40
RAY_PHASES = {"SUCCEEDED": JobPhase.SUCCEEDED, "FAILED": JobPhase.FAILED, "STOPPED": JobPhase.CANCELLED}


def status_of(info: Any) -> str:
    """Ray's status of a job (``JobDetails.status``): PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
    return str(getattr(info.status, "value", info.status))


def ended(info: Any) -> bool:
    """Whether Ray says the job is over (succeeded, failed or stopped)."""
    return status_of(info) in RAY_PHASES


def log_events(lines: Iterable[str]) -> Iterator[Event]:
    """The events of a Ray job's log lines, without the trainer's terminal phases (Ray's status is the verdict)."""
    for line in lines:
        event = ray_event(line)
        if not (isinstance(event, Phase) and event.phase.terminal):
            yield event


class LogSummary:
    """What a Ray job's log says so far: the trainer's phase, last progress point, metrics, failure, tail."""

    def __init__(self) -> None:
        self.phase: JobPhase | None = None
        self.reason = ""
        self.failure = ""
        self.progress: Progress | None = None
        self.metrics: dict[str, float] = {}
        self.tail: list[str] = []

    @classmethod
    def read(cls, text: str) -> LogSummary:
        summary = cls()
        lines = [line for line in text.splitlines() if line.strip()]
        for line in lines:
            event = ray_event(line)
            if isinstance(event, Phase):
                if event.phase == JobPhase.FAILED:
                    summary.failure = event.reason or summary.failure  # the last: the driver's verdict
                elif not event.phase.terminal:
                    summary.phase, summary.reason = event.phase, event.reason
            elif isinstance(event, Progress):
                summary.progress = event
            elif isinstance(event, Metric):
                summary.metrics[event.name] = event.value
        if not summary.failure:
            errors = [clean_line(line) for line in lines if ": error: " in line]
            summary.failure = errors[-1].split(": error: ", 1)[1] if errors else ""
        summary.tail = [describe_event(parse_line(line)) for line in tail_lines(text, LOG_TAIL_LINES)]
        return summary


def phase_of(info: Any, summary: LogSummary) -> tuple[JobPhase, str]:
    """The job's phase and message: Ray's verdict once it ended, Ray's PENDING, else the trainer's own phase."""
    status = status_of(info)
    verdict = RAY_PHASES.get(status)
    if verdict == JobPhase.CANCELLED:
        return verdict, "cancelled by user"
    if verdict == JobPhase.FAILED:
        return verdict, summary.failure or info.message or "the Ray job failed"
    if verdict is not None:
        return verdict, ""
    if status == "PENDING":
        return JobPhase.PENDING, info.message or "Ray has not started the job yet"
    if summary.phase is None:
        return JobPhase.INITIALIZING, "Ray Train is starting the workers"
    return summary.phase, summary.reason if summary.phase == JobPhase.PENDING else ""
