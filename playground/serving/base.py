"""The model-server interface: serve a finished job's model (or its base model) behind an OpenAI-compatible
endpoint, list and stop the servers. Training backends know nothing of it (they only train); the API facade
(:mod:`playground.api`) pairs a backend with its servers and stops a job's servers before the job is deleted.

Ownership (booth mode) as in :class:`~playground.backends.base.Backend`: for a visitor ``owner``
(a :class:`~playground.owner.Owner`), only servers of that visitor's jobs are listed or stopped; the default,
:data:`~playground.owner.OPERATOR`, sees them all.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from playground.errors import UserError
from playground.events import JobPhase
from playground.owner import OPERATOR, Owner
from playground.types import Endpoint, Job


@dataclass(frozen=True)
class ServerInfo:
    """A running server as the operator sees it: its endpoint, how long since its last request, its memory."""

    endpoint: Endpoint
    idle_seconds: float | None = None  # None: not known for this kind of server
    memory_bytes: int | None = None  # resident memory of its processes; None: not known here
    users: int | None = None  # a shared server: the visitors using it


class ModelServers(abc.ABC):
    """Model servers of one kind: local processes, or KServe InferenceServices on a cluster."""

    name: str = "abstract"

    @abc.abstractmethod
    def serve(self, job: Job, *, base: bool = False, port: int | None = None) -> Endpoint:
        """Serve ``job``'s fine-tuned model (or its base model) and wait until it answers. ``port``: listen
        there (local servers; elsewhere a one-line UserError naming ``--port``)."""

    @abc.abstractmethod
    def unserve(self, target: str, *, owner: Owner = OPERATOR) -> None:
        """Stop serving: ``target`` is an endpoint URL, a server name or a job id (all its servers); a one-line
        UserError when nothing matches."""

    @abc.abstractmethod
    def endpoints(self, *, owner: Owner = OPERATOR) -> list[Endpoint]:
        """The servers running now (all, or those of ``owner``'s jobs)."""

    @abc.abstractmethod
    def stop_job(self, job_id: str) -> None:
        """Stop every server of ``job_id`` (none running is fine): the facade calls it before deleting a job."""

    def stop_all(self) -> list[Endpoint]:
        """Stop every server (the operator's ``unserve --all``); the endpoints stopped."""
        stopped = self.endpoints()
        for endpoint in stopped:
            self.unserve(endpoint.name or endpoint.url)
        return stopped

    def details(self) -> list[ServerInfo]:
        """Every running server with what is known of its idle time and memory (``playground servers``)."""
        return [ServerInfo(e) for e in self.endpoints()]

    def stop_idle(self, *, now: float | None = None) -> list[Endpoint]:
        """Stop the servers the booth policy no longer wants (idle too long, visitor gone); none by default."""
        return []

    def check_port(self, port: int | None) -> None:  # noqa: B027 - a hook: most servers take any port
        """Before anything is asked of the backend: a port these servers cannot listen on is a one-line error."""

    def render(self, job: Job | str, *, base: bool = False) -> str:
        """The serving manifest ``serve`` would create, as YAML (``--dry-run``)."""
        raise UserError(f"--dry-run: the {self.name} backend creates no manifest; use --backend kubernetes")


def model_to_serve(job: Job, *, base: bool) -> str:
    """The model a job's server loads: its base model, or its fine-tuned model once it has Succeeded."""
    if base:
        if not job.base_model:
            raise UserError(f"job {job.id} has no base model yet (phase {job.phase}); try again soon", field="job")
        return job.base_model
    if job.phase != JobPhase.SUCCEEDED or not job.model_dir:
        raise UserError(f"job {job.id} is {job.phase}; it can be served once it has Succeeded", field="job")
    return job.model_dir
