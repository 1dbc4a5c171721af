"""TrainJob and InferenceService manifests for a blueprint, built with the kubeflow SDK's models.

Nothing here contacts a cluster: ``--dry-run`` renders exactly what ``submit``/``serve`` create.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from playground.blueprints import Blueprint
from playground.booth import owner_key
from playground.types import TrainRequest

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
TRAINJOB_PLURAL = "trainjobs"
CTR_PLURAL = "clustertrainingruntimes"
KSERVE_GROUP = "serving.kserve.io"
KSERVE_VERSION = "v1beta1"
ISVC_PLURAL = "inferenceservices"

LABEL_PREFIX = "blueprint-playground.dev/"
LABEL_BLUEPRINT = LABEL_PREFIX + "blueprint"
LABEL_JOB = LABEL_PREFIX + "job"
LABEL_KIND = LABEL_PREFIX + "kind"
LABEL_OWNER = LABEL_PREFIX + "owner"  # booth mode: a label-safe digest of the visitor id (owner_key)
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGED_BY = "blueprint-playground"
ANN_PARAMS = LABEL_PREFIX + "params"
ANN_OUTPUT = LABEL_PREFIX + "output-uri"
ANN_BASE = LABEL_PREFIX + "base-model"
ANN_TRAINER = LABEL_PREFIX + "trainer"
ANN_CANCELLED = LABEL_PREFIX + "cancelled"
ANN_TTL = LABEL_PREFIX + "ttl-seconds-after-finished"
ANN_OWNER = LABEL_PREFIX + "owner"  # the visitor id itself (labels hold only its digest)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"

WORKSPACE = "/workspace"
OUTPUT_DIR = WORKSPACE + "/output"
# The PVC JobSet creates from a runtime's shared volumeClaimPolicies template: <claim>-<jobset name>.
WORKSPACE_CLAIM = {"playground": "workspace", "builtin-torchtune": "initializer"}

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class ClusterOptions:
    """Per-deployment settings (backend options, else env, else defaults)."""

    namespace: str = "default"
    queue: str | None = None  # Kueue LocalQueue name
    hf_token_secret: str = "hf-token"  # Secret holding the Hugging Face token under ``hf_token_key``
    hf_token_key: str = "token"
    image: str | None = None  # the playground trainer image (default: the runtime's)
    ttl_seconds_after_finished: int | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, **overrides: Any) -> ClusterOptions:
        env = os.environ
        values: dict[str, Any] = {
            "queue": env.get("PLAYGROUND_KUEUE_QUEUE") or None,
            "hf_token_secret": env.get("PLAYGROUND_HF_TOKEN_SECRET", "hf-token"),
            "hf_token_key": env.get("PLAYGROUND_HF_TOKEN_KEY", "token"),
            "image": env.get("PLAYGROUND_TRAINER_IMAGE") or None,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def owner_metadata(owner: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) marking an object as ``owner``'s; empty for an operator's object."""
    if owner is None:
        return {}, {}
    return {LABEL_OWNER: owner_key(owner)}, {ANN_OWNER: owner}


def owner_selector(owner: str | None) -> str:
    """The label selector term for ``owner``'s objects ("" for everyone's)."""
    return f",{LABEL_OWNER}={owner_key(owner)}" if owner is not None else ""


def label_value(text: str) -> str:
    """A valid label value (<=63 chars, alphanumeric ends)."""
    value = _LABEL_VALUE.sub("-", str(text))[:63]
    return value.strip("-._")


def new_job_name(blueprint_id: str) -> str:
    """A DNS-1035 TrainJob name: the blueprint id (shortened) and a random suffix."""
    base = re.sub(r"[^a-z0-9-]+", "-", blueprint_id.lower()).strip("-")[:30].strip("-")
    if not base or not base[0].isalpha():
        base = "j" + base
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return f"{base}-{''.join(secrets.choice(alphabet) for _ in range(5))}"


