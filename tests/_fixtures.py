"""Small fixtures several test files need: tiny-llama-cpu's held-out prompts, a catalog blueprint file with a
field changed, a localhost port nothing listens on."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from playground.train.data import Sample


def tiny_held_out(n: int) -> list[Sample]:
    """The first ``n`` of tiny-llama-cpu's held-out samples (prompt, answer), as its trainer draws them: never
    trained on. The held-out split depends on neither the training rows nor the seed."""
    from playground.blueprints import get_blueprint
    from playground.train.data import synthetic_splits

    blueprint = get_blueprint("tiny-llama-cpu")
    task = blueprint.dataset.source.split("://", 1)[1]
    return synthetic_splits(task, dict(blueprint.dataset.options), num_train=0, num_eval=n, seed=0)[1]


def catalog_variant(directory: Path, blueprint_id: str, changes: Mapping[str, Any]) -> Path:
    """The catalog's ``blueprint_id`` with ``changes`` (dotted keys: ``{"id": "x", "method.kind": "qlora"}``),
    written as ``directory/<its id>.yaml`` (the directory made if missing); the file's path."""
    from playground.blueprints.loader import CATALOG_DIR

    data = yaml.safe_load((CATALOG_DIR / f"{blueprint_id}.yaml").read_text())
    for key, value in changes.items():
        *parents, leaf = key.split(".")
        node = data
        for name in parents:
            node = node[name]
        node[leaf] = value
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{data['id']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def unused_port() -> int:
    """A localhost port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
