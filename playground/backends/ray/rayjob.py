"""The KubeRay ``RayJob`` of a blueprint: how it is built (``--dry-run`` renders exactly what ``submit`` creates)
and how one is read back as the common :class:`~playground.types.Job` (pure functions over what the API returns).

One RayJob (``ray.io/v1``) per job, in K8sJobMode: KubeRay creates a RayCluster from ``spec.rayClusterSpec`` (a
head and one worker group sized from the blueprint's resources), then a submitter ``batch/v1`` Job named like the
RayJob whose pod runs ``ray job submit … -- <entrypoint>`` and then ``ray job logs --follow``: that pod's log is
the Ray job's driver log, which Ray Train fills with every worker's output. The entrypoint is the project's Ray
Train driver, ``python -m playground.train.on_ray``, with the same trainer arguments a TrainJob passes to
``python -m playground.train``. The workspace PVC (``workspace-<job>``, as for a TrainJob) is mounted on the head
and the workers: the model lands in ``/workspace/output/model``, which KServe serves as
``pvc://workspace-<job>/output/model``. Labels and annotations are the TrainJob's (blueprint, owner, queue, e2e run,
params, output and base model), so listing, owner filtering and serving work the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from playground.backends.kubernetes import manifests as m
from playground.backends.kubernetes.datafiles import DATA_MOUNT, DATA_VOLUME, DataPlacement, place
from playground.backends.kubernetes.status import pod_problem
from playground.blueprints import Blueprint
from playground.errors import BackendError, UserError, shown
from playground.events import EVENT_PREFIX, JobPhase
from playground.types import Job, TrainRequest

GROUP = "ray.io"
VERSION = "v1"
RAYJOB_PLURAL = "rayjobs"
RAYJOBS = "rayjobs.ray.io"
BACKEND = "kuberay"

RAY_VERSION = "2.55.1"  # the Ray in the trainer image (deploy/images/trainer.Dockerfile)
DEFAULT_IMAGE = "ghcr.io/blueprint-playground/trainer:0.1.0"  # the trainer image deploy/runtimes names
DRIVER_MODULE = "playground.train.on_ray"
RAY_STORAGE = m.WORKSPACE + "/ray"  # Ray Train's run storage, on the workspace every node mounts
CLUSTER_TTL_SECONDS = 30  # KubeRay deletes the finished job's RayCluster this long after it ends (GPUs freed)
HEAD_RESOURCES = {"cpu": "1", "memory": "4Gi"}  # GCS, dashboard and the driver (no training: num-cpus 0)
SUBMITTER_REQUESTS = {"cpu": "500m", "memory": "200Mi"}  # KubeRay's own defaults for the submitter
SUBMITTER_LIMITS = {"cpu": "1", "memory": "1Gi"}
HEAD_CONTAINER, WORKER_CONTAINER, SUBMITTER_CONTAINER = "ray-head", "ray-worker", "ray-job-submitter"
WORKER_GROUP = "trainer"
RAY_ENV = {
    "HF_HOME": m.WORKSPACE + "/.cache/huggingface",
    "PLAYGROUND_HOME": m.WORKSPACE + "/.playground",
    "RAY_DEDUP_LOGS": "0",  # every worker's event lines reach the driver's log, none folded as "repeated"
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0",  # the workers' prints stay plain lines in that log
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}

ANN_CANCELLED_AT = m.LABEL_PREFIX + "cancelled-at"  # when (a suspended RayJob has no endTime): its TTL runs from it
LABEL_RAY_ROLE = m.LABEL_PREFIX + "ray-role"  # head, worker or submitter: the pods a follower watches
ROLES = ("head", "worker", "submitter")
NODE_TYPE_LABEL = "ray.io/node-type"  # KubeRay's, on the RayCluster's pods
QUEUE_WAITING = "queued in Kueue queue {queue!r}: waiting for admission"

# A token of the entrypoint goes through two shells (the submitter's bash, then Ray's job supervisor, which
# re-joins the arguments Windows-style and runs them with /bin/sh): only characters neither shell touches.
_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_./:=@%+,-]+$")
SAFE_FORM = "letters, digits and . _ / : = @ % + , - (no spaces, quotes or other shell characters)"
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


# -- building one -----------------------------------------------------------------------------------------------
def cpu_cores(quantity: str | None) -> float | None:
    """A Kubernetes CPU quantity ("2", "500m") as cores; None when unset or unreadable."""
    if not quantity:
        return None
    try:
        return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    except ValueError:
        return None


@dataclass(frozen=True)
class Scaling:
    """Ray Train's worker group: one trainer worker per GPU (one per node on CPU), ``replicas`` worker pods."""

    replicas: int  # worker pods: one per node
    workers: int  # Ray Train workers in all: nodes x max(1, gpus_per_node)
    cpus_per_worker: float
    gpus_per_worker: int

    @classmethod
    def of(cls, blueprint: Blueprint) -> Scaling:
        res = blueprint.resources
        per_node = max(1, res.gpus_per_node)
        cpus = (cpu_cores(res.cpu) or 1.0) / per_node
        return cls(res.nodes, res.nodes * per_node, cpus, 1 if res.gpus_per_node else 0)


