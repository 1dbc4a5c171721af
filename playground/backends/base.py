"""The one backend interface (compare kubeflow SDK ``RuntimeBackend``).

Every backend reports the same :class:`~playground.types.Job` phases and the same typed
event stream, so the CLI, widgets and notebooks never care where a job runs.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playground.booth import BoothPolicy, SubmissionLedger, submit_lock, touch_presence
from playground.errors import UserError
from playground.events import Event
from playground.owner import OPERATOR, Owner
from playground.paths import ensure_writable_dir, playground_home
from playground.requests import check_request
from playground.types import Job, RunRequest


class Backend(abc.ABC):
    """Submit, watch, cancel and delete blueprint training jobs (training only: model servers have their own
    interface, :class:`playground.serving.base.ModelServers`, paired with a backend by :mod:`playground.facade`).

    Ownership (booth mode): every call that names a job takes ``owner``, an :class:`~playground.owner.Owner`; the
    default, :data:`~playground.owner.OPERATOR`, sees every job. For a visitor, a job that belongs to someone else
    is reported exactly like an unknown one (:class:`~playground.errors.JobNotFound`): its existence is not revealed.
    ``submit`` enforces :attr:`policy` (quotas, queue, deadline) for requests that carry an ``owner``.
    """

    name: str = "abstract"
    policy: BoothPolicy | None = None  # booth limits; None: no limits (a personal machine)

    def submit(self, request: RunRequest) -> Job:
        """Validate what can be validated without starting anything (:meth:`prepare`), then start the job.

        With a :attr:`policy` and ``request.owner_id`` set, the owner's quota is checked and the job created as one
        step for every process sharing :attr:`quota_home` (two clicks at the same moment make one job), else
        :class:`~playground.booth.QuotaExceeded`. The same rule for every backend. A submit also shows that
        the visitor is present (:func:`~playground.booth.touch_presence`).
        """
        check_request(request)  # the same for every backend, before its own checks
        prepared = self.prepare(request)
        if self.policy is None or request.owner_id is None:
            return self.create(request, prepared)
        home = ensure_writable_dir(self.quota_home, what="state dir")
        with submit_lock(home):
            ledger = SubmissionLedger(home)
            mine = self.list(owner=request.owner)
            times = max(ledger.times(request.owner_id), [job.created_at for job in mine], key=len)
            self.policy.check_quota(mine, times)
            self.check_capacity()
            touch_presence(home, request.owner_id)
            job = self.create(request, prepared)
            ledger.record(request.owner_id, job.created_at)
            return job

    @abc.abstractmethod
    def prepare(self, request: RunRequest) -> Any:
        """Check ``request`` for this backend and return what :meth:`create` needs; starts nothing."""

    @abc.abstractmethod
    def create(self, request: RunRequest, prepared: Any) -> Job:
        """Start the job :meth:`prepare` checked."""

    def check_capacity(self) -> None:  # noqa: B027 - a hook: only a backend with its own queue bounds it
        """Booth mode, under the submit lock: :class:`~playground.booth.QuotaExceeded` when the machine's
        queue is full (a visitor's submit creates nothing then)."""

    @property
    def quota_home(self) -> Path:
        """Where the booth's submission ledger and lock live (one per app, shared by its kernels)."""
        return playground_home()

    @abc.abstractmethod
    def get(self, job_id: str, *, owner: Owner = OPERATOR) -> Job:
        """The job's current state; :class:`~playground.errors.JobNotFound` if unknown (or not ``owner``'s)."""

    @abc.abstractmethod
    def list(self, *, owner: Owner = OPERATOR) -> list[Job]:
        """The jobs this backend knows, newest first: all of them, or only ``owner``'s."""

    @abc.abstractmethod
    def events(self, job_id: str, follow: bool = False, *, owner: Owner = OPERATOR) -> Iterator[Event]:
        """The job's history as typed events; with ``follow``, keep yielding until it ends.

        A stream always starts from the beginning, so a new process (or a reloaded page)
        sees the whole history before the live part. A queued job yields
        :class:`~playground.events.Queued` events as its position changes.
        """

    @abc.abstractmethod
    def cancel(self, job_id: str, *, owner: Owner = OPERATOR) -> Job:
        """Stop a running (or queued) job; it ends ``Cancelled``. A finished job is left as it is."""

    @abc.abstractmethod
    def delete(self, job_id: str, *, owner: Owner = OPERATOR) -> None:
        """Stop the job if needed and remove its state (the facade stops its model servers first)."""

    def expired(self, *, now: float | None = None) -> list[str]:
        """Finished jobs whose time-to-live (``Job.expires_at``) has passed. Nothing is deleted here: the facade's
        ``cleanup`` deletes them, servers first; the operator runs it with ``playground jobs --cleanup``."""
        return [job.id for job in self.list() if is_expired(job, now)]

    @property
    def cleanup_interval(self) -> float | None:
        """Seconds between the cleanups the facade runs on the side of ``list``/``submit``; None: only on request."""
        return None

    def render_train(self, request: RunRequest) -> str:
        """The manifest ``submit`` would create, as YAML (``--dry-run``)."""
        raise UserError(f"--dry-run: the {self.name} backend creates no manifest; use --backend kubernetes")


def is_expired(job: Job, now: float | None = None) -> bool:
    """Whether ``job``'s time-to-live has run out (at ``now``, default: the current time)."""
    return job.expires_at is not None and (time.time() if now is None else now) >= job.expires_at
