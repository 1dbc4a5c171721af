"""Resumable checkpoints: ``checkpoints/step-N/`` holds the trainable weights (the LoRA adapter
only, for LoRA), optimizer, scheduler, RNG states, the step and the data position.

Each checkpoint is written to a temporary directory and renamed into place, so a crash while
saving never leaves a half checkpoint for ``--resume`` to trip over.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

STATE_FILE = "state.pt"
INFO_FILE = "trainer_state.json"


def _trainable_state(model: Any) -> dict[str, Any]:
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(
    root: Path,
    *,
    step: int,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    data_position: dict[str, int],
    extra: dict[str, Any] | None = None,
    keep: int = 3,
) -> Path:
    """Write ``root/step-N`` atomically and keep the ``keep`` newest checkpoints."""
    import torch

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(
        {
            "step": step,
            "model": _trainable_state(model),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng,
            "data": data_position,
            "extra": extra or {},
        },
        tmp / STATE_FILE,
    )
    info = {"step": step, "data": data_position, **(extra or {})}
    (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if (p / STATE_FILE).exists() and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_checkpoint(path: Path, *, model: Any, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """Restore everything saved by :func:`save_checkpoint`; returns the raw state (step, data, extra)."""
    import torch

    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    params = dict(model.named_parameters())
    missing = [name for name in state["model"] if name not in params]
    if missing:
        raise RuntimeError(f"checkpoint {path} does not match the model (e.g. {missing[0]})")
    with torch.no_grad():
        for name, value in state["model"].items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    random.setstate(state["rng"]["python"])
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state
