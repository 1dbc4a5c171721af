"""The engine facade: what notebooks, widgets and the CLI call."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from playground.blueprints import Blueprint, get_blueprint, load_catalog
from playground.blueprints.loader import looks_like_file
from playground.owner import Owner, as_owner
from playground.types import SourceOverrides, TrainRequest

# The embedded default: the first card in the app's gallery, what `playground app` preselects, what
# binder opens on. A real pretrained LLM fine-tuned with LoRA on a CPU (tiny-llama-cpu is the smoke test).
DEFAULT_BLUEPRINT = "smollm2-135m-lora-kubectl"


def blueprints() -> list[Blueprint]:
    """Every catalog blueprint: the default first, then CPU-runnable ones, then by id."""
    return sorted(load_catalog().values(), key=lambda b: (b.id != DEFAULT_BLUEPRINT, b.needs_gpu, b.id))


def make_request(
    blueprint_id: str,
    params: Mapping[str, Any] | None = None,
    *,
    model_source: str | None = None,
    dataset_source: str | None = None,
    labels: Mapping[str, str] | None = None,
    owner: Owner | str | None = None,
) -> TrainRequest:
    """Validate ``params`` against the blueprint (one-line ParameterError) and build a request.

    ``blueprint_id`` is a catalog id or a path to a blueprint YAML file; a file outside the catalog
    stays a file (its absolute path) in the request, so the backend loads that same file.

    ``owner`` is the visitor the job belongs to (booth mode): an :class:`Owner`, or a visitor id; None (or
    ``Owner.operator()``) for an operator's job.
    """
    blueprint = get_blueprint(blueprint_id)
    resolved = blueprint.resolve_params(dict(params or {}))
    reference = str(Path(blueprint_id).expanduser().resolve()) if looks_like_file(blueprint_id) else blueprint.id
    _check_sources(blueprint, resolved, model_source, dataset_source)
    return TrainRequest(
        blueprint_id=reference,
        params=resolved,
        overrides=SourceOverrides(model=model_source, dataset=dataset_source),
        labels=dict(labels or {}),
        owner=as_owner(owner).id,
    )


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
) -> Any:  # -> playground.userdata.DatasetReport | None
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
    blueprint_id: str,
    params: Mapping[str, Any] | None = None,
    *,
    model_source: str | None = None,
    dataset_source: str | None = None,
    backend: str = "local",
) -> Any:  # -> playground.blueprints.plan.Plan
    """Predict memory per device, fit and training time of a run before launching it (starts nothing)."""
    from playground.blueprints.plan import make_plan

    blueprint = get_blueprint(blueprint_id)
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
    job_id: str,
    *,
    name: str | None = None,
    registry: str = "mlflow",
    registry_url: str | None = None,
    version: str | None = None,
    backend: str = "local",
    owner: Owner | str | None = None,
) -> Any:  # -> playground.runs.registry.RegisteredVersion
    """Record a finished job's model as a registered model version (``playground register``): MLflow's model
    registry by default, Kubeflow Hub with ``registry="kubeflow-hub"`` and ``registry_url``."""
    from playground.backends import get_backend
    from playground.runs.registry import check_options, register

    check_options(registry, registry_url, name, version)
    job = get_backend(backend).get(job_id, owner=as_owner(owner).id)
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
