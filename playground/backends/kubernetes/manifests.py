"""TrainJob manifests for a blueprint (InferenceServices: ``playground.serving.kserve``).

The TrainJob is assembled from the Trainer's own API models (``kubeflow_trainer_api``, the typed
form of the TrainJob CRD), so ``--dry-run`` renders exactly what ``submit`` creates and nothing here
contacts a cluster or relies on the SDK backend's private helpers. The one SDK helper used is the
TorchTune argument mapping for the opt-in ``builtin-torchtune`` variant (hence ``kubeflow<0.6``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from playground.backends.kubernetes import sdk
from playground.backends.kubernetes.datafiles import (
    PVC_SETTING,
    ClaimMount,
    DataPlacement,
    parse_setting,
    place,
    runtime_patch,
)
from playground.blueprints import Blueprint
from playground.booth import owner_key
from playground.errors import UserError
from playground.types import TrainRequest

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
TRAINJOB_PLURAL = "trainjobs"
CTR_PLURAL = "clustertrainingruntimes"

LABEL_PREFIX = "blueprint-playground.dev/"
LABEL_BLUEPRINT = LABEL_PREFIX + "blueprint"
LABEL_JOB = LABEL_PREFIX + "job"
LABEL_KIND = LABEL_PREFIX + "kind"
LABEL_OWNER = LABEL_PREFIX + "owner"  # booth mode: a label-safe digest of the visitor id (owner_key)
LABEL_E2E_RUN = LABEL_PREFIX + "e2e-run"
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

# Trainer kinds: the project's own trainer (every blueprint), or the opt-in upstream TorchTune variant.
PLAYGROUND, TORCHTUNE = "playground", "builtin-torchtune"
TRAINER_KINDS = (PLAYGROUND, TORCHTUNE)

WORKSPACE = "/workspace"
OUTPUT_DIR = WORKSPACE + "/output"
MODEL_DIR = WORKSPACE + "/model"  # where Kubeflow's model initializer writes (kubeflow.trainer.MODEL_PATH)
DATASET_DIR = WORKSPACE + "/dataset"  # ... and its dataset initializer (kubeflow.trainer.DATASET_PATH)
INITIALIZER_URI = re.compile(r"^(hf|s3)://.+")  # what Kubeflow's HF/S3 initializers download
# The PVC JobSet creates from a runtime's shared volumeClaimPolicies template: <claim>-<jobset name>.
WORKSPACE_CLAIM = {PLAYGROUND: "workspace", TORCHTUNE: "initializer"}

# Name lengths: job names are at most 26 characters, which leaves room for KServe's host label of an
# InferenceService named after the job (``playground.serving.kserve``).
DNS_LABEL_MAX = 63
JOB_NAME_MAX = 26
_JOB_SUFFIX = 5  # random characters after the blueprint stem

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")
_QUEUE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
QUEUE_FORM = (
    "a Kueue LocalQueue name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, "
    f"at most {DNS_LABEL_MAX} characters"
)


def _shown(value: str, limit: int = 80) -> str:
    """``value`` quoted for an error message, cut to ``limit`` characters."""
    return repr(value if len(value) <= limit else value[:limit] + "…")


def check_queue(value: str, setting: str = "PLAYGROUND_KUEUE_QUEUE") -> str:
    """The Kueue LocalQueue name, or a one-line error naming the setting and the allowed form."""
    if len(value) > DNS_LABEL_MAX or not _QUEUE_NAME.match(value):
        raise UserError(f"{setting} {_shown(value)} is not valid; allowed: {QUEUE_FORM}", field=setting)
    return value


def check_trainer(value: str, setting: str = "PLAYGROUND_K8S_TRAINER") -> str:
    if value not in TRAINER_KINDS:
        raise UserError(f"{setting} {_shown(value)} is unknown; allowed: {', '.join(TRAINER_KINDS)}", field=setting)
    return value


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
    trainer: str = PLAYGROUND  # or the opt-in builtin-torchtune variant
    data_claims: tuple[ClaimMount, ...] = ()  # PVCs holding local data files (PLAYGROUND_DATA_PVC), see datafiles

    @classmethod
    def from_env(cls, **overrides: Any) -> ClusterOptions:
        """Options given here win over the env; both are validated (one line naming the setting)."""
        env = os.environ
        values: dict[str, Any] = {
            "hf_token_secret": env.get("PLAYGROUND_HF_TOKEN_SECRET", "hf-token"),
            "hf_token_key": env.get("PLAYGROUND_HF_TOKEN_KEY", "token"),
            "image": env.get("PLAYGROUND_TRAINER_IMAGE") or None,
            "data_claims": tuple(parse_setting(env.get(PVC_SETTING, ""))),
        }
        labels = dict(overrides.pop("extra_labels", None) or {})
        run = env.get("PLAYGROUND_E2E_RUN")  # set by `playground e2e` for each notebook: its cleanup finds the jobs
        if run:
            labels.setdefault(LABEL_E2E_RUN, label_value(run))
        queue, trainer = overrides.pop("queue", None), overrides.pop("trainer", None)
        if queue:
            values["queue"] = check_queue(queue, "queue")
        elif env.get("PLAYGROUND_KUEUE_QUEUE"):
            values["queue"] = check_queue(env["PLAYGROUND_KUEUE_QUEUE"])
        values["trainer"] = (
            check_trainer(trainer, "trainer")
            if trainer
            else check_trainer(env.get("PLAYGROUND_K8S_TRAINER") or PLAYGROUND)
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values, extra_labels=labels)


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


def job_stem(blueprint_id: str) -> str:
    """The DNS-1035 prefix of a blueprint's job names (its id, shortened)."""
    base = re.sub(r"[^a-z0-9-]+", "-", blueprint_id.lower()).strip("-")
    if not base or not base[0].isalpha():
        base = "j" + base
    return base[: JOB_NAME_MAX - _JOB_SUFFIX - 1].strip("-")