@dataclass
class RayJobPlan:
    """Everything a RayJob (and its workspace PVC) is made of, before it is assembled."""

    name: str
    namespace: str
    blueprint: Blueprint
    labels: dict[str, str]
    annotations: dict[str, str]
    image: str
    trainer_args: list[str]  # python -m playground.train's, as the TrainJob passes them; every token shell-safe
    scaling: Scaling
    env: list[dict[str, Any]]  # the trainer's env (the TrainJob's), plus Ray's settings
    queue: str | None = None
    placement: DataPlacement | None = None
    active_deadline_seconds: int | None = None

    @property
    def workspace_claim(self) -> str:
        return m.workspace_pvc(self.name, m.PLAYGROUND)

    @property
    def entrypoint(self) -> list[str]:
        """The Ray job's command: the Ray Train driver sized by ``scaling``, then the trainer's arguments."""
        scaling = self.scaling
        return [
            *("python", "-m", DRIVER_MODULE, "--workers", str(scaling.workers)),
            *("--cpus-per-worker", f"{scaling.cpus_per_worker:g}", "--gpus-per-worker", str(scaling.gpus_per_worker)),
            *("--storage", RAY_STORAGE, "--", *self.trainer_args),
        ]


def base_model_uri(name: str, blueprint: Blueprint, override: str | None = None) -> str:
    """The base model for side by side: the trainer's ``base-model/`` for scratch://, else the source itself (a
    RayJob has no initializers: the trainer downloads a hub model itself)."""
    source = override or blueprint.model.source
    if source.startswith("scratch://"):
        return f"pvc://{m.workspace_pvc(name, m.PLAYGROUND)}/output/base-model"
    return source


def metadata(
    name: str, blueprint: Blueprint, request: TrainRequest, opts: m.ClusterOptions
) -> tuple[dict[str, str], dict[str, str]]:
    """The TrainJob's labels and annotations, for a RayJob (blueprint, managed-by, request labels, e2e run, queue,
    owner; params, output and base model URIs, trainer, TTL)."""
    labels = {
        m.LABEL_BLUEPRINT: m.label_value(blueprint.id),
        m.LABEL_MANAGED: m.MANAGED_BY,
        **{m.LABEL_PREFIX + m.label_value(k): m.label_value(v) for k, v in request.labels.items()},
        **opts.extra_labels,
    }
    if opts.queue:
        labels[m.QUEUE_LABEL] = opts.queue
    owner_labels, owner_annotations = m.owner_metadata(request.owner)
    labels.update(owner_labels)
    annotations = {
        m.ANN_PARAMS: json.dumps(request.params, sort_keys=True),
        m.ANN_OUTPUT: m.output_uri(name, blueprint),
        m.ANN_BASE: base_model_uri(name, blueprint, request.overrides.model),
        m.ANN_TRAINER: m.PLAYGROUND,
        **owner_annotations,
    }
    if opts.ttl_seconds_after_finished is not None:
        annotations[m.ANN_TTL] = str(opts.ttl_seconds_after_finished)
    return labels, annotations


def _token_field(args: list[str], index: int) -> str:
    """The input a trainer argument came from, for an error message."""
    flag = args[index - 1] if index else ""
    if flag == "--set":
        return args[index].split("=", 1)[0]
    return {"--model-source": "model", "--dataset-source": "dataset"}.get(flag, "blueprint")


