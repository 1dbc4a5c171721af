"""Will a run fit, and how long will it take? ``playground plan`` and the app's plan panel ask :func:`make_plan`.

Torch-free (a visitor's kernel may call it): the model's size comes from its ``config.json`` (or the
GGUF header of a packaged model, or the hub architectures the project knows), never from weights.

**Memory per device** (bytes) = framework + weights + gradients + optimizer state + activations:

* framework: what the trainer process holds besides the model (Python, torch, transformers, peft, the data,
  MLflow when runs are tracked): measured here by a run of the trainer on a 0.8M-parameter model
  (``FRAMEWORK_BYTES`` + ``TRACKING_BYTES``), or by an earlier run of the same blueprint when there is one;
  on a GPU, the CUDA context and the allocator's slack instead (``CUDA_CONTEXT_BYTES``).
* weights: parameters × bytes of the training dtype (float32 on CPU; bf16 for pretrained models on a
  GPU); the peak comes during training, after the checkpoint's file pages are released. With ``cpu_bf16``,
  plus oneDNN's bf16 matmuls per row shape the run meets (``CPU_BF16_BYTES_PER_SHAPE``, measured).
* gradients and AdamW's two moments: trainable parameters × bytes each (LoRA adapters train in fp32), and with
  ``average_last`` the weight average's float32 copy of them (counted with the optimizer state).
  DDP replicates them; FSDP2 divides weights, gradients and optimizer state by the processes.
* activations kept for the backward pass of a Llama/Qwen2 decoder layer, per token:
  ``4·hidden + 3·q_width + 3·kv_width + 4·intermediate`` values (norm inputs and outputs, q/k/v before
  and after RoPE, attention output, MLP gate/up/activation/product), ``4·hidden`` for the norms' fp32
  copies, ``3·(q_width + kv_width)`` for RoPE's intermediates, and ``2·out`` per LoRA-adapted projection
  (the adapter's output and its scaled copy), times layers, times the tokens of a
  micro-batch (micro-batch × padded width: a previous run's measured width, else ``max_seq_length``,
  an upper bound), plus the logits of the answer positions (the trainer projects only those).

**Time**: from the step rate of the most similar earlier run on this machine (same blueprint and model,
else any run: its measured FLOP/s), scaled by the FLOPs per step (:mod:`playground.train.flops`); with no
earlier run, from the FLOPs and a stated throughput (``PLAYGROUND_PEAK_FLOPS``, else the table below),
said so in the plan. The total (``Plan.seconds``, what booth deadlines are sized from) is a breakdown
(:class:`TimeBreakdown`): start-up (process, imports, model load, the base model's answers), training, evaluation
(held-out loss and greedy answers: FLOPs at the training rate plus a fixed cost per generate() forward) and saving,
each from the matched run when there is one, else modelled. **Load**: a CPU run shares the cores with whatever
else runs (:func:`machine_load`: the 1-minute load average, or this home's running trainers if more); with ``busy``
cores wanted by others and ``threads`` wanted by the run on ``cores``, training and evaluation take
``max(1, (busy + threads) / cores)`` times as long as on an idle machine (fair sharing: tiny-llama-cpu runs on 2 cores
beside other work got 3.1×, 3.4×, 6.0×, 7.2×, 4.2×, 2.1× less CPU than idle where the load average over the run said
3.0×, 4.5×, 5.4×, 5.5×, 4.2×, 2.1×); start-up and saving, one thread that also waits on the disk, less
(``SINGLE_THREAD_CONTENTION``). A run records the factor it trained under, from the CPU it got (``load_factor`` in
metrics.json: threads × wall / CPU seconds), so a basis measured under load is scaled back to an idle machine first.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from playground.blueprints.schema import Blueprint
from playground.errors import UserError, shown_path

GiB = 2**30
# Measured (benchmarks/plan_vs_measured.py): the trainer's peak RSS on the 0.8M-parameter tiny-llama-cpu
# model, torch 2.13 CPU + transformers 5, is 0.57 GB (the imports alone: 0.39 GB); logging the run to
# MLflow (playground/runs) adds about 0.15 GB (mlflow, SQLAlchemy, the logging thread).
FRAMEWORK_BYTES = int(0.53 * GiB)
TRACKING_BYTES = int(0.14 * GiB)
CUDA_CONTEXT_BYTES = int(0.6 * GiB)
GPU_ALLOCATOR_SLACK = 1.10  # the caching allocator reserves more than it hands out
# Stated when nothing on this machine was measured: sustained fp32 FLOP/s of one CPU core running the
# trainer (measured here: 54e9 per core on SmolLM2 LoRA; tiny-llama-cpu 37e9 in issue 21, 51e9 on 2026-12-07 scaled
# back to an idle machine by the CPU the run got; at 40e9 the plans before any run were 1.3-1.4× pessimistic), and
# the share of a GPU's bf16 peak a run reaches.
CPU_CORE_FLOPS = 50e9
# A blueprint with the cpu_bf16 setting on a CPU with bf16 instructions trains this much faster (SmolLM2-135M LoRA,
# 2 cores of an AMD EPYC with AVX512-BF16: 1.83 → 0.95 s per step; benchmarks/README.md).
CPU_BF16_SPEEDUP = 1.9
# ... and keeps, per row shape it meets, bf16 matmuls with their own copies of the weights: SmolLM2-135M LoRA, 40 steps
# of batch 8 on 2 cores, bf16 over float32: +0.13 GB padded (4 widths), +0.43 GB packed (~16 row widths).
CPU_BF16_BYTES_PER_SHAPE = int(0.027 * GiB)
GPU_ASSUMED_MFU = 0.35
ASSUMED_SETUP_SECONDS = {"cpu": 8.0, "gpu": 60.0}  # tiny-llama-cpu on an idle 2-core machine: 8.5 s to its 1st step
# a pretrained model's load and conversion check (the base answers are modelled apart): SmolLM2-135M's start-up took
# 44 s on an idle machine, 20 of them its 50 base answers
PRETRAINED_SETUP_FACTOR = 3.0
# Start-up and saving (one thread, and waits on the disk and on child processes) slow down less than training beside
# the same load: tiny-llama-cpu, 2 cores, load 7.9 / 9.2 / 10.2: start-up 2.3× / 3.3× / 2.4×, saving 2.1× / 4.4× / 2.1×
# the idle times (8.5 s, 2.2 s), where fair sharing with every busy core says 4.4× / 5.1× / 5.6×.
SINGLE_THREAD_CONTENTION = 0.45
# Stated until a run of the blueprint is measured here (2 cores, issue 62): one generate() forward's fixed cost
# (Python, the cache, greedy picking: the held-out answers are a few dozen small forwards per batch of 64), and the
# save (model/ and metrics.json, then the supervisor's wrap-up: the MLflow run, the status file).
DECODE_FORWARD_SECONDS = {"cpu": 0.005, "gpu": 0.03}
ASSUMED_SAVE_SECONDS = {"cpu": 3.0, "gpu": 15.0}
SAVE_BYTES_PER_SECOND = 200e6
GENERATE_BATCH = 64  # prompts per generate() call (playground.train.evaluate.GENERATE_BATCH)
ASSUMED_GPU_MEMORY = 80 * GiB  # a GPU the blueprint asks for, when this machine has none to ask
# Before a model's tokenizer is on disk: characters per token of a BPE tokenizer on English chat text
# (SmolLM2's on the kubectl task, its ChatML markers included: 4.3).
CHARS_PER_TOKEN = 4.0

_METRICS = "metrics.json"


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer's dimensions (Llama / Qwen2 / Mistral shapes)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool
    qkv_bias: bool
    source: str  # where the dimensions came from, for the plan's text

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str) -> Architecture:
        config = config.get("text_config", config)
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads") if k not in config]
        if missing:
            raise UserError(
                f"model config from {source}: missing {', '.join(missing)}; allowed: a decoder-only transformer "
                "config (llama, qwen2, mistral)",
                field="model",
            )
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        model_type = str(config.get("model_type", "llama"))
        return cls(
            model_type=model_type,
            vocab_size=int(config.get("vocab_size", 32000)),
            hidden_size=hidden,
            intermediate_size=int(config.get("intermediate_size", 4 * hidden)),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            tied_embeddings=bool(config.get("tie_word_embeddings", model_type != "llama")),
            qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
            source=source,
        )

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection in one layer, by the module names LoRA targets."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_width),
            "k_proj": (h, self.kv_width),
            "v_proj": (h, self.kv_width),
            "o_proj": (self.q_width, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_matmul_params(self) -> int:
        return sum(a * b for a, b in self.linear_shapes().values())

    @property
    def parameters(self) -> int:
        h = self.hidden_size
        bias = (self.q_width + 2 * self.kv_width) if self.qkv_bias else 0
        per_layer = self.layer_matmul_params() + bias + 2 * h  # + two RMSNorm weights
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + h

    def activation_values_per_token(self, lora_targets: tuple[str, ...] = ()) -> int:
        """Values one token keeps per layer for the backward pass (module docstring)."""
        h, q, kv, i = self.hidden_size, self.q_width, self.kv_width, self.intermediate_size
        values = 4 * h + 3 * q + 3 * kv + 4 * i  # norm in/out, q/k/v and their RoPE'd copies, attention, MLP
        values += 4 * h  # RMSNorm computes in fp32: the upcast input and its normalised copy, twice
        values += 3 * (q + kv)  # RoPE: q·cos, rotate_half(q), ·sin (and the same for k)
        shapes = self.linear_shapes()
        values += sum(2 * shapes[t][1] for t in lora_targets if t in shapes)  # LoRA: B's output and its scaled copy
        return values


@dataclass
class Memory:
    """Bytes per device."""

    framework: int
    weights: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.framework + self.weights + self.gradients + self.optimizer + self.activations


@dataclass(frozen=True)
class MachineLoad:
    """What else wants this machine's CPU now: ``busy_cores`` others keep busy out of ``cores``."""

    cores: int
    busy_cores: float
    running_jobs: int = 0  # this home's trainers running now
    basis: str = ""

    def slowdown(self, threads: int, contention: float = 1.0) -> float:
        """How many times longer CPU work wanting ``threads`` cores takes than on an idle machine: fair sharing with
        the busy cores (``contention`` < 1 for work that also waits on the disk and on child processes)."""
        return max(1.0, (contention * self.busy_cores + max(1, threads)) / max(1, self.cores))

    @classmethod
    def behind(cls, factor: float, threads: int, cores: int) -> MachineLoad:
        """The load that made work wanting ``threads`` cores ``factor`` times slower (a measured run's)."""
        return cls(cores=cores, busy_cores=max(0.0, factor * cores - max(1, threads)))