def workspace_pvc(job_name: str, trainer_kind: str) -> str:
    return f"{WORKSPACE_CLAIM.get(trainer_kind, 'workspace')}-{job_name}"


def output_uri(job_name: str, blueprint: Blueprint) -> str:
    """Where the servable model directory lands (KServe ``storageUri``)."""
    kind = blueprint.kubernetes.trainer
    if kind == "builtin-torchtune":
        # torchtune's HF checkpointer writes one directory per epoch under output_dir (1 epoch here).
        return f"pvc://{workspace_pvc(job_name, kind)}/output/epoch_0"
    return f"pvc://{workspace_pvc(job_name, kind)}/output/model"


def base_model_uri(job_name: str, blueprint: Blueprint, override: str | None = None) -> str:
    """The base model for side by side: the hub id, or the trainer's ``base-model/`` for scratch://."""
    source = override or blueprint.model.source
    if source.startswith("scratch://"):
        return f"pvc://{workspace_pvc(job_name, blueprint.kubernetes.trainer)}/output/base-model"
    return source


def _secret_env(name: str, opts: ClusterOptions, *, optional: bool) -> dict[str, Any]:
    ref = {"name": opts.hf_token_secret, "key": opts.hf_token_key, "optional": optional}
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def _container_patch(rjob: str, env: list[dict[str, Any]]):
    from kubeflow.trainer import options as o

    pod = o.PodTemplatePatch(spec=o.PodSpecPatch(containers=[o.ContainerPatch(name=rjob, env=env)]))
    return o.ReplicatedJobPatch(name=rjob, template=o.JobTemplatePatch(spec=o.JobSpecPatch(template=pod)))


def _resources(blueprint: Blueprint) -> dict[str, str] | None:
    res = blueprint.resources
    out: dict[str, str] = {}
    if res.cpu:
        out["cpu"] = str(res.cpu)
    if res.memory:
        out["memory"] = str(res.memory)
    if res.gpus_per_node:
        out["gpu"] = str(res.gpus_per_node)
    return out or None


def _runtime(blueprint: Blueprint):
    """The SDK's view of the blueprint's runtime, as ``get_runtime`` would derive it (no cluster)."""
    from kubeflow.trainer.constants import constants
    from kubeflow.trainer.types import types

    builtin = blueprint.kubernetes.trainer == "builtin-torchtune"
    trainer = types.RuntimeTrainer(
        trainer_type=types.TrainerType.BUILTIN_TRAINER if builtin else types.TrainerType.CUSTOM_TRAINER,
        framework="torchtune" if builtin else "torch",
        image="",
        num_nodes=blueprint.resources.nodes,
    )
    trainer.set_command(constants.TORCH_TUNE_COMMAND if builtin else constants.TORCH_COMMAND)
    return types.Runtime(
        name=blueprint.kubernetes.runtime, trainer=trainer, kind=types.RuntimeKind.CLUSTER_TRAINING_RUNTIME
    )


@dataclass
class TrainJobPlan:
    """Everything ``TrainerClient.train`` takes, plus the extra trainer args the SDK has no field for."""

    name: str
    runtime: Any
    trainer: Any
    initializer: Any
    options: list[Any]
    extra_args: list[str]


