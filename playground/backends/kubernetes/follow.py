"""Following one TrainJob: its step pods' logs (:class:`LogSource`), the story so far (:func:`history`) and the live
follow (:class:`JobFollow`, the one every job on a cluster shares: :class:`playground.cluster.follow.Follow`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from playground.backends.kubernetes.status import StreamState
from playground.cluster.follow import Follow, final_phase
from playground.cluster.pods import container_name, started, step_name
from playground.cluster.watch import LogEnded, LogFollower, LogLine, WatchItem, WatchStats
from playground.events import Event


@dataclass
class LogSource:
    """Where pod logs are read from (the kubernetes CoreV1Api and the job's namespace)."""

    core: Any
    namespace: str
    stats: WatchStats

    def follower(self, pod: dict[str, Any], sink: Callable[[WatchItem], None], stop: threading.Event, **kw: Any):
        return LogFollower(
            self.core,
            self.namespace,
            pod["metadata"]["name"],
            container_name(pod),
            step_name(pod),
            sink,
            stop,
            stats=self.stats,
            **kw,
        )

    def read(self, pod: dict[str, Any]) -> tuple[list[str], BaseException | None]:
        """A finished or running pod's log so far (no follow): its lines and the error that cut it short."""
        items: list[WatchItem] = []
        self.follower(pod, items.append, threading.Event(), follow=False).run()
        lines = [i.line for i in items if isinstance(i, LogLine)]
        error = next((i.error for i in items if isinstance(i, LogEnded)), None)
        return lines, error


def history(
    state: StreamState, job: dict[str, Any], pods: list[dict[str, Any]], events: list[dict[str, Any]], logs: LogSource
) -> Iterator[Event]:
    """The whole story of a job as it stands (no follow): pods, Events, each step's log, the TrainJob."""
    state.job = job
    for pod in pods:
        yield from state.on_pod("ADDED", pod)
    for ev in events:
        yield from state.on_event(ev)
    for pod in sorted(pods, key=step_name):
        if not started(pod):
            continue
        lines, error = logs.read(pod)
        for line in lines:
            yield from state.on_log(step_name(pod), line)
        if error is not None:
            yield from state.on_log_lost(step_name(pod))
    yield from state.on_job("MODIFIED", job)  # after the logs: they are the finer source
    end = final_phase(state)
    if end is not None:
        yield end


@dataclass(kw_only=True)
class JobFollow(Follow):
    """A live follow of one TrainJob: every step pod's log, read through ``logs``."""

    kind: ClassVar[str] = "trainjob"
    noun: ClassVar[str] = "TrainJob"

    logs: LogSource

    def log_follower(self, pod: dict[str, Any], sink: Callable[[WatchItem], None], stop: threading.Event, **kw: Any):
        return self.logs.follower(pod, sink, stop, **kw)