def check_tokens(args: list[str]) -> None:
    """Every trainer argument survives the RayJob's two shells unchanged, else a one-line error naming its input."""
    for index, token in enumerate(args):
        if not _SAFE_TOKEN.match(token):
            name = _token_field(args, index)
            raise UserError(
                f"{name} {shown(token)}: a RayJob's entrypoint passes through two shells (the submitter's bash, "
                f"then Ray's job supervisor); allowed: {SAFE_FORM}, or --backend kubernetes",
                field=name,
            )


def plan_rayjob(blueprint: Blueprint, request: TrainRequest, opts: m.ClusterOptions, name: str) -> RayJobPlan:
    """Map a blueprint + validated params onto a RayJob: the driver's entrypoint, scaling, pods, metadata."""
    from playground.runs import settings as rs

    if not m.shipped(blueprint):
        raise UserError(
            f"blueprint {blueprint.id!r} is not in the trainer image's catalog: the kuberay backend passes the "
            "blueprint by id (a RayJob's entrypoint cannot carry its YAML through two shells); allowed: a catalog "
            "blueprint, or --backend kubernetes for a blueprint of your own",
            field="blueprint",
        )
    files = m.local_data_files(blueprint, request)
    placement = place(files, list(opts.data_claims)) if files else None
    # The TrainJob's own trainer (args and env) without initializers: the trainer downloads hub sources itself.
    trainer = m.playground_trainer(name, blueprint, request, opts, False, placement)
    args = list(trainer.args)
    check_tokens(args)
    env = [e.to_dict() for e in trainer.env or []]
    for item in env:
        if item["name"] == rs.JOB_BACKEND_ENV:
            item["value"] = BACKEND
    env += [{"name": k, "value": v} for k, v in RAY_ENV.items()]
    labels, annotations = metadata(name, blueprint, request, opts)
    return RayJobPlan(
        name=name,
        namespace=opts.namespace,
        blueprint=blueprint,
        labels=labels,
        annotations=annotations,
        image=blueprint.kubernetes.image or opts.image or DEFAULT_IMAGE,
        trainer_args=args,
        scaling=Scaling.of(blueprint),
        env=env,
        queue=opts.queue,
        placement=placement,
        active_deadline_seconds=blueprint.kubernetes.active_deadline_seconds,
    )


def _volumes(plan: RayJobPlan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): the workspace PVC at /workspace, and your data's claim read-only where it has files."""
    volumes: list[dict[str, Any]] = [
        {"name": "workspace", "persistentVolumeClaim": {"claimName": plan.workspace_claim}}
    ]
    mounts: list[dict[str, Any]] = [{"name": "workspace", "mountPath": m.WORKSPACE}]
    if plan.placement is not None:
        claim = plan.placement.claim
        volumes.append({"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": claim.claim, "readOnly": True}})
        mount = {"name": DATA_VOLUME, "mountPath": DATA_MOUNT, "readOnly": True}
        if claim.sub_path:
            mount["subPath"] = claim.sub_path
        mounts.append(mount)
    return volumes, mounts


def _node_resources(blueprint: Blueprint) -> dict[str, Any]:
    """A worker pod's requests = limits: the blueprint's CPU, memory and ``nvidia.com/gpu`` per node."""
    res = blueprint.resources
    wanted = {"cpu": str(res.cpu or "1"), "memory": str(res.memory or "4Gi")}
    if res.gpus_per_node:
        wanted["nvidia.com/gpu"] = str(res.gpus_per_node)
    return {"requests": wanted, "limits": dict(wanted)}


_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
_POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000}


