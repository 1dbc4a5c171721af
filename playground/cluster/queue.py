"""A job's (TrainJob's, RayJob's) place in its Kueue LocalQueue, from Kueue's visibility API where it answers.

``GET /apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/NS/localqueues/LQ/pendingworkloads`` lists
the LocalQueue's pending Workloads with ``positionInLocalQueue`` (0 = next). A job's Workload is the one
owned by it (``ownerReferences``; Kueue names it ``<kind>-<name>-<hash>``, e.g. ``rayjob-<name>-<hash>``).
Clusters without the visibility API (or RBAC for it) answer 404/403: the job is then just "queued, waiting for
admission".
The API has no watch, so a follower looks again every few seconds, and only while the job waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSIONS = ("v1beta1", "v1beta2")
POLL_SECONDS = 5.0


def is_workload_of(item: dict[str, Any], job_name: str, owner_kind: str = "TrainJob") -> bool:
    """Whether a pending Workload belongs to the ``owner_kind`` (TrainJob, RayJob) ``job_name``."""
    meta = item.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == owner_kind and ref.get("name") == job_name:
            return True
    return str(meta.get("name", "")).startswith(f"{owner_kind.lower()}-{job_name}-")


def pending_position(
    api_client: Any, namespace: str, queue: str, job_name: str, owner_kind: str = "TrainJob"
) -> int | None:
    """The job's place in its LocalQueue, 1 = next; None when the API does not answer or lists it not."""
    for version in VISIBILITY_VERSIONS:
        path = f"/apis/{VISIBILITY_GROUP}/{version}/namespaces/{namespace}/localqueues/{queue}/pendingworkloads"
        try:
            data = api_client.call_api(
                path,
                "GET",
                response_type="object",
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=10,
            )
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                continue  # this version is not served (or no visibility API at all)
            return None  # forbidden, unavailable, unreachable: advisory only
        for item in (data or {}).get("items") or []:
            if is_workload_of(item, job_name, owner_kind):
                return int(item.get("positionInLocalQueue") or 0) + 1
        return None
    return None


@dataclass(frozen=True)
class QueuePosition:
    """A follow's inbox item: the job's place in its Kueue LocalQueue changed (1 = next)."""

    position: int


class QueuePoller:
    """While ``waiting()`` holds, report the job's queue position to ``sink`` as :class:`QueuePosition`
    whenever it changes (a thread; same start/stop shape as the resource watchers)."""

    def __init__(
        self,
        fetch: Callable[[], int | None],
        waiting: Callable[[], bool],
        sink: Callable[[QueuePosition], None],
        stop: threading.Event,
        interval: float = POLL_SECONDS,
    ) -> None:
        self.fetch, self.waiting, self.sink, self.stop_event = fetch, waiting, sink, stop
        self.interval = interval
        self.thread = threading.Thread(target=self.run, name="kueue-position", daemon=True)

    def run(self) -> None:
        last: int | None = None
        while not self.stop_event.is_set():
            if self.waiting():
                position = self.fetch()
                if position is not None and position != last:
                    self.sink(QueuePosition(position))
                last = position
            self.stop_event.wait(self.interval)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
