"""E2E profiles: which parameters each per-blueprint notebook gets, and the default timeouts.

- ``smoke``: CPU, no hub. The blueprints the project runs locally (the embedded default
  ``smollm2-135m-lora-kubectl``, a real pretrained model shipped in a package, its DPO and GRPO variants, and
  ``tiny-llama-cpu``)
  with their full defaults (each must reach its quality bar); hub blueprints on local stand-ins
  (``model_source``/``dataset_source`` = ``"standin"``: Llama blueprints get the real SmolLM2-135M
  weights, Qwen2 ones a tiny random Qwen2) for a few steps, quality not asserted (a stand-in
  cannot meet the real model's bar).
- ``gpu``: the real blueprints from the hub for a bounded number of steps, quality asserted.
- ``gpu-config``: GPU, no hub. The hub blueprints' architectures at full size built from config
  (``model_source="config"``: Llama-3.2-1B / Qwen2.5-1.5B dimensions, random init, a tokenizer built
  locally) on a learnable local Alpaca-format stand-in (2000 rows), bounded steps, LoRA as the
  blueprint says, quality asserted against a bar a random-init model can honestly meet (see
  ``CONFIG_QUALITY_THRESHOLD``; DPO/GRPO blueprints keep their generated data: DPO's bar is on held-out
  preference accuracy, ``CONFIG_METHOD_BARS``; GRPO is not asserted); tiny-llama-cpu with its defaults and its
  own bar.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from playground.errors import UserError, shown

PROFILES = ("smoke", "gpu", "gpu-config")
# eval_loss bar (nats per answer token) for random-init models built from config, on the task stand-in
# (playground.train.standins.task_rows): the untrained model scores ln(vocab) ≈ 11.8; a uniform guess
# among the 51 token types the answers use scores ln(51) = 3.93; knowing their frequencies (the unigram
# entropy) 2.9 (Llama tokenizer) / 3.15 (Qwen). At most 3.5 means training taught the model which
# tokens answer and roughly how often; below ~3, it uses the prompt.
CONFIG_QUALITY_THRESHOLD = 3.5
# DPO/GRPO blueprints on random-init models built from config (their own generated kubectl data): the metric and
# threshold asserted, per objective. Measured on an H100 (benchmarks/README.md, "DPO and GRPO on a GPU"): Qwen2.5-1.5B
# at full size, random init, 100 DPO steps at lr 1e-3 move held-out preference accuracy from 0.46 to 0.86 (reward
# margin 5.8) while exact match stays 0.02: ranking the exact command above its near miss is learnable from random
# weights, writing it is not. GRPO has no bar: after the 20-step warm start a random-init Llama-3.2-1B still writes no
# command, every sample scores 0 and the reward has nothing to rise from (the run must still succeed).
CONFIG_METHOD_BARS: dict[str, tuple[str, float]] = {"dpo": ("eval_preference_accuracy", 0.75)}


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
            objective = _objective(blueprint_id)
            if self.name == "gpu-config" and objective != "sft":
                # DPO/GRPO keep their own generated data; the eval_loss bar above is an SFT bar
                params.update(dataset_source=None, quality_threshold=None, assert_quality=False)
                if objective in CONFIG_METHOD_BARS:
                    metric, threshold = CONFIG_METHOD_BARS[objective]
                    params.update(quality_metric=metric, quality_threshold=threshold, assert_quality=True)
        elif kind == "local":
            params.update(self.local)
        return params


def _objective(blueprint_id: str | None) -> str:
    from playground.blueprints import load_catalog

    blueprint = load_catalog().get(blueprint_id or "")
    return blueprint.method.objective if blueprint else "sft"


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
    description="CPU: the SmolLM2 blueprints (SFT, DPO, GRPO) and tiny-llama-cpu with full defaults, hub blueprints "
    "on local stand-ins for a few steps",
    # on 2 idle cores: SmolLM2 SFT trains ~2-3 min, DPO ~4, GRPO ~10 (its warm start included), tiny ~60 s; shared
    # CI is slower
    cell_timeout=1200,
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

GPU_CONFIG = Profile(
    name="gpu-config",
    description="GPU, no hub: the hub blueprints' architectures at full size from config (random init), bounded steps",
    cell_timeout=1800,
    run_timeout=2700,
    needs_gpu=True,
    env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    common={"assert_quality": True},
    hub={
        "model_source": "config",
        "dataset_source": "standin",
        "max_steps": 100,
        "learning_rate": 1e-3,  # LoRA on random weights: the pretrained-model default (2e-4) moves too little
        "checkpoint_every": 50,  # a GPU checkpoint is written (and the run goes on past it)
        "log_every": 10,
        "quality_threshold": CONFIG_QUALITY_THRESHOLD,
        "max_new_tokens": 32,  # chat answers of a random-init model: bounded
    },
)

_BY_NAME = {p.name: p for p in (SMOKE, GPU, GPU_CONFIG)}


def get_profile(name: str) -> Profile:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UserError(f"unknown profile {shown(name)}; allowed: {', '.join(PROFILES)}", field="--profile") from None