def machine_load(home: Path | None = None, *, own_threads: float = 0.0, count_jobs: bool = True) -> MachineLoad:
    """This machine's load now: the 1-minute load average less ``own_threads`` (a trainer measuring its own
    surroundings), or the threads of this home's running trainers when they want more (a run that just started is
    not in the average yet; ``count_jobs=False``: the average alone). Other work that comes and goes during the run
    is not foreseen: the ETA follows the pace measured."""
    cores = _usable_cores()
    try:
        load1 = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        load1 = 0.0
    jobs = running_trainers(home) if count_jobs else []
    by_jobs = len(jobs) * cores
    busy = max(0.0, load1 - own_threads)
    basis = f"load average {load1:.1f} on {cores} cores"
    if by_jobs > busy:
        busy = float(by_jobs)
        basis = f"{len(jobs)} running training job(s) of {cores} threads on {cores} cores"
    elif jobs:
        basis += f", {len(jobs)} running training job(s)"
    return MachineLoad(cores=cores, busy_cores=round(busy, 2), running_jobs=len(jobs), basis=basis)


def running_trainers(home: Path | None = None) -> list[str]:
    """Ids of this home's local jobs whose trainer process runs now (Initializing to Saving)."""
    import psutil

    from playground.paths import playground_home

    jobs_dir = (home or playground_home()) / "jobs"
    running = []
    for status_file in jobs_dir.glob("*/status.json") if jobs_dir.is_dir() else []:
        try:
            status = json.loads(status_file.read_text())
        except (OSError, ValueError):
            continue
        pid = status.get("trainer_pid")
        if status.get("phase") in _RUNNING_PHASES and isinstance(pid, int) and psutil.pid_exists(pid):
            running.append(status_file.parent.name)
    return running


_RUNNING_PHASES = ("Initializing", "Training", "Evaluating", "Saving")


