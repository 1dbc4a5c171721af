"""Map a TrainJob, its step pods and Kubernetes Events onto JobPhase and the typed event stream.

Pure functions over plain dicts (what the API returns), so the stream and ``get`` agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from playground.backends.kubernetes import manifests as m
from playground.events import ClusterEvent, Event, JobPhase, Log, Metric, Phase, Progress, parse_line

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


def cluster_phase(job: dict[str, Any], pods: list[dict[str, Any]], *, refine: bool = False) -> tuple[JobPhase, str]:
    """The phase the cluster reports. ``refine``: the trainer's own log lines drive Training/Saving."""
    meta = job.get("metadata") or {}
    ann = meta.get("annotations") or {}
    if ann.get(m.ANN_CANCELLED):
        return JobPhase.CANCELLED, "cancelled by the user"
    conds = conditions(job)
    if conds.get("Failed", {}).get("status") == "True":
        failed = [f for f in (failure(p) for p in sorted(pods, key=step_name)) if f]
        c = conds["Failed"]
        detail = c.get("message") or c.get("reason") or "Failed"
        return JobPhase.FAILED, f"{failed[0]}: {detail}" if failed else f"{c.get('reason') or 'Failed'}: {detail}"
    if conds.get("Complete", {}).get("status") == "True":
        return JobPhase.SUCCEEDED, conds["Complete"].get("message") or "TrainJob completed"
    spec = job.get("spec") or {}
    queue = (meta.get("labels") or {}).get(m.QUEUE_LABEL)
    if spec.get("suspend") or conds.get("Suspended", {}).get("status") == "True":
        if queue:
            return JobPhase.PENDING, f"queued in Kueue queue {queue!r}: waiting for admission"
        return JobPhase.PENDING, conds.get("Suspended", {}).get("message") or "suspended"
    nodes = [p for p in pods if step_name(p).startswith("node-")]
    inits = [p for p in pods if not step_name(p).startswith("node-")]
    if any(started(p) for p in nodes):
        trainer = ann.get(m.ANN_TRAINER, "playground")
        if refine and trainer == "playground":
            return JobPhase.INITIALIZING, "node-0 running: the trainer is loading"
        return JobPhase.TRAINING, "node-0 running"
    running_inits = [step_name(p) for p in inits if started(p) and not finished(p)]
    if running_inits:
        return JobPhase.INITIALIZING, f"{', '.join(sorted(running_inits))} running"
    if inits and all(finished(p) for p in inits) and not nodes:
        return JobPhase.INITIALIZING, "initializers done, starting the trainer"
    for pod in pods:
        problem = pod_problem(pod)
        if problem:
            return JobPhase.PENDING, f"{step_name(pod)}: {problem[0]}: {problem[1]}".rstrip(": ")
    if pods:
        return JobPhase.PENDING, "pods are starting"
    return JobPhase.PENDING, "waiting for the TrainJob's pods"


def trainer_progress(job: dict[str, Any]) -> tuple[Progress | None, dict[str, float]]:
    """``status.trainerStatus`` as a Progress point and its numeric metrics.

    The playground trainer reports ``step``/``total_steps`` among its metrics, so the point has the
    same step as its log line; another trainer's bare percentage becomes ``step=percent`` of 100.
    """
    ts = (job.get("status") or {}).get("trainerStatus") or {}
    metrics: dict[str, float] = {}
    for item in ts.get("metrics") or []:
        try:
            metrics[str(item["name"])] = float(item["value"])
        except (KeyError, TypeError, ValueError):
            continue
    if "progressPercentage" not in ts:
        return None, metrics
    eta = ts.get("estimatedRemainingSeconds")
    step, total = int(ts["progressPercentage"]), 100
    if metrics.get("total_steps", 0) > 0 and "step" in metrics:
        step, total = int(metrics["step"]), int(metrics["total_steps"])
    progress = Progress(
        step=step,
        total_steps=total,
        loss=metrics.get("loss", metrics.get("train_loss")),
        learning_rate=metrics.get("learning_rate"),
        tokens_per_second=metrics.get("tokens_per_second"),
        eta_seconds=float(eta) if eta is not None else None,
    )
    return progress, metrics


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
    """What a follow of one job on a cluster keeps (a TrainJob's: :class:`StreamState`; a RayJob's: the kuberay
    backend's), and the rules they share: a cluster change or a pod's problem is said once, progress only moves
    forward, a metric is said when its value changes, and a failed job's reason carries the trainer's own."""

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


