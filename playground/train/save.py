"""Servable model directories, written atomically.

A full fine-tune (and a scratch job's ``base-model/``) is a plain Hugging Face directory (``config.json``,
``model.safetensors``, tokenizer files with the chat template, ``generation_config.json``) that vLLM, KServe's
HuggingFace runtime and ``AutoModelForCausalLM`` load unchanged, on transformers 5.x and 4.x alike (the same greedy
answers: :mod:`playground.models.portable`). A LoRA job's ``model/`` is its PEFT adapter (``adapter_config.json``,
``adapter_model.safetensors`` in float32, the tokenizer with the chat template): a few MB, loaded onto its base
model's server; the merged directory is an export (:func:`playground.models.adapters.merge_adapter`). Either is
written under a temporary name and renamed, so ``model/`` exists only when complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playground.models.portable import publish, temporary_sibling
from playground.train.tokenizer import save_tokenizer


def unwrap(model: Any) -> Any:
    """The bare model under DDP / torch.compile wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return getattr(model, "_orig_mod", model)


def merged(model: Any, *, in_place: bool = True) -> Any:
    """A model ready to save: LoRA merged into the base weights. In place by default (the end of
    training: no second copy of a 1B model in GPU memory); ``in_place=False`` merges a copy."""
    model = unwrap(model)
    if hasattr(model, "merge_and_unload"):  # peft
        if not in_place:
            import copy

            model = copy.deepcopy(model)
        return model.merge_and_unload()
    return model


def is_peft(model: Any) -> bool:
    """Whether ``model`` (under its wrappers) carries peft adapters."""
    return hasattr(unwrap(model), "peft_config")


def save_model_dir(
    model: Any,
    tokenizer: Any,
    target: Path,
    *,
    dtype: Any = None,
    in_place: bool = True,
    merge: bool = False,
    base_model: str | None = None,
) -> Path:
    """Write a servable directory at ``target`` atomically (replacing an older one): the PEFT adapter of a
    LoRA model (:func:`save_adapter_dir`; ``dtype`` does not apply), else a merged HF directory readable
    alike by transformers 4.x and 5.x (:func:`playground.models.portable.make_portable`). ``merge=True``
    merges a LoRA model instead (in place unless ``in_place=False``)."""
    if is_peft(model) and not merge:
        return save_adapter_dir(model, tokenizer, target, base_model=base_model)
    target = Path(target)
    tmp = temporary_sibling(target)
    final_model = merged(model, in_place=in_place)
    if dtype is not None and next(final_model.parameters()).dtype != dtype:
        final_model = final_model.to(dtype)
    final_model.save_pretrained(str(tmp), safe_serialization=True)
    save_tokenizer(tokenizer, tmp, context=model_context(final_model))
    for stale in tmp.glob("adapter_*"):  # never ship half of a LoRA layout next to merged weights
        stale.unlink()
    return publish(tmp, target)


def save_adapter_dir(model: Any, tokenizer: Any, target: Path, *, base_model: str | None = None) -> Path:
    """Write a LoRA model's PEFT adapter at ``target`` atomically: ``adapter_config.json``,
    ``adapter_model.safetensors`` (float32, whatever the training dtype: vLLM casts it to the served model's) and
    the tokenizer with the chat template. ``base_model`` (a directory, ``hf://`` or ``pkg://`` reference) replaces
    peft's ``base_model_name_or_path`` where given (a scratch model's saved ``base-model/``)."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    target = Path(target)
    tmp = temporary_sibling(target)
    peft_model = unwrap(model)
    peft_model.save_pretrained(str(tmp), safe_serialization=True, save_embedding_layers=False)
    weights_path = tmp / "adapter_model.safetensors"
    weights = load_file(str(weights_path))
    save_file({k: v.to(torch.float32).contiguous() for k, v in weights.items()}, str(weights_path), {"format": "pt"})
    if base_model:
        config_path = tmp / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base_model
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_tokenizer(tokenizer, tmp, context=model_context(peft_model.get_base_model()))
    (tmp / "README.md").unlink(missing_ok=True)  # peft's model card template: nothing a loader reads
    return publish(tmp, target)


def model_context(model: Any) -> int | None:
    """The model's context window in tokens (``max_position_embeddings``), when its config says."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None