def _usable_cores() -> int:
    from playground.train.cpu_share import usable_cores  # torch-free

    return usable_cores()


@dataclass
class TimeBreakdown:
    """Seconds of each phase of a run, as this machine's load now makes them; :attr:`total` is ``Plan.seconds``."""

    startup: float  # process start, imports, model load, data, the base model's held-out answers
    training: float
    evaluation: float  # the final held-out loss and answers
    saving: float  # model/, metrics.json, the supervisor's wrap-up
    slowdown: float = 1.0  # the training phase's load factor (1: an idle machine)
    load_basis: str = ""

    @property
    def total(self) -> float:
        return round(self.startup + self.training + self.evaluation + self.saving, 1)

    def describe(self) -> str:
        from playground.formatting import format_duration

        parts = {"start-up": self.startup, "training": self.training, "evaluation": self.evaluation}
        parts["saving"] = self.saving
        text = " + ".join(f"{name} {format_duration(value, sub_minute=True)}" for name, value in parts.items())
        if self.slowdown > 1:
            return f"{text}; × {self.slowdown:.2f} for the load ({self.load_basis})"
        return f"{text}; no slowdown ({self.load_basis})" if self.load_basis else text


@dataclass
class Plan:
    blueprint_id: str
    model_source: str
    architecture: dict[str, Any]
    parameters: int
    trainable_parameters: int
    method: str
    dtype: str
    device: str  # "cpu", "gpu"
    processes: int
    strategy: str  # single | ddp | fsdp
    micro_batch: int
    global_batch: int
    tokens_per_example: float
    tokens_basis: str
    max_steps: int
    memory: Memory
    capacity_bytes: int
    capacity_basis: str
    fits: bool
    advice: str | None
    seconds: float
    seconds_per_step: float
    time_basis: str
    memory_basis: str = ""
    notes: list[str] = field(default_factory=list)
    time: TimeBreakdown | None = None  # the phases ``seconds`` sums

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["memory"]["total"] = self.memory.total
        return data

    def describe(self) -> str:
        """The plan as a few readable lines (CLI, app panel)."""
        from playground.formatting import format_duration

        m = self.memory
        lines = [
            f"{self.blueprint_id}: {self.parameters / 1e6:.1f}M parameters, "
            f"{self.trainable_parameters / 1e6:.2f}M trainable ({self.method}, {self.dtype})",
            f"run: {self.max_steps} steps × global batch {self.global_batch} on {self.processes} "
            f"{self.device} process(es) ({self.strategy}); ~{self.tokens_per_example:.0f} tokens/example "
            f"({self.tokens_basis})",
            f"memory per device: {_gb(m.total)} = framework {_gb(m.framework)} + weights {_gb(m.weights)} + "
            f"gradients {_gb(m.gradients)} + optimizer {_gb(m.optimizer)} + activations {_gb(m.activations)} "
            f"({self.memory_basis})",
            f"available: {_gb(self.capacity_bytes)} ({self.capacity_basis}) → "
            + ("fits" if self.fits else "does NOT fit")
            + (f"; {self.advice}" if self.advice else ""),
            f"time: ~{format_duration(self.seconds)} ({self.seconds_per_step:.2f} s/step; {self.time_basis})",
        ]
        if self.time is not None:
            lines.append(f"time by phase: {self.time.describe()}")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


# ------------------------------------------------------------------------------------ architecture


def _char_vocab_size() -> int:
    from playground.train.tokenizer import CHAR_ALPHABET, CHAR_SPECIAL_TOKENS

    return len(CHAR_SPECIAL_TOKENS) + len(CHAR_ALPHABET)


