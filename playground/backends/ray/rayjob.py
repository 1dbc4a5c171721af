"""The KubeRay ``RayJob`` of a blueprint: how it is built (``--dry-run`` renders exactly what ``submit`` creates;
how one is read back as the common :class:`~playground.types.Job`: :mod:`.rayjob_status`).

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
from dataclasses import dataclass
from typing import Any

from playground.backends.common import cpu_cores
from playground.blueprints import Blueprint
from playground.cluster import manifests as m
from playground.cluster.datafiles import DATA_MOUNT, DATA_VOLUME, DataPlacement, place
from playground.cluster.trainer import playground_trainer
from playground.errors import UserError, shown
from playground.types import RunRequest

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

# A token of the entrypoint goes through two shells (the submitter's bash, then Ray's job supervisor, which
# re-joins the arguments Windows-style and runs them with /bin/sh): only characters neither shell touches.
_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_./:=@%+,-]+$")
SAFE_FORM = "letters, digits and . _ / : = @ % + , - (no spaces, quotes or other shell characters)"


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
    name: str, blueprint: Blueprint, request: RunRequest, opts: m.ClusterOptions
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
        m.ANN_PARAMS: json.dumps(request.params.as_dict(), sort_keys=True),
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


def plan_rayjob(blueprint: Blueprint, request: RunRequest, opts: m.ClusterOptions, name: str) -> RayJobPlan:
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
    trainer = playground_trainer(name, blueprint, request, opts, False, placement)
    args = list(trainer.args)
    # The run request travels in the pods' environment, past the shells; the sources are still held to the shell-safe
    # form they needed as arguments (behaviour unchanged: a RayJob refuses the same sources as before).
    sources = [("--model-source", request.overrides.model), ("--dataset-source", request.overrides.dataset)]
    check_tokens([*args, *(token for flag, value in sources if value for token in (flag, value))])
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
