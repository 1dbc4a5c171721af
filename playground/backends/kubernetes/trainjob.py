"""The TrainJob of a blueprint, assembled from the Trainer's own API models (``kubeflow_trainer_api``, the typed
form of the TrainJob CRD), so ``--dry-run`` renders exactly what ``submit`` creates and nothing here contacts a
cluster or relies on the SDK backend's private helpers: the plan (runtime, initializers, trainer, metadata) and the
object. The one SDK helper used is the TorchTune argument mapping for the opt-in ``builtin-torchtune`` variant (hence
``kubeflow<0.6``). What every playground object on a cluster shares (names, labels, options): :mod:`.manifests`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from playground.blueprints import Blueprint
from playground.cluster import sdk
from playground.cluster.datafiles import place, runtime_patch
from playground.cluster.manifests import (
    ANN_BASE,
    ANN_OUTPUT,
    ANN_PARAMS,
    ANN_TRAINER,
    ANN_TTL,
    GROUP,
    INITIALIZER_URI,
    LABEL_BLUEPRINT,
    LABEL_MANAGED,
    LABEL_PREFIX,
    MANAGED_BY,
    PLAYGROUND,
    QUEUE_LABEL,
    VERSION,
    ClusterOptions,
    base_model_uri,
    label_value,
    local_data_files,
    output_uri,
    owner_metadata,
    runtime_name,
    secret_env,
    uses_initializers,
)
from playground.cluster.trainer import playground_trainer, trainer_resources
from playground.errors import UserError, shown
from playground.types import RunRequest


@dataclass
class TrainJobPlan:
    """Everything a TrainJob is made of (API models), before it is assembled."""

    name: str
    namespace: str
    kind: str  # trainer kind: playground or builtin-torchtune
    runtime: str
    labels: dict[str, str]
    annotations: dict[str, str]
    trainer: Any  # kubeflow_trainer_api.models.TrainerV1alpha1Trainer
    initializer: Any = None  # kubeflow_trainer_api.models.TrainerV1alpha1Initializer
    active_deadline_seconds: int | None = None
    runtime_patches: list[Any] = field(default_factory=list)  # TrainerV1alpha1RuntimePatch (your data's PVC)


def _initializer_source(kind: str, override: str | None, default: str, blueprint: Blueprint) -> str:
    source = override or default
    if not INITIALIZER_URI.match(source):
        raise UserError(
            f"{kind} source {shown(source, 80)}: blueprint {blueprint.id!r} downloads its {kind} with Kubeflow's "
            f"{kind} initializer on Kubernetes; allowed: hf://ORG/NAME or s3://BUCKET/PATH",
            field=kind,
        )
    return source


def _torchtune_trainer(blueprint: Blueprint, request: RunRequest, initializer: Any):
    """The opt-in upstream TorchTune trainer: the SDK's TorchTune argument mapping, plus the params
    (max steps, learning rate...) that ``TorchTuneConfig`` has no field for."""
    from kubeflow.trainer.constants import constants
    from kubeflow.trainer.types import types
    from kubeflow_trainer_api import models

    params, method = request.params.as_dict(), blueprint.method
    peft = None
    if method.kind == "lora":
        peft = types.LoraConfig(
            lora_rank=int(params.get("lora_rank", method.rank)),
            lora_alpha=int(params.get("lora_alpha", method.alpha)),
            lora_dropout=float(params.get("lora_dropout", method.dropout)),
            lora_attn_modules=list(method.target_modules),
        )
    config = types.TorchTuneConfig(
        dtype=types.DataType.FP32 if blueprint.model.dtype == "float32" else types.DataType.BF16,
        batch_size=int(params["batch_size"]) if "batch_size" in params else None,
        epochs=1,
        num_nodes=blueprint.resources.nodes,
        peft_config=peft,
        dataset_preprocess_config=types.TorchTuneInstructDataset(
            source=types.DataFormat.PARQUET,
            split=blueprint.dataset.split,
            column_map={"input": "instruction", "output": "output"},
        ),
    )
    sdk_initializer = types.Initializer(
        dataset=types.HuggingFaceDatasetInitializer(storage_uri=initializer.dataset.storage_uri),
        model=types.HuggingFaceModelInitializer(storage_uri=initializer.model.storage_uri),
    )
    tune_keys = {
        "max_steps": "max_steps_per_epoch",
        "learning_rate": "optimizer.lr",
        "seed": "seed",
        "max_seq_length": "tokenizer.max_seq_len",
        "log_every": "log_every_n_steps",
        "gradient_accumulation_steps": "gradient_accumulation_steps",
    }
    args = sdk.torchtune_args(config, sdk_initializer)
    args += [f"{tune_keys[k]}={params[k]}" for k in sorted(params) if k in tune_keys]
    return models.TrainerV1alpha1Trainer(
        command=list(constants.TORCH_TUNE_COMMAND),
        args=args,
        numNodes=blueprint.resources.nodes,
        resourcesPerNode=trainer_resources(blueprint),
    )


def plan_trainjob(blueprint: Blueprint, request: RunRequest, opts: ClusterOptions, name: str) -> TrainJobPlan:
    """Map a blueprint + validated params onto a TrainJob: runtime, initializers, trainer, metadata."""
    from kubeflow_trainer_api import models

    kind = opts.trainer
    runtime = runtime_name(blueprint, kind)
    initializers = uses_initializers(blueprint, kind)
    labels = {
        LABEL_BLUEPRINT: label_value(blueprint.id),
        LABEL_MANAGED: MANAGED_BY,
        **{LABEL_PREFIX + label_value(k): label_value(v) for k, v in request.labels.items()},
        **opts.extra_labels,
    }
    if opts.queue:
        labels[QUEUE_LABEL] = opts.queue
    owner_labels, owner_annotations = owner_metadata(request.owner)
    labels.update(owner_labels)
    annotations = {
        ANN_PARAMS: json.dumps(request.params.as_dict(), sort_keys=True),
        ANN_OUTPUT: output_uri(name, blueprint, kind),
        ANN_BASE: base_model_uri(name, blueprint, request.overrides.model, kind),
        ANN_TRAINER: kind,
        **owner_annotations,
    }
    if opts.ttl_seconds_after_finished is not None:
        annotations[ANN_TTL] = str(opts.ttl_seconds_after_finished)
    initializer = None
    files = local_data_files(blueprint, request)
    placement = place(files, list(opts.data_claims)) if files and kind == PLAYGROUND else None
    if initializers:
        model_uri = _initializer_source("model", request.overrides.model, blueprint.model.source, blueprint)
        # Your file comes from the PVC; the dataset initializer still fetches the blueprint's own (the runtime's
        # dataset-initializer step runs either way), which the trainer then does not read.
        dataset_default = blueprint.dataset.source
        dataset_uri = _initializer_source(
            "dataset", None if placement is not None else request.overrides.dataset, dataset_default, blueprint
        )
        token = "ACCESS_TOKEN"  # what Kubeflow's initializers read; from the Secret, never inline
        initializer = models.TrainerV1alpha1Initializer(
            model=models.TrainerV1alpha1ModelInitializer(
                storageUri=model_uri, env=[secret_env(token, opts, optional=not blueprint.model.gated)]
            ),
            dataset=models.TrainerV1alpha1DatasetInitializer(
                storageUri=dataset_uri, env=[secret_env(token, opts, optional=True)]
            ),
        )
    if kind == PLAYGROUND:
        trainer = playground_trainer(name, blueprint, request, opts, initializers, placement)
    else:
        trainer = _torchtune_trainer(blueprint, request, initializer)
    return TrainJobPlan(
        name=name,
        namespace=opts.namespace,
        kind=kind,
        runtime=runtime,
        labels=labels,
        annotations=annotations,
        trainer=trainer,
        initializer=initializer,
        active_deadline_seconds=blueprint.kubernetes.active_deadline_seconds,
        runtime_patches=[runtime_patch(placement)] if placement is not None else [],
    )


def build_trainjob(plan: TrainJobPlan) -> dict[str, Any]:
    """The TrainJob object (what ``submit`` creates and ``--dry-run`` prints)."""
    from kubeflow_trainer_api import models

    job = models.TrainerV1alpha1TrainJob(
        apiVersion=f"{GROUP}/{VERSION}",
        kind="TrainJob",
        metadata=models.IoK8sApimachineryPkgApisMetaV1ObjectMeta(
            name=plan.name, namespace=plan.namespace, labels=plan.labels, annotations=plan.annotations
        ),
        spec=models.TrainerV1alpha1TrainJobSpec(
            runtimeRef=models.TrainerV1alpha1RuntimeRef(name=plan.runtime, kind="ClusterTrainingRuntime"),
            initializer=plan.initializer,
            trainer=plan.trainer,
            activeDeadlineSeconds=plan.active_deadline_seconds,
            runtimePatches=plan.runtime_patches or None,
        ),
    )
    return _clean(job.to_dict())


def _clean(data: Any) -> Any:
    """Drop empty lists/dicts the API models leave behind (e.g. ``env: []``)."""
    if isinstance(data, dict):
        out = {k: _clean(v) for k, v in data.items()}
        return {k: v for k, v in out.items() if v not in ({}, [], None)}
    if isinstance(data, list):
        return [_clean(v) for v in data]
    return data
