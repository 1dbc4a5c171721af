"""The training recipe: one readable loop, nanoGPT style.

Why a hand-written loop and not ``transformers.Trainer``: the playground needs an event at an
exact cadence (every ``log_every`` optimizer steps, and the last one) with figures we control
(tokens/s, ETA, MFU), a batch that is a pure function of the step (so ``--resume`` needs only the
step), eval by greedy generation through the chat template, and no per-step overhead we did not
write: ``loss.item()`` (a device sync) happens only on logging steps. HF Trainer stays the
baseline our benchmarks compare against.

The run's state lives on one object, torchtune style: a :class:`Recipe` holds the spec, its resolved
``Settings`` (playground/train/settings.py, torch-free) and what each stage builds, and runs as
``setup`` (``setup_distributed`` → ``setup_data``: tokenizer, data, batch order → ``setup_model``: + LoRA;
DDP or FSDP2 → ``setup_optimizer`` → ``restore``: ``--resume``) → ``train`` (``train_loop``: log,
checkpoint, eval → ``final_eval`` → ``save``: model dir, metrics.json) → ``cleanup`` (``teardown``).
Every stage is a function of that object, so a test can run any of them on its own. torch is imported
inside the stages, as in every ``playground.train`` module.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playground.errors import UserError
from playground.events import JobPhase, Progress
from playground.stopping import NotedReporter, StopRequest, StopWatch, answer_in_time
from playground.train import checkpoint, cpu_share, evaluate, parallel
from playground.train import model as models
from playground.train.data import Batches, file_splits, load_rows, synthetic_splits, tokenize
from playground.train.eta import EtaSmoother, LoadRecorder
from playground.train.finish import FinishReporter, earlier_finish_seconds, make_eta, planned_finish
from playground.train.flops import MFU_WARMUP_STEPS, FlopCounter, count_flops, mfu, peak_flops
from playground.train.parallel import gradient_sync
from playground.train.perf import CPU_BF16_WIDTH_MULTIPLE, causal_lm_loss, compile_model, cpu_has_bf16, model_inputs
from playground.train.reporting import Reporter
from playground.train.save import save_model_dir, unwrap
from playground.train.settings import BatchPlan, TrainSpec, check_resume
from playground.userdata.check import is_local_file

MAX_GRAD_NORM = 1.0
MIN_LR_RATIO = 0.1  # cosine decays to 10% of the peak
MAX_SYNTHETIC_ROWS = 50_000  # generated up front; longer runs cycle through them in epochs


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Dist:
    """torchrun (or Ray Train) sets RANK/WORLD_SIZE/LOCAL_RANK; a plain ``python -m`` run is rank 0 of 1.
    Ray Train has already joined the process group; torchrun leaves that to us."""
    dist = Dist(
        int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    )
    if dist.world_size > 1:
        import torch
        import torch.distributed

        if torch.cuda.is_available():
            torch.cuda.set_device(dist.local_rank)
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist


def cpu_threads() -> int:
    """Cores this process may really use: the affinity mask, capped by a cgroup CPU quota, shared
    with the other training processes on this machine."""
    cores = cpu_share.usable_cores()
    override = os.environ.get("PLAYGROUND_TRAIN_THREADS")
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # torchrun's processes on this machine share them
    return int(override) if override else max(1, cores // processes)


class Clock:
    """Training time, wall and process CPU, with eval and checkpoint pauses left out. CPU seconds
    are the load-robust figure on a shared machine (what the step-rate benchmark compares)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self._wall_start, self._cpu_start = time.perf_counter(), time.process_time()

    def lap(self) -> float:
        """Close the current window (its time counts); returns its wall seconds."""
        now_wall, now_cpu = time.perf_counter(), time.process_time()
        elapsed = now_wall - self._wall_start
        self.wall += elapsed
        self.cpu += now_cpu - self._cpu_start
        self._wall_start, self._cpu_start = now_wall, now_cpu
        return elapsed

    def restart(self) -> None:
        """Open a new window now; the time since the last one does not count (setup, a resume's load)."""
        self._wall_start, self._cpu_start = time.perf_counter(), time.process_time()

    def wall_total(self) -> float:
        return self.wall + time.perf_counter() - self._wall_start

    def cpu_total(self) -> float:
        return self.cpu + time.process_time() - self._cpu_start

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self._wall_start += time.perf_counter() - wall
            self._cpu_start += time.process_time() - cpu


def lr_lambda(warmup: int, total: int):
    """Linear warmup, then cosine decay to MIN_LR_RATIO of the peak."""

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))

    return schedule


def load_data(spec: TrainSpec, tokenizer: Any, dist: Dist | None = None) -> tuple[Any, Any]:
    """Tokenized train and held-out sets (never overlapping). The same on every rank."""
    ds = spec.blueprint.dataset
    settings = spec.settings
    seed, num_eval, num_train = settings.seed, settings.num_eval_examples, settings.num_train_examples
    if spec.dataset_source.startswith("synthetic://"):
        train, held = synthetic_splits(
            spec.dataset_source.removeprefix("synthetic://"),
            ds.options,
            num_train=num_train or min(settings.max_steps * settings.global_batch_size, MAX_SYNTHETIC_ROWS),
            num_eval=int(num_eval),
            seed=seed,
        )
    else:
        own_format = spec.dataset_source == ds.source  # a replaced source has its shape detected
        rows = load_rows(spec.dataset_source, ds.split)
        if ds.eval_source:
            eval_rows = load_rows(ds.eval_source, "train")
        else:
            eval_rows = load_rows(spec.dataset_source, ds.eval_split) if ds.eval_split else None
        train, held = file_splits(
            rows,
            eval_rows,
            fmt=ds.format if own_format else "auto",
            eval_fraction=ds.eval_fraction,
            num_train=num_train,
            num_eval=num_eval,
            seed=seed,
            source=spec.dataset_source,
            columns=ds.columns,
            strict=is_local_file(spec.dataset_source),
        )
    max_len = settings.max_seq_length
    return tokenize(train, tokenizer, max_len), tokenize(held, tokenizer, max_len)