@dataclass
class StreamState(JobState):
    """Turns raw cluster changes into typed events, each once, in a sensible order.

    Progress has two sources: node-0's ``@@playground`` log lines (every logged step, with learning
    rate, tokens/s, MFU...) and ``status.trainerStatus`` (a throttled summary the trainer posts to
    the Trainer controller). The rule that merges them without duplicates:

    * a point is emitted only if it is further along (``step/total_steps``) than the last one emitted,
      whichever source it comes from, so a step never appears twice and progress never goes back;
    * for the playground trainer the log lines are the source while node-0's log can be read;
      ``trainerStatus`` takes over only when that log is lost (``pods/log`` forbidden, the stream
      failed, the pod is gone), continuing from the last step the log gave;
    * for other trainers (``builtin-torchtune`` prints no ``@@playground`` lines) ``trainerStatus``
      is the only source.
    """

    tails: dict[str, list[str]] = field(default_factory=dict)

    @property
    def refine(self) -> bool:
        """The playground trainer: its own log lines drive Training/Saving and progress."""
        ann = ((self.job or {}).get("metadata") or {}).get("annotations") or {}
        return ann.get(m.ANN_TRAINER, "playground") == "playground"

    def job_phase(self, *, refine: bool = False) -> tuple[JobPhase, str]:
        return cluster_phase(self.job or {}, list(self.pods.values()), refine=refine)

    def _phase(self, phase: JobPhase, reason: str) -> list[Event]:
        if phase.terminal or RANK[phase] <= self.rank:
            return []
        self.rank, self.phase = RANK[phase], phase
        return [Phase(phase, reason)]

    def _progressed(self) -> list[Event]:
        """Phases the pods show the job went through (a step that already ran), oldest first."""
        out: list[Event] = []
        pods = list(self.pods.values())
        inits = sorted(step_name(p) for p in pods if not step_name(p).startswith("node-") and started(p))
        nodes = [p for p in pods if step_name(p).startswith("node-") and started(p)]
        if inits:
            out += self._phase(JobPhase.INITIALIZING, f"{', '.join(inits)} ran")
        if nodes:
            if self.refine:
                out += self._phase(JobPhase.INITIALIZING, "node-0 running: the trainer is loading")
            else:
                out += self._phase(JobPhase.TRAINING, "node-0 running")
        return out

    def on_job(self, etype: str, obj: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        if etype == "DELETED":
            self.job = None
            return out
        self.job = obj
        for ctype, cond in conditions(obj).items():
            key = ("cond", ctype, cond.get("status"), cond.get("reason"), cond.get("message"))
            if ctype in ("Suspended", "Created") or cond.get("status") == "True":
                text = cond.get("message") or ""
                out += self._once(key, ClusterEvent("TrainJob", cond.get("reason") or ctype, text))
        phase, reason = self.job_phase(refine=self.refine)
        if not phase.terminal and RANK[phase] > 0:
            out += self._progressed()
        out += self._phase(phase, reason)
        progress, metrics = trainer_progress(obj)
        if progress is not None and (self.logs_lost or not self.refine):
            out += self._progress(progress, "training (trainerStatus)")
        for name, value in metrics.items():
            if name.startswith("eval"):
                out += self._metric(Metric(name, value))
        return out

    def on_pod(self, etype: str, pod: dict[str, Any]) -> list[Event]:
        out = self._pod_changed(etype, pod)
        if etype != "DELETED" and self.job is not None:
            out += self._progressed()
            out += self._phase(*self.job_phase(refine=self.refine))
        return out

    def on_log(self, source: str, line: str) -> list[Event]:
        tail = self.tails.setdefault(source, [])
        tail.append(line)
        del tail[:-50]
        if not source.startswith("node-0"):
            return [Log(source, line)]
        event = parse_line(line, source=source)
        if isinstance(event, Phase):
            if event.phase == JobPhase.FAILED:
                self.trainer_failure = event.reason
            if event.phase.terminal:
                return []
            return self._phase(event.phase, event.reason)
        if isinstance(event, Progress):
            return self._progress(event, "training")
        if isinstance(event, Metric):
            return self._metric(event)
        return [event]

    def on_log_lost(self, source: str) -> list[Event]:
        """node-0's log cannot be read (any more): from now on trainerStatus drives progress."""
        if not source.startswith("node-0") or self.logs_lost:
            return []
        self.logs_lost = True
        return self.on_job("MODIFIED", self.job) if self.job is not None else []

    def failing_tail(self, n: int = 20) -> list[str]:
        """Last log lines of the failing step (or of node-0)."""
        for pod in sorted(self.pods.values(), key=step_name):
            if failure(pod):
                return self.tails.get(step_name(pod), [])[-n:]
        return self.tails.get("node-0", [])[-n:]
