"""A machine-wide FIFO queue of local jobs waiting for one of N training slots.

Booth mode bounds the trainings that run at once on one machine (a 2-core box trains one at a time).
State lives under ``$PLAYGROUND_HOME/queue/`` so every process (kernels, CLI calls, supervisors)
sees the same queue:

- ``waiting/<submit-time>-<job>.json``: one entry per waiting job, written at submit (so the order is
  the submit order even if supervisors start out of order). Entries of jobs that are no longer alive
  (``alive(job)`` false: their supervisor is gone) are pruned by whoever looks.
- ``slots/<k>.lock``: an exclusive lock the supervisor of a training job holds for as long as it
  trains; the kernel drops it when the process dies, so a crash never leaks a slot.
  ``slots/<k>.json`` says which job holds it (for estimates; the lock is what counts).
- ``lock``: serialises changes (join, start, leave).

Only the head of the line may take a free slot (fair FIFO by submit time). Waiters look again about
once a second (no faster). The wait estimate combines the running jobs' ETAs with the typical
duration of the jobs ahead (:func:`estimate_wait`).
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

POLL_INTERVAL = 1.0  # seconds between a waiter's looks at the queue
_LOCK_TIMEOUT = 30.0


@dataclass(frozen=True)
class Entry:
    """A waiting job."""

    job: str
    submitted: float
    path: Path


class Slot:
    """A held training slot: release it (or exit) when the training ends."""

    def __init__(self, lock: FileLock, index: int, info: Path) -> None:
        self.lock = lock
        self.index = index
        self.info = info

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.info.unlink(missing_ok=True)
        self.lock.release()


class TrainingQueue:
    """The queue in ``home/queue`` with ``slots`` trainings at once; ``alive(job)`` says whether a
    waiting job still exists and waits (the local backend: its supervisor holds its lock)."""

    def __init__(self, home: Path | str, slots: int, alive: Callable[[str], bool]) -> None:
        self.root = Path(home) / "queue"
        self.slots = max(1, int(slots))
        self.alive = alive

    # -- files -------------------------------------------------------------------------------
    @property
    def waiting_dir(self) -> Path:
        return self.root / "waiting"

    @property
    def slots_dir(self) -> Path:
        return self.root / "slots"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.waiting_dir.mkdir(parents=True, exist_ok=True)
        self.slots_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.root / "lock"))
        lock.acquire(timeout=_LOCK_TIMEOUT)
        try:
            yield
        finally:
            lock.release()

    def _entry_path(self, job_id: str, submitted: float) -> Path:
        return self.waiting_dir / f"{int(submitted * 1e6):020d}-{job_id}.json"

    def _find(self, job_id: str) -> Path | None:
        if not self.waiting_dir.is_dir():
            return None
        return next(iter(self.waiting_dir.glob(f"*-{job_id}.json")), None)

    @staticmethod
    def _write(path: Path, data: dict[str, Any]) -> None:
        from playground.backends.local.state import write_json_atomic

        write_json_atomic(path, data)

    def _entries(self) -> list[Entry]:
        """Waiting entries in submit order; those of jobs no longer alive are removed."""
        if not self.waiting_dir.is_dir():
            return []
        entries = []
        for path in sorted(self.waiting_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not self.alive(data["job"]):
                path.unlink(missing_ok=True)
                continue
            entries.append(Entry(job=data["job"], submitted=float(data["submitted"]), path=path))
        return entries

    # -- the waiting line ----------------------------------------------------------------------
    def join(self, job_id: str, submitted: float) -> None:
        """Put a job in line (at submit, once it is alive); its place is its submit time."""
        with self._locked():
            self._write(self._entry_path(job_id, submitted), {"job": job_id, "submitted": submitted})

    def leave(self, job_id: str) -> bool:
        """Take a job out of the line (cancelled, or it failed before its turn). False if it was not in it."""
        with self._locked():
            path = self._find(job_id)
            if path is None:
                return False
            path.unlink(missing_ok=True)
            return True

    def waiting(self) -> list[Entry]:
        with self._locked():
            return self._entries()

    def position(self, job_id: str) -> int | None:
        """1 for the next job to start; None when the job is not waiting."""
        for index, entry in enumerate(self.waiting(), start=1):
            if entry.job == job_id:
                return index
        return None

    # -- slots -----------------------------------------------------------------------------------
    def _holders(self) -> dict[int, dict[str, Any]]:
        """Slot index -> holder info, for the slots whose lock is held (probed without waiting)."""
        held: dict[int, dict[str, Any]] = {}
        indexes = {int(p.stem) for p in self.slots_dir.glob("*.lock") if p.stem.isdigit()}
        for index in sorted(indexes | set(range(self.slots))):
            info = self.slots_dir / f"{index}.json"
            probe = FileLock(str(self.slots_dir / f"{index}.lock"))
            try:
                probe.acquire(timeout=0)
            except Timeout:
                try:
                    held[index] = json.loads(info.read_text())
                except (OSError, ValueError):
                    held[index] = {}
                continue
            probe.release()
            info.unlink(missing_ok=True)
        return held

    def running(self) -> list[str]:
        """The jobs holding a slot now."""
        with self._locked():
            return [h["job"] for h in self._holders().values() if h.get("job")]

    def try_start(self, job_id: str) -> Slot | None:
        """Take a free slot if ``job_id`` is at the head of the line; None means: wait and look again."""
        with self._locked():
            entries = self._entries()
            if not entries or entries[0].job != job_id:
                return None
            for index in range(self.slots):
                lock = FileLock(str(self.slots_dir / f"{index}.lock"))
                try:
                    lock.acquire(timeout=0)
                except Timeout:
                    continue
                info = self.slots_dir / f"{index}.json"
                self._write(info, {"job": job_id, "since": time.time(), "pid": os.getpid()})
                entries[0].path.unlink(missing_ok=True)
                return Slot(lock, index, info)
            return None


# -- estimates --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timing:
    """How long a job of some blueprint takes: startup, then per step, then evaluation and saving."""

    startup: float
    per_step: float
    finish: float

    def duration(self, steps: int) -> float:
        return self.startup + self.per_step * steps + self.finish


def timing_from_status(status: dict[str, Any]) -> Timing | None:
    """A job's timing from its ``status.json`` (first and latest progress points); None if unknown.

    A job still running gives its timing so far (no finish part yet).
    """
    started = status.get("started_at")
    first_at, first_step = status.get("first_progress_at"), status.get("first_progress_step")
    progress = status.get("progress") or {}
    last_at, last_step = progress.get("time"), progress.get("step")
    if None in (started, first_at, first_step, last_at, last_step) or last_step <= first_step:
        return None
    per_step = (last_at - first_at) / (last_step - first_step)
    startup = max(0.0, first_at - started - per_step * first_step)
    finished = status.get("finished_at")
    return Timing(startup=startup, per_step=per_step, finish=max(0.0, finished - last_at) if finished else 0.0)


def typical_timing(timings: list[Timing]) -> Timing | None:
    """The median of recent timings of one blueprint (None without any)."""
    if not timings:
        return None

    def median(values: list[float]) -> float:
        values = sorted(values)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    return Timing(
        startup=median([t.startup for t in timings]),
        per_step=median([t.per_step for t in timings]),
        finish=median([t.finish for t in timings]),
    )


def remaining_seconds(status: dict[str, Any], steps: int, typical: Timing | None, now: float) -> float | None:
    """Seconds until a running job ends: its own ETA (plus the usual finish), else typical minus elapsed."""
    progress = status.get("progress") or {}
    finish = typical.finish if typical else 0.0
    if progress.get("eta_seconds") is not None:
        age = max(0.0, now - float(progress.get("time") or now))
        return max(0.0, float(progress["eta_seconds"]) - age) + finish
    if typical is None:
        return None
    started = status.get("started_at") or now
    return max(0.0, typical.duration(steps) - (now - started))


def estimate_wait(running: list[float | None], ahead: list[float | None], slots: int) -> float | None:
    """Seconds until a job gets one of ``slots`` slots, given the running jobs' remaining seconds and
    the durations of the jobs ahead of it in line (in order). None when a needed figure is unknown."""
    if any(r is None for r in running):
        return None
    heap = [float(r) for r in running if r is not None] + [0.0] * max(0, slots - len(running))
    heapq.heapify(heap)
    for duration in ahead:
        if duration is None:
            return None
        heapq.heappush(heap, heapq.heappop(heap) + duration)
    return heap[0]


# -- the local backend's queue and estimator ---------------------------------------------------------
def jobs_queue(home: Path | str, slots: int) -> TrainingQueue:
    """The queue of the local jobs under ``home/jobs``: a job is alive while its supervisor holds its lock."""
    from playground.backends.local import state

    jobs_dir = Path(home) / "jobs"
    return TrainingQueue(home, slots, alive=lambda job: state.supervisor_alive(jobs_dir / job))


class WaitEstimator:
    """A queued local job's wait, from the jobs under ``jobs_dir``: the running jobs' ETAs (or their
    blueprint's typical duration minus what they have run) and the typical durations of the jobs ahead.

    Typical durations come from the last few Succeeded jobs of the same blueprint (their first and last
    progress points), else from the running jobs of that blueprint so far; they are recomputed when the
    running set changes, and at most every ``refresh`` seconds otherwise.
    """

    HISTORY = 5  # finished jobs per blueprint the typical timing is the median of

    def __init__(self, jobs_dir: Path, slots: int, refresh: float = 30.0) -> None:
        self.jobs_dir = Path(jobs_dir)
        self.slots = slots
        self.refresh = refresh
        self._specs: dict[str, dict[str, Any]] = {}
        self._typical: dict[str, Timing] = {}
        self._typical_key: tuple[str, ...] | None = None
        self._typical_at = float("-inf")

    def _read(self, job: str, name: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.jobs_dir / job / name).read_text())
        except (OSError, ValueError):
            return None

    def _spec(self, job: str) -> dict[str, Any] | None:
        if job not in self._specs:
            spec = self._read(job, "spec.json")
            if spec is None:
                return None
            self._specs[job] = spec  # written once: safe to keep
        return self._specs[job]

    @staticmethod
    def _steps(spec: dict[str, Any]) -> int:
        return int((spec.get("params") or {}).get("max_steps") or 0)

    def typical(self, running: list[str]) -> dict[str, Timing]:
        """Blueprint id -> typical timing."""
        from playground.events import JobPhase

        key = tuple(sorted(running))
        if key == self._typical_key and time.monotonic() - self._typical_at < self.refresh:
            return self._typical
        finished: dict[str, list[tuple[float, Timing]]] = {}
        partial: dict[str, list[Timing]] = {}
        for jobdir in self.jobs_dir.iterdir() if self.jobs_dir.is_dir() else ():
            spec, status = self._spec(jobdir.name), self._read(jobdir.name, "status.json")
            timing = timing_from_status(status) if spec and status else None
            if timing is None:
                continue
            blueprint = spec["blueprint_id"]
            if status.get("phase") == str(JobPhase.SUCCEEDED):
                finished.setdefault(blueprint, []).append((float(status.get("finished_at") or 0), timing))
            elif not JobPhase(status.get("phase", "Pending")).terminal:
                partial.setdefault(blueprint, []).append(timing)
        typical: dict[str, Timing] = {}
        for blueprint, items in finished.items():
            recent = [t for _, t in sorted(items, key=lambda item: item[0])[-self.HISTORY :]]
            typical[blueprint] = typical_timing(recent)  # type: ignore[assignment]
        for blueprint, timings in partial.items():
            typical.setdefault(blueprint, typical_timing(timings))  # type: ignore[arg-type]
        self._typical, self._typical_key, self._typical_at = typical, key, time.monotonic()
        return typical

    def _duration(self, job: str, typical: dict[str, Timing]) -> float | None:
        spec = self._spec(job)
        timing = typical.get(spec["blueprint_id"]) if spec else None
        return timing.duration(self._steps(spec)) if timing and spec else None

    def estimate(self, running: list[str], ahead: list[str], now: float | None = None) -> float | None:
        """Seconds until a job behind ``ahead`` starts, with ``running`` holding slots; None if unknown."""
        now = time.time() if now is None else now
        typical = self.typical(running)
        remaining: list[float | None] = []
        for job in running:
            spec, status = self._spec(job), self._read(job, "status.json")
            if spec is None or status is None:
                remaining.append(None)
                continue
            timing = typical.get(spec["blueprint_id"])
            remaining.append(remaining_seconds(status, self._steps(spec), timing, now))
        return estimate_wait(remaining, [self._duration(job, typical) for job in ahead], self.slots)
