"""The one backend interface (compare kubeflow SDK ``RuntimeBackend``).

Every backend reports the same :class:`~playground.types.Job` phases and the same typed
event stream, so the CLI, widgets and notebooks never care where a job runs.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

from playground.booth import BoothPolicy
from playground.errors import UserError
from playground.events import Event
from playground.types import Endpoint, Job, TrainRequest


class Backend(abc.ABC):
    """Submit, watch, serve and clean up blueprint training jobs.

    Ownership (booth mode): every call that names a job takes ``owner``. ``owner=None`` is the
    operator's view (every job). With an ``owner``, a job that belongs to someone else is reported
    exactly like an unknown one (:class:`~playground.errors.JobNotFound`): its existence is not revealed.
    ``submit`` enforces :attr:`policy` (quotas, queue, deadline) for requests that carry an ``owner``.
    """

    name: str = "abstract"
    policy: BoothPolicy | None = None  # booth limits; None: no limits (a personal machine)

    @abc.abstractmethod
    def submit(self, request: TrainRequest) -> Job:
        """Validate what can be validated without starting anything, then start the job.

        With a :attr:`policy` and ``request.owner`` set, the owner's quota is checked and the job
        created atomically (two clicks at the same moment make one job), else
        :class:`~playground.booth.QuotaExceeded`.
        """

    @abc.abstractmethod
    def get(self, job_id: str, *, owner: str | None = None) -> Job:
        """The job's current state; :class:`~playground.errors.JobNotFound` if unknown (or not ``owner``'s)."""

    @abc.abstractmethod
    def list(self, *, owner: str | None = None) -> list[Job]:
        """The jobs this backend knows, newest first: all of them, or only ``owner``'s."""

    @abc.abstractmethod
    def events(self, job_id: str, follow: bool = False, *, owner: str | None = None) -> Iterator[Event]:
        """The job's history as typed events; with ``follow``, keep yielding until it ends.

        A stream always starts from the beginning, so a new process (or a reloaded page)
        sees the whole history before the live part. A queued job yields
        :class:`~playground.events.Queued` events as its position changes.
        """

    @abc.abstractmethod
    def cancel(self, job_id: str, *, owner: str | None = None) -> Job:
        """Stop a running (or queued) job; it ends ``Cancelled``. A finished job is left as it is."""

    @abc.abstractmethod
    def delete(self, job_id: str, *, owner: str | None = None) -> None:
        """Stop the job if needed, stop its servers, and remove its state."""

    @abc.abstractmethod
    def serve(self, job_id: str, *, base: bool = False, owner: str | None = None, port: int | None = None) -> Endpoint:
        """Serve the job's fine-tuned model (or its base model) and wait until ready. ``port``: listen on
        that port (local servers; a port that is taken is a one-line UserError naming ``--port``)."""

    @abc.abstractmethod
    def unserve(self, target: str, *, owner: str | None = None) -> None:
        """Stop serving: ``target`` is an endpoint URL, a server name or a job id (all its servers).

        With an ``owner``, only servers of that owner's jobs match.
        """

    @abc.abstractmethod
    def endpoints(self, *, owner: str | None = None) -> list[Endpoint]:
        """The model servers this backend is running (all, or those of ``owner``'s jobs)."""

    def cleanup(self, *, now: float | None = None) -> list[str]:
        """Remove finished jobs (and their servers) older than the policy's TTL; the ids removed.

        Backends run it opportunistically (on submit and list) when a policy is active; the operator
        runs it with ``playground jobs --cleanup``.
        """
        return []

    def render_train(self, request: TrainRequest) -> str:
        """The manifest ``submit`` would create, as YAML (``--dry-run``)."""
        raise UserError(f"--dry-run: the {self.name} backend creates no manifest; use --backend kubernetes")

    def render_serve(self, job_id: str, *, base: bool = False) -> str:
        """The serving manifest ``serve`` would create, as YAML (``--dry-run``)."""
        raise UserError(f"--dry-run: the {self.name} backend creates no manifest; use --backend kubernetes")
