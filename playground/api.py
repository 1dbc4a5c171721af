"""The engine facade: what notebooks, widgets and the CLI call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from playground.blueprints import Blueprint, get_blueprint, load_catalog
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
) -> TrainRequest:
    """Validate ``params`` against the blueprint (one-line ParameterError) and build a request."""
    blueprint = get_blueprint(blueprint_id)
    resolved = blueprint.resolve_params(dict(params or {}))
    return TrainRequest(
        blueprint_id=blueprint.id,
        params=resolved,
        overrides=SourceOverrides(model=model_source, dataset=dataset_source),
        labels=dict(labels or {}),
    )
