"""Following one job on a cluster (a TrainJob in the kubernetes backend, a RayJob in the kuberay backend): its
watchers and pod-log followers feed one inbox of typed items, and one flat dispatch turns each item into events (the
job's state, a :class:`~playground.cluster.pods.JobState`, decides what is new).

The follow ends when the job is terminal, every watcher has delivered its first list, and the
followed logs are drained (or ``drain_timeout`` passed since the job ended).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from playground.cluster.pods import finished, started
from playground.cluster.queue import QueuePoller, QueuePosition
from playground.cluster.watch import (
    LogEnded,
    LogFollower,
    LogLine,
    ObjectChanged,
    ResourceWatcher,
    Synced,
    WatchFailed,
    WatchItem,
)
from playground.events import EVENT_PREFIX, Event, JobPhase, Phase, Queued


def final_phase(state: Any) -> Phase | None:
    """The terminal Phase event (``state``: a JobState with ``failing_tail``), with the failing step's last plain log
    lines when it failed."""
    end = state.terminal()
    if end is None:
        return None
    phase, reason = end
    if phase == JobPhase.FAILED:
        tail = [line for line in state.failing_tail(10) if EVENT_PREFIX not in line][-3:]
        if tail:
            reason = f"{reason}; last log lines: {' | '.join(tail)}"
    return Phase(phase, reason)


@dataclass(kw_only=True)
class Follow:
    """A live follow of one job: watchers (the job object, its pods, Events) and one log follower per followed pod
    that started. Subclasses name the job object's watch ``kind`` and ``noun`` and say which pods' logs to follow."""

    kind: ClassVar[str]  # the job object's watch kind ("trainjob", "rayjob")
    noun: ClassVar[str]  # its Kubernetes kind, for the "was deleted" message

    state: Any  # StreamState-like: on_job/on_pod/on_event/on_log/on_log_lost, phase, pods, terminal()
    watchers: list[ResourceWatcher | QueuePoller]
    inbox: queue.Queue
    drain_timeout: float
    fail: Callable[[str, BaseException], BaseException]  # a watch that gave up -> the error to raise
    stop_logs: threading.Event = field(default_factory=threading.Event)
    followers: dict[str, LogFollower] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    synced: set[str] = field(default_factory=set)
    terminal_at: float | None = None

    def follows(self, pod: dict[str, Any]) -> bool:
        """Whether this pod's log is followed (once it started)."""
        return True

    def log_follower(self, pod: dict[str, Any], sink: Callable[[WatchItem], None], stop: threading.Event, **kw: Any):
        raise NotImplementedError

    def final(self) -> Phase | None:
        return final_phase(self.state)

    def events(self) -> Iterator[Event]:
        try:
            for watcher in self.watchers:
                watcher.start()
            while True:
                try:
                    item = self.inbox.get(timeout=0.5)
                except queue.Empty:
                    item = None
                if isinstance(item, ObjectChanged) and item.kind == self.kind and item.change == "DELETED":
                    yield Phase(JobPhase.CANCELLED, f"the {self.noun} was deleted")
                    return
                yield from self.dispatch(item)
                end = self.finished()
                if end is not None:
                    yield end
                    return
        finally:
            for watcher in self.watchers:
                watcher.stop()
            for follower in self.followers.values():
                follower.stop()

    def dispatch(self, item: WatchItem | QueuePosition | None) -> list[Event]:
        """One inbox item -> the events it means (flat: one case per item type)."""
        state = self.state
        match item:
            case ObjectChanged(kind=kind, change=change, obj=obj) if kind == self.kind:
                return state.on_job(change, obj)
            case ObjectChanged(kind="pod", change=change, obj=obj):
                out = state.on_pod(change, obj)
                self.follow_logs(obj)
                return out
            case ObjectChanged(obj=obj):
                return state.on_event(obj)
            case Synced(kind=kind):
                self.synced.add(kind)
            case LogLine(source=source, line=line):
                return state.on_log(source, line)
            case LogEnded(source=source, error=None):
                self.ended.add(source)
            case LogEnded(source=source):
                self.ended.add(source)
                return state.on_log_lost(source)
            case QueuePosition(position=position):  # Kueue's visibility API, while the job waits
                return [Queued(position)] if state.phase in (None, JobPhase.PENDING) else []
            case WatchFailed(kind="event"):
                pass  # Events are advisory: a missing permission must not stop the job view
            case WatchFailed(kind=kind, error=error):
                raise self.fail(kind, error)
        return []

    def follow_logs(self, pod: dict[str, Any]) -> None:
        if not self.follows(pod):
            return
        name = pod["metadata"]["name"]
        if name in self.followers or not started(pod):
            return
        follower = self.log_follower(
            pod,
            self.inbox.put,
            self.stop_logs,
            is_finished=lambda: finished(self.state.pods.get(name) or pod),
        )
        self.followers[name] = follower
        follower.start()

    def finished(self) -> Phase | None:
        """The terminal Phase once the job ended and its logs are drained (or the drain timed out)."""
        if self.terminal_at is None:
            if self.state.terminal() is None or not {self.kind, "pod"} <= self.synced:
                return None
            self.terminal_at = time.monotonic()
            for pod in self.state.pods.values():  # a pod that ran but was never followed (short-lived)
                self.follow_logs(pod)
        drained = all(f.source in self.ended for f in self.followers.values())
        if drained or time.monotonic() - self.terminal_at > self.drain_timeout:
            return self.final()
        return None
