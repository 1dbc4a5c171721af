"""A LoRA job's model is its PEFT adapter (``adapter_config.json`` + ``adapter_model.safetensors`` + the tokenizer
with the chat template, a few MB), served on its base model; :func:`merge_adapter` makes the merged Hugging Face
directory for those who need one (``playground export JOB --merged``), written as the trainer writes a full
fine-tune's: portable to transformers 4.x and 5.x, atomically.

Light to import (stdlib only): torch, transformers and peft load inside :func:`merge_adapter`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from playground.errors import UserError, shown_path

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_FORMS = "a local model directory, hf://ORG/NAME or pkg://DISTRIBUTION/FILE"


def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` is a PEFT adapter directory (``adapter_config.json`` present)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_config(path: str | Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` as a dict."""
    return json.loads((Path(path) / ADAPTER_CONFIG).read_text())


def adapter_rank(path: str | Path) -> int:
    """The LoRA rank ``r`` of the adapter at ``path`` (vLLM's ``--max-lora-rank`` must be at least this)."""
    return int(adapter_config(path)["r"])


def base_model_dir(base_model: str) -> tuple[str, dict[str, Any]]:
    """What ``from_pretrained`` takes for a job's base reference, with its keyword arguments: a local directory,
    a ``pkg://`` source's converted directory (converted on first use), or ``hf://ORG/NAME`` (the hub cache,
    downloading only where it is reachable; token from ``HF_TOKEN``)."""
    if base_model.startswith("pkg://"):
        from playground.models.packaged import ensure_converted

        return str(ensure_converted(base_model)), {}
    if base_model.startswith("hf://"):
        from playground.train.model import hf_token, parse_source

        _, repo = parse_source(base_model)
        return repo, {"token": hf_token()}
    path = Path(base_model).expanduser()
    if not (path / "config.json").is_file():
        raise UserError(
            f"base model {shown_path(base_model)}: not a model directory (no config.json there); allowed: {BASE_FORMS}",
            field="base_model",
        )
    return str(path), {}


def merge_adapter(
    adapter_dir: str | Path, base_model: str, target: str | Path, *, say: Callable[[str], None] | None = None
) -> Path:
    """Load ``base_model`` (float32), apply the adapter at ``adapter_dir``, merge it, and write a portable Hugging
    Face directory at ``target`` atomically (in the base's stored dtype, the tokenizer and chat template from the
    adapter directory). Returns ``target``."""
    adapter_dir, target = Path(adapter_dir), Path(target)
    if not is_adapter_dir(adapter_dir):
        raise UserError(f"{shown_path(str(adapter_dir))}: not a PEFT adapter (no {ADAPTER_CONFIG})", field="model")
    ref, options = base_model_dir(base_model)
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from playground.train.save import save_model_dir

    if say:
        say(f"merging the adapter {adapter_dir} into {base_model} (loading the base model)")
    config = AutoConfig.from_pretrained(ref, **options)
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    stored_dtype = getattr(torch, stored) if isinstance(stored, str) else stored
    tokenizer = AutoTokenizer.from_pretrained(str(adapter_dir))
    base = AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32, **options)
    vocabulary = base.get_input_embeddings().num_embeddings
    if vocabulary < len(tokenizer):
        raise UserError(
            f"{shown_path(str(adapter_dir))}: its tokenizer has {len(tokenizer)} tokens, the base model {vocabulary}; "
            "allowed: the base model the job trained on",
            field="base_model",
        )
    model = PeftModel.from_pretrained(base, str(adapter_dir))
    dtype = stored_dtype if isinstance(stored_dtype, torch.dtype) else None
    return save_model_dir(model, tokenizer, target, dtype=dtype, merge=True)
