"""Following one RayJob: :class:`RayJobState` turns its changes, its pods', the namespace's Events and the driver's
log into typed events, each once; :class:`RayJobFollow` is the live follow (the kubernetes backend's, with the
submitter pods' logs)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from playground.backends.ray import rayjob_status as rs
from playground.backends.ray.logs import clean_line, ray_event
from playground.cluster.follow import Follow
from playground.cluster.pods import RANK, JobState
from playground.cluster.watch import LogFollower, WatchItem
from playground.events import ClusterEvent, Event, JobPhase, Log, Metric, Phase, Progress


@dataclass
class RayJobState(JobState):
    """Turns raw cluster changes (the RayJob, its pods, Events, the driver's log) into typed events, each once.

    Phases only move forward, except that a still Pending job says so again when the reason changes (queued in
    Kueue → creating the Ray cluster → a pod Unschedulable…). The trainer's ``@@playground`` lines drive
    Initializing/Training/Saving and progress while the driver's log can be read; KubeRay's status says when it
    ends. A retried submitter pod prints the log again from the start: a line is emitted only the first time.
    """

    reason: str = ""
    lines: list[str] = field(default_factory=list)  # the driver's lines so far (a failure's tail)
    counts: dict[str, Counter] = field(default_factory=dict)  # per submitter pod: how often each line came
    most: Counter = field(default_factory=Counter)  # the most times a line came from one pod
    closed: set[str] = field(default_factory=set)  # submitter pods past their log's end (its repeated tail)

    def job_phase(self, *, refine: bool = False) -> tuple[JobPhase, str]:
        return rs.cluster_phase(self.job or {}, list(self.pods.values()), refine=refine)

    def _phase(self, phase: JobPhase, reason: str) -> list[Event]:
        rank = RANK[phase]
        if phase.terminal or rank < self.rank:
            return []
        if rank == self.rank and (phase != JobPhase.PENDING or reason == self.reason):
            return []
        self.rank, self.phase, self.reason = rank, phase, reason
        return [Phase(phase, reason)]

    def _cluster(self) -> list[Event]:
        if self.job is None:
            return []
        return self._phase(*self.job_phase(refine=not self.logs_lost))

    def on_job(self, etype: str, obj: dict[str, Any]) -> list[Event]:
        if etype == "DELETED":
            self.job = None
            return []
        self.job = obj
        status = rs.RayJobView.from_dict(obj).status
        out: list[Event] = []
        if status.job_deployment_status:  # KubeRay's state machine, one line per step
            ray = status.job_status or "not submitted"
            cluster = f", cluster {status.ray_cluster_name}" if status.ray_cluster_name else ""
            key = ("rayjob", status.job_deployment_status, status.job_status)
            out += self._once(key, ClusterEvent("RayJob", status.job_deployment_status, f"Ray job {ray}{cluster}"))
        return out + self._cluster()

    def on_pod(self, etype: str, pod: dict[str, Any]) -> list[Event]:
        if rs.pod_role(pod) is None:
            return []
        out = self._pod_changed(etype, pod)
        return out if etype == "DELETED" else out + self._cluster()

    def on_log(self, pod: str, line: str) -> list[Event]:
        text = clean_line(line)
        if pod in self.closed:
            return []
        if text.startswith(rs.EPILOGUE):  # `ray job logs` repeats the log's tail after a failure: the end
            self.closed.add(pod)
            return []
        if not text.strip():
            return []
        counts = self.counts.setdefault(pod, Counter())
        counts[text] += 1
        if counts[text] <= self.most[text]:
            return []  # a retried submitter replaying what an earlier one printed
        self.most[text] = counts[text]
        if rs.is_submitter_line(text):  # the submitter's own chatter: only the news, once
            return self._once(("submitter", text), Log("submitter", text)) if rs.is_submitter_news(text) else []
        self.lines.append(line)
        del self.lines[:-200]
        event = ray_event(line)
        if isinstance(event, Phase):
            if event.phase == JobPhase.FAILED:  # the first one is the cause; the driver's wraps it
                self.trainer_failure = self.trainer_failure or event.reason
            if event.phase.terminal:
                return []  # KubeRay's status is the verdict
            if event.phase == JobPhase.PENDING and self.rank > 0:  # the driver waits for the workers' resources
                return self._once(("waiting", event.reason), ClusterEvent("Ray", "WaitingForResources", event.reason))
            return self._phase(event.phase, event.reason)
        if isinstance(event, Progress):
            return self._progress(event)
        if isinstance(event, Metric):
            return self._metric(event)
        return [event]

    def on_log_lost(self, pod: str) -> list[Event]:
        """The driver's log cannot be read (any more): KubeRay's status alone moves the phase on."""
        if self.logs_lost:
            return []
        self.logs_lost = True
        return self._cluster()

    def final_phase(self) -> Phase | None:
        """The terminal Phase event, with the driver's last plain log lines when it failed."""
        end = self.terminal()
        if end is None:
            return None
        phase, reason = end
        if phase == JobPhase.FAILED:
            tail = rs.LogSummary.read(self.lines).plain[-3:]
            if tail:
                reason = f"{reason}; last log lines: {' | '.join(tail)}"
        return Phase(phase, reason)


@dataclass(kw_only=True)
class RayJobFollow(Follow):
    """A live follow of one RayJob: the log of each submitter pod that ran (the driver's), through ``follower``."""

    kind: ClassVar[str] = "rayjob"
    noun: ClassVar[str] = "RayJob"

    follower: Callable[..., LogFollower]  # (pod, sink, stop, **kw) -> a LogFollower of its submitter container

    def follows(self, pod: dict[str, Any]) -> bool:
        return rs.pod_role(pod) == "submitter"

    def log_follower(self, pod: dict[str, Any], sink: Callable[[WatchItem], None], stop: threading.Event, **kw: Any):
        return self.follower(pod, sink, stop, **kw)

    def final(self) -> Phase | None:
        return self.state.final_phase()
