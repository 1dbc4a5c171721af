"""On-disk state of local jobs, shared by :class:`LocalBackend` and the supervisor process.

A job lives in ``$PLAYGROUND_HOME/jobs/<job-id>/``:

- ``spec.json``: what was asked for (blueprint, params, sources, the trainer command), written once;
- ``status.json``: phase, latest progress, metrics, pids, exit code, log tail; rewritten atomically
  (temp file + ``os.replace``) by the supervisor, and by a reader only when the supervisor died;
- ``train.log``: the trainer's output, event lines included (the whole event history);
- ``output/``: the trainer's ``--output`` directory (``model/``, ``base-model/``, ``metrics.json``...);
- ``supervisor.lock``: held (``flock``, exclusive) by the job's supervisor for its whole life. ``submit``
  takes it before the job exists and hands the locked file to the supervisor it starts, so there is no
  moment when a live job's lock is free. A reader that can take the lock knows the supervisor is gone,
  and only such a reader may write ``status.json`` (ownership: the live supervisor is its only writer);
- ``cancel-requested``: written by ``cancel`` before it signals, so a supervisor still starting sees it.

Nothing here imports torch: the UI's kernel reads job state through these helpers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playground.processes import process_alive

SPEC = "spec.json"
STATUS = "status.json"
LOG = "train.log"
OUTPUT = "output"
SUPERVISOR_LOG = "supervisor.log"
SUPERVISOR_LOCK = "supervisor.lock"
SUPERVISOR_PID = "supervisor.pid"
CANCEL_REQUESTED = "cancel-requested"
SUPERVISOR_MODULE = "playground.backends.local.supervisor"
TRAINER_MODULE = "playground.train"
LOG_TAIL_LINES = 50


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so a reader sees either the old or the new file, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # unique per writer
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def take_supervisor_lock(jobdir: Path) -> int:
    """Create the job's lock file and hold it (exclusive); the returned fd goes to the supervisor."""
    fd = os.open(jobdir / SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a fresh file: nobody else holds it
    return fd


@contextlib.contextmanager
def supervisor_gone(jobdir: Path) -> Iterator[bool | None]:
    """Whether the job's supervisor is gone, kept true for the ``with`` body (the lock is held meanwhile).

    True: nobody holds the supervisor lock, so the supervisor has exited (or was never started) and
    the caller may write ``status.json``. False: the supervisor (or ``submit`` starting it) holds it.
    None: the job has no lock file (made by a version before the lock); decide by pid instead.
    """
    try:
        fd = os.open(jobdir / SUPERVISOR_LOCK, os.O_RDONLY | os.O_CLOEXEC)  # never created here
    except FileNotFoundError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: readers do not block each other
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def supervisor_alive(jobdir: Path) -> bool:
    """Whether the job's supervisor still runs (by its lock; by pid for jobs made before the lock)."""
    with supervisor_gone(jobdir) as gone:
        if gone is not None:
            return not gone
    return process_alive(read_supervisor_pid(jobdir), *supervisor_markers(jobdir))


def read_supervisor_pid(jobdir: Path) -> int | None:
    try:
        return int((jobdir / SUPERVISOR_PID).read_text().strip())
    except (OSError, ValueError):
        return None


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
