"""Map a TrainJob, its step pods and Kubernetes Events onto JobPhase and the typed event stream (the pod rules every
job on a cluster shares: :mod:`playground.cluster.pods`).

Pure functions over plain dicts (what the API returns), so the stream and ``get`` agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from playground.cluster import manifests as m
from playground.cluster.pods import RANK, JobState, conditions, failure, finished, pod_problem, started, step_name
from playground.events import ClusterEvent, Event, JobPhase, Log, Metric, Phase, Progress, parse_line


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
