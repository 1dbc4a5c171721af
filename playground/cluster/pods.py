"""A job's pods and Kubernetes Events as seen by every playground job on a cluster (a TrainJob's step pods, a
RayJob's Ray pods): their steps, states and problems, and :class:`JobState`, the rules every follow of one job shares.

Pure functions over plain dicts (what the API returns), so the stream and ``get`` agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from playground.cluster import manifests as m
from playground.events import ClusterEvent, Event, JobPhase, Metric, Progress

RANK = {
    JobPhase.PENDING: 0,
    JobPhase.INITIALIZING: 1,
    JobPhase.TRAINING: 2,
    JobPhase.EVALUATING: 3,
    JobPhase.SAVING: 4,
    JobPhase.SUCCEEDED: 5,
    JobPhase.FAILED: 5,
    JobPhase.CANCELLED: 5,
}
WAITING_PROBLEMS = {
    "ImagePullBackOff",
    "ErrImagePull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "InvalidImageName",
}


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in ((obj.get("status") or {}).get("conditions") or [])}


def is_true(obj: dict[str, Any], ctype: str) -> bool:
    return conditions(obj).get(ctype, {}).get("status") == "True"


def step_name(pod: dict[str, Any]) -> str:
    """dataset-initializer, model-initializer or node-N (the SDK's step names)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    rjob = labels.get(m.RJOB_LABEL) or labels.get(m.ANCESTOR_LABEL) or "node"
    if rjob in ("node", "launcher", "trainer"):
        return f"node-{labels.get(m.JOB_INDEX_LABEL, '0')}"
    return rjob


def container_name(pod: dict[str, Any]) -> str:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    step = step_name(pod)
    wanted = "node" if step.startswith("node-") else step
    names = [c.get("name") for c in containers]
    return wanted if wanted in names else (names[0] or wanted)


def container_state(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    name = container_name(pod)
    for st in statuses:
        if st.get("name") == name:
            return st.get("state") or {}
    return statuses[0].get("state") or {} if statuses else {}


def started(pod: dict[str, Any]) -> bool:
    """Its container has run (logs can be read)."""
    state = container_state(pod)
    return "running" in state or "terminated" in state


def finished(pod: dict[str, Any]) -> bool:
    return "terminated" in container_state(pod) or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def failure(pod: dict[str, Any]) -> str | None:
    """'node-0 failed (OOMKilled, exit code 137)' for a failed step, else None."""
    term = container_state(pod).get("terminated")
    phase = (pod.get("status") or {}).get("phase")
    if term and term.get("exitCode", 0) != 0:
        return f"{step_name(pod)} failed ({term.get('reason') or 'Error'}, exit code {term.get('exitCode')})"
    if phase == "Failed":
        reason = (pod.get("status") or {}).get("reason") or "Failed"
        return f"{step_name(pod)} failed ({reason})"
    return None


def pod_problem(pod: dict[str, Any]) -> tuple[str, str] | None:
    """Why a pod is not running: (reason, message) for Unschedulable, ImagePullBackOff..."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return cond.get("reason") or "Unschedulable", cond.get("message") or ""
    waiting = container_state(pod).get("waiting") or {}
    if waiting.get("reason") in WAITING_PROBLEMS:
        return waiting["reason"], waiting.get("message") or ""
    return None


def event_matches(event: dict[str, Any], job_name: str) -> bool:
    """A Kubernetes Event about this TrainJob, its JobSet/Jobs/Pods/PVC or its Kueue Workload."""
    inv = event.get("involvedObject") or event.get("regarding") or {}
    name = inv.get("name") or ""
    if name == job_name or name.startswith(job_name + "-"):
        return True
    if inv.get("kind") == "Workload" and job_name in name:
        return True
    return inv.get("kind") == "PersistentVolumeClaim" and name.endswith("-" + job_name)


@dataclass
class JobState:
    """What a follow of one job on a cluster keeps (a TrainJob's: the kubernetes backend's ``StreamState``; a
    RayJob's: the kuberay backend's), and the rules they share: a cluster change or a pod's problem is said once,
    progress only moves forward, a metric is said when its value changes, and a failed job's reason carries the
    trainer's own."""

    job_name: str
    job: dict[str, Any] | None = None
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    rank: int = -1
    phase: JobPhase | None = None
    seen: set[tuple[Any, ...]] = field(default_factory=set)
    metrics: dict[str, float] = field(default_factory=dict)
    latest: Progress | None = None  # the last point emitted
    logs_lost: bool = False  # the trainer's log could not be read to its end: the cluster's status takes over
    trainer_failure: str = ""

    def job_phase(self, *, refine: bool = False) -> tuple[JobPhase, str]:
        """The phase the job object and its pods show (``refine``: the trainer's log drives the finer phases)."""
        raise NotImplementedError

    def _phase(self, phase: JobPhase, reason: str) -> list[Event]:
        raise NotImplementedError

    def _progress(self, point: Progress, reason: str = "training") -> list[Event]:
        """Emit ``point`` if it is further along than the last point emitted (the dedupe rule)."""
        if self.latest is not None and point.fraction <= self.latest.fraction:
            return []
        self.latest = point
        return [*self._phase(JobPhase.TRAINING, reason), point]

    def _once(self, key: tuple[Any, ...], event: Event) -> list[Event]:
        if key in self.seen:
            return []
        self.seen.add(key)
        return [event]

    def _metric(self, event: Metric) -> list[Event]:
        if self.metrics.get(event.name) == event.value:
            return []
        self.metrics[event.name] = event.value
        return [event]

    def _pod_changed(self, etype: str, pod: dict[str, Any]) -> list[Event]:
        """Keep the pod (forget a deleted one) and say its problem (ImagePullBackOff, Unschedulable...) once."""
        name = (pod.get("metadata") or {}).get("name", "")
        if etype == "DELETED":
            self.pods.pop(name, None)
            return []
        self.pods[name] = pod
        problem = pod_problem(pod)
        if not problem:
            return []
        return self._once(("pod", name, *problem), ClusterEvent("Pod", problem[0], f"{name}: {problem[1]}"))

    def on_event(self, ev: dict[str, Any]) -> list[Event]:
        if not event_matches(ev, self.job_name):
            return []
        meta = ev.get("metadata") or {}
        inv = ev.get("involvedObject") or ev.get("regarding") or {}
        key = ("event", meta.get("uid") or meta.get("name"))
        kind = "Queue" if inv.get("kind") == "Workload" else inv.get("kind") or "Event"
        message = ev.get("message") or ev.get("note") or ""
        return self._once(key, ClusterEvent(kind, ev.get("reason") or "", f"{inv.get('name', '')}: {message}"))

    def terminal(self) -> tuple[JobPhase, str] | None:
        if self.job is None:
            return None
        phase, reason = self.job_phase()
        if not phase.terminal:
            return None
        if phase == JobPhase.FAILED and self.trainer_failure and self.trainer_failure not in reason:
            reason = f"{reason}; trainer: {self.trainer_failure}"
        return phase, reason