def new_job_name(blueprint_id: str) -> str:
    """A DNS-1035 TrainJob name of at most 26 characters: the blueprint stem and a random suffix."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return f"{job_stem(blueprint_id)}-{''.join(secrets.choice(alphabet) for _ in range(_JOB_SUFFIX))}"


def uses_initializers(blueprint: Blueprint, kind: str) -> bool:
    return kind == TORCHTUNE or blueprint.kubernetes.initializers


def runtime_name(blueprint: Blueprint, kind: str) -> str:
    """The ClusterTrainingRuntime a blueprint runs on with trainer ``kind``."""
    if kind == PLAYGROUND:
        return blueprint.kubernetes.runtime
    if not blueprint.kubernetes.torchtune_runtime:
        raise UserError(
            f"blueprint {blueprint.id!r} has no builtin-torchtune variant (kubernetes.torchtune_runtime is not set); "
            f"run it with the playground trainer",
            field="trainer",
        )
    return blueprint.kubernetes.torchtune_runtime


def workspace_pvc(job_name: str, trainer_kind: str) -> str:
    return f"{WORKSPACE_CLAIM.get(trainer_kind, 'workspace')}-{job_name}"


def output_uri(job_name: str, blueprint: Blueprint, kind: str = PLAYGROUND) -> str:
    """Where the servable model directory lands (KServe ``storageUri``)."""
    if kind == TORCHTUNE:
        # torchtune's HF checkpointer writes one directory per epoch under output_dir (1 epoch here).
        return f"pvc://{workspace_pvc(job_name, kind)}/output/epoch_0"
    return f"pvc://{workspace_pvc(job_name, kind)}/output/model"


def base_model_uri(job_name: str, blueprint: Blueprint, override: str | None = None, kind: str = PLAYGROUND) -> str:
    """The base model for side by side: the trainer's ``base-model/`` for scratch://, the copy the model
    initializer downloaded into the job's workspace, else the source itself (a hub id)."""
    source = override or blueprint.model.source
    if source.startswith("scratch://"):
        return f"pvc://{workspace_pvc(job_name, kind)}/output/base-model"
    if uses_initializers(blueprint, kind) and INITIALIZER_URI.match(source):
        return f"pvc://{workspace_pvc(job_name, kind)}/model"
    return source


def secret_env(name: str, opts: ClusterOptions, *, optional: bool):
    """An env var read from the HF token Secret (never the value itself)."""
    from kubeflow_trainer_api import models

    ref = models.IoK8sApiCoreV1SecretKeySelector(name=opts.hf_token_secret, key=opts.hf_token_key, optional=optional)
    return models.IoK8sApiCoreV1EnvVar(name=name, valueFrom=models.IoK8sApiCoreV1EnvVarSource(secretKeyRef=ref))


def _resources(blueprint: Blueprint):
    """Requests = limits per node: cpu, memory and ``nvidia.com/gpu``."""
    from kubeflow_trainer_api import models

    res = blueprint.resources
    wanted = {"cpu": res.cpu, "memory": res.memory, "nvidia.com/gpu": res.gpus_per_node or None}
    quantities = {k: models.IoK8sApimachineryPkgApiResourceQuantity(str(v)) for k, v in wanted.items() if v}
    if not quantities:
        return None
    return models.IoK8sApiCoreV1ResourceRequirements(requests=quantities, limits=dict(quantities))


def _initializer_source(kind: str, override: str | None, default: str, blueprint: Blueprint) -> str:
    source = override or default
    if not INITIALIZER_URI.match(source):
        raise UserError(
            f"{kind} source {_shown(source)}: blueprint {blueprint.id!r} downloads its {kind} with Kubeflow's "
            f"{kind} initializer on Kubernetes; allowed: hf://ORG/NAME or s3://BUCKET/PATH",
            field=kind,
        )
    return source


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


