"""A KubeRay ``RayJob`` read back as the common :class:`~playground.types.Job` (pure functions over what the API
returns; how one is built: :mod:`.rayjob`): its phase from KubeRay's status and its pods' problems, its pods' roles,
and what the driver's log (the submitter pod's) says.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from playground.backends.ray.rayjob import ANN_CANCELLED_AT, BACKEND, LABEL_RAY_ROLE
from playground.cluster import manifests as m
from playground.cluster.pods import pod_problem
from playground.errors import BackendError
from playground.events import EVENT_PREFIX, JobPhase
from playground.types import Job

ROLES = ("head", "worker", "submitter")
NODE_TYPE_LABEL = "ray.io/node-type"  # KubeRay's, on the RayCluster's pods
QUEUE_WAITING = "queued in Kueue queue {queue!r}: waiting for admission"

# Lines the submitter itself prints around the driver's log (`ray job submit --no-wait`, then `ray job logs
# --follow` and its verdict); "Status message:" starts a repeat of the log's tail and ends what is worth reading.
_SUBMITTER_LINE = re.compile(
    r"^(-+|Job submission server address: .*|Job '[^']*' (submitted successfully|succeeded|failed|was stopped)"
    r"|Next steps|Query the (logs|status) of the job:|Request the job to be stopped:|ray job (logs|status|stop) \S+"
    r"|Tailing logs until the job exits.*|Waiting for Ray Dashboard GCS to become healthy.*|Status for job .*)$"
)
_SUBMITTER_NEWS = re.compile(
    r"^(Job '[^']*' (submitted successfully|succeeded|failed|was stopped)|Waiting for Ray Dashboard GCS to become .*)$"
)
EPILOGUE = "Status message: "


# -- reading a RayJob (typed view of what the API returns) ----------------------------------------------------
class _View(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ObjectMetaView(_View):
    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: datetime | None = Field(None, alias="creationTimestamp")


class RayJobSpecView(_View):
    suspend: bool = False
    active_deadline_seconds: int | None = Field(None, alias="activeDeadlineSeconds")


class RayClusterStatusView(_View):
    state: str = ""
    desired_worker_replicas: int | None = Field(None, alias="desiredWorkerReplicas")
    ready_worker_replicas: int | None = Field(None, alias="readyWorkerReplicas")


class RayJobStatusView(_View):
    job_deployment_status: str = Field("", alias="jobDeploymentStatus")
    job_status: str = Field("", alias="jobStatus")
    reason: str = ""
    message: str = ""
    start_time: datetime | None = Field(None, alias="startTime")
    end_time: datetime | None = Field(None, alias="endTime")
    ray_cluster_name: str = Field("", alias="rayClusterName")
    job_id: str = Field("", alias="jobId")
    failed: int | None = None
    ray_cluster_status: RayClusterStatusView = Field(default_factory=RayClusterStatusView, alias="rayClusterStatus")


class RayJobView(_View):
    """The parts of a RayJob the backend reads (KubeRay ships no Python models for its CRDs)."""

    metadata: ObjectMetaView = Field(default_factory=ObjectMetaView)
    spec: RayJobSpecView = Field(default_factory=RayJobSpecView)
    status: RayJobStatusView = Field(default_factory=RayJobStatusView)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> RayJobView:
        """The RayJob as a view; a one-line BackendError for one it cannot read."""
        try:
            return cls.model_validate(obj)
        except ValidationError as exc:
            name = (obj.get("metadata") or {}).get("name", "?")
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise BackendError(f"RayJob {name!r} is not readable: {where}: {first['msg']}") from None


# -- reading one: phases, pods, the driver's log ------------------------------------------------------------------
def pod_role(pod: dict[str, Any]) -> str | None:
    """head, worker or submitter (None for a pod that is not one of the RayJob's)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    role = labels.get(LABEL_RAY_ROLE) or labels.get(NODE_TYPE_LABEL)
    return role if role in ROLES else None


def pod_name(pod: dict[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("name", "")


def submitters(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The submitter pods (a retried submitter Job has several), oldest first: the failed ones (the Job controller
    replaced them), then by creation time (which has only second precision)."""

    def order(pod: dict[str, Any]) -> tuple[bool, str, str]:
        failed = (pod.get("status") or {}).get("phase") == "Failed"
        return not failed, (pod.get("metadata") or {}).get("creationTimestamp") or "", pod_name(pod)

    return sorted((p for p in pods if pod_role(p) == "submitter"), key=order)


def pod_failure(pod: dict[str, Any]) -> str | None:
    """'worker rayjob-x-worker-abc failed (OOMKilled, exit code 137)' for a failed pod, else None."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        term = (status.get("state") or {}).get("terminated") or {}
        if term and term.get("exitCode", 0) != 0:
            reason = term.get("reason") or "Error"
            return f"{pod_role(pod)} {pod_name(pod)} failed ({reason}, exit code {term.get('exitCode')})"
    return None


def is_submitter_line(text: str) -> bool:
    """A line the submitter prints itself (``ray job submit``/``logs`` chatter), not the driver's."""
    return bool(_SUBMITTER_LINE.match(text.strip()))


def is_submitter_news(text: str) -> bool:
    """A submitter line worth showing: the Ray job submitted, its verdict, or the wait for the Ray dashboard."""
    return bool(_SUBMITTER_NEWS.match(text.strip()))


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def failed_reason(view: RayJobView) -> str:
    """One line for a Failed RayJob: KubeRay's reason and the first line of its message."""
    status = view.status
    reason = status.reason or status.job_deployment_status or "Failed"
    if reason == "DeadlineExceeded":
        limit = view.spec.active_deadline_seconds
        return f"deadline exceeded: the RayJob ran longer than its activeDeadlineSeconds ({limit} s)"
    message = _first_line(status.message).split(", last available logs", 1)[0].rstrip(":")
    return f"{reason}: {message}" if message else reason


def cluster_phase(obj: dict[str, Any], pods: list[dict[str, Any]], *, refine: bool = False) -> tuple[JobPhase, str]:
    """The phase KubeRay reports (``status.jobDeploymentStatus`` and ``status.jobStatus``), with the pods' problems
    while the cluster is created. ``refine``: the trainer's own log lines drive Training/Saving."""
    view = RayJobView.from_dict(obj)
    meta, status = view.metadata, view.status
    if meta.annotations.get(m.ANN_CANCELLED):
        return JobPhase.CANCELLED, "cancelled by the user"
    deployment, ray_status = status.job_deployment_status, status.job_status
    if deployment in ("Failed", "ValidationFailed"):
        return JobPhase.FAILED, failed_reason(view)
    if deployment == "Complete":
        if ray_status == "SUCCEEDED":
            return JobPhase.SUCCEEDED, f"RayJob completed: {_first_line(status.message) or 'the Ray job succeeded'}"
        if ray_status == "STOPPED":
            return JobPhase.CANCELLED, "the Ray job was stopped"
        return JobPhase.FAILED, failed_reason(view)
    queue = meta.labels.get(m.QUEUE_LABEL)
    if view.spec.suspend or deployment in ("Suspending", "Suspended"):
        if queue:
            return JobPhase.PENDING, QUEUE_WAITING.format(queue=queue)
        return JobPhase.PENDING, "suspended"
    ray_pods = [p for p in pods if pod_role(p)]
    if deployment in ("Running", "Waiting"):
        if ray_status == "RUNNING":
            if refine:
                return JobPhase.INITIALIZING, "the Ray job is running: the trainer is loading"
            return JobPhase.TRAINING, "the Ray job is running"
        if ray_status in ("SUCCEEDED", "FAILED", "STOPPED"):  # KubeRay ends it once the submitter is done
            return (JobPhase.INITIALIZING if refine else JobPhase.TRAINING), f"the Ray job ended ({ray_status})"
        return JobPhase.INITIALIZING, "the Ray job is submitted: its driver is starting"
    for pod in sorted(ray_pods, key=lambda p: ROLES.index(pod_role(p) or "head")):
        problem = pod_problem(pod)
        if problem:
            return JobPhase.PENDING, f"{pod_role(pod)} {pod_name(pod)}: {problem[0]}: {problem[1]}".rstrip(": ")
    if deployment == "Initializing":
        cluster = status.ray_cluster_name or "?"
        if status.ray_cluster_status.state == "ready":
            return JobPhase.PENDING, f"Ray cluster {cluster} is ready: submitting the Ray job"
        if ray_pods:
            return JobPhase.PENDING, f"creating Ray cluster {cluster}: its pods are starting"
        return JobPhase.PENDING, f"creating Ray cluster {cluster}"
    if deployment == "Retrying":
        return JobPhase.PENDING, f"retrying on a new Ray cluster (failed {status.failed or 0} time(s))"
    return JobPhase.PENDING, "waiting for KubeRay to start the RayJob"


def seconds(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _iso_seconds(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def blueprint_id(labels: dict[str, str]) -> str:
    return m.blueprint_id(labels)


def to_job(obj: dict[str, Any], pods: list[dict[str, Any]] | None, log: LogSummary | None = None) -> Job:
    """The Job a RayJob is: phase (with its pods), progress and metrics from the driver's log (``log``), the model
    directory once Succeeded, and the last log lines of a failed one."""
    import time

    view = RayJobView.from_dict(obj)
    meta, status = view.metadata, view.status
    phase, reason = cluster_phase(obj, pods or [])
    message = reason
    log = log or LogSummary()
    if phase == JobPhase.FAILED:
        if log.failure and log.failure not in message:
            message = f"{message}; trainer: {log.failure}"
        if log.plain:
            message = f"{message}; last log line: {log.plain[-1]}"
    ended = seconds(status.end_time) if phase.terminal else None
    if phase == JobPhase.CANCELLED and meta.annotations.get(ANN_CANCELLED_AT):
        ended = _iso_seconds(meta.annotations[ANN_CANCELLED_AT]) or ended
    ttl = meta.annotations.get(m.ANN_TTL)
    try:
        params = json.loads(meta.annotations.get(m.ANN_PARAMS, "{}"))
    except ValueError:
        params = {}
    return Job(
        id=meta.name,
        blueprint_id=blueprint_id(meta.labels),
        backend=BACKEND,
        phase=phase,
        params=params,
        created_at=seconds(meta.creation_timestamp) or time.time(),
        started_at=seconds(status.start_time),
        finished_at=ended,
        message=message,
        progress=log.progress,
        metrics=dict(log.metrics),
        model_dir=meta.annotations.get(m.ANN_OUTPUT) if phase == JobPhase.SUCCEEDED else None,
        base_model=meta.annotations.get(m.ANN_BASE),
        log_tail=list(log.tail) if phase == JobPhase.FAILED else [],
        labels={k[len(m.LABEL_PREFIX) :]: v for k, v in meta.labels.items() if k.startswith(m.LABEL_PREFIX)},
        owner=meta.annotations.get(m.ANN_OWNER),
        expires_at=ended + int(ttl) if ttl is not None and ended is not None else None,
    )


@dataclass
class LogSummary:
    """What the driver's log (the submitter pod's) says so far: last progress point, eval metrics, the trainer's
    failure, and its last lines (readable; the submitter's own chatter and its repeat of the tail left out)."""

    progress: Any = None  # Progress | None
    metrics: dict[str, float] = field(default_factory=dict)
    failure: str = ""
    tail: list[str] = field(default_factory=list)  # every kind of line, events described
    plain: list[str] = field(default_factory=list)  # the plain lines among them (no event)

    @classmethod
    def read(cls, lines: list[str], keep: int = 20) -> LogSummary:
        from playground.backends.ray.logs import clean_line, ray_event
        from playground.events import Metric, Phase, Progress
        from playground.formatting import describe_event

        summary = cls()
        readable: list[str] = []
        for line in lines:
            text = clean_line(line)
            if text.startswith(EPILOGUE):
                break
            if not text.strip() or is_submitter_line(text):
                continue
            event = ray_event(line)
            if isinstance(event, Progress):
                summary.progress = event
            elif isinstance(event, Metric) and event.name.startswith("eval"):
                summary.metrics[event.name] = event.value
            elif isinstance(event, Phase) and event.phase == JobPhase.FAILED:
                summary.failure = summary.failure or event.reason
            readable.append(describe_event(event) if EVENT_PREFIX in text else text)
            if EVENT_PREFIX not in text:
                summary.plain.append(text)
        summary.tail, summary.plain = readable[-keep:], summary.plain[-keep:]
        return summary
