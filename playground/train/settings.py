"""A run's training settings, torch-free: what the entrypoint validates before anything starts and what
``playground plan`` and ``playground data check`` read without loading the trainer.

One rule for a setting (:func:`resolve_setting`): the run's parameter > the blueprint's fixed ``training``
block > ``TRAINING_DEFAULTS`` (playground/blueprints/schema.py, the one place a default lives).
:class:`Settings` is every setting resolved and typed; :class:`BatchPlan` splits its global batch over
the processes; :func:`check_resume` holds a resumed run to what its checkpoint was trained with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from playground.blueprints import Blueprint
from playground.blueprints.schema import TRAINING_DEFAULTS
from playground.errors import UserError
from playground.run_request import RunParameters


def resolve_setting(blueprint: Blueprint, params: dict[str, Any], name: str) -> Any:
    """A training setting: the run's parameter > the blueprint's fixed ``training`` setting >
    ``TRAINING_DEFAULTS``. The trainer (:meth:`TrainSpec.setting`) and ``playground plan`` both ask this."""
    if name in params:
        return params[name]
    if name in blueprint.training:
        return blueprint.training[name]
    return TRAINING_DEFAULTS.get(name)


def default_warmup(max_steps: int) -> int:
    """Warmup steps when no setting gives them: 5% of ``max_steps``, at least 1, at most 100."""
    return min(100, max(1, max_steps // 20))


@dataclass(frozen=True)
class TrainSpec:
    """Everything a run needs, resolved and validated by the entrypoint (from its :class:`RunRequest`)."""

    blueprint: Blueprint
    params: RunParameters  # the run request's parameters, validated when it was read
    output: Path
    model_source: str
    dataset_source: str
    resume: bool = False

    def setting(self, name: str) -> Any:
        """Parameter > the blueprint's fixed training setting > TRAINING_DEFAULTS."""
        return resolve_setting(self.blueprint, self.params.as_dict(), name)

    @cached_property
    def settings(self) -> Settings:
        """Every setting resolved and typed, once per run (:meth:`Settings.from_spec`)."""
        return Settings.from_spec(self)


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's global batch is split: every rank runs ``micro_steps``
    micro-batches of ``micro_batch`` examples; ``micro_batch × micro_steps × world_size`` is
    always ``global_batch``."""

    global_batch: int
    micro_batch: int
    micro_steps: int


@dataclass(frozen=True)
class Settings:
    """The run's resolved training settings, one field per ``TRAINING_DEFAULTS`` entry (no defaults of
    their own: :meth:`from_spec` resolves every one)."""

    max_steps: int
    learning_rate: float
    warmup_steps: int
    weight_decay: float
    batch_size: int
    gradient_accumulation_steps: int
    seed: int
    log_every: int
    eval_every: int
    checkpoint_every: int
    packing: bool
    compile: bool
    cpu_bf16: bool
    average_last: float
    distributed: str
    max_seq_length: int
    num_train_examples: int | None
    num_eval_examples: int | None
    beta: float
    sft_weight: float
    num_generations: int
    max_completion_length: int
    temperature: float
    warm_start_steps: int
    sample_every: int

    # What a resumed run must keep (checked against the checkpoint): the data and its order (the seed;
    # the training rows, their tokenization and the held-out prompts kept out of them; the global
    # batch) and the learning-rate schedule. Everything else may change, notably the number of
    # processes, DDP/FSDP2 and how the global batch is split: a step sees the same examples and
    # computes the same update either way.
    RESUME_KEEPS = (
        "seed",
        "global_batch_size",
        "max_steps",
        "warmup_steps",
        "learning_rate",
        "max_seq_length",
        "num_train_examples",
        "num_eval_examples",
        "beta",
        "sft_weight",
        "num_generations",
        "max_completion_length",
        "warm_start_steps",
        "average_last",
    )
    RESUME_MAY_CHANGE = (
        "the number of GPUs/processes, DDP/FSDP2, the batch_size × gradient_accumulation_steps split "
        "and the log/eval/checkpoint cadence"
    )
    RESUME_HINTS = {"global_batch_size": "batch_size × gradient_accumulation_steps = {saved}"}

    @classmethod
    def from_spec(cls, spec: TrainSpec) -> Settings:
        """Every setting resolved (:func:`resolve_setting`) and typed; a one-line UserError for a
        ``distributed`` strategy that does not exist."""
        from playground.train.parallel import STRATEGIES

        max_steps = int(spec.setting("max_steps"))
        warmup = spec.setting("warmup_steps")
        distributed = str(spec.setting("distributed"))
        num_train, num_eval = spec.setting("num_train_examples"), spec.setting("num_eval_examples")
        if distributed == "fsdp" and spec.blueprint.method.objective != "sft":
            raise UserError(
                f"training setting 'distributed': 'fsdp' is not wired for {spec.blueprint.method.objective.upper()} "
                "(TRL's trainer runs one process or DDP under torchrun); allowed: auto, ddp",
                field="distributed",
            )
        if spec.setting("cpu_bf16") and spec.blueprint.method.objective != "sft":
            raise UserError(
                f"training setting 'cpu_bf16' is not wired for {spec.blueprint.method.objective.upper()} (TRL's "
                "trainer pads batches to every width, and oneDNN keeps a bf16 matmul per shape); allowed: false",
                field="cpu_bf16",
            )
        average_last = spec.setting("average_last")
        if isinstance(average_last, bool) or not isinstance(average_last, int | float) or not 0 <= average_last <= 1:
            raise UserError(
                f"training setting 'average_last': {average_last!r} is not allowed; allowed: a fraction of the steps "
                "from 0 (off: the last step's weights) to 1",
                field="average_last",
            )
        if average_last and spec.blueprint.method.objective != "sft":
            raise UserError(
                f"training setting 'average_last' is not wired for {spec.blueprint.method.objective.upper()} (TRL's "
                "trainer keeps no weight average); allowed: 0",
                field="average_last",
            )
        temperature = spec.setting("temperature")
        if not float(temperature) > 0:
            raise UserError(
                f"training setting 'temperature': {temperature!r} is not allowed; allowed: a number "
                "above 0 (GRPO samples its tries at it)",
                field="temperature",
            )
        if distributed not in STRATEGIES:
            raise UserError(
                f"training setting 'distributed': {distributed!r} is not allowed; allowed: {', '.join(STRATEGIES)}",
                field="distributed",
            )
        return cls(
            max_steps=max_steps,
            learning_rate=float(spec.setting("learning_rate")),
            warmup_steps=int(warmup) if warmup is not None else default_warmup(max_steps),
            weight_decay=float(spec.setting("weight_decay")),
            batch_size=int(spec.setting("batch_size")),
            gradient_accumulation_steps=int(spec.setting("gradient_accumulation_steps")),
            seed=int(spec.setting("seed")),
            log_every=max(1, int(spec.setting("log_every"))),
            eval_every=int(spec.setting("eval_every")),
            checkpoint_every=int(spec.setting("checkpoint_every")),
            packing=bool(spec.setting("packing")),
            cpu_bf16=bool(spec.setting("cpu_bf16")),
            average_last=float(average_last),
            compile=bool(spec.setting("compile")),
            distributed=distributed,
            max_seq_length=int(spec.setting("max_seq_length")),
            num_train_examples=None if num_train is None else int(num_train),
            num_eval_examples=None if num_eval is None else int(num_eval),
            beta=float(spec.setting("beta")),
            sft_weight=float(spec.setting("sft_weight")),
            num_generations=int(spec.setting("num_generations")),
            max_completion_length=int(spec.setting("max_completion_length")),
            temperature=float(temperature),
            warm_start_steps=int(spec.setting("warm_start_steps")),
            sample_every=int(spec.setting("sample_every")),
        )

    @property
    def first_averaged_step(self) -> int | None:
        """The first step whose weights enter the average (``average_last``), None when nothing is averaged."""
        tail = round(self.average_last * self.max_steps)
        return self.max_steps - tail + 1 if tail else None

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step, whatever the number of processes."""
        return self.batch_size * self.gradient_accumulation_steps

    def resume_config(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.RESUME_KEEPS}

    def plan(self, world_size: int) -> BatchPlan:
        """Split the fixed global batch over ``world_size`` processes, nanoGPT style: the
        accumulation steps divide first, then the micro-batch. A one-line UserError when the global
        batch cannot be split evenly."""
        accum, batch = self.gradient_accumulation_steps, self.batch_size
        split_accum = math.gcd(accum, world_size)
        split_batch = world_size // split_accum
        if batch % split_batch:
            raise UserError(
                f"batch_size={batch} × gradient_accumulation_steps={accum} = global batch {batch * accum} cannot be "
                f"split evenly over {world_size} processes; allowed: a global batch divisible by {world_size}",
                field="batch_size",
            )
        return BatchPlan(batch * accum, batch // split_batch, accum // split_accum)


def check_resume(spec: TrainSpec, settings: Settings) -> Path | None:
    """The checkpoint ``--resume`` continues from (None: none yet), after checking that the run
    keeps the seed, global batch and schedule it was trained with (a one-line UserError naming the
    first setting that changed). Reads JSON only: the entrypoint calls it before starting anything."""
    from playground.train import checkpoint

    if spec.blueprint.method.objective == "sft":
        latest, info_file = checkpoint.latest_checkpoint(spec.output / "checkpoints"), checkpoint.INFO_FILE
    else:  # DPO/GRPO: TRL's checkpoint-N, the settings in a file of ours beside them
        latest, info_file = checkpoint.latest_trl_checkpoint(spec.output), checkpoint.TRL_SETTINGS_FILE
    if latest is not None:
        checkpoint.check_resume(
            latest, settings.resume_config(), Settings.RESUME_MAY_CHANGE, Settings.RESUME_HINTS, info_file=info_file
        )
    return latest
