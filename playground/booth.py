"""Booth mode: one machine (or one namespace) serving many anonymous visitors, safely.

A :class:`BoothPolicy` bounds what visitors can start: one running job each, a few per hour, a
bounded number of trainings at once per machine (the rest wait in a FIFO queue of bounded length), a
deadline per job sized from its plan (:func:`job_deadline`: training stops there, the model is still evaluated and
saved), a time-to-live for finished jobs and their servers, and the machine's model servers (one shared
base server per base model, one fine-tuned server per visitor, a cap on all of them, an idle time-to-live).
Backends enforce it in ``submit`` for requests that carry an ``owner`` (a visitor id); jobs without an owner are
the operator's.

A visitor's kernel shows it is still there with :func:`touch_presence` (a :class:`Heartbeat`); a
queued job of a visitor gone longer than ``visitor_gone_seconds`` leaves the queue, and their model
server stops.

Settings come from the environment (``PLAYGROUND_BOOTH=1`` turns booth mode on; the limits are
``PLAYGROUND_BOOTH_*``, see :data:`SETTINGS`); a bad value is one line naming the setting.
Engine only: no Jupyter imports.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from playground.errors import UserError, shown
from playground.owner import Owner, as_owner

ENABLE_SETTING = "PLAYGROUND_BOOTH"
HOUR = 3600.0
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
_LOCK_TIMEOUT = 30.0  # seconds a submit waits for another submit of this machine


class QuotaExceeded(UserError):
    """A visitor's limit is reached (a job running, the hourly cap). ``retry_after_seconds`` when known."""

    def __init__(self, message: str, *, retry_after_seconds: float | None = None) -> None:
        super().__init__(message, field="quota")
        self.retry_after_seconds = retry_after_seconds