def _gguf_config(path: Path) -> dict[str, Any]:
    """A Llama-style config from a GGUF file's header (no tensors read)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def value(key: str) -> Any:
        field_ = reader.fields.get(key)
        if field_ is None:
            return None
        return field_.parts[field_.data[0]].tolist()[0] if field_.data else None

    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    heads = value(f"{arch}.attention.head_count")
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    return {
        "model_type": arch,
        "hidden_size": value(f"{arch}.embedding_length"),
        "intermediate_size": value(f"{arch}.feed_forward_length"),
        "num_hidden_layers": value(f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": value(f"{arch}.attention.head_count_kv") or heads,
        "vocab_size": len(tokens.data) if tokens is not None else None,
        "tie_word_embeddings": not has_output,
    }


def resolve_architecture(blueprint: Blueprint, model_source: str | None = None) -> Architecture:
    """The dimensions of the model a run would train, read without loading any weights."""
    source = model_source or blueprint.model.source
    if source.startswith("scratch://"):
        arch = source.removeprefix("scratch://")
        config = {"model_type": arch, "tie_word_embeddings": True, **blueprint.model.config}
        if blueprint.model.tokenizer in (None, "chars"):
            config.setdefault("vocab_size", _char_vocab_size())
        return Architecture.from_config(config, f"{source} (blueprint config)")
    if source.startswith("pkg://"):
        from playground.models import packaged

        converted = packaged.find_converted(source)
        if converted is not None:
            return Architecture.from_config(json.loads((converted / "config.json").read_text()), source)
        return Architecture.from_config(_gguf_config(packaged.locate(source).file), f"{source} (GGUF header)")
    if source.startswith("hf://"):
        from playground.train.standins import HUB_ARCHITECTURES, standin_arch

        repo = source.removeprefix("hf://")
        try:
            family = standin_arch(source)
        except UserError:
            raise UserError(
                f"model source {source!r}: its size is not known offline; allowed: a local model directory "
                "(--model-source DIR) or a hub model of the Llama 3 / Qwen2 families",
                field="model",
            ) from None
        return Architecture.from_config({"model_type": family, **HUB_ARCHITECTURES[family]}, f"{repo} (hub config)")
    config_file = Path(source).expanduser() / "config.json"
    if not config_file.is_file():
        raise UserError(
            f"model source {shown_path(source)}: no config.json there; allowed: a local model directory, "
            "hf://ORG/NAME, pkg://DISTRIBUTION/FILE or scratch://ARCH",
            field="model",
        )
    return Architecture.from_config(json.loads(config_file.read_text()), shown_path(source, quoted=False))


def trainable_parameters(arch: Architecture, blueprint: Blueprint, params: dict[str, Any]) -> int:
    if blueprint.method.kind != "lora":
        return arch.parameters
    rank = int(params.get("lora_rank", blueprint.method.rank))
    shapes = arch.linear_shapes()
    targets = [t for t in blueprint.method.target_modules if t in shapes]
    return arch.layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)


# ------------------------------------------------------------------------------------ data


def example_lengths(
    blueprint: Blueprint, params: dict[str, Any], source: str, *, dataset_source: str | None = None, n: int = 256
) -> list[int] | None:
    """Token counts of ``n`` of the run's training examples as the trainer renders them (the chat template
    over the whole conversation), torch-free (:mod:`playground.userdata.template`): synthetic datasets and
    local data files. None where that cannot be known without loading more (a hub dataset)."""
    from playground.userdata.check import is_local_file
    from playground.userdata.template import renderer_for

    data = dataset_source or blueprint.dataset.source
    if data.startswith("synthetic://"):
        from playground.train.data import SYNTHETIC_TASKS, synthetic_splits
        from playground.train.settings import resolve_setting

        task = data.removeprefix("synthetic://")
        if task not in SYNTHETIC_TASKS:
            return None
        seed = int(resolve_setting(blueprint, params, "seed"))
        train, _ = synthetic_splits(task, dict(blueprint.dataset.options), num_train=n, num_eval=20, seed=seed)
        conversations = [sample.messages() for sample in train]
    elif is_local_file(data) and Path(data).expanduser().is_file():
        import random

        from playground.userdata.shapes import read_conversations

        _, conversations = read_conversations(data, columns=blueprint.dataset.columns)
        if len(conversations) > n:
            conversations = random.Random(0).sample(conversations, n)
    else:
        return None
    renderer = renderer_for(blueprint, source)
    if renderer is None:
        return None
    return [renderer.count_tokens(renderer.render(messages)) for messages in conversations]


def _tokenizer_known(blueprint: Blueprint, source: str) -> bool:
    if source.startswith("scratch://") and blueprint.model.tokenizer in (None, "chars"):
        return True
    directory = _model_directory(source)
    return directory is not None and (directory / "tokenizer.json").is_file()


def _model_directory(source: str) -> Path | None:
    if source.startswith("pkg://"):
        from playground.models import packaged

        return packaged.find_converted(source)
    if "://" in source:
        return None
    return Path(source).expanduser()


def micro_batch_positions(
    lengths: list[int], micro_batch: int, max_seq_length: int, seed: int = 0, multiple: int = 1,
    packing: bool = False,
) -> tuple[list[int], int]:  # fmt: skip
    """Shuffled micro-batches of these examples as the trainer makes them: the positions its forward computes for each
    (:func:`~playground.train.perf.computed_positions`: padded rows, or one packed row) and the rows per micro-batch."""
    import random

    order = [min(n, max_seq_length) for n in lengths]
    longest = max(order, default=0)
    random.Random(seed).shuffle(order)
    chunks = [order[i : i + micro_batch] for i in range(0, len(order) - micro_batch + 1, micro_batch)] or [order]
    from playground.train.perf import computed_positions  # torch-free at import

    return [computed_positions(chunk, multiple, longest, packing=packing) for chunk in chunks], len(chunks[0])


# ------------------------------------------------------------------------------------ history


@dataclass(frozen=True)
class MeasuredRun:
    """A finished local run's figures (its metrics.json), the basis of time predictions."""

    job_id: str
    blueprint_id: str
    model_source: str
    device: str
    world_size: int
    steps: int
    global_batch: int
    train_seconds: float
    wall_seconds: float
    train_flops: float | None
    train_tokens: int | None
    mean_padded_width: float | None
    num_eval_examples: int | None
    peak_memory_bytes: int | None = None
    micro_batch_size: int | None = None
    finish_seconds: float | None = None  # the final evaluation and the save
    compute_dtype: str = "float32"  # of the training matmuls (bfloat16: a GPU, or a CPU with cpu_bf16)
    evaluate_seconds: float | None = None  # the final evaluation alone (newer trainers)
    job_seconds: float | None = None  # the job's own wall time: trainer start to Succeeded (status.json)
    tail_seconds: float = 0.0  # after metrics.json was written, until the job said Succeeded
    load_factor: float = 1.0  # the machine's load while it trained (MachineLoad.slowdown; 1: idle)

    @property
    def seconds_per_step(self) -> float:
        return self.train_seconds / max(1, self.steps)

    @property
    def idle_seconds_per_step(self) -> float:
        """The step time on an idle machine: the measured one less the load it ran under."""
        return self.seconds_per_step / max(1.0, self.load_factor)

    @property
    def flops_per_second(self) -> float | None:
        return self.train_flops / self.train_seconds if self.train_flops and self.train_seconds > 0 else None

    @property
    def overhead_seconds(self) -> float:
        return max(0.0, self.wall_seconds - self.train_seconds)

    @property
    def saving_seconds(self) -> float | None:
        """The save and the job's wrap-up after it, where the run recorded the evaluation apart."""
        if self.finish_seconds is None or self.evaluate_seconds is None:
            return None
        return max(0.0, self.finish_seconds - self.evaluate_seconds) + self.tail_seconds

    @property
    def startup_seconds(self) -> float:
        """Everything before the first step: the job's wall time less training, the finish and the wrap-up."""
        wall = self.job_seconds if self.job_seconds is not None else self.wall_seconds
        return max(0.0, wall - self.train_seconds - (self.finish_seconds or 0.0) - self.tail_seconds)


