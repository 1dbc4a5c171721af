"""The engine facade: what notebooks, widgets and the CLI call.

The app's widgets use nothing else of the engine but this module, :mod:`playground.facade` and the typed records,
events, errors and owner (the layer table in ``tests/test_architecture.py``): the types and helpers they need are
importable from here, and ``__all__`` lists every name this API offers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.answers import answer_is_correct
from playground.backends import BACKENDS
from playground.backends.base import Backend
from playground.blueprints import Blueprint, get_blueprint, load_catalog
from playground.blueprints.custom import ArchitectureCheck, check_architecture
from playground.blueprints.plan import Plan
from playground.booth import booth_enabled
from playground.diagnostics import without_tracebacks
from playground.formatting import format_duration, format_rate, progress_line, time_left_in
from playground.owner import Owner, as_owner
from playground.paths import ensure_writable_dir, playground_home
from playground.run_request import RunParameters, RunRequest
from playground.runs.registry import RegisteredVersion
from playground.runs.store import Curve, RunRecord, job_run, loss_curves
from playground.types import Endpoint, Job
from playground.userdata.check import DatasetReport
from playground.userdata.rows import FILE_SUFFIXES, DatasetError
from playground.userdata.shapes import parse_columns

# The embedded default: the first card in the app's gallery, what `playground app` preselects, what
# binder opens on. A real pretrained LLM fine-tuned with LoRA on a CPU (tiny-llama-cpu is the smoke test).
DEFAULT_BLUEPRINT = "smollm2-135m-lora-kubectl"


def blueprints() -> list[Blueprint]:
    """Every catalog blueprint: the default first, then CPU-runnable ones, then by id."""
    return sorted(load_catalog().values(), key=lambda b: (b.id != DEFAULT_BLUEPRINT, b.needs_gpu, b.id))


def make_request(
    blueprint_id: str,
    params: Mapping[str, Any] | RunParameters | None = None,
    *,
    model_source: str | None = None,
    dataset_source: str | None = None,
    labels: Mapping[str, str] | None = None,
    owner: Owner | str | None = None,
) -> RunRequest:
    """The typed run request (:class:`RunRequest`), ``params`` validated against the blueprint once (one-line
    ParameterError naming the field): text from a form, ``--set`` or a notebook, or typed values. Parameters that
    already are :class:`RunParameters` (:func:`parameters` made them: the launch form) are taken as they are.

    ``blueprint_id`` is a catalog id or a path to a blueprint YAML file; a file outside the catalog
    stays a file (its absolute path) in the request, so the backend loads that same file.

    ``owner`` is the visitor the job belongs to (booth mode): an :class:`Owner`, or a visitor id; None (or
    ``Owner.operator()``) for an operator's job.
    """
    request = RunRequest.build(
        blueprint_id,
        params,
        model_source=model_source,
        dataset_source=dataset_source,
        labels=labels,
        owner=as_owner(owner),
    )
    _check_sources(request.blueprint, request.params.as_dict(), model_source, dataset_source)
    return request


def parameters(blueprint: str | Blueprint, values: Mapping[str, Any]) -> tuple[RunParameters | None, dict[str, str]]:
    """A launch form's values checked each on its own (every bad field its own one-line error), then together:
    (typed parameters for :func:`make_request`, {}) or (None, {field: error})."""
    bp = get_blueprint(blueprint) if isinstance(blueprint, str) else blueprint
    return RunParameters.check_fields(bp, values)


def _check_sources(
    blueprint: Blueprint, params: dict[str, Any], model_source: str | None, dataset_source: str | None
) -> None:
    """Before anything starts: a replaced model must be one the trainer can train, and a dataset file here
    (the blueprint's own or the replacement) must pass :func:`check_data`. A path that is not on this machine
    is left to the backend (on Kubernetes it names a file in the pod)."""
    from playground.userdata.check import is_local_file

    if model_source is not None and ("://" in model_source or Path(model_source).expanduser().is_dir()):
        from playground.blueprints.custom import check_architecture

        check_architecture(model_source, blueprint)
    source = dataset_source or blueprint.dataset.source
    if blueprint.method.objective != "sft":  # DPO/GRPO rows: their own columns (prompt/chosen/rejected, prompt/answer)
        from playground.train.preferences import check_method_dataset

        check_method_dataset(blueprint.method.objective, source, blueprint.dataset.split)
    elif is_local_file(source) and Path(source).expanduser().is_file():
        check_data(blueprint, params, dataset_source=dataset_source, model_source=model_source)


def check_data(
    blueprint: str | Blueprint,
    params: Mapping[str, Any] | None = None,
    *,
    dataset_source: str | None = None,
    model_source: str | None = None,
    columns: Mapping[str, str] | None = None,
    eval_source: str | None = None,
) -> DatasetReport | None:
    """Check a dataset file against a blueprint's model before launch (``playground data check``): a one-line
    DatasetError naming the file, row and field, or a report (split, token percentiles, rows truncated by
    ``max_seq_length``, a preview with the trained tokens marked). None for data that is not a local file."""
    from playground.userdata import check_dataset

    bp = get_blueprint(blueprint) if isinstance(blueprint, str) else blueprint
    resolved = bp.resolve_params(dict(params or {}))
    return check_dataset(
        bp, resolved, dataset_source, model_source=model_source, columns=columns, eval_source=eval_source
    )


def custom_blueprint(
    blueprint_id: str,
    *,
    base: str = DEFAULT_BLUEPRINT,
    title: str | None = None,
    model_source: str | None = None,
    dataset_source: str | None = None,
    columns: Mapping[str, str] | None = None,
    eval_source: str | None = None,
    method: str | None = None,
    quality: str | None = None,
    save: bool = True,
    directory: str | Path | None = None,
    overwrite: bool = False,
) -> tuple[Blueprint, Path | None, list[str]]:
    """A blueprint of your own (``playground custom``): ``base``'s recipe on your model and/or data, the
    architecture and the data checked, saved as ``<directory>/<id>.yaml`` (default
    ``$PLAYGROUND_HOME/blueprints``, part of the catalog). Returns (blueprint, file or None, notes)."""
    from playground.blueprints.custom import make_custom, save_blueprint
    from playground.booth import booth_enabled
    from playground.errors import UserError

    if booth_enabled():
        raise UserError("custom blueprints are not available in booth mode", field="blueprint")
    blueprint, notes = make_custom(
        get_blueprint(base),
        blueprint_id,
        title=title,
        model_source=model_source,
        dataset_source=dataset_source,
        columns=columns,
        eval_source=eval_source,
        method=method,
        quality=quality,
    )
    path = save_blueprint(blueprint, directory, overwrite=overwrite) if save else None
    return blueprint, path, notes


def plan_run(
    blueprint_id: str | Blueprint,
    params: Mapping[str, Any] | None = None,
    *,
    model_source: str | None = None,
    dataset_source: str | None = None,
    backend: str = "local",
) -> Plan:
    """Predict memory per device, fit and training time of a run before launching it (starts nothing).
    ``blueprint_id``: a catalog id, a blueprint file, or a :class:`Blueprint` already loaded."""
    from playground.blueprints.plan import make_plan

    blueprint = get_blueprint(blueprint_id) if isinstance(blueprint_id, str) else blueprint_id
    return make_plan(
        blueprint,
        blueprint.resolve_params(dict(params or {})),
        model_source=model_source,
        dataset_source=dataset_source,
        backend=backend,
    )


def runs(blueprint_id: str | None = None) -> list[Any]:
    """The jobs' MLflow runs, newest first (``playground runs``): status, verdict, metrics, differing params."""
    from playground.runs.store import list_runs

    return list_runs(blueprint_id)


def register_model(
    job_id: str | Job,
    *,
    name: str | None = None,
    registry: str = "mlflow",
    registry_url: str | None = None,
    version: str | None = None,
    backend: str = "local",
    owner: Owner | str | None = None,
) -> RegisteredVersion:
    """Record a finished job's model as a registered model version (``playground register``): MLflow's model
    registry by default, Kubeflow Hub with ``registry="kubeflow-hub"`` and ``registry_url``. ``job_id``: a job's id
    on ``backend`` (checked against ``owner``), or the :class:`Job` itself as already read (the app's monitor)."""
    from playground.backends import get_backend
    from playground.runs.registry import check_options, register

    check_options(registry, registry_url, name, version)
    job = job_id if isinstance(job_id, Job) else get_backend(backend).get(job_id, owner=as_owner(owner))
    return register(job, name=name, registry=registry, registry_url=registry_url, version=version)


def serve(
    job_id: str,
    *,
    base: bool = False,
    port: int | str | None = None,
    backend: str = "local",
    owner: Owner | str | None = None,
) -> Any:  # -> playground.types.Endpoint
    """Serve a finished job's model (``base=True``: its base model) behind an OpenAI-compatible endpoint and
    wait until it answers (``playground serve JOB [--base] [--port N]``). ``port``: listen there (local
    backend; 1-65535, one that is taken is a one-line UserError naming ``--port`` and nothing starts)."""
    from playground.facade import connect
    from playground.serving.local import parse_port

    checked = parse_port(port) if port is not None else None
    return connect(backend).serve(job_id, base=base, owner=as_owner(owner), port=checked)


# --- what the app's widgets ask the engine (widgets/ import nothing else of it: tests/test_architecture.py) ---------
def local_gpu_count() -> int:
    """GPUs a trainer started from this machine could use, found without importing torch (``PLAYGROUND_GPU_COUNT``
    replaces the count)."""
    from playground.backends.gpus import detect_gpus

    return detect_gpus()


def blueprint_notes(blueprint: Blueprint, backend: str = "local", gpus: int | None = None) -> list[str]:
    """Why ``blueprint`` cannot run as it is on ``backend`` here (empty: it can): too few GPUs on this machine
    (``gpus``; default :func:`local_gpu_count`), a packaged model whose package is missing, a gated model without
    ``HF_TOKEN``, the Hugging Face hub offline. The operator's advice, one line each."""
    import os

    from playground.blueprints.fit import local_fit
    from playground.blueprints.plan import on_machine

    notes: list[str] = []
    if on_machine(backend) == "local":
        fit = local_fit(blueprint, local_gpu_count() if gpus is None else gpus)
        if not fit.runnable:
            notes.append(fit.advice())
    if blueprint.model.source.startswith("pkg://"):
        from playground.models.packaged import missing_package_note

        notes += [note] if (note := missing_package_note(blueprint.model.source)) else []
    if blueprint.model.gated and not os.environ.get("HF_TOKEN"):
        notes.append("gated model on the Hugging Face hub: set HF_TOKEN in the environment")
    elif blueprint.model.source.startswith("hf://") and os.environ.get("HF_HUB_OFFLINE") == "1":
        notes.append("downloads from the Hugging Face hub, which is offline here (HF_HUB_OFFLINE=1)")
    return notes


def chat(endpoint: Endpoint | str, messages: Any, **options: Any) -> str | Iterator[str]:
    """One chat completion from a served model: the answer, or with ``stream=True`` an iterator of its text chunks.
    ``messages``: ``{"role", "content"}`` dicts (a plain string is one user turn); ``options``: ``stream``,
    ``max_tokens``, ``temperature``, ``model``, ``timeout`` (the one client, ``playground.serving.client.chat``)."""
    from playground.serving.client import chat as complete

    return complete(endpoint, messages, **options)


def request_reading(blueprint: Blueprint, prompt: str) -> str:
    """What the blueprint's models are asked instead of ``prompt`` (its ``serving.normalize``: the kubectl task reads
    a request into the phrasing it was trained on); "" when they are asked the prompt as typed."""
    if blueprint.serving.normalize != "kubectl":
        return ""
    from playground.kubectl.request import normalize

    reading = normalize(prompt)
    return "" if reading == prompt else reading


@dataclass(frozen=True)
class FinishedAnswer:
    """A model's answer as the chat shows it, after :func:`finish_answer`."""

    answer: str
    added_namespace: str = ""  # the namespace added to the answer from the request
    held_back: str = ""  # why the guard replaced the model's answer with its refusal
    truncated: bool = False  # the server stopped at the token limit


def finish_answer(blueprint: Blueprint, prompt: str, answer: str, *, truncated: bool = False) -> FinishedAnswer:
    """A model's whole answer to ``prompt`` as the blueprint's serving settings finish it: ``serving.complete``
    (the kubectl task adds the request's namespace; a cut answer is left as it is), then ``serving.guard`` (a
    command the guard refuses becomes its refusal, with the reason)."""
    added = ""
    if blueprint.serving.complete == "kubectl" and not truncated:
        from playground.kubectl.answer import added_namespace, with_namespace

        namespace = added_namespace(prompt, answer)
        answer, added = with_namespace(answer, namespace), namespace or ""
    if blueprint.serving.guard == "kubectl":
        from playground.kubectl.guard import REFUSAL, check

        verdict = check(prompt, answer)
        if not verdict.allowed:
            return FinishedAnswer(REFUSAL, held_back=verdict.reason)
    return FinishedAnswer(answer, added_namespace=added, truncated=truncated)


__all__ = [
    "BACKENDS",
    "DEFAULT_BLUEPRINT",
    "FILE_SUFFIXES",
    "ArchitectureCheck",
    "Backend",
    "Blueprint",
    "Curve",
    "DatasetError",
    "DatasetReport",
    "Endpoint",
    "FinishedAnswer",
    "Job",
    "Owner",
    "Plan",
    "RegisteredVersion",
    "RunParameters",
    "RunRecord",
    "RunRequest",
    "answer_is_correct",
    "blueprint_notes",
    "blueprints",
    "booth_enabled",
    "chat",
    "check_architecture",
    "check_data",
    "custom_blueprint",
    "ensure_writable_dir",
    "finish_answer",
    "format_duration",
    "format_rate",
    "get_blueprint",
    "job_run",
    "local_gpu_count",
    "loss_curves",
    "make_request",
    "parameters",
    "parse_columns",
    "plan_run",
    "playground_home",
    "progress_line",
    "register_model",
    "request_reading",
    "runs",
    "serve",
    "time_left_in",
    "without_tracebacks",
]
