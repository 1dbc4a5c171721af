"""Model directories that load the same on every serving runtime: transformers 5.x and the 4.x that KServe's
HuggingFace runtime images still ship (checked on 4.57.x by :mod:`playground.models.fidelity`).

transformers 5 writes the RoPE settings only in ``rope_parameters``; 4.x never reads that block and silently
falls back to ``rope_theta`` 10000 (SmolLM2's is 100000: different answers). :func:`make_portable` rewrites
the JSON files of a freshly written directory so both major versions read every field the model needs:

* ``config.json``: ``rope_theta`` (and ``partial_rotary_factor``) at top level as well, and 4.x's
  ``rope_scaling`` for a scaled RoPE type (llama3, yarn, ...; 5.x reads it as the same ``rope_parameters``);
  loader-only keys dropped (``_model_name_or_path`` holding a GGUF file's internal name, ...).
* ``generation_config.json``: the BOS/EOS/pad ids, from ``config.json`` where it lacks them.
* ``tokenizer_config.json``: load-time settings dropped (``is_local``, ``local_files_only``, ``backend``...).

then makes it readable by a server running under another uid: directories 0755, files 0644. A PEFT adapter
directory (``adapter_config.json``, no ``config.json``: a LoRA job's ``model/``) gets the tokenizer and mode steps.
:func:`publish` does all of it to a temporary directory and renames it into place (atomic).
Light to import (stdlib only).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

# Written by a loader about where it loaded from, not settings of the model: never shipped.
LOADER_ONLY_CONFIG_KEYS = frozenset(
    {"_model_name_or_path", "_name_or_path", "name_or_path", "_commit_hash", "_attn_implementation_autoset"}
)
LOADER_ONLY_TOKENIZER_KEYS = frozenset(
    {
        "is_local",
        "local_files_only",
        "backend",
        "name_or_path",
        "_commit_hash",
        "cache_dir",
        "force_download",
        "proxies",
        "token",
        "use_auth_token",
        "revision",
        "subfolder",
        "trust_remote_code",
        "gguf_file",
        "_from_auto",
    }
)
SPECIAL_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
# rope_parameters keys 4.x reads at the config's top level rather than inside rope_scaling
_TOP_LEVEL_ROPE_KEYS = ("rope_theta", "partial_rotary_factor")


def _text_configs(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The config and its nested text config (multimodal layouts), where the RoPE settings live."""
    nested = config.get("text_config")
    return [config] + ([nested] if isinstance(nested, dict) else [])


def portable_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` that transformers 4.x and 5.x read alike (see the module docstring)."""
    config = {k: v for k, v in config.items() if k not in LOADER_ONLY_CONFIG_KEYS}
    for part in _text_configs(config):
        rope = part.get("rope_parameters")
        if not isinstance(rope, dict) or "rope_theta" not in rope:
            continue  # none, or nested per layer type (4.x has no equivalent: left as it is)
        for key in _TOP_LEVEL_ROPE_KEYS:
            if key in rope:
                part[key] = rope[key]
        scaling = {k: v for k, v in rope.items() if k not in _TOP_LEVEL_ROPE_KEYS}
        if scaling.get("rope_type", "default") == "default":
            part.pop("rope_scaling", None)  # 4.x: None means the default RoPE
        else:
            part["rope_scaling"] = scaling
    return config


def portable_generation_config(generation: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """``generation_config.json`` with the special token ids, taken from ``config.json`` where missing."""
    generation = dict(generation)
    for key in SPECIAL_TOKEN_IDS:
        if generation.get(key) is None and config.get(key) is not None:
            generation[key] = config[key]
    return generation


def portable_tokenizer_config(tokenizer_config: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer_config.json`` without the settings of the load that produced it."""
    return {k: v for k, v in tokenizer_config.items() if k not in LOADER_ONLY_TOKENIZER_KEYS}


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def make_portable(directory: str | Path) -> Path:
    """Rewrite a model directory's JSON files for every transformers version, then make it readable."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if config_path.is_file():  # absent in a PEFT adapter directory: its base model carries the config
        config = portable_config(_read(config_path))
        _write(config_path, config)
        generation_path = directory / "generation_config.json"
        generation = _read(generation_path) if generation_path.is_file() else {}
        _write(generation_path, portable_generation_config(generation, config))
    tokenizer_path = directory / "tokenizer_config.json"
    if tokenizer_path.is_file():
        _write(tokenizer_path, portable_tokenizer_config(_read(tokenizer_path)))
    make_readable(directory)
    return directory


def make_readable(directory: str | Path) -> None:
    """Directories 0755, files 0644: a model server running under another uid (a KServe pod, another user
    sharing the model cache) can read the weights (safetensors and tempfile-based writers create 0600)."""
    for root, _dirs, files in os.walk(directory):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


def portability_problems(directory: str | Path) -> list[str]:
    """What would make ``directory`` load differently on transformers 4.x and 5.x (empty: nothing)."""
    directory = Path(directory)
    problems: list[str] = []
    config = _read(directory / "config.json") if (directory / "config.json").is_file() else {}  # {}: an adapter
    for part in _text_configs(config):
        rope = part.get("rope_parameters")
        if isinstance(rope, dict) and "rope_theta" in rope and part.get("rope_theta") != rope["rope_theta"]:
            problems.append(f"config.json: rope_theta {part.get('rope_theta')} != rope_parameters {rope['rope_theta']}")
    problems += [f"config.json: loader-only key {k}" for k in sorted(LOADER_ONLY_CONFIG_KEYS & set(config))]
    tokenizer_path = directory / "tokenizer_config.json"
    if tokenizer_path.is_file():
        keys = LOADER_ONLY_TOKENIZER_KEYS & set(_read(tokenizer_path))
        problems += [f"tokenizer_config.json: loader-only key {k}" for k in sorted(keys)]
    generation_path = directory / "generation_config.json"
    generation = _read(generation_path) if generation_path.is_file() else {}
    problems += [
        f"generation_config.json: {key} missing (config.json has {config[key]})"
        for key in SPECIAL_TOKEN_IDS
        if config.get(key) is not None and generation.get(key) is None
    ]
    for root, _dirs, files in os.walk(directory):
        for path in [Path(root)] + [Path(root) / name for name in files]:
            mode, wanted = stat.S_IMODE(path.stat().st_mode), 0o755 if path.is_dir() else 0o644
            if mode != wanted:
                problems.append(f"{path.relative_to(directory) or '.'}: mode {mode:o}, expected {wanted:o}")
    return problems


def fsync_tree(directory: Path) -> None:
    """Flush every file of ``directory`` and the directory itself to disk."""
    for path in directory.iterdir():
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_sibling(target: Path) -> Path:
    """A fresh, empty temporary directory next to ``target`` (same filesystem: the rename is atomic)."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish(tmp: Path, target: Path) -> Path:
    """Make the model directory written in ``tmp`` portable and readable, then rename it to ``target``
    (replacing an older one), so ``target`` exists only when complete."""
    make_portable(tmp)
    fsync_tree(tmp)
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(target)
    return target
