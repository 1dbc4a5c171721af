"""A blueprint of your own: another blueprint's recipe on your model and your data, checked before it is
saved, and saved as a YAML file that the catalog (``$PLAYGROUND_HOME/blueprints`` or
``PLAYGROUND_BLUEPRINTS``), ``playground train FILE.yaml`` and the app load unchanged. Torch-free."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from playground.blueprints.schema import Blueprint, Example, QualitySpec
from playground.errors import UserError, shown, shown_path

# The linear layers LoRA can wrap, per model family (names as in transformers' modeling files).
_LLAMA_LIKE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LINEAR_MODULES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
         "smollm3", "olmo", "olmo2", "granite", "cohere", "starcoder2_llama"),
        _LLAMA_LIKE,
    ),
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    "phi": ("q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"),
    "gpt2": ("c_attn", "c_proj", "c_fc"),
    "gpt_neox": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
    "falcon": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
    "opt": ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"),
    "gptj": ("q_proj", "k_proj", "v_proj", "out_proj", "fc_in", "fc_out"),
}  # fmt: skip
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
QUALITY_FORM = re.compile(r"^\s*([a-z_]+)\s*(>=|<=)\s*([0-9.eE+-]+)\s*$")


@dataclass
class ArchitectureCheck:
    model_type: str | None
    target_modules: list[str]  # what LoRA will wrap (the blueprint's, or the family's when those are absent)
    notes: list[str] = field(default_factory=list)


def _model_config(source: str, base: Blueprint) -> tuple[dict[str, Any] | None, str]:
    """(the model's config.json as a dict, or None where it cannot be read here, and why)."""
    if source.startswith("scratch://"):
        from playground.train.model import parse_source

        parse_source(source)
        return {
            "model_type": source.removeprefix("scratch://"),
            "architectures": ["ForCausalLM"],
            **base.model.config,
        }, ""
    if source.startswith("pkg://"):
        from playground.blueprints.plan import _gguf_config
        from playground.models import packaged

        packaged.check(source)
        converted = packaged.find_converted(source)
        if converted is not None:
            return json.loads((converted / "config.json").read_text()), ""
        return {**_gguf_config(packaged.locate(source).file), "architectures": ["ForCausalLM"]}, ""
    if source.startswith("hf://"):
        from playground.train.model import parse_source

        _, repo = parse_source(source)
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(repo, "config.json")
        except ImportError:
            cached = None
        if isinstance(cached, str):
            return json.loads(Path(cached).read_text()), ""
        return None, f"the config of {source} is not in the local hub cache: the trainer checks it when the job starts"
    path = Path(source).expanduser()
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UserError(
            f"model source {shown_path(source)}: not a model directory (no config.json there); allowed: "
            "hf://ORG/NAME, a local Hugging Face model directory, pkg://DISTRIBUTION/FILE or scratch://ARCH",
            field="model",
        )
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise UserError(
            f"model source {shown_path(source)}: no tokenizer there (tokenizer.json / tokenizer_config.json); "
            "allowed: a directory saved with save_pretrained for both the model and its tokenizer",
            field="model",
        )
    try:
        return json.loads(config_file.read_text()), ""
    except json.JSONDecodeError as exc:
        raise UserError(
            f"model source {shown_path(source)}: config.json is not valid JSON ({exc.msg})", field="model"
        ) from None


def check_architecture(
    source: str, base: Blueprint, *, method: str | None = None, target_modules: list[str] | None = None
) -> ArchitectureCheck:
    """Whether the trainer can train ``source`` (a causal language model; LoRA targets that exist in it);
    a one-line UserError naming the model and what is allowed when it cannot."""
    config, why = _model_config(source, base)
    kind = method or base.method.kind
    wanted = list(target_modules or base.method.target_modules)
    if config is None:
        return ArchitectureCheck(None, wanted, [why])
    config = config.get("text_config", config) if "architectures" not in config else config
    model_type = str(config.get("model_type") or "")
    architectures = [str(a) for a in config.get("architectures") or []]
    if config.get("is_encoder_decoder") or (
        architectures and not any(a.endswith(CAUSAL_SUFFIXES) for a in architectures)
    ):
        what = ", ".join(architectures) or model_type or "?"
        raise UserError(
            f"model source {shown_path(source)}: {what} is not a causal language model, which is what the trainer "
            "fine-tunes; allowed: a decoder-only model (…ForCausalLM: Llama, Qwen2, Mistral, Gemma, Phi-3, GPT-2…)",
            field="model",
        )
    check = ArchitectureCheck(model_type or None, wanted)
    if kind != "lora":
        return check
    known = LINEAR_MODULES.get(model_type)
    if known is None:
        check.notes.append(f"LoRA targets of model type {model_type or '?'!r} are checked when the job starts")
        return check
    missing = [t for t in wanted if t not in known]
    if missing and target_modules:
        raise UserError(
            f"target_modules {', '.join(missing)}: not in a {model_type} model; allowed: {', '.join(known)}",
            field="method.target_modules",
        )
    if missing:
        check.target_modules = list(known)
        check.notes.append(f"LoRA on every linear layer of the {model_type} model: {', '.join(known)}")
    return check


def parse_quality(text: str) -> QualitySpec:
    """``eval_exact_match>=0.6`` or ``eval_loss<=1.2`` → the quality bar."""
    match = QUALITY_FORM.match(text or "")
    metrics = ("eval_exact_match", "eval_loss")
    if not match or match.group(1) not in metrics:
        raise UserError(
            f"--quality {shown(text)}: expected METRIC>=VALUE or METRIC<=VALUE; allowed metrics: {', '.join(metrics)}",
            field="quality",
        )
    try:
        threshold = float(match.group(3))
    except ValueError:
        raise UserError(f"--quality {shown(text)}: {match.group(3)!r} is not a number", field="quality") from None
    return QualitySpec(metric=match.group(1), threshold=threshold, higher_is_better=match.group(2) == ">=")


def _examples(blueprint: Blueprint, dataset_source: str, columns: Mapping[str, str]) -> list[Example]:
    """Up to 3 single-turn rows of the file as the chat panel's examples (with the expected answers)."""
    from playground.userdata.shapes import read_conversations

    _, conversations = read_conversations(dataset_source, columns=columns)
    single = [c for c in conversations if len(c) == 2] or conversations
    return [Example(prompt=c[-2]["content"], expected=c[-1]["content"]) for c in single[-3:]]


def make_custom(
    base: Blueprint,
    blueprint_id: str,
    *,
    title: str | None = None,
    model_source: str | None = None,
    dataset_source: str | None = None,
    columns: Mapping[str, str] | None = None,
    eval_source: str | None = None,
    method: str | None = None,
    target_modules: list[str] | None = None,
    quality: str | None = None,
) -> tuple[Blueprint, list[str]]:
    """``base``'s recipe on another model and/or dataset, every input checked: (the blueprint, notes)."""
    from playground.userdata import check_dataset
    from playground.userdata.check import is_local_file
    from playground.userdata.shapes import check_columns

    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,62}", blueprint_id or ""):
        raise UserError(
            f"id {shown(blueprint_id)}: allowed: 2-63 characters of a-z, 0-9, '.' and '-' (first a letter or digit)",
            field="id",
        )
    if method not in (None, "lora", "full"):
        raise UserError(f"--method {shown(method)}: allowed: lora, full", field="method")
    model = model_source or base.model.source
    arch = check_architecture(model, base, method=method, target_modules=target_modules)
    data = base.model_dump(mode="json", exclude_defaults=True)
    data["id"] = blueprint_id
    if model != base.model.source:
        data["model"] = {"source": _absolute(model)}
        if model.startswith("scratch://") and base.model.source.startswith("scratch://"):
            data["model"] = {**base.model.model_dump(mode="json", exclude_defaults=True), "source": model}
    data["method"] = {**data["method"], "kind": method or base.method.kind, "target_modules": arch.target_modules}
    notes = list(arch.notes)
    if dataset_source is not None:
        if not is_local_file(dataset_source) and not dataset_source.startswith("hf://"):
            raise UserError(
                f"dataset {shown_path(dataset_source)}: allowed: a .jsonl/.json/.csv/.parquet file or hf://ORG/NAME",
                field="dataset",
            )
        data["dataset"] = {
            "source": _absolute(dataset_source),
            "format": "auto",
            **({"columns": check_columns(columns)} if columns else {}),
            **({"eval_source": _absolute(eval_source)} if eval_source else {}),
        }
        data.setdefault("description", "")
        data["description"] = f"{base.title} recipe on your data ({Path(dataset_source).name})."
    name = Path(model.rstrip("/")).name if "://" not in model else model.rstrip("/").split("/")[-1]
    how = "LoRA" if (method or base.method.kind) == "lora" else "full"
    data["title"] = title or f"{name} · {how} · {Path(dataset_source).stem if dataset_source else base.task}"
    if quality:
        data["quality"] = parse_quality(quality).model_dump(mode="json")
    blueprint = Blueprint.model_validate(data)
    if dataset_source is not None and is_local_file(dataset_source):
        report = check_dataset(blueprint, {}, model_source=model)
        notes += report.notes if report else []
        blueprint = blueprint.model_copy(update={"examples": _examples(blueprint, dataset_source, columns or {})})
    return blueprint, notes


