"""The project's trainer as a cluster runs it (``python -m playground.train``, torchrun for several processes): its
command, arguments, environment and resources, shared by the TrainJob (``backends/kubernetes``) and the RayJob
(``backends/ray``), whose pods run the same trainer the same way. The run request travels in the container's
environment (``PLAYGROUND_RUN_REQUEST``), with the sources rewritten to where the pod sees them."""

from __future__ import annotations

import os

from playground.blueprints import Blueprint
from playground.cluster.datafiles import DataPlacement
from playground.cluster.manifests import (
    DATASET_DIR,
    MODEL_DIR,
    OUTPUT_DIR,
    ClusterOptions,
    output_uri,
    secret_env,
    trainer_blueprint_yaml,
)
from playground.run_request import REQUEST_ENV, RunRequest


def run_env(name: str, blueprint: Blueprint, request: RunRequest, opts: ClusterOptions) -> dict[str, str]:
    """What the trainer's MLflow run needs in the pod (playground/runs): the job, backend, owner and storage URI;
    the cluster's tracking server when ``MLFLOW_TRACKING_URI`` names one (http(s); any credentials in it are
    dropped: give them as MLFLOW_TRACKING_TOKEN/… from a Secret), with the namespace as the MLflow workspace
    (KEP-897). Without one, tracking is off in the pod (a SQLite file there would vanish with it)."""
    from playground.runs import settings as rs

    env = {rs.JOB_ID_ENV: name, rs.JOB_BACKEND_ENV: "kubernetes", rs.MODEL_URI_ENV: output_uri(name, blueprint)}
    if request.owner_id is not None:
        env[rs.JOB_OWNER_ENV] = request.owner_id
    uri = os.environ.get(rs.TRACKING_ENV, "")
    if rs.tracking_enabled() and uri.startswith(("http://", "https://")):
        env.update({rs.TRACKING_ENV: rs.safe_uri(uri), "MLFLOW_WORKSPACE": opts.namespace})
    else:
        env[rs.DISABLE_ENV] = "0"
    return env


def trainer_resources(blueprint: Blueprint):
    """Requests = limits per node: cpu, memory and ``nvidia.com/gpu``."""
    from kubeflow_trainer_api import models

    res = blueprint.resources
    wanted = {"cpu": res.cpu, "memory": res.memory, "nvidia.com/gpu": res.gpus_per_node or None}
    quantities = {k: models.IoK8sApimachineryPkgApiResourceQuantity(str(v)) for k, v in wanted.items() if v}
    if not quantities:
        return None
    return models.IoK8sApiCoreV1ResourceRequirements(requests=quantities, limits=dict(quantities))


def playground_trainer(
    name: str,
    blueprint: Blueprint,
    request: RunRequest,
    opts: ClusterOptions,
    initializers: bool,
    placement: DataPlacement | None = None,
):
    """``python -m playground.train`` (torchrun when there is more than one process), its run request in the pod's
    environment (``PLAYGROUND_RUN_REQUEST``: one JSON document, the sources as the pod sees them)."""
    from kubeflow_trainer_api import models

    res = blueprint.resources
    args = ["--output", OUTPUT_DIR]
    dataset_override = request.overrides.dataset
    if placement is not None and dataset_override:
        dataset_override = placement.paths.get(dataset_override, dataset_override)  # your file, on the PVC
    if initializers:  # the initializers downloaded both into the shared workspace (your file: read from the PVC)
        dataset_arg = dataset_override if placement is not None and request.overrides.dataset else DATASET_DIR
        sources = {"model": MODEL_DIR, "dataset": dataset_arg}
    else:
        sources = {"model": request.overrides.model, "dataset": dataset_override}
    pod_request = request.for_trainer(
        blueprint_id=blueprint.id, blueprint_yaml=trainer_blueprint_yaml(blueprint, placement), overrides=sources
    )
    procs = max(1, res.gpus_per_node)
    distributed = res.nodes * procs > 1  # torchrun reads nnodes/nproc/rank/master from the PET_* env
    command = ["torchrun", "-m", "playground.train"] if distributed else ["python", "-m", "playground.train"]
    env = [models.IoK8sApiCoreV1EnvVar(name="PYTHONUNBUFFERED", value="1")]
    needs_hub = not initializers and any(
        (src or "").startswith("hf://")
        for src in (
            request.overrides.model or blueprint.model.source,
            request.overrides.dataset or blueprint.dataset.source,
        )
    )
    if needs_hub:  # the entrypoint downloads itself: the token from the Secret, never inline
        env.append(secret_env("HF_TOKEN", opts, optional=not blueprint.model.gated))
    env += [models.IoK8sApiCoreV1EnvVar(name=k, value=v) for k, v in run_env(name, blueprint, request, opts).items()]
    env.append(models.IoK8sApiCoreV1EnvVar(name=REQUEST_ENV, value=pod_request.to_json()))
    return models.TrainerV1alpha1Trainer(
        image=blueprint.kubernetes.image or opts.image or None,
        command=command,
        args=args,
        numNodes=res.nodes,
        numProcPerNode=procs,
        resourcesPerNode=trainer_resources(blueprint),
        env=env,
    )
