"""Register a finished job's model: MLflow's model registry (default) or Kubeflow Hub.

MLflow: a version of registered model NAME whose ``source`` is the job's storage URI (its model
directory locally, ``pvc://…`` on Kubernetes), linked to the job's run, with the job's metrics as tags.
Kubeflow Hub: the ``model-registry`` client's ``register_model`` (name, version, storage URI, metrics
as custom properties). A registered model is served by reference: ``models:/NAME/VERSION`` or
``NAME@VERSION`` resolves to the job that made it (:func:`resolve_job`). A LoRA job's model is its PEFT
adapter: registered as such, with its base model and rank as tags (:func:`model_tags`).
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from playground.errors import UserError, shown
from playground.events import JobPhase
from playground.runs import settings as rs

REGISTRIES = ("mlflow", "kubeflow-hub")
TOKEN_ENV = "PLAYGROUND_REGISTRY_TOKEN"  # Kubeflow Hub bearer token (else the client's service-account token)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A LoRA job's registered model is its PEFT adapter: these tags say so and name the base it is served on.
TAG_MODEL_FORMAT = "playground.model_format"  # "peft-lora" (adapter) or "huggingface" (a full model directory)
TAG_BASE_MODEL = "playground.base_model"  # the job's base reference: a directory, hf:// or pkg://
TAG_LORA_RANK = "playground.lora_rank"
_REF = re.compile(r"^(?:models:/(?P<a>[^/@]+)/(?P<av>[^/@]+)|(?P<b>[^/@:]+)@(?P<bv>[^/@]+))$")


@dataclass
class RegisteredVersion:
    registry: str
    name: str
    version: str
    source: str  # the job's storage URI
    job_id: str
    run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    where: str = ""  # the registry's address (no credentials)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_options(registry: str, registry_url: str | None, name: str | None, version: str | None) -> None:
    """One line naming the bad field; nothing is contacted."""
    if registry not in REGISTRIES:
        raise UserError(
            f"--registry {shown(registry)} is unknown; allowed: {', '.join(REGISTRIES)}", field="--registry"
        )
    if name is not None and not _NAME.match(name):
        raise UserError(
            f"--name {shown(name)} is not valid; allowed: letters, digits, '.', '_' and '-' (at most 128, "
            "starting with a letter or digit)",
            field="--name",
        )
    if version is not None and (registry == "mlflow" or not _VERSION.match(version)):
        allowed = "only with --registry kubeflow-hub (MLflow numbers versions itself)"
        if registry != "mlflow":
            allowed = "letters, digits, '.', '_' and '-' (at most 64)"
        raise UserError(f"--version {shown(version)} is not valid; allowed: {allowed}", field="--version")
    if registry == "kubeflow-hub":
        parts = urlsplit(registry_url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(
                f"--registry-url {shown(rs.safe_uri(registry_url or ''))} is not valid; "
                "allowed: http(s)://HOST[:PORT] of the Kubeflow Hub (Model Registry) REST API",
                field="--registry-url",
            )
    elif registry_url:
        raise UserError("--registry-url only applies to --registry kubeflow-hub", field="--registry-url")


def storage_uri(job: Any) -> str:
    """Where the job's model lives: ``pvc://…`` on Kubernetes, an absolute directory locally."""
    if job.phase != JobPhase.SUCCEEDED or not job.model_dir:
        raise UserError(
            f"job {job.id} is {job.phase}, not Succeeded with a model; allowed: a finished job (see `playground jobs`)",
            field="job",
        )
    return str(job.model_dir)


def model_tags(job: Any) -> dict[str, str]:
    """What the registry records about the model's layout: an adapter's format, base and rank (read from a
    local model directory; a remote one's layout is not known here: no tags)."""
    from pathlib import Path

    from playground.models.adapters import adapter_rank, is_adapter_dir

    model = Path(str(job.model_dir or ""))
    if not job.model_dir or not model.is_dir():
        return {}
    if not is_adapter_dir(model):
        return {TAG_MODEL_FORMAT: "huggingface"}
    tags = {TAG_MODEL_FORMAT: "peft-lora", TAG_LORA_RANK: str(adapter_rank(model))}
    if job.base_model:
        tags[TAG_BASE_MODEL] = str(job.base_model)
    return tags


