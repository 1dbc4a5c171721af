"""The one backend interface (compare kubeflow SDK ``RuntimeBackend``).

Every backend reports the same :class:`~playground.types.Job` phases and the same typed
event stream, so the CLI, widgets and notebooks never care where a job runs.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

from playground.errors import UserError
from playground.events import Event
from playground.types import Endpoint, Job, TrainRequest


class Backend(abc.ABC):
    """Submit, watch, serve and clean up blueprint training jobs."""

    name: str = "abstract"

    @abc.abstractmethod
    def submit(self, request: TrainRequest) -> Job:
        """Validate what can be validated without starting anything, then start the job."""

    @abc.abstractmethod
    def get(self, job_id: str) -> Job:
        """The job's current state; :class:`~playground.errors.JobNotFound` if unknown."""

    @abc.abstractmethod
    def list(self) -> list[Job]:
        """All jobs this backend knows, newest first."""

    @abc.abstractmethod
    def events(self, job_id: str, follow: bool = False) -> Iterator[Event]:
        """The job's history as typed events; with ``follow``, keep yielding until it ends.

        A stream always starts from the beginning, so a new process (or a reloaded page)
        sees the whole history before the live part.
        """

    @abc.abstractmethod
    def cancel(self, job_id: str) -> Job:
        """Stop a running job; it ends ``Cancelled``. A finished job is left as it is."""

    @abc.abstractmethod
    def delete(self, job_id: str) -> None:
        """Stop the job if needed, stop its servers, and remove its state."""

    @abc.abstractmethod
    def serve(self, job_id: str, *, base: bool = False) -> Endpoint:
        """Serve the job's fine-tuned model (or its base model) and wait until ready."""

    @abc.abstractmethod
    def unserve(self, target: str) -> None:
        """Stop serving: ``target`` is an endpoint URL, a server name or a job id (all its servers)."""

    @abc.abstractmethod
    def endpoints(self) -> list[Endpoint]:
        """The model servers this backend is running."""

    def render_train(self, request: TrainRequest) -> str:
        """The manifest ``submit`` would create, as YAML (``--dry-run``)."""
        raise UserError(f"--dry-run: the {self.name} backend creates no manifest; use --backend kubernetes")

    def render_serve(self, job_id: str, *, base: bool = False) -> str:
        """The serving manifest ``serve`` would create, as YAML (``--dry-run``)."""
        raise UserError(f"--dry-run: the {self.name} backend creates no manifest; use --backend kubernetes")
