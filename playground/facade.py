"""The facade the CLI, the app and the notebooks use: one training backend and its model servers as one object.

Training backends (:mod:`playground.backends`) only train; model servers (:mod:`playground.serving`) only serve.
The facade pairs them: ``serve`` checks the caller may see the job, then asks the servers; ``delete`` stops the
job's servers before the backend removes the job; ``cleanup`` deletes the jobs past their TTL the same way, stops the
model servers the booth no longer wants (idle, visitor gone), and runs on the side of ``list``/``submit`` as often as
the backend asks (booth mode), never inside the backend.

Every verb takes ``owner``: an :class:`~playground.owner.Owner`, or the legacy ``str | None`` of the app's widgets
and notebooks (None: the operator), made an Owner once here (a bad id is a one-line error naming ``owner``); the
backends, servers and chat store below get that Owner and convert nothing again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from playground.backends import Backend, get_backend
from playground.backends.base import is_expired
from playground.booth import Heartbeat, touch_presence
from playground.chats import ChatStore
from playground.errors import JobNotFound, UserError
from playground.events import Event
from playground.owner import Owner, as_owner
from playground.serving.base import ModelServers, ServerInfo
from playground.types import Endpoint, Job, RunRequest


class Playground:
    """Jobs on one backend and their model servers (the same verbs as ``Backend``, plus serving)."""

    def __init__(self, backend: Backend, servers: ModelServers | None = None) -> None:
        self.backend = backend
        self._servers = servers
        self._last_cleanup = float("-inf")

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def policy(self) -> Any:
        return self.backend.policy

    @property
    def servers(self) -> ModelServers:
        """The backend's model servers (made on first use: listing jobs needs none)."""
        if self._servers is None:
            from playground.serving import servers_for

            self._servers = servers_for(self.backend)
        return self._servers

    # -- jobs -------------------------------------------------------------------------------------
    def submit(self, request: RunRequest) -> Job:
        self._cleanup_now_and_then()
        return self.backend.submit(request)

    def get(self, job_id: str, *, owner: Owner | str | None = None) -> Job:
        return self.backend.get(job_id, owner=as_owner(owner))

    def list(self, *, owner: Owner | str | None = None) -> list[Job]:
        """The jobs (``owner``'s, or all); when a cleanup is due, one listing of every job serves both."""
        who = as_owner(owner)
        if not self._cleanup_due():
            return self.backend.list(owner=who)
        everyone = self.backend.list()
        removed = set(self._delete_expired(everyone))
        return [job for job in everyone if job.id not in removed and who.sees(job.owner)]

    def events(self, job_id: str, follow: bool = False, *, owner: Owner | str | None = None) -> Iterator[Event]:
        return self.backend.events(job_id, follow, owner=as_owner(owner))

    def cancel(self, job_id: str, *, owner: Owner | str | None = None) -> Job:
        return self.backend.cancel(job_id, owner=as_owner(owner))

    def delete(self, job_id: str, *, owner: Owner | str | None = None) -> None:
        """Stop the job's servers, then the job, and remove it (someone else's job: JobNotFound, nothing stops)."""
        who = as_owner(owner)
        self.backend.get(job_id, owner=who)
        self.servers.stop_job(job_id)
        self.backend.delete(job_id, owner=who)
        with contextlib.suppress(OSError, ValueError):
            ChatStore(self.backend.quota_home).forget(job_id)

    def cleanup(self, *, now: float | None = None) -> list[str]:
        """Delete the finished jobs past their TTL, with their servers, and stop the servers idle past theirs
        (booth mode); the ids deleted."""
        return self._delete(self.backend.expired(now=now), now=now)

    def _delete_expired(self, jobs: list[Job]) -> list[str]:
        """The listed jobs whose ``expires_at`` has passed, deleted (one listing serves listing and cleanup)."""
        return self._delete([job.id for job in jobs if is_expired(job)])

    def _delete(self, job_ids: list[str], *, now: float | None = None) -> list[str]:
        self._last_cleanup = time.monotonic()
        removed = []
        for job_id in job_ids:
            try:
                self.delete(job_id)
            except (JobNotFound, UserError):
                continue  # removed by someone else meanwhile
            removed.append(job_id)
        if self.policy is not None:  # a backend without model servers, or one stopped meanwhile: nothing to do
            with contextlib.suppress(UserError, OSError):
                self.servers.stop_idle(now=now)
        return removed

    def _cleanup_due(self) -> bool:
        interval = self.backend.cleanup_interval
        return interval is not None and time.monotonic() - self._last_cleanup >= interval

    def _cleanup_now_and_then(self) -> None:
        if self._cleanup_due():
            self.cleanup()

    # -- serving ----------------------------------------------------------------------------------
    def serve(
        self, job_id: str, *, base: bool = False, owner: Owner | str | None = None, port: int | None = None
    ) -> Endpoint:
        """Serve the job's fine-tuned model (or its base model) and wait until it answers."""
        who = as_owner(owner)
        self.servers.check_port(port)  # refused before the backend is asked anything
        return self.servers.serve(self.backend.get(job_id, owner=who), base=base, port=port)

    def unserve(self, target: str, *, owner: Owner | str | None = None) -> None:
        self.servers.unserve(target, owner=as_owner(owner))

    def endpoints(self, *, owner: Owner | str | None = None) -> list[Endpoint]:
        return self.servers.endpoints(owner=as_owner(owner))

    def server_details(self) -> list[ServerInfo]:
        """The operator's view of every server: owner, kind, idle time, memory (``playground servers``)."""
        return self.servers.details()

    def unserve_all(self) -> list[Endpoint]:
        """Stop every model server, shared ones too (the operator's ``playground unserve --all``)."""
        return self.servers.stop_all()

    # -- chats: a reloaded page shows the visitor's chat with a job again -----------------------------------
    def chat_history(self, job_id: str, *, owner: Owner | str | None = None) -> list[dict[str, Any]]:
        """``owner``'s kept chat with the job's models (someone else's job: JobNotFound)."""
        who = as_owner(owner)
        self.backend.get(job_id, owner=who)
        return ChatStore(self.backend.quota_home).load(job_id, who)

    def save_chat(self, job_id: str, exchanges: list[dict[str, Any]], *, owner: Owner | str | None = None) -> None:
        """Keep ``owner``'s chat with the job's models (bounded: see :mod:`playground.chats`)."""
        who = as_owner(owner)
        self.backend.get(job_id, owner=who)
        ChatStore(self.backend.quota_home).save(job_id, who, exchanges)

    # -- presence (booth mode) -------------------------------------------------------------------------
    def keep_present(self, owner: Owner | str | None, *, interval: float | None = None) -> Heartbeat | None:
        """Show that ``owner`` is at the booth for as long as this process lives (a started :class:`Heartbeat`
        that touches their presence every ``interval`` seconds: by default a third of the time after which a
        visitor counts as gone, at most a minute). None outside booth mode or for the operator."""
        who = as_owner(owner)
        if self.policy is None or who.id is None:
            return None
        home, visitor = self.backend.quota_home, who.id
        every = interval if interval is not None else min(60.0, self.policy.visitor_gone_seconds / 3)
        return Heartbeat(lambda: touch_presence(home, visitor), every).start()

    # -- manifests (--dry-run) --------------------------------------------------------------------
    def render_train(self, request: RunRequest) -> str:
        return self.backend.render_train(request)

    def render_serve(self, job_id: str, *, base: bool = False) -> str:
        return self.servers.render(job_id, base=base)


def connect(name: str = "local", **options: Any) -> Playground:
    """The facade over a backend by name (``options`` go to the backend, e.g. namespace, context)."""
    return Playground(get_backend(name, **options))
