"""On-disk state of local jobs, shared by :class:`LocalBackend` and the supervisor process.

A job lives in ``$PLAYGROUND_HOME/jobs/<job-id>/``:

- ``spec.json``: what was asked for (blueprint, params, sources, the trainer command), written once;
- ``status.json``: phase, latest progress, metrics, pids, exit code, log tail; rewritten atomically
  (temp file + ``os.replace``) by the supervisor, and by a reader only when the supervisor died;
- ``train.log``: the trainer's output, event lines included (the whole event history);
- ``output/``: the trainer's ``--output`` directory (``model/``, ``base-model/``, ``metrics.json``...).

Nothing here imports torch: the UI's kernel reads job state through these helpers.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from playground.events import ClusterEvent, Event, Log, Metric, Phase, Progress

SPEC = "spec.json"
STATUS = "status.json"
LOG = "train.log"
OUTPUT = "output"
SUPERVISOR_LOG = "supervisor.log"
SUPERVISOR_MODULE = "playground.backends.local.supervisor"
TRAINER_MODULE = "playground.train"
LOG_TAIL_LINES = 50


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so a reader sees either the old or the new file, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def describe_event(event: Event) -> str:
    """One readable line for an event (``playground logs``, log tails)."""
    if isinstance(event, Log):
        return event.line
    if isinstance(event, Progress):
        parts = [f"step {event.step}/{event.total_steps}"]
        if event.loss is not None:
            parts.append(f"loss {event.loss:.4f}")
        if event.learning_rate is not None:
            parts.append(f"lr {event.learning_rate:.2e}")
        if event.tokens_per_second is not None:
            parts.append(f"{event.tokens_per_second:,.0f} tok/s")
        if event.eta_seconds is not None:
            parts.append(f"eta {format_duration(event.eta_seconds)}")
        return "[progress] " + "  ".join(parts)
    if isinstance(event, Phase):
        return f"[phase] {event.phase}" + (f": {event.reason}" if event.reason else "")
    if isinstance(event, Metric):
        return f"[metric] {event.name} = {event.value:.4g}"
    if isinstance(event, ClusterEvent):
        return f"[{event.kind}] {event.reason}: {event.message}"
    return str(event)


def format_duration(seconds: float | None) -> str:
    """``75`` → ``1:15``, ``3725`` → ``1:02:05``; unknown → ``?``."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def supervisor_markers(jobdir: Path) -> tuple[str, str]:
    """What a job's supervisor command line contains (whatever path spelling started it)."""
    return SUPERVISOR_MODULE, jobdir.name


def trainer_markers(jobdir: Path) -> tuple[str, str]:
    """What a job's trainer command line contains (``python -m playground.train`` or torchrun)."""
    return TRAINER_MODULE, f"{jobdir.name}{os.sep}{OUTPUT}"


def kill_group(pgid: int | None, sig: int = signal.SIGKILL) -> bool:
    """Signal a whole process group; False when it is already gone."""
    if not pgid or pgid <= 0:
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