# --- the run's state ---------------------------------------------------------------------------


@dataclass
class Runtime:
    """Where the run happens: ranks, the device, the numeric mode."""

    dist: Dist
    device: Any
    cuda: bool
    bf16: bool  # bf16 autocast / weights (GPU with bf16 support only)
    cpu_bf16: bool = False  # the training forward/backward under bf16 autocast on a CPU (the cpu_bf16 setting)
    thread_guard: Any = None  # a spinning CPU run's cpu_share.ThreadGuard: fewer threads while others need the CPU

    def watch_cpu(self) -> None:
        """Training begins: the thread guard (if any) starts sampling."""
        if self.thread_guard is not None:
            self.thread_guard.watch()

    def share_cpu(self, reporter: Any) -> None:
        """Apply the thread guard's ask between steps (the training thread owns torch's thread count)."""
        if self.thread_guard is not None and (change := self.thread_guard.apply()):
            reporter.log(change)

    def sharing_cpu(self, reporter: Any, then: Callable[[int, int], None] | None = None) -> Callable[[int, int], None]:
        """A progress callback for the held-out answers (a minute on 2 cores) that applies the guard's ask between
        batches, as between training steps, then calls ``then(done, total)``."""

        def answered(done: int, total: int) -> None:
            self.share_cpu(reporter)
            if then is not None:
                then(done, total)

        return answered

    def autocast(self) -> contextlib.AbstractContextManager:
        """Evaluation's and generation's numeric mode: bf16 on a GPU; float32 on a CPU, as the model is served."""
        import torch

        return torch.autocast("cuda", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()

    @property
    def compute_dtype(self) -> str:
        """The training matmuls' dtype, as metrics.json records it (``playground plan`` matches runs by it)."""
        return "bfloat16" if self.bf16 or self.cpu_bf16 else "float32"

    def train_autocast(self) -> contextlib.AbstractContextManager:
        """The training step's numeric mode: :meth:`autocast`, or bf16 on a CPU with ``cpu_bf16``."""
        import torch

        return torch.autocast("cpu", dtype=torch.bfloat16) if self.cpu_bf16 else self.autocast()

    def synchronize(self) -> None:
        """Wait for queued device work (CUDA runs asynchronously), before reading a clock."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        if self.dist.world_size > 1:
            import torch.distributed

            torch.distributed.barrier()


@dataclass
class DataState:
    """The tokenizer, the tokenized train and held-out sets, and the deterministic batch order."""

    tokenizer: Any
    train_set: Any
    eval_set: Any
    batches: Any
    plan: BatchPlan


@dataclass
class ModelState:
    """The model as saved and evaluated (``model``) and as trained (``train_model``: the same
    module when single or FSDP2-sharded in place, a wrapper under DDP), with what MFU and the
    optimizer need to know about it."""

    model: Any
    train_model: Any
    strategy: str  # single | ddp | fsdp
    trainable: list[Any]
    n_params: int
    weights_dtype: Any
    flops: FlopCounter


@dataclass
class OptimizerState:
    optimizer: Any
    scheduler: Any


@dataclass
class TrainState:
    """What the loop advances and a checkpoint keeps: the step, the eval history, the training clock."""

    start_step: int = 0
    step: int = 0
    last_loss: float = math.nan
    history: list[dict[str, Any]] = field(default_factory=list)
    clock: Clock = field(default_factory=Clock)
    average: list[Any] | None = None  # the running mean of the trainable weights (``average_last``), float32
    averaged_steps: int = 0  # how many steps' weights it holds


class Recipe:
    """One run: the spec, its resolved settings and what each stage builds (``runtime``, ``data``,
    ``model``, ``optim``, ``state``), run as ``setup() → train() → cleanup()``. A stage's attribute
    exists once that stage has run."""

    runtime: Runtime
    data: DataState
    model: ModelState
    optim: OptimizerState

    def __init__(self, spec: TrainSpec, reporter: Reporter) -> None:
        self.wall_start = time.perf_counter()
        self.spec, self.reporter = spec, reporter
        self.settings = spec.settings
        self.state = TrainState()
        self.finish = FinishReporter(reporter)  # the Evaluating and Saving phases after the last step
        self.finish_estimate = 0.0  # seconds they took last time (setup finds out), added to the ETA
        self.eta = EtaSmoother(self.settings.max_steps)  # smoothed; setup adds the finish (earlier run's or plan's)
        self.load = LoadRecorder(cpu_threads())  # the machine's load while training: metrics.json's load_factor
        self.stop_watch = StopWatch.from_env()  # a stop request (a booth deadline): checked at every step boundary
        self.stopped: StopRequest | None = None  # set when one ended training before max_steps
        self.eval_finish_by: float | None = None  # the final evaluation answers only what fits before this
        self.eval_answered: int | None = None  # held-out requests it answered, when fewer than all
        self.eval_answers: list[str] | None = None  # the last held-out evaluation's answers

    def setup(self) -> None:
        """Ranks and device, data, model, optimizer, and the state (``--resume``: the checkpoint's)."""
        self.runtime = setup_distributed(self)
        self.data = setup_data(self)
        self.model = setup_model(self)
        self.optim = setup_optimizer(self)
        self.state = restore(self)
        # the final evaluation and save, as long as they took last time: part of every progress point's ETA
        self.finish_estimate = earlier_finish_seconds(self.spec.output, self.spec.blueprint.id, len(self.data.eval_set))
        planned = planned_finish(self.spec) if self.runtime.dist.main else None
        self.eta = make_eta(self.settings.max_steps, self.finish_estimate, planned, self.finish)

    def train(self) -> dict[str, Any]:
        """The base model's exact match (before the first step), the loop, the final eval and the save; returns the
        final metrics (also in metrics.json)."""
        base_eval(self)
        train_loop(self)
        use_average(self)
        return save(self, final_eval(self))

    def cleanup(self) -> None:
        teardown(self)


# --- the stages: each a function of the Recipe -------------------------------------------------


def setup_distributed(recipe: Recipe) -> Runtime:
    """Ranks (torchrun or a single process; NCCL on GPU, gloo on CPU), the device, bf16 or float32,
    the seed."""
    import torch

    dist = init_distributed()
    recipe.reporter.enabled = recipe.reporter.enabled and dist.main
    cuda = torch.cuda.is_available()
    guard = None
    if not cuda:
        full = cpu_threads()
        torch.set_num_threads(full if os.environ.get("PLAYGROUND_TRAIN_THREADS") else cpu_share.start_threads(full))
        if dist.world_size == 1:
            guard = cpu_share.ThreadGuard.for_this_process(full, start=torch.get_num_threads())
    # bf16 on GPU (autocast over fp32 masters for scratch models, bf16 weights for hub models); float32 on CPU,
    # unless the blueprint asks for cpu_bf16 and the CPU has bf16 instructions (emulated bf16 is slower).
    bf16 = cuda and torch.cuda.is_bf16_supported()
    cpu_bf16 = not cuda and recipe.settings.cpu_bf16
    if cpu_bf16 and not cpu_has_bf16():
        cpu_bf16 = False
        recipe.reporter.log("cpu_bf16: this CPU has no bf16 instructions (AVX512-BF16 or AMX); training in float32")
    torch.manual_seed(recipe.settings.seed)
    device = torch.device(f"cuda:{dist.local_rank}" if cuda else "cpu")
    return Runtime(dist, device, cuda, bf16, cpu_bf16, thread_guard=guard)


def _threads_note(runtime: Runtime) -> str:
    """Why the model line's thread count is what it is: spinning alone, or fewer than the cores because others kept
    them busy at the start (the guard takes them back when they sit idle). Only a run with a thread guard starts on
    fewer than its cores or spins with a guard."""
    import torch

    guard = runtime.thread_guard
    if guard is None:
        return ""
    if cpu_share.spinning():
        return " (spinning: alone on an idle CPU)"
    if torch.get_num_threads() < guard.full:
        return f" of {guard.full} (the others were busy at the start; taken back when idle)"
    return ""


def setup_data(recipe: Recipe) -> DataState:
    """Tokenizer (with the chat template), train and held-out sets, batch order."""
    spec, runtime = recipe.spec, recipe.runtime
    plan = recipe.settings.plan(runtime.dist.world_size)
    kind, ref = models.parse_source(spec.model_source)
    tokenizer = models.load_tokenizer(kind, ref, spec.blueprint.model)
    train_set, eval_set = load_data(spec, tokenizer, runtime.dist)
    recipe.reporter.log(
        f"data: {len(train_set)} training and {len(eval_set)} held-out examples from {spec.dataset_source} "
        f"(up to {train_set.input_ids.shape[1]} tokens each); global batch {plan.global_batch} = "
        f"{runtime.dist.world_size} process(es) × {plan.micro_steps} micro-batch(es) × {plan.micro_batch}"
    )
    # Small tensors: keep the whole tokenized training set on the device, index it there.
    train_set.input_ids = train_set.input_ids.to(runtime.device)
    train_set.labels = train_set.labels.to(runtime.device)
    batches = Batches(
        train_set,
        batch_size=plan.micro_batch,
        seed=recipe.settings.seed,
        rank=runtime.dist.rank,
        world_size=runtime.dist.world_size,
        grad_accum=plan.micro_steps,
        width_multiple=CPU_BF16_WIDTH_MULTIPLE if runtime.cpu_bf16 else 1,
        packing=recipe.settings.packing,
    )
    return DataState(tokenizer, train_set, eval_set, batches, plan)


def build_model(spec: TrainSpec, tokenizer: Any, weights_dtype: Any) -> Any:
    """The blueprint's model as it trains (LoRA-wrapped for LoRA), on the CPU, with its generation
    settings; seeded, so every rank builds the same weights."""
    kind, ref = models.parse_source(spec.model_source)
    blueprint = spec.blueprint
    model = models.build_model(kind, ref, blueprint.model, tokenizer, dtype=weights_dtype, seed=spec.settings.seed)
    models.configure_generation(model, tokenizer, blueprint.serving.max_new_tokens)
    return model


def saves_base_model(kind: str) -> bool:
    """Whether the job writes its base model beside its model (``output/base-model``): a scratch model (its untrained
    weights exist nowhere else), and a packaged model (``pkg://``) trained on a cluster, where KServe can load nothing
    from a Python package: its adapter is served on that copy."""
    from playground.runs.settings import JOB_BACKEND_ENV

    return kind == "scratch" or (kind == "pkg" and os.environ.get(JOB_BACKEND_ENV) in ("kubernetes", "kuberay"))


def setup_model(recipe: Recipe) -> ModelState:
    """Build or load the model (+ LoRA), save the untrained scratch model, then wrap it for data
    parallelism (DDP, or FSDP2 sharding; see playground/train/parallel.py)."""
    import torch

    spec, runtime, settings, tokenizer = recipe.spec, recipe.runtime, recipe.settings, recipe.data.tokenizer
    blueprint, dist = spec.blueprint, runtime.dist
    kind, _ = models.parse_source(spec.model_source)
    weights_dtype = torch.bfloat16 if (runtime.bf16 and kind != "scratch") else torch.float32
    model = build_model(spec, tokenizer, weights_dtype)
    if saves_base_model(kind) and dist.main and not (spec.output / "base-model").exists():
        save_model_dir(model, tokenizer, spec.output / "base-model")  # the untrained model, for base-vs-tuned chat
    if blueprint.method.kind == "lora":
        model = models.apply_lora(model, blueprint.method, spec.params)
    model.to(runtime.device)
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    flops = count_flops(model)
    device_bytes = torch.cuda.get_device_properties(runtime.device).total_memory if runtime.cuda else None
    strategy = parallel.choose_strategy(
        settings.distributed,
        world_size=dist.world_size,
        state_bytes=parallel.training_state_bytes(model),
        device_bytes=device_bytes,
    )
    if settings.first_averaged_step and strategy == "fsdp":
        raise UserError(
            "training setting 'average_last' is not wired for FSDP2 (the average would be sharded); allowed: 0, "
            "or distributed: ddp",
            field="average_last",
        )
    train_model = parallel.wrap(
        model, strategy, device_ids=[dist.local_rank] if runtime.cuda else None, bf16_compute=runtime.bf16
    )
    workers = (
        f"{dist.world_size} GPUs"
        if runtime.cuda
        else f"{dist.world_size} process(es) × {torch.get_num_threads()} threads" + _threads_note(runtime)
    )
    recipe.reporter.log(
        f"model: {spec.model_source} ({n_params / 1e6:.2f}M parameters, {n_trainable / 1e6:.2f}M trainable, "
        f"{blueprint.method.kind}) on {runtime.device} in {'bf16' if runtime.bf16 else 'float32'}, {workers}"
        + (f", {'FSDP2' if strategy == 'fsdp' else 'DDP'}" if strategy != "single" else "")
    )
    if settings.compile:
        train_model = compile_model(train_model, dynamic=settings.packing)
    trainable = [p for p in model.parameters() if p.requires_grad]  # after sharding: FSDP2 swaps in DTensors
    return ModelState(model, train_model, strategy, trainable, n_params, weights_dtype, flops)


def setup_optimizer(recipe: Recipe) -> OptimizerState:
    """AdamW (no weight decay on vectors), linear warmup then cosine decay."""
    import torch

    settings, trainable = recipe.settings, recipe.model.trainable
    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0}],
        lr=settings.learning_rate,
        betas=(0.9, 0.95),
        fused=recipe.runtime.cuda or None,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(settings.warmup_steps, settings.max_steps))
    return OptimizerState(optimizer, scheduler)