@dataclass(frozen=True)
class BoothPolicy:
    """Limits for a public booth. The defaults suit one 2-core box training one job at a time."""

    max_running_per_owner: int = 1  # jobs a visitor may have unfinished (queued or running) at once
    max_jobs_per_owner_per_hour: int = 6  # jobs a visitor may submit in any 60 minutes
    max_concurrent_trainings: int = 1  # trainings at once on this machine (local backend); the rest queue
    # The cap on a local job's deadline (see job_deadline): the deadline is the plan's time × DEADLINE_SLACK, at most
    # this. At the deadline training stops at the next step; the model is still evaluated and saved (Succeeded).
    # 1800: the default blueprint's plan beside one CPU hog is ~10 min (deadline ~20 min) and a run on this 2-core
    # machine under load 5-9 took up to 21.6 min: at 900 the plan never decided, the cap always did.
    job_deadline_seconds: int = 1800
    finished_ttl_seconds: int = 1800  # finished jobs and their servers are removed this long after the end
    # Jobs waiting for a training slot on this machine (local backend); a visitor's submit beyond it is refused.
    # 6: with one slot, ~3.5 minutes per SmolLM2 job (240 steps, the final eval, saving), the last in line waits
    # about 20 minutes.
    max_queued: int = 6
    visitor_gone_seconds: int = 300  # a queued job of a visitor unseen this long leaves the queue (Cancelled)
    # Model server processes on this machine (local servers): one vLLM server per base model (~4.2 GB RSS with its
    # 1 GB KV cache) answers every visitor's base chat and LoRA adapter; a full fine-tune gets a server of its own.
    max_servers: int = 4
    server_idle_seconds: int = 600  # an adapter or fine-tuned server with no chat request this long is unloaded
    server_evict_idle_seconds: int = 120  # at the cap, a visitor's fine-tuned server idle this long makes room
    # LoRA adapters loaded on one base server; one more evicts the least recently used (re-served in ~0.05 s on
    # the visitor's next chat). 32 SmolLM2 r16 adapters: ~0.7 GB in float32.
    max_adapters: int = 32
    # After the deadline: at least this long for the final evaluation and the save (longer when this blueprint's
    # earlier finishes took longer, see deadline_grace) before a trainer that did not stop is killed (Failed).
    deadline_grace_seconds: int = 300

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low = _LOWEST.get(f.name, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UserError(
                    f"booth setting {f.name} ({SETTINGS[f.name]}): {value!r} is not allowed; "
                    f"allowed: an integer >= {low}",
                    field=SETTINGS[f.name],
                )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BoothPolicy:
        """The policy from ``PLAYGROUND_BOOTH_*`` settings (unset ones keep their defaults)."""
        from playground.blueprints.schema import parse_number

        env = os.environ if env is None else env
        values: dict[str, int] = {}
        for name, setting in SETTINGS.items():
            raw = env.get(setting)
            if raw is None or not raw.strip():
                continue
            low = _LOWEST.get(name, 1)
            try:
                values[name] = int(parse_number(raw, integer=True))  # the one parser: ASCII digits only
            except ValueError:
                raise UserError(
                    f"{setting}: {shown(raw)} is not an integer; allowed: an integer >= {low}", field=setting
                ) from None
            if values[name] < low:
                message = f"{setting}: {raw.strip()} is out of range; allowed: an integer >= {low}"
                raise UserError(message, field=setting)
        return cls(**values)

    @classmethod
    def from_settings(cls, env: Mapping[str, str] | None = None) -> BoothPolicy | None:
        """The policy when ``PLAYGROUND_BOOTH`` is on, else None (no limits: a personal machine)."""
        env = os.environ if env is None else env
        return cls.from_env(env) if booth_enabled(env) else None

    # -- quotas ----------------------------------------------------------------------------------
    def check_quota(self, jobs: Iterable, submitted_at: Iterable[float], now: float | None = None) -> None:
        """Raise :class:`QuotaExceeded` if the owner of ``jobs`` may not submit another one now.

        ``jobs``: the owner's jobs (anything with ``done``); ``submitted_at``: when the owner
        submitted jobs (a ledger that survives deletes, or the jobs' ``created_at``).
        """
        now = time.time() if now is None else now
        unfinished = [job for job in jobs if not job.done]
        if len(unfinished) >= self.max_running_per_owner:
            if self.max_running_per_owner == 1:
                message = "you already have a job running; wait for it to finish or cancel it"
            else:
                message = (
                    f"you already have {len(unfinished)} jobs running (the limit); wait for one to finish or cancel it"
                )
            raise QuotaExceeded(message)
        recent = sorted(t for t in submitted_at if now - HOUR < t <= now + 60)
        cap = self.max_jobs_per_owner_per_hour
        if len(recent) >= cap:
            free_at = recent[len(recent) - cap] + HOUR
            wait = max(1.0, free_at - now)
            minutes = max(1, math.ceil(wait / 60))
            raise QuotaExceeded(
                f"hourly limit of {cap} jobs reached; try again in {minutes} minute{'s' if minutes != 1 else ''}",
                retry_after_seconds=wait,
            )


SETTINGS: dict[str, str] = {
    "max_running_per_owner": "PLAYGROUND_BOOTH_MAX_RUNNING_PER_VISITOR",
    "max_jobs_per_owner_per_hour": "PLAYGROUND_BOOTH_MAX_JOBS_PER_HOUR",
    "max_concurrent_trainings": "PLAYGROUND_BOOTH_MAX_CONCURRENT_TRAININGS",
    "job_deadline_seconds": "PLAYGROUND_BOOTH_JOB_DEADLINE_SECONDS",
    "deadline_grace_seconds": "PLAYGROUND_BOOTH_DEADLINE_GRACE_SECONDS",
    "finished_ttl_seconds": "PLAYGROUND_BOOTH_FINISHED_TTL_SECONDS",
    "max_queued": "PLAYGROUND_BOOTH_MAX_QUEUED",
    "visitor_gone_seconds": "PLAYGROUND_BOOTH_VISITOR_GONE_SECONDS",
    "max_servers": "PLAYGROUND_BOOTH_MAX_SERVERS",
    "server_idle_seconds": "PLAYGROUND_BOOTH_SERVER_IDLE_SECONDS",
    "server_evict_idle_seconds": "PLAYGROUND_BOOTH_SERVER_EVICT_IDLE_SECONDS",
    "max_adapters": "PLAYGROUND_BOOTH_MAX_ADAPTERS",
}
_LOWEST = {"finished_ttl_seconds": 0, "server_evict_idle_seconds": 0}  # others: 1


# -- deadlines -------------------------------------------------------------------------------------------
DEADLINE_SLACK = 2.0  # a job's deadline: twice the time its plan predicts for this machine...
DEADLINE_FLOOR_SECONDS = 120  # ...but never less than two minutes (a cold start, a slow first step)...
# (...and never more than the policy's job_deadline_seconds, the operator's cap)
FINISH_SLACK = 3.0  # the grace after the deadline: three times the blueprint's last measured evaluation and save


def job_deadline(planned_seconds: float | None, cap: int) -> int:
    """A job's deadline in seconds from its trainer's start: ``DEADLINE_SLACK`` × the plan's time for this machine
    (``make_plan(...).seconds``), at least ``DEADLINE_FLOOR_SECONDS``, at most ``cap`` (the policy's
    ``job_deadline_seconds``); ``cap`` when there is no plan."""
    if planned_seconds is None or not math.isfinite(planned_seconds) or planned_seconds <= 0:
        return cap
    return min(cap, max(DEADLINE_FLOOR_SECONDS, math.ceil(DEADLINE_SLACK * planned_seconds)))


def deadline_grace(finish_seconds: float | None, floor: int) -> int:
    """How long after the deadline a trainer may take to stop, evaluate and save before it is killed:
    ``FINISH_SLACK`` × the blueprint's last measured finish (``finish_seconds`` of an earlier run), at least ``floor``
    (the policy's ``deadline_grace_seconds``)."""
    if finish_seconds is None or not math.isfinite(finish_seconds) or finish_seconds <= 0:
        return floor
    return max(floor, math.ceil(FINISH_SLACK * finish_seconds))


def booth_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``PLAYGROUND_BOOTH`` turns booth mode on (a bad value is a one-line error)."""
    env = os.environ if env is None else env
    raw = env.get(ENABLE_SETTING, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    allowed = ", ".join(v for v in (*_TRUE, *_FALSE) if v)
    raise UserError(f"{ENABLE_SETTING}: {raw!r} is not a boolean; allowed: {allowed}", field=ENABLE_SETTING)


# -- owners (the type: playground.owner) ------------------------------------------------------------------
def validate_owner(owner: Owner | str | None) -> str | None:
    """A visitor id as given (None stays None: the operator); one-line error naming ``owner`` for anything that is
    not a short printable text (see :class:`~playground.owner.Owner`)."""
    return as_owner(owner).id


def owner_key(owner: str) -> str:
    """A stable, label-safe digest of a visitor id (32 hex chars): Kubernetes labels, file names."""
    return hashlib.sha256(owner.encode()).hexdigest()[:32]


# -- one submit at a time, and who submitted when ------------------------------------------------------
@contextlib.contextmanager
def submit_lock(home: Path) -> Iterator[None]:
    """Serialise quota check + job creation across threads and processes sharing ``home``.

    Two Launch clicks at the same moment (two threads of a kernel, two kernels) make one job.
    """
    from filelock import FileLock, Timeout

    lock_dir = Path(home) / "booth"
    lock_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_dir / "submit.lock"))
    try:
        lock.acquire(timeout=_LOCK_TIMEOUT)
    except Timeout:
        raise UserError("the booth is busy starting other jobs; try again in a moment", field="quota") from None
    try:
        yield
    finally:
        lock.release()


class SubmissionLedger:
    """When each visitor submitted jobs in the last hour (``home/booth/submissions.json``).

    Kept apart from the jobs themselves so that deleting a job does not give a visitor their
    hourly quota back. Read and written only under :func:`submit_lock`.
    """

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / "booth" / "submissions.json"

    def _read(self) -> dict[str, list[float]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: [float(t) for t in v] for k, v in data.items() if isinstance(v, list)}

    def times(self, owner: str) -> list[float]:
        return self._read().get(owner_key(owner), [])

    def record(self, owner: str, when: float | None = None) -> None:
        now = time.time() if when is None else when
        data = {k: [t for t in v if t > now - HOUR] for k, v in self._read().items()}
        data = {k: v for k, v in data.items() if v}
        data.setdefault(owner_key(owner), []).append(now)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)


# -- presence: is a visitor still at the booth? --------------------------------------------------------
def _presence_path(home: Path, owner: str) -> Path:
    return Path(home) / "booth" / "presence" / owner_key(owner)


def touch_presence(home: Path | str, owner: str, when: float | None = None) -> None:
    """Record that ``owner`` is at the booth now (their kernel calls it now and then; a submit does too)."""
    path = _presence_path(Path(home), owner)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    if when is not None:
        os.utime(path, (when, when))


def last_seen(home: Path | str, owner: str) -> float | None:
    """When ``owner`` was last seen (None: never recorded)."""
    try:
        return _presence_path(Path(home), owner).stat().st_mtime
    except OSError:
        return None


def visitor_gone(home: Path | str, owner: Owner, after_seconds: float, now: float | None = None) -> bool:
    """Whether ``owner`` was last seen more than ``after_seconds`` ago. The operator and a visitor never
    seen (no record: nothing says they left) are never gone."""
    if owner.id is None:
        return False
    seen = last_seen(home, owner.id)
    now = time.time() if now is None else now
    return seen is not None and now - seen > after_seconds


class Heartbeat:
    """Calls ``beat`` every ``interval`` seconds on a daemon thread until :meth:`stop` (or the process ends:
    a culled kernel stops beating, which is how the engine learns a visitor has left)."""

    def __init__(self, beat: Callable[[], None], interval: float) -> None:
        self.beat = beat
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="playground-presence", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a full disk must not kill the kernel's thread
                self.beat()
            if self._stop.wait(self.interval):
                return
