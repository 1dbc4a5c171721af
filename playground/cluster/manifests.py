"""What every playground object on a cluster shares (TrainJobs: :mod:`playground.backends.kubernetes.trainjob`; the
kuberay backend's RayJobs; InferenceServices: ``playground.serving.kserve``): the deployment's options, labels and
annotations, job names, the job's workspace claim and model URIs, the HF token Secret's env, and how a blueprint and
your data files travel to the trainer's pods.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from playground.backends.common import is_uri
from playground.blueprints import Blueprint, load_catalog
from playground.booth import owner_key
from playground.cluster.datafiles import (
    PVC_SETTING,
    ClaimMount,
    DataPlacement,
    parse_setting,
)
from playground.errors import UserError, shown
from playground.owner import Owner
from playground.types import RunRequest

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


def check_queue(value: str, setting: str = "PLAYGROUND_KUEUE_QUEUE") -> str:
    """The Kueue LocalQueue name, or a one-line error naming the setting and the allowed form."""
    if len(value) > DNS_LABEL_MAX or not _QUEUE_NAME.match(value):
        raise UserError(f"{setting} {shown(value, 80)} is not valid; allowed: {QUEUE_FORM}", field=setting)
    return value


def check_trainer(value: str, setting: str = "PLAYGROUND_K8S_TRAINER") -> str:
    if value not in TRAINER_KINDS:
        raise UserError(f"{setting} {shown(value, 80)} is unknown; allowed: {', '.join(TRAINER_KINDS)}", field=setting)
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


def owner_metadata(owner: Owner) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) marking an object as ``owner``'s (the id's digest, the id); empty for the operator's."""
    if owner.id is None:
        return {}, {}
    return {LABEL_OWNER: owner_key(owner.id)}, {ANN_OWNER: owner.id}


def owner_selector(owner: Owner) -> str:
    """The label selector term for ``owner``'s objects ("" for the operator: everyone's)."""
    return f",{LABEL_OWNER}={owner_key(owner.id)}" if owner.id is not None else ""


def visible_to(labels: Mapping[str, str], owner: Owner) -> bool:
    """Whether an object carrying ``labels`` is ``owner``'s to see (the operator sees every object)."""
    return owner.id is None or labels.get(LABEL_OWNER) == owner_key(owner.id)


def label_value(text: str) -> str:
    """A valid label value (<=63 chars, alphanumeric ends)."""
    value = _LABEL_VALUE.sub("-", str(text))[:63]
    return value.strip("-._")


def blueprint_id(labels: dict[str, str]) -> str:
    """The blueprint a job ran, from its (label-safe) blueprint label."""
    value = labels.get(LABEL_BLUEPRINT, "")
    catalog = load_catalog()
    return value if value in catalog else next((b for b in catalog if label_value(b) == value), value)


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
    if source.startswith(("scratch://", "pkg://")):  # written by the trainer (KServe loads nothing from a package)
        return f"pvc://{workspace_pvc(job_name, kind)}/output/base-model"
    if uses_initializers(blueprint, kind) and INITIALIZER_URI.match(source):
        return f"pvc://{workspace_pvc(job_name, kind)}/model"
    return source


def secret_env(name: str, opts: ClusterOptions, *, optional: bool):
    """An env var read from the HF token Secret (never the value itself)."""
    from kubeflow_trainer_api import models

    ref = models.IoK8sApiCoreV1SecretKeySelector(name=opts.hf_token_secret, key=opts.hf_token_key, optional=optional)
    return models.IoK8sApiCoreV1EnvVar(name=name, valueFrom=models.IoK8sApiCoreV1EnvVarSource(secretKeyRef=ref))


def local_data_files(blueprint: Blueprint, request: RunRequest) -> list[str]:
    """The run's data files on this machine (no URL): the dataset override, else the blueprint's own source,
    and the blueprint's held-out file. On Kubernetes they are read from a PVC (:mod:`.datafiles`)."""
    dataset = request.overrides.dataset or blueprint.dataset.source
    files = [dataset, blueprint.dataset.eval_source or ""]
    return [f for f in files if f and not is_uri(f)]


def shipped(blueprint: Blueprint) -> bool:
    """Whether the trainer image's catalog has this very blueprint (else its YAML travels in the args)."""
    from playground.blueprints.loader import CATALOG_DIR, load_blueprint_file

    path = CATALOG_DIR / f"{blueprint.id}.yaml"
    return path.is_file() and load_blueprint_file(path) == blueprint


def trainer_blueprint_yaml(blueprint: Blueprint, placement: DataPlacement | None) -> str | None:
    """What a cluster trainer's run request carries of the blueprint besides its id: nothing for a shipped blueprint
    (the image's catalog has it); else its YAML (a blueprint of your own, a few KB of settings, never data), with its
    local data files renamed to where the trainer's pods see them."""
    if shipped(blueprint):
        return None
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
    return blueprint_yaml(blueprint)


def to_yaml(obj: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)
