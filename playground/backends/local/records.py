"""A local job's records read back (:mod:`.state` says what is on disk): its status reconciled with its
supervisor, its log's tail, the :class:`~playground.types.Job` they make, and its log as events (replayed, then
followed).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from playground.backends.local import state
from playground.events import Event, JobPhase, Phase, Progress, event_from_dict, parse_line
from playground.formatting import describe_event
from playground.processes import process_alive
from playground.types import Job

FOLLOW_INTERVAL = 0.2  # seconds between looks at a followed log


def reconciled_status(jobdir: Path) -> dict[str, Any]:
    """``status.json``, reconciled: a non-terminal job whose supervisor is gone becomes Failed.

    The supervisor is the only writer of a live job's status; this writes only while holding the
    supervisor lock, which proves the supervisor has exited (it cannot come back).
    """
    status = state.read_json(jobdir / state.STATUS)
    if JobPhase(status["phase"]).terminal:
        return status
    with state.supervisor_gone(jobdir) as gone:
        if gone is False:
            return status
        if gone is None and state.supervisor_alive(jobdir):  # a job made before the lock
            return status
        status = state.read_json(jobdir / state.STATUS)  # it may have finished just now
        if JobPhase(status["phase"]).terminal:
            return status
        trainer = status.get("trainer_pid")
        if trainer and process_alive(trainer, *state.trainer_markers(jobdir)):
            state.kill_group(status.get("trainer_pgid") or trainer, signal.SIGKILL)
        tail = log_tail(jobdir)
        supervisor_tail = supervisor_log_tail(jobdir)
        tail = tail + [f"[supervisor] {line}" for line in supervisor_tail]
        if (jobdir / state.CANCEL_REQUESTED).exists():  # signalled before it could answer
            phase, message = JobPhase.CANCELLED, "cancelled by user"
        else:
            phase = JobPhase.FAILED
            message = "supervisor exited unexpectedly" + (f": {supervisor_tail[-1]}" if supervisor_tail else "")
        status.update(
            phase=str(phase), message=message, finished_at=time.time(), log_tail=tail or status.get("log_tail", [])
        )
        state.write_json_atomic(jobdir / state.STATUS, status)
    return status


def supervisor_log_tail(jobdir: Path, lines: int = 20) -> list[str]:
    """The supervisor's own output (a crash of the supervisor itself shows only here)."""
    try:
        text = (jobdir / state.SUPERVISOR_LOG).read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def log_tail(jobdir: Path, lines: int = state.LOG_TAIL_LINES) -> list[str]:
    """The trainer log's last lines, events described."""
    try:
        with open(jobdir / state.LOG, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 256 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [describe_event(parse_line(line)) for line in text.splitlines()[-lines:]]


def to_job(jobdir: Path, status: dict[str, Any], *, backend: str, ttl_seconds: float | None) -> Job:
    """The Job a job directory holds, given its (reconciled) status; ``ttl_seconds``: booth mode's time a finished
    job is kept (``Job.expires_at``), None for no end."""
    spec = state.read_json(jobdir / state.SPEC)
    phase = JobPhase(status["phase"])
    progress = None
    if status.get("progress"):
        progress = event_from_dict({"type": "progress", **status["progress"]})
        assert isinstance(progress, Progress)
    model = jobdir / state.OUTPUT / "model"
    model_dir = str(model) if phase == JobPhase.SUCCEEDED and model.is_dir() else None
    base_model = spec.get("base_model")
    if base_model and base_model.startswith(str(jobdir)) and not Path(base_model).is_dir():
        base_model = None  # scratch:// base weights are not written yet (or the job failed first)
    finished_at = status.get("finished_at")
    expires = None
    if ttl_seconds is not None and phase.terminal and finished_at is not None:
        expires = float(finished_at) + ttl_seconds
    return Job(
        id=spec["id"],
        blueprint_id=spec["blueprint_id"],
        backend=backend,
        phase=phase,
        params=spec["params"],
        created_at=spec["created_at"],
        started_at=status.get("started_at"),
        finished_at=finished_at,
        message=status.get("message", ""),
        progress=progress,
        metrics=dict(status.get("metrics") or {}),
        model_dir=model_dir,
        base_model=base_model,
        log_tail=list(status.get("log_tail") or []),
        labels=dict(spec.get("labels") or {}),
        owner=spec.get("owner"),
        queue_position=status.get("queue_position") if phase == JobPhase.PENDING else None,
        estimated_wait_seconds=status.get("estimated_wait_seconds") if phase == JobPhase.PENDING else None,
        expires_at=expires,
    )


def _line_events(raw_lines: list[bytes]) -> Iterator[Event]:
    """The events of the log's lines, without the trainer's terminal phases (the supervisor's verdict, written to
    status.json, is the terminal phase)."""
    for raw in raw_lines:
        event = parse_line(raw.decode("utf-8", errors="replace"))
        if not (isinstance(event, Phase) and event.phase.terminal):
            yield event


def log_events(jobdir: Path, status: Callable[[], dict[str, Any]], follow: bool) -> Iterator[Event]:
    """The job's log as events from its start, then (``follow``) as it grows, ending with the terminal Phase of
    ``status()`` (the reconciled status.json) once the job is over."""
    try:
        fh = open(jobdir / state.LOG, "rb")  # noqa: SIM115 - closed in finally; a generator
    except FileNotFoundError:
        return
    try:
        pending = b""
        while True:
            chunk = fh.read(1 << 16)
            if chunk:
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                yield from _line_events(lines)
                continue
            try:
                now = status()
            except FileNotFoundError:
                return  # deleted meanwhile
            phase = JobPhase(now["phase"])
            if phase.terminal:
                rest = pending + fh.read()  # the log is complete before the terminal status is written
                yield from _line_events([raw for raw in rest.split(b"\n") if raw.strip()])
                yield Phase(phase, now.get("message", ""), time=now.get("finished_at") or time.time())
                return
            if not follow:
                return
            time.sleep(FOLLOW_INTERVAL)
    finally:
        fh.close()