def register(
    job: Any,
    *,
    name: str | None = None,
    registry: str = "mlflow",
    registry_url: str | None = None,
    version: str | None = None,
    tracking_uri: str | None = None,
) -> RegisteredVersion:
    """Record ``job``'s model as a version of ``name`` (default: the blueprint id)."""
    check_options(registry, registry_url, name, version)
    source = storage_uri(job)
    name = name or re.sub(r"[^A-Za-z0-9._-]+", "-", job.blueprint_id.rsplit("/", 1)[-1]).strip("-.")[:128]
    metrics = {k: float(v) for k, v in job.metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    if registry == "kubeflow-hub":
        assert registry_url is not None
        return _register_hub(job, name, version or job.id, source, metrics, registry_url)
    return _register_mlflow(job, name, source, metrics, tracking_uri)


def _register_mlflow(job: Any, name: str, source: str, metrics: dict[str, float], uri: str | None) -> RegisteredVersion:
    from mlflow.exceptions import MlflowException

    from playground.runs.store import run_for_job
    from playground.runs.tracking import open_client

    uri = uri or rs.store_uri()
    run = run_for_job(job.id, uri=uri)
    client = open_client(uri)
    try:
        client.create_registered_model(name, tags={rs.TAG_BLUEPRINT: job.blueprint_id})
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    tags = {rs.TAG_JOB: job.id, rs.TAG_BACKEND: job.backend, rs.TAG_BLUEPRINT: job.blueprint_id}
    tags.update({f"metric.{k}": repr(v) for k, v in metrics.items()})
    tags.update(model_tags(job))
    model_version = client.create_model_version(
        name,
        source=source,
        run_id=run.run_id if run else None,
        tags=tags,
        description=f"job {job.id} ({job.backend}), blueprint {job.blueprint_id}",
    )
    return RegisteredVersion(
        "mlflow",
        name,
        str(model_version.version),
        source,
        job.id,
        run.run_id if run else None,
        metrics,
        rs.safe_uri(uri),
    )


def _register_hub(
    job: Any, name: str, version: str, source: str, metrics: dict[str, float], url: str
) -> RegisteredVersion:
    """Kubeflow Hub through the ``model-registry`` client (a bearer token from PLAYGROUND_REGISTRY_TOKEN,
    else the client's own service-account token; never printed)."""
    try:
        from model_registry import ModelRegistry
        from model_registry.exceptions import StoreError
    except ImportError:
        raise UserError(
            "--registry kubeflow-hub needs the model-registry client: pip install 'blueprint-playground[hub]'",
            field="--registry",
        ) from None
    parts = urlsplit(url)
    address = f"{parts.scheme}://{parts.hostname}"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    author = os.environ.get("USER") or "blueprint-playground"
    token = os.environ.get(TOKEN_ENV) or None
    metadata: dict[str, Any] = {f"metric.{k}": v for k, v in metrics.items()}
    metadata.update({rs.TAG_JOB: job.id, rs.TAG_BACKEND: job.backend, rs.TAG_BLUEPRINT: job.blueprint_id})
    metadata.update(model_tags(job))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "User access token is missing" on a plain-http registry
            hub = ModelRegistry(address, port, author=author, is_secure=parts.scheme == "https", user_token=token)
        hub.register_model(
            name,
            source,
            version=version,
            model_format_name="huggingface",
            model_format_version="1",
            version_description=f"job {job.id} ({job.backend}), blueprint {job.blueprint_id}",
            metadata=metadata,
        )
    except StoreError as exc:
        raise UserError(f"Kubeflow Hub at {rs.safe_uri(url)}: {rs.scrub(str(exc))}", field="--version") from None
    except Exception as exc:  # connection refused, HTTP errors: one line, no token
        reason = rs.scrub(str(exc)).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UserError(f"Kubeflow Hub at {rs.safe_uri(url)} failed: {reason}", field="--registry-url") from None
    return RegisteredVersion("kubeflow-hub", name, version, source, job.id, None, metrics, rs.safe_uri(url))


def parse_reference(text: str) -> tuple[str, str] | None:
    """``models:/NAME/VERSION`` or ``NAME@VERSION`` → (name, version); None for anything else (a job id)."""
    match = _REF.match(text)
    if not match:
        return None
    return (match["a"], match["av"]) if match["a"] else (match["b"], match["bv"])


def resolve_job(text: str, *, tracking_uri: str | None = None) -> str:
    """A job id for ``text``: a registered model reference resolves (MLflow registry) to the job that
    made it; anything else is returned unchanged (taken as a job id)."""
    reference = parse_reference(text)
    if reference is None:
        return text
    name, version = reference
    from playground.runs.store import client_for

    client = client_for(tracking_uri)
    if client is None:
        raise UserError(f"{shown(text)}: there is no MLflow model registry here yet", field="model")
    from mlflow.exceptions import MlflowException

    try:
        if version.isdigit():
            model_version = client.get_model_version(name, version)
        else:
            model_version = client.get_model_version_by_alias(name, version)
    except MlflowException:
        names = [m.name for m in client.search_registered_models(max_results=10)]
        known = f"registered: {', '.join(names)}" if names else "no model is registered yet"
        raise UserError(f"{shown(text)}: no such registered model version; {known}", field="model") from None
    job_id = model_version.tags.get(rs.TAG_JOB)
    if not job_id:
        raise UserError(f"{shown(text)} was not registered by `playground register` (no job id)", field="model")
    return job_id
