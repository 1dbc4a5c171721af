"""Resumable checkpoints: ``checkpoints/step-N/`` holds the trainable weights (the LoRA adapter
only, for LoRA), optimizer, scheduler, RNG states, the step, the data position and the settings the
run must keep (``config``: seed, global batch, schedule), which ``--resume`` checks.

Saving and loading are collectives: every rank calls them. Sharded (FSDP2) weights and optimizer
state are gathered into full tensors on rank 0's CPU (``DTensor.full_tensor`` and
``torch.distributed.checkpoint.state_dict`` with ``full_state_dict=True, cpu_offload=True``), and
only rank 0 writes, so a checkpoint is one plain file whatever the world size and strategy (a run
may resume on another number of GPUs). On load, rank 0 reads it and broadcasts to the other ranks
(``broadcast_from_rank0``), which shard what they receive, so only rank 0's node needs the files.

Each checkpoint is written to a temporary directory and renamed into place, so a crash while
saving never leaves a half checkpoint for ``--resume`` to trip over.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

from playground.errors import UserError

STATE_FILE = "state.pt"
INFO_FILE = "trainer_state.json"
TRL_SETTINGS_FILE = "playground_settings.json"  # DPO/GRPO: beside TRL's files in each checkpoint-N
FORMAT = 2  # 2: optimizer state keyed by parameter name (torch.distributed.checkpoint), "config" kept


def _trainable_state(model: Any, keep: bool = True) -> dict[str, Any]:
    """Full CPU copies of the trainable parameters (a collective for sharded ones: every rank
    gathers each one in turn; only where ``keep`` is the copy kept, so other ranks hold no full model)."""
    from torch.distributed.tensor import DTensor

    state = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            value = param.detach()
            if isinstance(value, DTensor):
                value = value.full_tensor()
            if keep:
                state[name] = value.cpu().clone()
    return state


def _full_options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def save_checkpoint(
    root: Path,
    *,
    step: int,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    data_position: dict[str, int],
    config: dict[str, Any],
    extra: dict[str, Any] | None = None,
    average: dict[str, Any] | None = None,
    main: bool = True,
    keep: int = 3,
) -> Path | None:
    """Gather and write ``root/step-N`` atomically (rank 0: ``main``); keep the ``keep`` newest.
    ``average``: the running weight average (``{"steps": n, "weights": {name: tensor}}``), kept beside the weights.
    Every rank must call it; returns the path on rank 0, None elsewhere."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    weights = _trainable_state(model, keep=main)
    optim_state = get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))
    if not main:
        return None
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
            "format": FORMAT,
            "step": step,
            "model": weights,
            "optimizer": optim_state,
            "scheduler": scheduler.state_dict(),
            "rng": rng,
            "data": data_position,
            "config": config,
            "extra": extra or {},
            **({"average": average} if average else {}),
        },
        tmp / STATE_FILE,
    )
    info = {"step": step, "data": data_position, "config": config, **(extra or {})}
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


def latest_trl_checkpoint(output: Path) -> Path | None:
    """The newest complete ``checkpoints/checkpoint-N`` of a TRL-run method (Hugging Face's layout; complete:
    the run's settings are written beside TRL's files, :data:`TRL_SETTINGS_FILE`)."""
    root = output / "checkpoints"
    found = [p for p in root.glob("checkpoint-*") if p.name[11:].isdigit() and (p / TRL_SETTINGS_FILE).exists()]
    return max(found, key=lambda p: int(p.name[11:]), default=None)


def check_resume(
    path: Path, config: dict[str, Any], allowed: str, hints: dict[str, str] | None = None, *, info_file: str = INFO_FILE
) -> None:
    """A one-line UserError naming the first setting of ``config`` that differs from the one the
    checkpoint at ``path`` was trained with (read from its JSON; no torch needed). ``allowed``
    says in the message what may change on resume; ``hints`` how to set a derived value
    (``{saved}`` is replaced by the checkpoint's value; default ``NAME={saved}``)."""
    try:
        saved = json.loads((path / info_file).read_text()).get("config")
    except (OSError, ValueError):
        return  # an unreadable checkpoint fails clearly when it is loaded
    if saved is None:
        raise UserError(
            f"resume: {path} was written by an older trainer and records no settings to check; start a fresh --output",
            field="resume",
        )
    for name, value in config.items():
        if name in saved and saved[name] != value:
            fix = (hints or {}).get(name, f"{name}={{saved}}").format(saved=saved[name])
            raise UserError(
                f"resume: {name}={value} differs from {saved[name]} in {path.parent.name}/{path.name}; a resumed run "
                f"keeps {', '.join(config)} ({allowed} may change); set {fix} or use a fresh --output",
                field=name,
            )


def load_checkpoint(
    path: Path | None, *, model: Any, optimizer: Any, scheduler: Any, world_size: int = 1, main: bool = True
) -> dict[str, Any] | None:
    """Restore what :func:`save_checkpoint` wrote into ``model`` (sharded or not), ``optimizer``,
    ``scheduler`` and the RNGs; returns the rest (step, data, config, extra). Every rank calls it;
    rank 0 reads ``path`` (the other ranks may pass None) and broadcasts. Returns None when there
    is no checkpoint."""
    import torch
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state: dict[str, Any] | None = None
    error = ""
    if main and path is not None:
        try:
            state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
            if not isinstance(state, dict) or state.get("format") != FORMAT:
                raise RuntimeError(f"checkpoint {path} is not in this trainer's format {FORMAT}")
            params = {name for name, p in model.named_parameters() if p.requires_grad}
            if set(state["model"]) != params:
                name = next(iter(set(state["model"]) ^ params))
                raise RuntimeError(f"checkpoint {path} does not match the model (e.g. {name})")
        except Exception as exc:  # every rank fails the same way, none waits forever
            error = f"{type(exc).__name__}: {exc}"
    meta = None if state is None else {k: v for k, v in state.items() if k not in ("model", "optimizer")}
    if world_size > 1:
        box = [error, meta]
        torch.distributed.broadcast_object_list(box, src=0)
        error, meta = box
    if error:
        raise RuntimeError(f"cannot resume: {error}")
    if meta is None:
        return None
    shared = {"broadcast_from_rank0": True} if world_size > 1 else {}
    weights = state["model"] if state else {}
    set_model_state_dict(model, weights, options=_full_options(strict=False, **shared))
    set_optimizer_state_dict(model, optimizer, state["optimizer"] if state else {}, options=_full_options(**shared))
    scheduler.load_state_dict(meta["scheduler"])
    random.setstate(meta["rng"]["python"])
    torch.set_rng_state(meta["rng"]["torch"])
    if "cuda" in meta["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(meta["rng"]["cuda"])
    return meta
