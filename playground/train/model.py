"""Model sources: ``scratch://<arch>`` (config built locally, random init), ``hf://org/name``
(hub; token from ``HF_TOKEN`` only), ``pkg://DISTRIBUTION/FILE`` (a model file shipped inside an
installed Python package, converted once into a cached Hugging Face directory, see
:mod:`playground.models.packaged`) or a local Hugging Face directory (a stand-in or a mirror).
LoRA adapters come from peft, configured by the blueprint's method and parameters."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from playground.errors import UserError, shown_path
from playground.run_request import RunParameters

SCRATCH_ARCHS = ("llama", "qwen2")
SOURCE_FORMS = "hf://ORG/NAME, scratch://llama, scratch://qwen2, pkg://DISTRIBUTION/FILE, or a local model directory"


def parse_source(source: str) -> tuple[str, str]:
    """``("hf", repo)``, ``("scratch", arch)``, ``("pkg", source)`` or ``("local", path)``; a one-line
    UserError otherwise. A ``pkg://`` source is checked here (installed, intact, convertible, cache
    writable) and converted on first load (:func:`model_dir`)."""
    if source.startswith("hf://"):
        repo = source.removeprefix("hf://").strip("/")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise UserError(
                f"model source {shown_path(source)}: expected hf://ORG/NAME; allowed: {SOURCE_FORMS}", field="model"
            )
        return "hf", repo
    if source.startswith("scratch://"):
        arch = source.removeprefix("scratch://")
        if arch not in SCRATCH_ARCHS:
            raise UserError(
                f"model source {shown_path(source)}: unknown architecture; allowed: {', '.join(SCRATCH_ARCHS)}",
                field="model",
            )
        return "scratch", arch
    if source.startswith("pkg://"):
        from playground.models import packaged

        packaged.check(source)
        return "pkg", source
    path = Path(source).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return "local", str(path)
    raise UserError(
        f"model source {shown_path(source)}: not a model directory (no config.json there); allowed: {SOURCE_FORMS}",
        field="model",
    )


def hf_token() -> str | None:
    """The hub token, from the environment only (never a parameter, never printed)."""
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


def model_dir(kind: str, ref: str) -> tuple[str, str]:
    """``("local", converted directory)`` for a ``pkg://`` source (converting it the first time);
    any other source unchanged."""
    if kind != "pkg":
        return kind, ref
    from playground.models import packaged

    return "local", str(packaged.ensure_converted(ref))


def load_tokenizer(kind: str, ref: str, spec: Any) -> Any:
    """The tokenizer for a model source, with the blueprint's chat template (or a default)."""
    from playground.train.tokenizer import build_char_tokenizer, ensure_chat_template

    if kind == "scratch":
        if spec.tokenizer in (None, "chars"):
            return build_char_tokenizer(spec.chat_template)
        kind, ref = parse_source(spec.tokenizer)
    kind, ref = model_dir(kind, ref)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ref, token=hf_token() if kind == "hf" else None)
    ensure_chat_template(tokenizer, spec.chat_template)
    return tokenizer


def build_model(kind: str, ref: str, spec: Any, tokenizer: Any, *, dtype: Any, seed: int) -> Any:
    """A causal LM: from a locally built config (random init, seeded) or from pretrained weights."""
    import torch
    from transformers import AutoModelForCausalLM

    if kind == "scratch":
        from transformers import LlamaConfig, Qwen2Config

        config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[ref]
        options = {"tie_word_embeddings": True, **spec.config}
        config = config_cls(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
            **options,
        )
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        return model.to(dtype)
    kind, ref = model_dir(kind, ref)
    token = hf_token() if kind == "hf" else None
    model = AutoModelForCausalLM.from_pretrained(ref, dtype=dtype, token=token)
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))
    return model


def lora_config(method: Any, params: RunParameters) -> Any:
    """peft's LoraConfig for the blueprint (rank/alpha/dropout from the run's parameters, else the method's)."""
    from peft import LoraConfig

    return LoraConfig(
        r=method.rank if params.lora_rank is None else params.lora_rank,
        lora_alpha=method.alpha if params.lora_alpha is None else params.lora_alpha,
        lora_dropout=method.dropout if params.lora_dropout is None else params.lora_dropout,
        target_modules=list(method.target_modules),
        task_type="CAUSAL_LM",
    )


def check_lora_targets(model: Any, method: Any) -> None:
    """A one-line UserError when none of ``method.target_modules`` is a module of ``model`` (peft's own check,
    before a trainer that applies the adapters itself, as TRL's do, fails with a traceback)."""
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    if not names & set(method.target_modules):
        linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if type(m).__name__ == "Linear"})
        raise UserError(
            f"method.target_modules {', '.join(method.target_modules)}: not in this {model.config.model_type} model; "
            f"allowed: {', '.join(linear)}",
            field="method.target_modules",
        )


def apply_lora(model: Any, method: Any, params: RunParameters) -> Any:
    """Wrap ``model`` with LoRA adapters (:func:`lora_config`)."""
    from peft import get_peft_model

    check_lora_targets(model, method)
    return get_peft_model(model, lora_config(method, params))


def configure_generation(model: Any, tokenizer: Any, max_new_tokens: int) -> None:
    """Greedy decoding that stops at the tokenizer's EOS (and the model's own stop tokens)."""
    gen = model.generation_config
    eos = gen.eos_token_id
    eos_ids = list(eos) if isinstance(eos, list | tuple) else ([eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.insert(0, tokenizer.eos_token_id)
    gen.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    gen.pad_token_id = tokenizer.pad_token_id
    gen.do_sample = False
    gen.max_new_tokens = max_new_tokens
    for name in ("temperature", "top_p", "top_k"):  # sampling knobs would only warn with do_sample=False
        if hasattr(gen, name):
            setattr(gen, name, None)
    model.config.pad_token_id = tokenizer.pad_token_id