def restore(recipe: Recipe) -> TrainState:
    """With ``--resume``, load the latest checkpoint (weights, optimizer, schedule, RNG, step, history,
    training time) on every rank; otherwise a fresh state at step 0."""
    spec, dist, optim = recipe.spec, recipe.runtime.dist, recipe.optim
    state = TrainState()
    if not spec.resume:
        return state
    latest = check_resume(spec, recipe.settings) if dist.main else None
    saved = checkpoint.load_checkpoint(
        latest,
        model=recipe.model.model,
        optimizer=optim.optimizer,
        scheduler=optim.scheduler,
        world_size=dist.world_size,
        main=dist.main,
    )
    if saved is None:
        recipe.reporter.log("resume: no checkpoint yet; starting from step 0")
        return state
    state.start_step = state.step = int(saved["step"])
    if saved.get("average"):  # the running weight average (average_last) continues where it was
        weights = saved["average"]["weights"]
        state.average = [weights[name].to(recipe.runtime.device) for name in trainable_names(recipe)]
        state.averaged_steps = int(saved["average"]["steps"])
    state.history = list(saved["extra"].get("history", []))
    state.clock.wall = float(saved["extra"].get("train_seconds", 0.0))
    state.clock.cpu = float(saved["extra"].get("train_cpu_seconds", 0.0))
    recipe.reporter.log(f"resume: continuing from checkpoints/step-{state.start_step} (step {state.start_step})")
    return state


