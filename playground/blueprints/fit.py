"""Can a blueprint train here? One rule, one wording: the catalog table, the app's cards, the
local backend's refusal and the trainer's own check all ask :func:`local_fit`.

The rule: a blueprint that needs no GPU runs anywhere; one that needs GPUs runs where at least
that many are found, or on CPU when a local model directory replaces its hub model (the small
stand-ins the tests and the smoke e2e profile use). ``PLAYGROUND_GPU_COUNT`` replaces the count found on
this machine (:func:`gpu_count_override`): ``0`` makes a GPU machine refuse as one without GPUs does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from playground.blueprints.schema import Blueprint, parse_number
from playground.errors import UserError, shown

GPU_COUNT_SETTING = "PLAYGROUND_GPU_COUNT"


def gpu_count_override(env: Mapping[str, str] | None = None) -> int | None:
    """``PLAYGROUND_GPU_COUNT``: the GPUs to take this machine as having, instead of those detected (None: unset).

    Every count of this machine's GPUs reads it first: the local backend's and the trainer's fit check, the
    plan, the e2e ``gpu`` profile's check. A bad value is a one-line UserError naming the setting."""
    raw = (os.environ if env is None else env).get(GPU_COUNT_SETTING)
    if raw is None or not raw.strip():
        return None
    try:
        count = int(parse_number(raw, integer=True))
    except ValueError:
        count = -1
    if count < 0:
        raise UserError(
            f"{GPU_COUNT_SETTING}: {shown(raw)} is not a GPU count; allowed: an integer >= 0 (unset: detect them)",
            field=GPU_COUNT_SETTING,
        )
    return count


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


@dataclass(frozen=True)
class LocalFit:
    """Whether ``blueprint_id`` can train on a machine with ``have`` GPUs, and how many trainer processes."""

    blueprint_id: str
    need: int  # GPUs per node the blueprint asks for
    have: int  # GPUs found on this machine
    stand_in: bool = False  # a local model directory replaces the blueprint's model

    @property
    def runnable(self) -> bool:
        return self.need <= 0 or self.stand_in or self.have >= self.need

    @property
    def processes(self) -> int:
        """Trainer processes to start: one per GPU used, one on CPU."""
        if self.need <= 0:
            return 1
        return max(1, min(self.need, self.have)) if self.stand_in else self.need

    @property
    def note(self) -> str:
        """A few words for tables and cards: ``runs here (CPU)``, ``needs 1 GPU and this machine has none``."""
        if self.need <= 0:
            return "runs here (CPU)"
        if self.have >= self.need:
            return f"runs here ({_gpus(self.have)})"
        if self.stand_in:
            return "runs here with the local stand-in model"
        return f"needs {_gpus(self.need)} and this machine has {self.have or 'none'}"

    def advice(self) -> str:
        """The note plus what to do instead: ``…; try 'tiny-llama-cpu' (runs on CPU) or the kubernetes backend``."""
        if self.runnable:
            return self.note
        from playground.blueprints.loader import load_catalog

        catalog = load_catalog()
        refused = catalog.get(self.blueprint_id)
        objective = refused.method.objective if refused else "sft"
        # CPU blueprints of the same method (SFT, DPO, GRPO) first, in catalog order
        runnable = sorted(
            (bp for bp in catalog.values() if not bp.needs_gpu), key=lambda bp: bp.method.objective != objective
        )
        cpu = [bp.id for bp in runnable][:2]
        instead = " or ".join(f"{i!r}" for i in cpu)
        return self.note + (f"; try {instead} (runs on CPU) or" if cpu else "; use") + " the kubernetes backend"

    def check(self) -> None:
        """Raise the one-line UserError (field ``blueprint``) when the blueprint cannot train here."""
        if not self.runnable:
            raise UserError(f"blueprint {self.blueprint_id!r} {self.advice()}", field="blueprint")


def local_fit(blueprint: Blueprint, gpus: int, *, model_source: str | None = None) -> LocalFit:
    """Can ``blueprint`` train on a machine with ``gpus`` GPUs, given a ``model_source`` override?"""
    stand_in = bool(model_source) and "://" not in str(model_source)
    return LocalFit(blueprint.id, blueprint.resources.gpus_per_node, gpus, stand_in)