def measured_runs(home: Path | None = None) -> list[MeasuredRun]:
    """Finished local runs, newest first (jobs whose trainer wrote metrics.json)."""
    from playground.paths import playground_home

    jobs_dir = (home or playground_home()) / "jobs"
    runs: list[tuple[float, MeasuredRun]] = []
    for metrics_file in jobs_dir.glob(f"*/output/{_METRICS}") if jobs_dir.is_dir() else []:
        try:
            metrics = json.loads(metrics_file.read_text())
            spec = json.loads((metrics_file.parent.parent / "spec.json").read_text())
            run = MeasuredRun(
                job_id=str(spec["id"]),
                blueprint_id=str(spec["blueprint_id"]),
                model_source=str((spec.get("overrides") or {}).get("model") or spec.get("base_model") or ""),
                device="gpu" if str(metrics.get("device", "cpu")).startswith("cuda") else "cpu",
                world_size=int(metrics.get("world_size", 1)),
                steps=int(metrics["steps"]) - int(metrics.get("resumed_from_step") or 0),
                global_batch=int(metrics["global_batch_size"]),
                train_seconds=float(metrics["train_seconds"]),
                wall_seconds=float(metrics["wall_seconds"]),
                train_flops=metrics.get("train_flops"),
                train_tokens=metrics.get("train_tokens"),
                mean_padded_width=metrics.get("mean_padded_width"),
                num_eval_examples=metrics.get("num_eval_examples"),
                peak_memory_bytes=metrics.get("peak_memory_bytes"),
                micro_batch_size=metrics.get("micro_batch_size"),
                finish_seconds=metrics.get("finish_seconds"),
                compute_dtype=str(metrics.get("compute_dtype") or "float32"),
                evaluate_seconds=metrics.get("evaluate_seconds"),
                load_factor=float(metrics.get("load_factor") or 1.0),
                **_job_times(metrics_file),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a run that did not finish, or an older trainer's metrics: not a basis
        if run.steps > 0 and run.train_seconds > 0:
            runs.append((metrics_file.stat().st_mtime, run))
    return [run for _, run in sorted(runs, key=lambda pair: pair[0], reverse=True)]


def _job_times(metrics_file: Path) -> dict[str, float]:
    """The job's wall time from its status.json (trainer start to Succeeded) and the wrap-up after metrics.json;
    nothing for a job that did not succeed or an older state directory."""
    try:
        status = json.loads((metrics_file.parent.parent / "status.json").read_text())
        started, ended = float(status["started_at"]), float(status["updated_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    tail = ended - metrics_file.stat().st_mtime
    if status.get("phase") != "Succeeded" or ended <= started or not 0 <= tail < 120:  # 120: updated later (served)
        return {}
    return {"job_seconds": ended - started, "tail_seconds": tail}


# ------------------------------------------------------------------------------------ the plan


def _device_capacity(device: str, blueprint: Blueprint, backend: str) -> tuple[int, str]:
    if backend != "local":
        if device == "gpu":
            return ASSUMED_GPU_MEMORY, "per GPU, assumed: an 80 GB GPU"
        memory = blueprint.resources.memory
        return _quantity_bytes(memory), f"the blueprint's pod memory request {memory}"
    if device == "gpu":
        total = _local_gpu_memory()
        if total:
            return total, "this machine's GPU"
        return ASSUMED_GPU_MEMORY, "per GPU, assumed: an 80 GB GPU (none on this machine)"
    import psutil

    return int(psutil.virtual_memory().available), "this machine's available memory"


def _local_gpu_memory() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU
        return None


def _quantity_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(float(quantity))


def _dtype(device: str, source: str) -> tuple[str, int]:
    if device == "gpu" and not source.startswith("scratch://"):
        return "bfloat16", 2
    return "float32", 4


def _strategy(setting: str, processes: int, replicated_bytes: int, capacity: int) -> str:
    if processes <= 1:
        return "single"
    if setting in ("ddp", "fsdp"):
        return setting
    return "fsdp" if replicated_bytes > 0.5 * capacity else "ddp"


def on_machine(backend: str) -> str:
    """The machine a backend trains on: ``local`` for local and for ray with its local Ray, else the name."""
    import os

    return "local" if backend == "ray" and not os.environ.get("RAY_ADDRESS") else backend


def _devices(blueprint: Blueprint, backend: str, gpus: int | None) -> tuple[str, int, str | None]:
    """(device, trainer processes, a note) for ``blueprint`` on ``backend``: on the local backend, as many processes
    as this machine has GPUs for it (``gpus``: that count, else detected)."""
    device = "gpu" if blueprint.needs_gpu else "cpu"
    gpu_count = blueprint.resources.gpus_per_node * blueprint.resources.nodes
    if backend != "local":
        return device, max(1, gpu_count), None
    from playground.backends.gpus import detect_gpus

    have = detect_gpus() if gpus is None else gpus
    processes = max(1, min(have, gpu_count) if have else gpu_count) if device == "gpu" else 1
    note = None
    if blueprint.needs_gpu and not have:
        note = f"this machine has no GPU: planned for the blueprint's {gpu_count} GPU(s)"
    return device, processes, note


def _tokens(
    blueprint: Blueprint,
    params: dict[str, Any],
    setting: Any,
    source: str,
    *,
    dataset_source: str | None,
    micro_batch: int,
    cpu_bf16: bool,
    widths: list[MeasuredRun],
) -> tuple[float, str, int]:
    """(tokens per example, where that number comes from, the bf16 row shapes a CPU run meets): the examples'
    widths through the chat template, else an earlier run's padded width, else max_seq_length."""
    max_steps, max_seq = int(setting("max_steps")), int(setting("max_seq_length"))
    accum = int(setting("gradient_accumulation_steps") or 1)
    lengths = example_lengths(blueprint, params, source, dataset_source=dataset_source)
    if lengths:
        from playground.train.perf import CPU_BF16_WIDTH_MULTIPLE  # torch-free at import

        multiple = CPU_BF16_WIDTH_MULTIPLE if cpu_bf16 else 1
        packing = bool(setting("packing"))
        positions, rows = micro_batch_positions(lengths, micro_batch, max_seq, multiple=multiple, packing=packing)
        bf16_shapes = len(set(positions[: max_steps * accum])) if cpu_bf16 else 0  # oneDNN: a matmul set per shape
        how = "the tokenizer" if _tokenizer_known(blueprint, source) else f"~{CHARS_PER_TOKEN:g} characters per token"
        width = "packed" if packing else "padded"
        basis = f"{width} width of {len(lengths)} examples through the chat template and {how}"
        return sum(positions) / len(positions) / rows, basis, bf16_shapes
    if widths and widths[0].micro_batch_size == micro_batch:
        return min(float(widths[0].mean_padded_width or max_seq), max_seq), "padded width measured by an earlier run", 0
    return float(max_seq), "max_seq_length: an upper bound until a run is measured", 0


def _memory(
    arch: Architecture,
    blueprint: Blueprint,
    setting: Any,
    *,
    device: str,
    processes: int,
    weight_bytes: int,
    trainable: int,
    sequences: float,
    bf16_shapes: int,
    capacity: int,
    micro_batch: int,
    tokens_per_example: float,
    runs: list[MeasuredRun],
) -> tuple[Memory, str, str]:
    """(memory per device, where its framework share comes from, the distributed strategy): the model's terms,
    with the framework share (and the activations' scale) fitted to this blueprint's measured runs."""
    from playground.runs.settings import tracking_enabled

    lora = blueprint.method.kind == "lora"
    tbytes = 4 if lora else weight_bytes  # peft keeps adapters in fp32
    framework = CUDA_CONTEXT_BYTES if device == "gpu" else FRAMEWORK_BYTES
    framework += TRACKING_BYTES if tracking_enabled() else 0
    weights = arch.parameters * weight_bytes + bf16_shapes * CPU_BF16_BYTES_PER_SHAPE
    replicated = weights + trainable * tbytes * 3
    strategy = _strategy(str(setting("distributed") or "auto"), processes, replicated, capacity)
    shard = processes if strategy == "fsdp" else 1
    targets = tuple(blueprint.method.target_modules) if lora else ()
    activations = sequences * activation_bytes(
        arch, micro_batch, tokens_per_example, 2 if device == "gpu" else 4, targets
    )
    memory = Memory(
        framework=framework,
        weights=int(weights / shard),
        gradients=int(trainable * tbytes * (2 if strategy == "ddp" else 1) / shard),  # DDP: + its bucket copy
        # AdamW's two moments, and the weight average's float32 copy where average_last keeps one
        optimizer=int((2 * trainable * tbytes + (4 * trainable if setting("average_last") else 0)) / shard),
        activations=int(activations),
    )
    if device == "gpu":
        memory.activations = int(memory.activations * GPU_ALLOCATOR_SLACK)
    value_bytes = 2 if device == "gpu" else 4
    measured = [
        (activation_bytes(arch, r.micro_batch_size, r.mean_padded_width, value_bytes, targets), r)
        for r in runs
        if r.peak_memory_bytes and r.micro_batch_size and r.mean_padded_width and r.world_size == processes
    ]
    line = _fit_line([(a, float(r.peak_memory_bytes or 0)) for a, r in measured])
    if line is not None:  # runs of two or more batch shapes: peak = fixed + slope × modelled activations
        fixed, slope = line
        memory.activations = int(slope * memory.activations)
        memory.framework = max(int(0.2 * GiB), int(fixed - (memory.total - memory.framework - memory.activations)))
        return memory, "fitted to runs " + ", ".join(r.job_id for _, r in measured), strategy
    if measured:
        # What this machine's trainer process holds besides the model terms, as that run measured it.
        run_activations, run = min(measured, key=lambda pair: abs(pair[0] - memory.activations))
        modelled = memory.total - memory.framework - memory.activations + run_activations
        memory.framework = max(int(0.2 * GiB), int((run.peak_memory_bytes or 0) - modelled))
        return memory, f"framework share measured by run {run.job_id}", strategy
    return memory, "framework share stated (measured on the 0.8M-parameter model)", strategy


def _idle_step_seconds(
    flops: Any,
    step_flops: float,
    timed: list[MeasuredRun],
    runs: list[MeasuredRun],
    *,
    device: str,
    processes: int,
    compute: str,
    global_batch: int,
) -> tuple[float, str, bool]:
    """(seconds per step on an idle machine, where that comes from, whether it is an estimate without a measured
    run of this blueprint): fitted to this blueprint's runs, else scaled from one, else FLOPs at a measured or
    stated rate."""
    fit = _fit_step_time(timed, flops)
    if fit is not None:  # seconds per step on an idle machine: each run's less the load it ran under
        fixed, per_flop, used = fit
        names = ", ".join(r.job_id for r in used)
        basis = f"measured: {fixed:.3f} s + FLOPs / {1 / per_flop:.2e} per s per step, fitted to runs {names}"
        return fixed + per_flop * step_flops, basis, False
    if timed:
        run = timed[0]
        basis_flops = _run_step_flops(run, flops)
        scale = step_flops / basis_flops if basis_flops else global_batch / run.global_batch
        basis = f"measured: run {run.job_id} of this blueprint ({run.seconds_per_step:.2f} s/step), "
        basis += "scaled by FLOPs per step"
        return run.idle_seconds_per_step * scale, basis, False
    measured = next((r for r in runs if r.device == device and r.compute_dtype == compute and r.flops_per_second), None)
    if measured is not None:
        rate = (measured.flops_per_second or 0.0) * measured.load_factor * (processes / measured.world_size)
        basis = f"FLOPs at the FLOP/s run {measured.job_id} reached here ({measured.flops_per_second:.2e}/s)"
    else:
        rate, basis = _stated_throughput(device, processes)
        if device == "cpu" and compute == "bfloat16":
            rate *= CPU_BF16_SPEEDUP
            basis += f", × {CPU_BF16_SPEEDUP:g} for bf16 (cpu_bf16, measured on SmolLM2 LoRA)"
    return step_flops / rate, basis, True


def _flop_counter(arch: Architecture, trainable: int, lora: bool) -> tuple[Any, int]:
    """The step's FLOP counter (LoRA: the base's matmuls frozen, the adapters trained) and the base's matmul
    parameters (the lm_head's included)."""
    from playground.train.flops import FlopCounter

    base_matmul = arch.layer_matmul_params() * arch.layers + arch.vocab_size * arch.hidden_size  # + the lm_head
    counter = FlopCounter(
        trainable_matmul_params=trainable if lora else base_matmul,
        frozen_matmul_params=base_matmul if lora else 0,
        layers=arch.layers,
        attention_width=arch.q_width,
    )
    return counter, base_matmul


def make_plan(
    blueprint: Blueprint,
    params: dict[str, Any],
    *,
    model_source: str | None = None,
    dataset_source: str | None = None,
    backend: str = "local",
    gpus: int | None = None,
    home: Path | None = None,
    load: MachineLoad | None = None,
) -> Plan:
    """Predict memory per device, fit and time for training ``blueprint`` with ``params`` (validated); a CPU run's
    time under ``load`` (default: this machine's now, :func:`machine_load`)."""
    from playground.train.settings import resolve_setting

    setting = partial(resolve_setting, blueprint, params)
    source = model_source or blueprint.model.source
    arch = resolve_architecture(blueprint, model_source)
    backend = on_machine(backend)
    device, processes, backend_note = _devices(blueprint, backend, gpus)
    dtype, wbytes = _dtype(device, source)
    n_params = arch.parameters
    trainable = trainable_parameters(arch, blueprint, params)
    lora = blueprint.method.kind == "lora"
    batch_size, accum = int(setting("batch_size")), int(setting("gradient_accumulation_steps") or 1)
    global_batch = batch_size * accum
    micro_batch = max(1, global_batch // (processes * accum)) if processes > 1 else batch_size
    runs = measured_runs(home)
    same = [r for r in runs if r.blueprint_id == blueprint.id and r.device == device]
    same_model = [r for r in same if not model_source or r.model_source == str(model_source)] or same
    cpu_bf16 = device == "cpu" and bool(setting("cpu_bf16")) and cpu_has_bf16_flags()
    tokens_per_example, tokens_basis, bf16_shapes = _tokens(
        blueprint, params, setting, source, dataset_source=dataset_source, micro_batch=micro_batch,
        cpu_bf16=cpu_bf16, widths=[r for r in same_model if r.mean_padded_width],
    )  # fmt: skip
    capacity, capacity_basis = _device_capacity(device, blueprint, backend)
    work, sequences, objective_note = objective_work(blueprint, setting)
    memory, memory_basis, strategy = _memory(
        arch, blueprint, setting, device=device, processes=processes, weight_bytes=wbytes, trainable=trainable,
        sequences=sequences, bf16_shapes=bf16_shapes, capacity=capacity, micro_batch=micro_batch,
        tokens_per_example=tokens_per_example, runs=same_model,
    )  # fmt: skip
    fits = memory.total <= capacity
    advice = None if fits else _advice(memory, capacity, blueprint, params, micro_batch, processes, strategy)

    flops, base_matmul = _flop_counter(arch, trainable, lora)
    step_flops = flops.batch(int(global_batch * tokens_per_example), int(global_batch * tokens_per_example**2))
    step_flops *= work
    notes: list[str] = [note for note in (backend_note, objective_note) if note]
    timed = [r for r in same_model if r.world_size == processes]
    seconds_per_step, time_basis, estimated = _idle_step_seconds(
        flops, step_flops, timed, runs, device=device, processes=processes, global_batch=global_batch,
        compute="bfloat16" if device == "gpu" or cpu_bf16 else "float32",
    )  # fmt: skip
    if estimated:
        notes.append("setup, evaluation and saving time are estimated; a measured run of this blueprint refines them")
    if tokens_basis.startswith("max_seq_length"):
        notes.append("activations and time assume every example fills max_seq_length (an upper bound)")
    local_cpu = device == "cpu" and backend == "local"  # a cluster's node or a GPU: this machine's load is not theirs
    load = (load or machine_load(home)) if local_cpu else None
    eval_rate = step_flops / seconds_per_step if seconds_per_step > 0 else CPU_CORE_FLOPS
    if cpu_bf16:  # the held-out answers run in float32 on a CPU (as the model is served): no bf16 speed-up
        eval_rate /= CPU_BF16_SPEEDUP
    phases = time_breakdown(
        blueprint, setting, device=device, basis=timed[0] if timed else None, idle_step_seconds=seconds_per_step,
        eval_flops_per_second=eval_rate,
        matmul_params=base_matmul, tokens_per_example=tokens_per_example, saved_bytes=(trainable * 4 if lora else
        n_params * wbytes), pretrained=not source.startswith("scratch://"), load=load,
        threads=_usable_cores() if device == "cpu" else 1,
    )  # fmt: skip
    seconds_per_step *= phases.slowdown
    return Plan(
        blueprint_id=blueprint.id,
        model_source=source,
        architecture=asdict(arch),
        parameters=n_params + (trainable if lora else 0),  # as the trainer counts them: adapters included
        trainable_parameters=trainable,
        method=f"lora r{int(params.get('lora_rank', blueprint.method.rank))}" if lora else blueprint.method.kind,
        dtype=dtype,
        device=device,
        processes=processes,
        strategy=strategy,
        micro_batch=micro_batch,
        global_batch=global_batch,
        tokens_per_example=round(tokens_per_example, 1),
        tokens_basis=tokens_basis,
        max_steps=int(setting("max_steps")),
        memory=memory,
        capacity_bytes=capacity,
        capacity_basis=capacity_basis,
        fits=fits,
        advice=advice,
        seconds=phases.total,
        seconds_per_step=round(seconds_per_step, 4),
        time_basis=time_basis,
        memory_basis=memory_basis,
        notes=notes,
        time=phases,
    )


def time_breakdown(
    blueprint: Blueprint, setting: Any, *, device: str, basis: MeasuredRun | None, idle_step_seconds: float,
    eval_flops_per_second: float, matmul_params: int, tokens_per_example: float, saved_bytes: int, pretrained: bool,
    load: MachineLoad | None, threads: int,
) -> TimeBreakdown:  # fmt: skip
    """The run's phases on this machine now (module docstring): each from ``basis`` (the newest measured run of the
    blueprint, scaled back to an idle machine) where it recorded the phase, else modelled; then × the load."""
    max_steps = int(setting("max_steps"))
    n_eval = int(setting("num_eval_examples") or 50)
    exact = blueprint.dataset.format == "synthetic" or blueprint.quality.metric == "eval_exact_match"
    answer_tokens = max(4.0, min(float(blueprint.serving.max_new_tokens), tokens_per_example / 2))
    forward_flops = 2.0 * matmul_params * tokens_per_example  # one example through the model, no backward
    answers = 0.0  # greedy answers to the held-out requests: prefill and decode ≈ one example's tokens, plus a fixed
    if exact:  # cost per generate() forward (a batch of 64 requests decodes its answer tokens one by one)
        forwards = math.ceil(n_eval / GENERATE_BATCH) * answer_tokens
        answers = n_eval * forward_flops / eval_flops_per_second + forwards * DECODE_FORWARD_SECONDS[device]
    modelled_eval = n_eval * forward_flops / eval_flops_per_second + answers  # + the held-out loss
    idle = 1.0 if basis is None else max(1.0, basis.load_factor)  # the basis run's load, for its phases
    cores = load.cores if load is not None else _usable_cores()
    idle_single = MachineLoad.behind(idle, threads, cores).slowdown(1, SINGLE_THREAD_CONTENTION)
    if basis is not None and basis.num_eval_examples and basis.finish_seconds is not None:
        recorded = basis.evaluate_seconds if basis.evaluate_seconds is not None else basis.finish_seconds
        evaluation = recorded / idle * n_eval / basis.num_eval_examples
    else:
        evaluation = modelled_eval
    saving = basis.saving_seconds if basis is not None else None
    if saving is not None:
        saving /= idle_single
    else:
        saving = ASSUMED_SAVE_SECONDS[device] + saved_bytes / SAVE_BYTES_PER_SECOND
    if basis is not None:
        startup = basis.startup_seconds / idle_single
    else:  # the process, imports and model load, then the base model's answers (cached for a packaged model)
        startup = (
            ASSUMED_SETUP_SECONDS[device] * (PRETRAINED_SETUP_FACTOR if pretrained and device == "cpu" else 1) + answers
        )
    slowdown = load.slowdown(threads) if load is not None else 1.0
    single = load.slowdown(1, SINGLE_THREAD_CONTENTION) if load is not None else 1.0  # start-up and saving
    return TimeBreakdown(
        startup=round(startup * single, 1),
        training=round(idle_step_seconds * max_steps * slowdown, 1),
        evaluation=round(evaluation * slowdown, 1),
        saving=round(saving * single, 1),
        slowdown=round(slowdown, 3),
        load_basis=load.basis if load is not None else "",
    )


def objective_work(blueprint: Blueprint, setting: Any) -> tuple[float, float, str | None]:
    """A DPO/GRPO step against an SFT step on the same batch: (FLOPs factor, sequences held for the backward
    pass per example, a note). A forward pass is ~1/3 of a training step's FLOPs."""
    objective = blueprint.method.objective
    if objective == "dpo":  # chosen and rejected trained, both scored by the reference too
        return 2 * (1 + 1 / 3), 2.0, "DPO: each pair trains two answers and scores both under the reference model"
    if objective == "grpo":  # each request's samples: generated (~a forward), trained, scored by the reference
        samples = int(setting("num_generations"))
        return (
            samples * (1 + 2 / 3),
            float(samples),
            (
                f"GRPO: {samples} sampled answers per request; sampling token by token on a CPU is slower than its "
                "FLOPs say, so a measured run of this blueprint is the better basis"
            ),
        )
    return 1.0, 1.0, None


def activation_bytes(
    arch: Architecture, micro_batch: int, width: float, value_bytes: int, lora_targets: tuple[str, ...] = ()
) -> int:
    """Activations a micro-batch keeps for the backward pass, plus the answer positions' logits (module docstring)."""
    tokens = micro_batch * width
    answer_positions = micro_batch * max(1.0, width / 3)  # the loss needs only the answers' logits
    layers = tokens * arch.layers * arch.activation_values_per_token(lora_targets) * value_bytes
    return int(layers + answer_positions * arch.vocab_size * 4 * 3)


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """``y = intercept + slope × x`` by least squares over points with at least two distinct x; None when
    there are fewer, or the slope is not positive (noise)."""
    if len({round(x) for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    if slope <= 0:
        return None
    return max(0.0, mean_y - slope * mean_x), slope


def _fit_step_time(runs: list[MeasuredRun], flops: Any) -> tuple[float, float, list[MeasuredRun]] | None:
    """``seconds per step = fixed + per_flop × FLOPs``, least squares over runs of at least two step sizes
    (a small model's step is mostly fixed cost: Python, the optimizer, kernel launches). None with fewer."""
    points = [(f, r.idle_seconds_per_step, r) for r in runs if (f := _run_step_flops(r, flops))]
    line = _fit_line([(f, t) for f, t, _ in points])
    if line is None:
        return None
    fixed, per_flop = line
    return fixed, per_flop, [r for _, _, r in points]


def _run_step_flops(run: MeasuredRun, flops: Any) -> float | None:
    """FLOPs per step of an earlier run, recomputed with this plan's counter (same model)."""
    if run.mean_padded_width:  # the plan's own convention: every example counted at the padded width
        width = run.mean_padded_width
        return flops.batch(int(run.global_batch * width), int(run.global_batch * width * width))
    return None


def cpu_has_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bf16 instructions (AVX512-BF16 or AMX), from its flags: what the trainer's ``cpu_bf16``
    needs (it asks oneDNN, which reads the same CPUID bits); False where the flags cannot be read."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _stated_throughput(device: str, processes: int) -> tuple[float, str]:
    from playground.train.flops import PEAK_FLOPS_ENV

    override = os.environ.get(PEAK_FLOPS_ENV)
    if override:
        peak = float(override)
        return peak * processes, f"FLOPs at ${PEAK_FLOPS_ENV}={peak:.2e}/s per device (stated)"
    if device == "gpu":
        from playground.train.flops import PEAK_FLOPS

        peak = PEAK_FLOPS["H100"]
        rate = peak * GPU_ASSUMED_MFU * processes
        return rate, f"FLOPs at {GPU_ASSUMED_MFU:.0%} of an H100's bf16 peak per GPU (stated; no run measured here)"
    cores = os.cpu_count() or 1
    return CPU_CORE_FLOPS * cores, f"FLOPs at {CPU_CORE_FLOPS:.0e}/s per CPU core × {cores} (stated; no run measured)"


def _advice(
    memory: Memory, capacity: int, blueprint: Blueprint, params: dict[str, Any], micro_batch: int, processes: int,
    strategy: str,
) -> str:  # fmt: skip
    """The one change that would make it fit, if one does."""
    fixed = memory.total - memory.activations
    if fixed < capacity and memory.activations > 0:
        per_example = memory.activations / micro_batch
        batch = int((capacity - fixed) // per_example)
        if batch >= 1:
            return f"batch_size={batch} (or gradient_accumulation_steps) would fit"
    if blueprint.method.kind != "lora":
        return "LoRA instead of a full fine-tune would cut gradients and optimizer state"
    if processes > 1 and strategy != "fsdp":
        return "distributed=fsdp would shard the weights over the GPUs"
    needed = math.ceil(memory.total / GiB)
    return f"needs a device with at least {needed} GiB, or more GPUs with FSDP2"