def measures_exact_match(blueprint: Any) -> bool:
    """Whether the held-out evaluation generates answers and scores their exact match."""
    return blueprint.dataset.format == "synthetic" or blueprint.quality.metric == "eval_exact_match"


def answer_budget(recipe: Recipe) -> int:
    """Tokens an answer to a held-out request may take: the longest expected answer and two more, at most the
    serving limit."""
    return min(recipe.spec.blueprint.serving.max_new_tokens, _longest_answer(recipe.data.eval_set) + 2)


def held_out_exact_match(recipe: Recipe, model: Any, on_answered: Callable[[int, int], None] | None = None) -> float:
    """``model``'s greedy answers to the held-out requests, scored by exact match (the thread guard's ask applies
    between batches)."""
    data, runtime = recipe.data, recipe.runtime
    prompts = data.eval_set.prompt_ids
    with runtime.autocast():
        answers = answer_in_time(
            lambda ids, progress: evaluate.generate_answers(
                model, data.tokenizer, ids, max_new_tokens=answer_budget(recipe), device=runtime.device,
                on_progress=progress,
            ),
            prompts, finish_by=recipe.eval_finish_by, on_progress=runtime.sharing_cpu(recipe.reporter, on_answered),
        )  # fmt: skip
    if len(answers) < len(prompts):  # stopped early with little time left: fewer requests, still a score
        recipe.eval_answered = len(answers)
        recipe.reporter.log(f"evaluation: {len(answers)} of {len(prompts)} held-out requests answered in the time left")
    recipe.eval_answers = answers  # the final evaluation's are written as output/eval_answers.jsonl
    return evaluate.exact_match(answers, [s.answer for s in data.eval_set.samples][: len(answers)])


