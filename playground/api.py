"""The engine facade: what notebooks, widgets and the CLI call."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from playground.blueprints import Blueprint, get_blueprint, load_catalog
from playground.blueprints.loader import looks_like_file
from playground.booth import validate_owner
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
    owner: str | None = None,
) -> TrainRequest:
    """Validate ``params`` against the blueprint (one-line ParameterError) and build a request.

    ``blueprint_id`` is a catalog id or a path to a blueprint YAML file; a file outside the catalog
    stays a file (its absolute path) in the request, so the backend loads that same file.

    ``owner`` is the visitor the job belongs to (booth mode); None for an operator's job.
    """
    blueprint = get_blueprint(blueprint_id)
    resolved = blueprint.resolve_params(dict(params or {}))
    reference = str(Path(blueprint_id).expanduser().resolve()) if looks_like_file(blueprint_id) else blueprint.id
    return TrainRequest(
        blueprint_id=reference,
        params=resolved,
        overrides=SourceOverrides(model=model_source, dataset=dataset_source),
        labels=dict(labels or {}),
        owner=validate_owner(owner),
    )