def _template(plan: RayJobPlan, role: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    labels = {m.LABEL_JOB: plan.name, LABEL_RAY_ROLE: role, m.LABEL_MANAGED: m.MANAGED_BY}
    return {
        "metadata": {"labels": labels},
        "spec": {"securityContext": dict(_POD_SECURITY), "containers": [container], **spec},
    }


def _ray_container(plan: RayJobPlan, name: str, resources: dict[str, Any], env: list[dict[str, Any]]) -> dict:
    _, mounts = _volumes(plan)
    return {
        "name": name,
        "image": plan.image,
        "env": env,
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": dict(_CONTAINER_SECURITY),
    }


def build_rayjob(plan: RayJobPlan) -> dict[str, Any]:
    """The RayJob object (what ``submit`` creates and ``--dry-run`` prints)."""
    volumes, _ = _volumes(plan)
    scaling = plan.scaling
    head_env = list(plan.env)
    gpus = plan.blueprint.resources.gpus_per_node
    if gpus:  # the driver checks the trainer's arguments on the head (no GPU) for the workers' nodes
        head_env.append({"name": "PLAYGROUND_GPU_COUNT", "value": str(gpus)})
    head = _ray_container(plan, HEAD_CONTAINER, {"requests": HEAD_RESOURCES, "limits": dict(HEAD_RESOURCES)}, head_env)
    head["ports"] = [
        {"containerPort": 6379, "name": "gcs-server"},
        {"containerPort": 8265, "name": "dashboard"},
        {"containerPort": 10001, "name": "client"},
    ]
    head_spec: dict[str, Any] = {"volumes": volumes}
    if scaling.replicas == 1:
        # A ReadWriteOnce workspace: the head joins the one worker's node (the worker is placed first, for its GPUs).
        term = {
            "labelSelector": {"matchLabels": {m.LABEL_JOB: plan.name, LABEL_RAY_ROLE: "worker"}},
            "topologyKey": "kubernetes.io/hostname",
        }
        head_spec["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    worker = _ray_container(plan, WORKER_CONTAINER, _node_resources(plan.blueprint), list(plan.env))
    submitter = {
        "name": SUBMITTER_CONTAINER,
        "image": plan.image,
        "resources": {"requests": SUBMITTER_REQUESTS, "limits": SUBMITTER_LIMITS},
        "securityContext": dict(_CONTAINER_SECURITY),
    }
    spec: dict[str, Any] = {
        "entrypoint": " ".join(plan.entrypoint),
        "submissionMode": "K8sJobMode",
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": CLUSTER_TTL_SECONDS,
        "rayClusterSpec": {
            "rayVersion": RAY_VERSION,
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},  # the head trains nothing: Ray Train's workers go to the workers
                "template": _template(plan, "head", head, **head_spec),
            },
            "workerGroupSpecs": [
                {
                    "groupName": WORKER_GROUP,
                    "replicas": scaling.replicas,
                    "minReplicas": scaling.replicas,
                    "maxReplicas": scaling.replicas,
                    "rayStartParams": {},
                    "template": _template(plan, "worker", worker, volumes=volumes),
                }
            ],
        },
        "submitterPodTemplate": _template(plan, "submitter", submitter, restartPolicy="Never"),
    }
    if plan.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = plan.active_deadline_seconds
    if plan.queue:
        spec["suspend"] = True  # Kueue admits it: it unsuspends the RayJob when the queue has room
    rayjob = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RayJob",
        "metadata": {
            "name": plan.name,
            "namespace": plan.namespace,
            "labels": plan.labels,
            "annotations": plan.annotations,
        },
        "spec": spec,
    }
    return json.loads(json.dumps(rayjob))  # plain data, nothing shared between the pod templates


def build_workspace_pvc(plan: RayJobPlan, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job's workspace (``workspace-<job>``): ReadWriteOnce on one node (the head joins the worker's node),
    ReadWriteMany across several. ``owner``: the created RayJob, so deleting it deletes the claim too."""
    access = "ReadWriteOnce" if plan.scaling.replicas == 1 else "ReadWriteMany"
    meta: dict[str, Any] = {
        "name": plan.workspace_claim,
        "namespace": plan.namespace,
        "labels": {
            m.LABEL_JOB: plan.name,
            m.LABEL_BLUEPRINT: plan.labels[m.LABEL_BLUEPRINT],
            m.LABEL_MANAGED: m.MANAGED_BY,
        },
    }
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta,
        "spec": {"accessModes": [access], "resources": {"requests": {"storage": plan.blueprint.kubernetes.storage}}},
    }


def owner_reference(rayjob: dict[str, Any]) -> dict[str, Any]:
    meta = rayjob["metadata"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RayJob", "name": meta["name"], "uid": meta["uid"]}


def to_yaml(plan: RayJobPlan) -> str:
    """The workspace PVC and the RayJob, as the YAML ``kubectl apply -f`` takes (``--dry-run``)."""
    import yaml

    docs = [build_workspace_pvc(plan), build_rayjob(plan)]
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)


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
    from playground.backends.kubernetes.mapping import blueprint_id as from_labels

    return from_labels(labels)


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