def base_eval(recipe: Recipe) -> dict[str, float]:
    """The untouched model's held-out exact match (``base_eval_exact_match``), measured before the first step, in the
    Initializing phase: the "before" of the page's headline. Before any step the model is the base (LoRA's B matrices
    start at zero) or, for a model trained from scratch, its random initialisation. Skipped on ``--resume`` from a
    checkpoint (the checkpoint's history keeps the figure) and for tasks without exact match."""
    spec, runtime, data, state = recipe.spec, recipe.runtime, recipe.data, recipe.state
    if state.start_step or spec.resume or not measures_exact_match(spec.blueprint):
        return {}
    started = time.perf_counter()
    results: dict[str, float] = {}
    # not under FSDP2, where generation is collective: a cache one rank sees and another does not would split it
    cache = base_eval_cache_of(recipe) if recipe.model.strategy != "fsdp" else None
    cached = evaluate.read_cached(cache)
    if cached is not None:  # the same base model asked the same questions before (a booth runs one blueprint all day)
        results = cached
    elif runtime.dist.main or recipe.model.strategy == "fsdp":
        recipe.reporter.phase(JobPhase.INITIALIZING, f"asking the base model {len(data.eval_set)} held-out questions")
        runtime.watch_cpu()  # two runs launched at once both start spinning: the first to see the other gives way
        results["base_eval_exact_match"] = held_out_exact_match(recipe, unwrap(recipe.model.model))
        if runtime.dist.main:
            evaluate.write_cached(cache, results)
    if runtime.dist.main:
        seconds = time.perf_counter() - started
        how = "known from an earlier run" if cached is not None else f"{seconds:.1f} s"
        recipe.reporter.log(
            f"base model before training: exact match {results['base_eval_exact_match']:.1%} on "
            f"{len(data.eval_set)} held-out examples ({how})"
        )
        recipe.reporter.metric("base_eval_exact_match", results["base_eval_exact_match"])
        state.history.append({"step": 0, "train_seconds": 0.0, **results})
    runtime.barrier()
    return results


def base_eval_cache_of(recipe: Recipe) -> Path | None:
    """:func:`base_eval_cache` for ``recipe``'s model and held-out set (its data set up); ``playground.train.warm``
    fills the same file ahead of the first run."""
    eval_set = recipe.data.eval_set
    expected = [s.answer for s in eval_set.samples]
    return base_eval_cache(recipe.spec.model_source, eval_set.prompt_ids, expected, answer_budget(recipe))