def run_env(name: str, blueprint: Blueprint, request: TrainRequest, opts: ClusterOptions) -> dict[str, str]:
    """What the trainer's MLflow run needs in the pod (playground/runs): the job, backend, owner and storage URI;
    the cluster's tracking server when ``MLFLOW_TRACKING_URI`` names one (http(s); any credentials in it are
    dropped: give them as MLFLOW_TRACKING_TOKEN/… from a Secret), with the namespace as the MLflow workspace
    (KEP-897). Without one, tracking is off in the pod (a SQLite file there would vanish with it)."""
    from playground.runs import settings as rs

    env = {rs.JOB_ID_ENV: name, rs.JOB_BACKEND_ENV: "kubernetes", rs.MODEL_URI_ENV: output_uri(name, blueprint)}
    if request.owner is not None:
        env[rs.JOB_OWNER_ENV] = request.owner
    uri = os.environ.get(rs.TRACKING_ENV, "")
    if rs.tracking_enabled() and uri.startswith(("http://", "https://")):
        env.update({rs.TRACKING_ENV: rs.safe_uri(uri), "MLFLOW_WORKSPACE": opts.namespace})
    else:
        env[rs.DISABLE_ENV] = "0"
    return env


def local_data_files(blueprint: Blueprint, request: TrainRequest) -> list[str]:
    """The run's data files on this machine (no URL): the dataset override, else the blueprint's own source,
    and the blueprint's held-out file. On Kubernetes they are read from a PVC (:mod:`.datafiles`)."""
    dataset = request.overrides.dataset or blueprint.dataset.source
    files = [dataset, blueprint.dataset.eval_source or ""]
    return [f for f in files if f and "://" not in f]


def shipped(blueprint: Blueprint) -> bool:
    """Whether the trainer image's catalog has this very blueprint (else its YAML travels in the args)."""
    from playground.blueprints.loader import CATALOG_DIR, load_blueprint_file

    path = CATALOG_DIR / f"{blueprint.id}.yaml"
    return path.is_file() and load_blueprint_file(path) == blueprint


def blueprint_args(blueprint: Blueprint, placement: DataPlacement | None) -> list[str]:
    """``--blueprint ID`` for a shipped blueprint; else its YAML (a blueprint of your own, a few KB of settings,
    never data), with its local data files renamed to where the trainer's pods see them."""
    if shipped(blueprint):
        return ["--blueprint", blueprint.id]
    from playground.blueprints.custom import blueprint_yaml
    from playground.blueprints.schema import Example

    dataset = blueprint.dataset
    # The chat examples (rows of your file) stay with the app: the trainer never reads them.
    blueprint = blueprint.model_copy(update={"examples": [Example(prompt="(the chat examples stay with the app)")]})
    if placement is not None:
        moved = {
            "source": placement.paths.get(dataset.source, dataset.source),
            "eval_source": placement.paths.get(dataset.eval_source or "", dataset.eval_source),
        }
        blueprint = blueprint.model_copy(update={"dataset": dataset.model_copy(update=moved)})
    return ["--blueprint-yaml", blueprint_yaml(blueprint)]


def playground_trainer(
    name: str,
    blueprint: Blueprint,
    request: TrainRequest,
    opts: ClusterOptions,
    initializers: bool,
    placement: DataPlacement | None = None,
):
    """``python -m playground.train`` (torchrun when there is more than one process) with the blueprint's params."""
    from kubeflow_trainer_api import models

    res = blueprint.resources
    args = blueprint_args(blueprint, placement)
    for key in sorted(request.params):
        value = request.params[key]
        args += ["--set", f"{key}={json.dumps(value) if isinstance(value, bool) else value}"]
    args += ["--output", OUTPUT_DIR]
    dataset_override = request.overrides.dataset
    if placement is not None and dataset_override:
        dataset_override = placement.paths.get(dataset_override, dataset_override)  # your file, on the PVC
    if initializers:  # the initializers downloaded both into the shared workspace (your file: read from the PVC)
        dataset_arg = dataset_override if placement is not None and request.overrides.dataset else DATASET_DIR
        args += ["--model-source", MODEL_DIR, "--dataset-source", dataset_arg]
    else:
        if request.overrides.model:
            args += ["--model-source", request.overrides.model]
        if dataset_override:
            args += ["--dataset-source", dataset_override]
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
    return models.TrainerV1alpha1Trainer(
        image=blueprint.kubernetes.image or opts.image or None,
        command=command,
        args=args,
        numNodes=res.nodes,
        numProcPerNode=procs,
        resourcesPerNode=_resources(blueprint),
        env=env,
    )


def _torchtune_trainer(blueprint: Blueprint, request: TrainRequest, initializer: Any):
    """The opt-in upstream TorchTune trainer: the SDK's TorchTune argument mapping, plus the params
    (max steps, learning rate...) that ``TorchTuneConfig`` has no field for."""
    from kubeflow.trainer.constants import constants
    from kubeflow.trainer.types import types
    from kubeflow_trainer_api import models

    params, method = request.params, blueprint.method
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
        resourcesPerNode=_resources(blueprint),
    )


def plan_trainjob(blueprint: Blueprint, request: TrainRequest, opts: ClusterOptions, name: str) -> TrainJobPlan:
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
        ANN_PARAMS: json.dumps(request.params, sort_keys=True),
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


def to_yaml(obj: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)
