"""E2E profiles: which parameters each per-blueprint notebook gets, and the default timeouts.

- ``smoke``: CPU, no hub. The blueprints the project runs locally (the embedded default
  ``smollm2-135m-lora-kubectl``, a real pretrained model shipped in a package, and ``tiny-llama-cpu``)
  with their full defaults (each must reach its quality bar); hub blueprints on local stand-ins
  (``model_source``/``dataset_source`` = ``"standin"``: Llama blueprints get the real SmolLM2-135M
  weights, Qwen2 ones a tiny random Qwen2) for a few steps, quality not asserted (a stand-in
  cannot meet the real model's bar).
- ``gpu``: the real blueprints from the hub for a bounded number of steps, quality asserted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from playground.errors import UserError

PROFILES = ("smoke", "gpu")


@dataclass(frozen=True)
class Profile:
    """Parameters and limits for one kind of e2e run."""

    name: str
    description: str
    cell_timeout: int  # seconds one cell may run (papermill execution_timeout)
    run_timeout: int  # seconds one whole notebook may run before its kernel is killed
    needs_gpu: bool
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the kernel
    common: dict[str, Any] = field(default_factory=dict)  # every notebook
    hub: dict[str, Any] = field(default_factory=dict)  # blueprints whose model comes from the hub
    local: dict[str, Any] = field(default_factory=dict)  # blueprints the project builds itself (scratch://)

    def parameters(self, blueprint_id: str | None, *, backend: str) -> dict[str, Any]:
        """The papermill parameters for a notebook running ``blueprint_id`` (None: unknown blueprint)."""
        params: dict[str, Any] = {"headless": True, "backend": backend, **self.common}
        kind = _blueprint_kind(blueprint_id)
        if kind == "hub":
            params.update(self.hub)
        elif kind == "local":
            params.update(self.local)
        return params


def _blueprint_kind(blueprint_id: str | None) -> str | None:
    """``hub`` (model from hf://), ``local`` (scratch://, pkg:// or a directory) or None when not in the catalog."""
    if not blueprint_id:
        return None
    from playground.blueprints import load_catalog

    blueprint = load_catalog().get(blueprint_id)
    if blueprint is None:
        return None
    return "hub" if blueprint.model.source.startswith("hf://") else "local"


SMOKE = Profile(
    name="smoke",
    description="CPU: smollm2-135m-lora-kubectl and tiny-llama-cpu with full defaults, hub blueprints on local "
    "stand-ins for a few steps",
    cell_timeout=1200,  # the SmolLM2 blueprint trains ~2-3 min on 2 idle cores, tiny ~60 s; shared CI is slower
    run_timeout=1800,
    needs_gpu=False,
    env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    common={"assert_quality": True},
    hub={
        "model_source": "standin",
        "dataset_source": "standin",
        "max_steps": 3,
        "batch_size": 2,
        "max_seq_length": 64,
        "assert_quality": False,
    },
)

GPU = Profile(
    name="gpu",
    description="GPU: the real blueprints from the hub, bounded steps, quality bar asserted",
    cell_timeout=3600,
    run_timeout=5400,
    needs_gpu=True,
    common={"assert_quality": True},
    hub={"model_source": None, "dataset_source": None, "max_steps": 60},
)

_BY_NAME = {p.name: p for p in (SMOKE, GPU)}


def get_profile(name: str) -> Profile:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UserError(f"unknown profile {name!r}; allowed: {', '.join(PROFILES)}", field="--profile") from None