def base_eval_cache(
    model_source: str, prompt_ids: list[list[int]], answers: list[str], max_new_tokens: int
) -> Path | None:
    """Where a pretrained base model's held-out figures are kept (the model cache's ``base-evals/``), keyed by the
    model (a packaged model's converted directory, named by its hash; a hub id) and the exact questions, answers
    and token budget. None for models that may change (a local directory) or cost nothing (built from config)."""
    from playground.models import packaged

    if model_source.startswith(packaged.SCHEME):
        found = packaged.find_converted(model_source)
        model = found.name if found is not None else None
    else:
        model = model_source if model_source.startswith("hf://") else None
    if model is None:
        return None
    key = json.dumps([model, prompt_ids, answers, max_new_tokens], separators=(",", ":"))
    return packaged.cache_root() / "base-evals" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def evaluate_model(recipe: Recipe, on_answered: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """Held-out metrics (eval loss; exact match for synthetic tasks), reported by rank 0 as Metric
    events and appended to the history. Rank 0 evaluates alone, except under FSDP2, where every
    forward pass is a collective: there every rank runs the same eval (generation with
    ``synced_gpus``, which transformers turns on for FSDP-managed models)."""
    spec, runtime, data, state = recipe.spec, recipe.runtime, recipe.data, recipe.state
    runtime.share_cpu(recipe.reporter)
    results: dict[str, float] = {}
    trained_seconds = state.clock.wall_total()  # before the eval's own time
    if runtime.dist.main or recipe.model.strategy == "fsdp":
        bare = unwrap(recipe.model.model)
        results["eval_loss"] = evaluate.eval_loss(
            bare, data.eval_set, batch_size=max(recipe.settings.batch_size, 32), device=runtime.device,
            autocast=runtime.autocast,
        )  # fmt: skip
        if measures_exact_match(spec.blueprint):
            results["eval_exact_match"] = held_out_exact_match(recipe, bare, on_answered)
    if runtime.dist.main:
        for name, value in results.items():
            recipe.reporter.metric(name, value)
        state.history.append({"step": state.step, "train_seconds": round(trained_seconds, 3), **results})
    runtime.barrier()
    return results


def save_checkpoint(recipe: Recipe) -> None:
    """Write ``checkpoints/step-N`` for ``--resume``: every rank gathers, rank 0 writes."""
    runtime, data, state = recipe.runtime, recipe.data, recipe.state
    micro_step = state.step * data.plan.micro_steps
    checkpoint.save_checkpoint(
        recipe.spec.output / "checkpoints",
        step=state.step,
        model=recipe.model.model,
        optimizer=recipe.optim.optimizer,
        scheduler=recipe.optim.scheduler,
        data_position=dict(zip(("epoch", "batch"), data.batches.position(micro_step), strict=True)),
        config=recipe.settings.resume_config(),
        average=average_state(recipe),
        extra={
            "history": state.history,
            "train_seconds": state.clock.wall_total(),
            "train_cpu_seconds": state.clock.cpu_total(),
            "loss": state.last_loss,
            "world_size": runtime.dist.world_size,
            "strategy": recipe.model.strategy,
        },
        main=runtime.dist.main,
    )
    runtime.barrier()


@dataclass
class _Window:
    """Figures summed over the steps since the last Progress event."""

    loss: Any  # a device tensor: summing needs no sync
    steps: int = 0
    tokens: int = 0
    flops: int = 0  # this rank's model FLOPs since the MFU timer started (warm-up steps left out)
    warmup_seconds: float = 0.0  # window time spent in warm-up steps (not in the MFU timer)


def train_loop(recipe: Recipe) -> None:
    """Steps ``start_step+1 .. max_steps``: gradient accumulation, clipping, AdamW, the schedule; a
    Progress event every ``log_every`` steps (and the last), eval and checkpoints on their cadence.
    ``loss.item()`` (a device sync) happens only on logging steps. Advances ``recipe.state``.

    The loss of a step is the mean over every answer token of its global batch, whatever the
    number of processes and micro-batches: each micro-batch sums its token losses and divides by
    the step's total (``num_items_in_batch``), and the gradient is scaled by the world size because
    DDP and FSDP2 average gradients over ranks. So 1 and 16 processes compute the same step."""
    import torch

    runtime, settings, data, model = recipe.runtime, recipe.settings, recipe.data, recipe.model
    optim, state = recipe.optim, recipe.state
    world, micro_steps, max_steps = runtime.dist.world_size, data.plan.micro_steps, settings.max_steps
    peak = peak_flops(torch.cuda.get_device_name(runtime.device) if runtime.cuda else None)
    # MFU leaves out this process's first steps (warm-up), but always measures at least one step.
    warmup_end = state.start_step + min(MFU_WARMUP_STEPS, max(0, max_steps - state.start_step - 1))
    recipe.reporter.phase(JobPhase.TRAINING)
    model.train_model.train()
    window = _Window(torch.zeros((), device=runtime.device))
    state.clock.restart()  # training time starts now: setup and a resume's checkpoint load are not training
    runtime.watch_cpu()
    for step in range(state.start_step + 1, max_steps + 1):
        runtime.share_cpu(recipe.reporter)
        label_tokens = data.batches.label_tokens(step - 1)
        for micro in range(micro_steps):
            micro_step = (step - 1) * micro_steps + micro
            ids, labels, n_tokens = data.batches.batch(micro_step)
            inputs = model_inputs(
                ids, labels, data.batches.lengths(micro_step), packing=data.batches.packing,
                width_multiple=data.batches.width_multiple,
            )  # fmt: skip
            with gradient_sync(model.train_model, model.strategy, micro == micro_steps - 1), runtime.train_autocast():
                loss = causal_lm_loss(model.train_model, inputs, label_tokens, answer_only=not settings.compile)
            (loss * world).backward()
            window.loss += loss.detach()
            window.tokens += n_tokens
            if peak and step > warmup_end:
                lengths = data.batches.lengths(micro_step)
                window.flops += model.flops.batch(n_tokens, int((lengths * lengths).sum()))
        torch.nn.utils.clip_grad_norm_(model.trainable, MAX_GRAD_NORM)
        optim.optimizer.step()
        optim.scheduler.step()
        optim.optimizer.zero_grad(set_to_none=True)
        window.steps += 1
        state.step = step
        if settings.first_averaged_step and step >= settings.first_averaged_step:
            add_to_average(recipe)

        if step % settings.log_every == 0 or step == max_steps:
            _report_progress(recipe, window, peak)
            window = _Window(window.loss.zero_())
        elif peak and step == warmup_end:  # warm-up over mid-window: the MFU timer starts now
            runtime.synchronize()
            window.warmup_seconds += state.clock.lap()
        if settings.eval_every and step % settings.eval_every == 0 and step < max_steps:
            with state.clock.paused():  # eval time is not training time
                evaluate_model(recipe)
        if settings.checkpoint_every and step % settings.checkpoint_every == 0:
            with state.clock.paused():
                save_checkpoint(recipe)
        if step < max_steps and stop_requested(recipe, step):
            if window.steps:  # the last trained step's point
                _report_progress(recipe, window, peak)
            recipe.stopped = recipe.stop_watch.requested() or StopRequest("stop", time.time())
            recipe.reporter.log(f"{recipe.stopped.describe(step, max_steps)}: evaluating and saving the model")
            break
    state.clock.lap()


def stop_requested(recipe: Any, step: int) -> bool:
    """Whether training should stop after ``step`` (a stop file: :mod:`playground.stopping`). Distributed, every rank
    must agree: one tiny all-reduce on logging steps only (they sync the device anyway)."""
    asked = recipe.stop_watch.requested() is not None
    if recipe.runtime.dist.world_size == 1:
        return asked
    if step % recipe.settings.log_every:
        return False
    import torch
    import torch.distributed

    flag = torch.tensor([1.0 if asked else 0.0], device=recipe.runtime.device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


def average_state(recipe: Recipe) -> dict[str, Any] | None:
    """The running weight average for a checkpoint (CPU copies keyed by parameter name), None when there is none."""
    state = recipe.state
    if state.average is None or not state.averaged_steps:
        return None
    weights = zip(trainable_names(recipe), state.average, strict=True)
    return {"steps": state.averaged_steps, "weights": {name: mean.cpu().clone() for name, mean in weights}}


def trainable_names(recipe: Recipe) -> list[str]:
    """The names of ``recipe.model.trainable``, in its order."""
    return [name for name, p in recipe.model.model.named_parameters() if p.requires_grad]


def add_to_average(recipe: Recipe) -> None:
    """Fold this step's trainable weights into their running mean (float32; ``average_last``)."""
    import torch

    state = recipe.state
    with torch.no_grad():
        if state.average is None or not state.averaged_steps:
            state.average = [p.detach().float().clone() for p in recipe.model.trainable]
        else:
            for mean, param in zip(state.average, recipe.model.trainable, strict=True):
                mean.lerp_(param.detach().float(), 1.0 / (state.averaged_steps + 1))
    state.averaged_steps += 1


def use_average(recipe: Recipe) -> None:
    """After the last step: the trainable weights become their mean over the averaged steps (what the final
    evaluation scores and the model directory holds). Nothing changes when nothing was averaged."""
    import torch

    state, first = recipe.state, recipe.settings.first_averaged_step
    if state.average is None or not state.averaged_steps:
        return
    with torch.no_grad():
        for mean, param in zip(state.average, recipe.model.trainable, strict=True):
            param.copy_(mean.to(param.dtype))
    recipe.reporter.log(
        f"weights: the mean of steps {first}-{recipe.settings.max_steps} ({state.averaged_steps} steps, average_last "
        f"{recipe.settings.average_last:g})"
    )


def _report_progress(recipe: Recipe, window: _Window, peak: float | None) -> None:
    """One Progress event for the window: loss and tokens summed over ranks, MFU per device."""
    import torch

    runtime, state = recipe.runtime, recipe.state
    world = runtime.dist.world_size
    counts = torch.tensor([window.tokens, window.flops], dtype=torch.float64, device=runtime.device)
    totals = torch.cat([window.loss.double().reshape(1), counts])
    if world > 1:
        torch.distributed.all_reduce(totals)
    loss_sum, tokens, flops = totals.tolist()  # the only device sync of the window
    state.last_loss = loss_sum / window.steps  # each step's loss is already its global-batch mean
    timed = state.clock.lap()  # since the window (or the MFU timer) started
    elapsed = window.warmup_seconds + timed
    step, max_steps = state.step, recipe.settings.max_steps
    if not runtime.cuda:
        recipe.load.sample(elapsed, torch.get_num_threads())
    recipe.reporter.progress(
        Progress(
            step=step,
            total_steps=max_steps,
            epoch=round(recipe.data.batches.epoch_float(step * recipe.data.plan.micro_steps), 4),
            loss=state.last_loss,
            learning_rate=recipe.optim.scheduler.get_last_lr()[0],
            tokens_per_second=tokens / elapsed if elapsed > 0 else None,
            eta_seconds=recipe.eta.update(step, window.steps, elapsed),  # smoothed, with the evaluation and save
            gpu_memory_bytes=torch.cuda.max_memory_allocated(runtime.device) if runtime.cuda else None,
            mfu=mfu(flops / world, timed, peak),
        )
    )
    if not math.isfinite(state.last_loss):
        raise FloatingPointError(f"loss became {state.last_loss} at step {step}; try a lower learning_rate")


def final_eval(recipe: Recipe) -> dict[str, float]:
    """Held-out metrics of the trained model (the quality bar reads them), as the Evaluating phase."""
    if recipe.stopped is None:
        recipe.state.step = recipe.settings.max_steps
    request = recipe.stopped or recipe.stop_watch.requested()  # asked during the last step: the time limit holds
    recipe.eval_finish_by = request.eval_finish_by() if request is not None else None
    if recipe.stopped is not None:  # Evaluating and Saving say where training stopped
        recipe.finish.reporter = NotedReporter(
            recipe.reporter, recipe.stopped.describe(recipe.state.step, recipe.settings.max_steps)
        )
    recipe.finish.evaluating(len(recipe.data.eval_set))
    recipe.eval_answers = None
    results = evaluate_model(recipe, on_answered=recipe.finish.answered)
    if recipe.runtime.dist.main and recipe.eval_answers is not None:
        write_eval_answers(recipe.spec.output / EVAL_ANSWERS, recipe.data.eval_set.samples, recipe.eval_answers)
    return results


EVAL_ANSWERS = "eval_answers.jsonl"  # the final evaluation's answers, one JSON object per held-out request


def write_eval_answers(path: Path, samples: list[Any], answers: list[str]) -> None:
    """One line per answered held-out request: its prompt ``messages`` (as the chat template got them), the
    ``answer``, the ``expected`` one and whether it is ``correct`` (:func:`evaluate.exact_match`'s rule)."""
    records = [
        {
            "messages": sample.prompt_messages(),
            "answer": answer,
            "expected": sample.answer,
            "correct": evaluate.exact_match([answer], [sample.answer]) == 1.0,
        }
        for sample, answer in zip(samples, answers, strict=False)
    ]
    lines = [json.dumps(record) for record in records]
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)


def save(recipe: Recipe, final: dict[str, float], *, merge: bool = False) -> dict[str, Any]:
    """The servable ``model/`` directory (a LoRA job's: its PEFT adapter, unless ``merge``: a GRPO warm start's
    is the policy's starting weights) and ``metrics.json``, written atomically by rank 0.
    FSDP2-sharded weights are gathered into a plain copy of the model on rank 0's CPU first."""
    import torch

    spec, runtime, data, model, state = recipe.spec, recipe.runtime, recipe.data, recipe.model, recipe.state
    recipe.finish.saving()
    to_save = model.model
    if model.strategy == "fsdp":
        weights = parallel.full_state_dict(model.model)  # every rank takes part; rank 0 gets them
        to_save = None
        if runtime.dist.main:
            to_save = build_model(spec, data.tokenizer, model.weights_dtype)
            if spec.blueprint.method.kind == "lora":
                to_save = models.apply_lora(to_save, spec.blueprint.method, spec.params)
            to_save.load_state_dict(weights)
    metrics: dict[str, Any] = {}
    if runtime.dist.main:
        save_dtype = torch.bfloat16 if model.weights_dtype == torch.bfloat16 else None
        base = str(spec.output / "base-model") if spec.model_source.startswith("scratch://") else None
        save_model_dir(to_save, data.tokenizer, spec.output / "model", dtype=save_dtype, merge=merge, base_model=base)
        metrics = {
            **final,
            **{  # the base model's figures (history keeps them across a resume)
                name: value
                for entry in state.history
                if entry["step"] == 0
                for name, value in entry.items()
                if name.startswith("base_")
            },
            "train_loss": state.last_loss,
            "steps": state.step,
            "train_seconds": round(state.clock.wall, 3),
            "train_cpu_seconds": round(state.clock.cpu, 3),
            "wall_seconds": round(time.perf_counter() - recipe.wall_start, 3),
            "num_train_examples": len(data.train_set),
            "num_eval_examples": len(data.eval_set),
            "parameters": model.n_params,
            "device": str(runtime.device),
            "world_size": runtime.dist.world_size,
            "strategy": model.strategy,
            "global_batch_size": data.plan.global_batch,
            "resumed_from_step": state.start_step or None,
            "averaged_steps": state.averaged_steps,  # average_last: the model holds the mean of the last this many
            "history": state.history,
            **measured_footprint(recipe),
            "finish_seconds": recipe.finish.seconds,  # the final evaluation and the save: the next run's ETA has it
            "evaluate_seconds": recipe.finish.evaluate_seconds,  # the evaluation alone: the plan's breakdown has it
            # the load it trained under (the CPU it got): the plan scales its times back to an idle machine by it
            "load_factor": recipe.load.measured(state.clock.wall, state.clock.cpu, gpu=runtime.cuda),
            "load_average_factor": recipe.load.factor,  # what the load average said it would be
        }
        if recipe.stopped is not None:  # a stop request (a booth deadline) ended training early
            metrics["stopped"] = stopped_record(
                recipe.stopped, state.step, recipe.settings.max_steps, recipe.eval_answered, len(data.eval_set)
            )
        write_metrics(spec.output, metrics)
    return metrics


def stopped_record(
    request: StopRequest, step: int, total_steps: int, answered: int | None, eval_examples: int
) -> dict[str, Any]:
    """``metrics.json``'s ``stopped``: why and where training stopped, and how much of the held-out set was scored."""
    return {
        "reason": request.reason,
        "step": step,
        "total_steps": total_steps,
        "message": request.describe(step, total_steps),
        "eval_examples_answered": eval_examples if answered is None else answered,
        "eval_examples": eval_examples,
    }


def write_metrics(output: Path, metrics: dict[str, Any]) -> None:
    """``metrics.json`` in ``output``, written atomically (strict JSON: NaN/inf become null)."""
    tmp = output / ".metrics.json.tmp"
    tmp.write_text(json.dumps(_finite_json(metrics), indent=2, allow_nan=False, default=str) + "\n")
    tmp.replace(output / "metrics.json")


def peak_memory(runtime: Runtime) -> dict[str, Any]:
    """This process's peak memory: the allocator's reserved peak on a GPU, RSS on a CPU."""
    import resource

    import torch

    if runtime.cuda:
        return {
            "peak_memory_bytes": int(torch.cuda.max_memory_reserved(runtime.device)),
            "peak_memory_kind": "gpu_reserved",
        }
    rss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
    return {"peak_memory_bytes": rss, "peak_memory_kind": "rss"}


def measured_footprint(recipe: Recipe) -> dict[str, Any]:
    """What ``playground plan`` learns from a finished run: peak memory of this process (RSS on CPU, the
    allocator's reserved peak on a GPU), trainable parameters, and the tokens and model FLOPs of all
    steps (rank 0's micro-batches × world size: the ranks' shares are the same size)."""
    import torch

    runtime, data, model = recipe.runtime, recipe.data, recipe.model
    micro_steps = recipe.state.step * data.plan.micro_steps
    tokens = squares = widths = 0
    for micro_step in range(micro_steps):
        lengths = data.batches.lengths(micro_step)
        tokens += int(lengths.sum())
        squares += int((lengths * lengths).sum())
        widths += data.batches.computed_width(lengths)
    world = runtime.dist.world_size
    return {
        "trainable_parameters": sum(p.numel() for p in model.trainable),  # FSDP2 DTensors: the global size
        **peak_memory(runtime),
        "train_tokens": tokens * world,
        "train_flops": model.flops.batch(tokens, squares) * world,
        "mean_padded_width": round(widths / max(1, micro_steps), 2),
        "micro_batch_size": data.plan.micro_batch,
        "dtype": "bfloat16" if model.weights_dtype == torch.bfloat16 else "float32",
        "compute_dtype": runtime.compute_dtype,
    }


def teardown(recipe: Recipe) -> None:
    """Stop the thread guard; wait for every rank, then leave the process group."""
    if recipe.runtime.thread_guard is not None:
        recipe.runtime.thread_guard.stop()
    if recipe.runtime.dist.world_size > 1:
        import torch.distributed

        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def run(spec: TrainSpec, reporter: Reporter) -> dict[str, Any]:
    """Train, evaluate and save; returns the final metrics (also written to metrics.json)."""
    recipe = Recipe(spec, reporter)
    recipe.setup()
    metrics = recipe.train()
    recipe.cleanup()
    return metrics


def _longest_answer(data: Any) -> int:
    """Answer length in tokens (labels after the prompt), the most generation needs."""
    return int((data.labels != -100).sum(1).max()) if len(data) else 1


def _finite_json(value: Any) -> Any:
    """NaN/inf become null (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_json(v) for v in value]
    return value