def _absolute(source: str) -> str:
    return source if "://" in source else str(Path(source).expanduser().resolve())


def blueprint_yaml(blueprint: Blueprint) -> str:
    """The YAML text the loader reads back into an equal blueprint (defaults left out)."""
    data = blueprint.model_dump(mode="json", exclude_defaults=True)
    data["examples"] = [e.model_dump(mode="json", exclude_none=True) for e in blueprint.examples]
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def custom_dir() -> Path:
    """Where saved blueprints go by default; part of the catalog (see ``loader.catalog_dirs``)."""
    from playground.paths import playground_home

    return playground_home() / "blueprints"


def save_blueprint(blueprint: Blueprint, directory: str | Path | None = None, *, overwrite: bool = False) -> Path:
    """Write ``<directory>/<id>.yaml`` atomically (default: :func:`custom_dir`); returns the path."""
    from playground.blueprints.loader import CATALOG_DIR, load_catalog
    from playground.paths import ensure_writable_dir

    target_dir = ensure_writable_dir(
        Path(directory).expanduser() if directory else custom_dir(), what="blueprint directory"
    )
    target = target_dir / f"{blueprint.id}.yaml"
    shipped = (CATALOG_DIR / f"{blueprint.id}.yaml").exists()
    if shipped or (not overwrite and (target.exists() or blueprint.id in load_catalog())):
        raise UserError(
            f"id {blueprint.id!r}: a blueprint with that id already exists; allowed: a new id"
            + ("" if shipped else " (or --overwrite)"),
            field="id",
        )
    fd, tmp = tempfile.mkstemp(dir=target_dir, prefix=f".{blueprint.id}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(blueprint_yaml(blueprint))
    os.replace(tmp, target)
    from playground.blueprints.loader import _load_dirs

    _load_dirs.cache_clear()  # the catalog sees the new file
    return target