def plan_trainjob(
    blueprint: Blueprint, request: TrainRequest, opts: ClusterOptions, name: str, runtime: Any = None
) -> TrainJobPlan:
    """Map a blueprint + validated params onto the SDK's trainer, initializer and options."""
    from kubeflow.trainer import options as o
    from kubeflow.trainer.types import types

    kind = blueprint.kubernetes.trainer
    params = request.params
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
        ANN_PARAMS: json.dumps(params, sort_keys=True),
        ANN_OUTPUT: output_uri(name, blueprint),
        ANN_BASE: base_model_uri(name, blueprint, request.overrides.model),
        ANN_TRAINER: kind,
        **owner_annotations,
    }
    if opts.ttl_seconds_after_finished is not None:
        annotations[ANN_TTL] = str(opts.ttl_seconds_after_finished)
    options: list[Any] = [
        o.Name(name=name),
        o.Labels(labels=labels),
        o.Annotations(annotations=annotations),
        o.ActiveDeadlineSeconds(seconds=blueprint.kubernetes.active_deadline_seconds),
    ]
    runtime = runtime or _runtime(blueprint)
    resources = _resources(blueprint)
    extra_args: list[str] = []
    initializer = None
    if kind == "playground":
        args = ["--blueprint", blueprint.id]
        for key in sorted(params):
            value = params[key]
            args += ["--set", f"{key}={json.dumps(value) if isinstance(value, bool) else value}"]
        args += ["--output", OUTPUT_DIR]
        if request.overrides.model:
            args += ["--model-source", request.overrides.model]
        if request.overrides.dataset:
            args += ["--dataset-source", request.overrides.dataset]
        distributed = blueprint.resources.nodes > 1 or blueprint.resources.gpus_per_node > 1
        command = ["torchrun", "-m", "playground.train"] if distributed else ["python", "-m", "playground.train"]
        trainer = types.CustomTrainerContainer(
            image=blueprint.kubernetes.image or opts.image or "",
            num_nodes=blueprint.resources.nodes,
            resources_per_node=resources,
            env={"PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
        )
        options += [o.TrainerCommand(command=command), o.TrainerArgs(args=args)]
        # The token reaches the trainer from the Secret, never inline (the SDK's RuntimePatch mechanism).
        token = [_secret_env("HF_TOKEN", opts, optional=not blueprint.model.gated)]
        rjobs = [_container_patch("node", token)]
    else:
        model_uri = request.overrides.model or blueprint.model.source
        dataset_uri = request.overrides.dataset or blueprint.dataset.source
        initializer = types.Initializer(
            dataset=types.HuggingFaceDatasetInitializer(storage_uri=dataset_uri),
            model=types.HuggingFaceModelInitializer(storage_uri=model_uri),
        )
        method = blueprint.method
        peft = None
        if method.kind == "lora":
            peft = types.LoraConfig(
                lora_rank=int(params.get("lora_rank", method.rank)),
                lora_alpha=int(params.get("lora_alpha", method.alpha)),
                lora_dropout=float(params.get("lora_dropout", method.dropout)),
                lora_attn_modules=list(method.target_modules),
            )
        trainer = types.BuiltinTrainer(
            config=types.TorchTuneConfig(
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
                resources_per_node=resources,
            )
        )
        tune_keys = {
            "max_steps": "max_steps_per_epoch",
            "learning_rate": "optimizer.lr",
            "seed": "seed",
            "max_seq_length": "tokenizer.max_seq_len",
            "log_every": "log_every_n_steps",
            "gradient_accumulation_steps": "gradient_accumulation_steps",
        }
        extra_args = [f"{tune_keys[k]}={params[k]}" for k in sorted(params) if k in tune_keys]
        optional = not blueprint.model.gated
        rjobs = [
            _container_patch("dataset-initializer", [_secret_env("ACCESS_TOKEN", opts, optional=True)]),
            _container_patch("model-initializer", [_secret_env("ACCESS_TOKEN", opts, optional=optional)]),
        ]
    options.append(
        o.RuntimePatch(
            training_runtime_spec=o.TrainingRuntimeSpecPatch(
                template=o.JobSetTemplatePatch(spec=o.JobSetSpecPatch(replicated_jobs=rjobs))
            )
        )
    )
    return TrainJobPlan(name, runtime, trainer, initializer, options, extra_args)


def sdk_backend(namespace: str):
    """An SDK KubernetesBackend used only to build specs (no kubeconfig loaded, no request made)."""
    from kubeflow.trainer.backends.kubernetes.backend import KubernetesBackend as SDKBackend

    backend = object.__new__(SDKBackend)
    backend.namespace = namespace
    return backend


def build_trainjob(plan: TrainJobPlan, sdk: Any) -> dict[str, Any]:
    """The TrainJob object, assembled exactly as ``TrainerClient.train`` assembles it."""
    from kubeflow.trainer.constants import constants
    from kubeflow_trainer_api import models

    job_spec: dict[str, Any] = {}
    for option in plan.options:
        option(job_spec, plan.trainer, sdk)
    meta = job_spec.get("metadata", {})
    spec = job_spec.get("spec", {})
    trainjob_spec = sdk._get_trainjob_spec(
        runtime=plan.runtime,
        initializer=plan.initializer,
        trainer=plan.trainer,
        trainer_overrides=spec.get("trainer", {}),
        runtime_patches=spec.get("runtimePatches"),
        active_deadline_seconds=spec.get("activeDeadlineSeconds"),
    )
    if plan.extra_args and trainjob_spec.trainer is not None:
        trainjob_spec.trainer.args = list(trainjob_spec.trainer.args or []) + plan.extra_args
    job = models.TrainerV1alpha1TrainJob(
        apiVersion=constants.API_VERSION,
        kind=constants.TRAINJOB_KIND,
        metadata=models.IoK8sApimachineryPkgApisMetaV1ObjectMeta(
            name=meta.get("name", plan.name),
            namespace=sdk.namespace,
            labels=meta.get("labels"),
            annotations=meta.get("annotations"),
        ),
        spec=trainjob_spec,
    )
    return _clean(job.to_dict())


def _clean(data: Any) -> Any:
    """Drop empty lists/dicts the SDK leaves behind (e.g. ``env: []``)."""
    if isinstance(data, dict):
        out = {k: _clean(v) for k, v in data.items()}
        return {k: v for k, v in out.items() if v not in ({}, [], None)}
    if isinstance(data, list):
        return [_clean(v) for v in data]
    return data


def isvc_name(job_name: str, base: bool) -> str:
    return f"{job_name}-{'base' if base else 'ft'}"


def build_inferenceservice(
    job_name: str,
    blueprint: Blueprint,
    storage_uri: str,
    opts: ClusterOptions,
    *,
    base: bool,
    owner: str | None = None,
) -> dict[str, Any]:
    """A KServe InferenceService on the Hugging Face runtime serving ``storage_uri``."""
    name = isvc_name(job_name, base)
    res = blueprint.resources
    requests = {"cpu": str(res.cpu or "1"), "memory": str(res.memory or "4Gi")}
    limits = dict(requests)
    args: list[str] = []
    if res.gpus_per_node:
        limits["nvidia.com/gpu"] = "1"
        requests["nvidia.com/gpu"] = "1"
    else:
        args.append("--backend=huggingface")  # vLLM needs a GPU; the transformers backend runs on CPU
    if blueprint.model.dtype != "auto":
        args.append(f"--dtype={blueprint.model.dtype}")
    model: dict[str, Any] = {
        "modelFormat": {"name": "huggingface"},
        "storageUri": storage_uri,
        "resources": {"requests": requests, "limits": limits},
    }
    if args:
        model["args"] = args
    if storage_uri.startswith("hf://"):
        model["env"] = [_secret_env("HF_TOKEN", opts, optional=not blueprint.model.gated)]
    labels = {
        LABEL_JOB: job_name,
        LABEL_KIND: "base" if base else "fine-tuned",
        LABEL_BLUEPRINT: label_value(blueprint.id),
        LABEL_MANAGED: MANAGED_BY,
        **opts.extra_labels,
    }
    owner_labels, owner_annotations = owner_metadata(owner)
    labels.update(owner_labels)
    metadata: dict[str, Any] = {"name": name, "namespace": opts.namespace, "labels": labels}
    if owner_annotations:
        metadata["annotations"] = owner_annotations
    return {
        "apiVersion": f"{KSERVE_GROUP}/{KSERVE_VERSION}",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {"predictor": {"model": model}},
    }


def to_yaml(obj: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)
