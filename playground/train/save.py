"""Servable model directories, written atomically.

A plain Hugging Face directory (``config.json``, ``model.safetensors``, tokenizer files with the
chat template, ``generation_config.json``) that ``transformers serve``, KServe's HuggingFace
runtime and ``AutoModelForCausalLM`` load unchanged, on transformers 5.x and 4.x alike (the same greedy
answers: :mod:`playground.models.portable`). LoRA adapters are merged first. The directory is written
under a temporary name and renamed, so ``model/`` exists only when complete.
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


def save_model_dir(model: Any, tokenizer: Any, target: Path, *, dtype: Any = None, in_place: bool = True) -> Path:
    """Write a servable directory at ``target`` atomically (replacing an older one), readable alike by
    transformers 4.x and 5.x (:func:`playground.models.portable.make_portable`). LoRA models are merged
    (in place unless ``in_place=False``)."""
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


def model_context(model: Any) -> int | None:
    """The model's context window in tokens (``max_position_embeddings``), when its config says."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None
