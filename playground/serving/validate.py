"""Check a model directory before serving it: a plain Hugging Face layout, or a PEFT LoRA adapter (what a LoRA
job saves), complete.

Light on purpose (JSON and safetensors headers only, no torch) so a bad directory is
reported in one line before any server process starts.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from playground.errors import UserError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def _fail(path: Path, message: str) -> UserError:
    return UserError(f"model directory {str(path)!r} {message}", field="model_dir")


def _read_json(path: Path, root: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _fail(root, f"has an unreadable {path.name} ({exc})") from None
    if not isinstance(data, dict):
        raise _fail(root, f"has an invalid {path.name} (not a JSON object)")
    return data


def _check_safetensors(path: Path, root: Path) -> None:
    """The header parses and the file is as long as the header says (catches truncated copies)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            if header_len > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(fh.read(header_len))
    except (OSError, ValueError, struct.error) as exc:
        raise _fail(root, f"has a corrupt {path.name} ({exc})") from None
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        raise _fail(root, f"has an incomplete {path.name} ({size} bytes, expected {8 + header_len + end})")


def check_model_dir(model_dir: str | Path, *, require_chat_template: bool = True) -> Path:
    """Raise a one-line :class:`UserError` naming what is missing; return the directory."""
    root = Path(model_dir).expanduser()
    if not root.exists():
        raise _fail(root, "does not exist")
    if not root.is_dir():
        raise _fail(root, "is not a directory")
    if (root / "adapter_config.json").is_file():
        return check_adapter_dir(root)
    if not (root / "config.json").is_file():
        raise _fail(root, "is missing config.json")
    config = _read_json(root / "config.json", root)
    if not config.get("architectures") and not config.get("model_type"):
        raise _fail(root, "has a config.json without 'architectures' or 'model_type'")

    index = root / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index, root).get("weight_map", {}).values()))
        for shard in shards:
            if not (root / shard).is_file():
                raise _fail(root, f"is missing weights file {shard} (listed in model.safetensors.index.json)")
            _check_safetensors(root / shard, root)
    elif (root / "model.safetensors").is_file():
        _check_safetensors(root / "model.safetensors", root)
    elif not any(root.glob("*.safetensors")) and not (root / "pytorch_model.bin").is_file():
        raise _fail(root, "is missing weights file model.safetensors")

    if not any((root / name).is_file() for name in TOKENIZER_FILES):
        raise _fail(root, "is missing tokenizer file tokenizer.json")
    tok_config = root / "tokenizer_config.json"
    if not tok_config.is_file():
        raise _fail(root, "is missing tokenizer file tokenizer_config.json")
    if require_chat_template:
        has_template = any((root / name).is_file() for name in CHAT_TEMPLATE_FILES)
        if not has_template and not _read_json(tok_config, root).get("chat_template"):
            raise _fail(root, "is missing chat template chat_template.jinja (or tokenizer_config.json 'chat_template')")
    return root


def check_adapter_dir(adapter_dir: str | Path) -> Path:
    """A LoRA adapter directory: ``adapter_config.json`` (a LoRA with its rank) and complete adapter weights."""
    root = Path(adapter_dir).expanduser()
    config = _read_json(root / "adapter_config.json", root)
    if str(config.get("peft_type", "LORA")).upper() != "LORA" or not isinstance(config.get("r"), int):
        raise _fail(root, "has an adapter_config.json that is not a LoRA adapter with a rank 'r'")
    weights = root / "adapter_model.safetensors"
    if not weights.is_file():
        raise _fail(root, "is missing weights file adapter_model.safetensors")
    _check_safetensors(weights, root)
    return root
