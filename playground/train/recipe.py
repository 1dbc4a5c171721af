"""The training recipe: one readable loop, nanoGPT style.

Why a hand-written loop and not ``transformers.Trainer``: the playground needs an event at an
exact cadence (every ``log_every`` optimizer steps, and the last one) with figures we control
(tokens/s, ETA, MFU), a batch that is a pure function of the step (so ``--resume`` needs only the
step), eval by greedy generation through the chat template, and no per-step overhead we did not
write: ``loss.item()`` (a device sync) happens only on logging steps. HF Trainer stays the
baseline our benchmarks compare against.

Reads top to bottom: settings → distributed setup → tokenizer and data → model (+ LoRA) →
optimizer → resume → loop (log, checkpoint, eval) → final eval → save → metrics.json.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.blueprints import Blueprint
from playground.events import JobPhase, Progress
from playground.train.reporting import Reporter

# Settings used when neither the blueprint's parameters nor its fixed ``training`` block set them.
DEFAULTS: dict[str, Any] = {
    "learning_rate": 2e-4,
    "max_steps": 100,
    "batch_size": 8,
    "gradient_accumulation_steps": 1,
    "warmup_steps": None,  # None: 5% of max_steps, at most 100
    "weight_decay": 0.0,
    "seed": 0,
    "max_seq_length": 512,
    "num_train_examples": None,  # None: all rows (synthetic: max_steps × global batch, capped)
    "num_eval_examples": 200,
    "eval_every": 0,
    "checkpoint_every": 0,
    "log_every": 10,
}
MAX_GRAD_NORM = 1.0
MIN_LR_RATIO = 0.1  # cosine decays to 10% of the peak
MAX_SYNTHETIC_ROWS = 50_000  # generated up front; longer runs cycle through them in epochs
# Dense bf16 peak FLOP/s per device, for MFU (unknown devices: MFU not reported).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12}


@dataclass(frozen=True)
class TrainSpec:
    """Everything a run needs, resolved and validated by the entrypoint."""

    blueprint: Blueprint
    params: dict[str, Any]  # blueprint parameters, validated
    output: Path
    model_source: str
    dataset_source: str
    resume: bool = False

    def setting(self, name: str) -> Any:
        """Parameter > the blueprint's fixed training setting > DEFAULTS."""
        if name in self.params:
            return self.params[name]
        if name in self.blueprint.training:
            return self.blueprint.training[name]
        return DEFAULTS.get(name)


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Dist:
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; a plain ``python -m`` run is rank 0 of 1."""
    dist = Dist(
        int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    )
    if dist.world_size > 1:
        import torch
        import torch.distributed

        if torch.cuda.is_available():
            torch.cuda.set_device(dist.local_rank)
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist


def cpu_threads() -> int:
    """Cores this process may really use: the affinity mask, capped by a cgroup CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    override = os.environ.get("PLAYGROUND_TRAIN_THREADS")
    return int(override) if override else max(1, cores)


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


def load_data(spec: TrainSpec, tokenizer: Any, dist: Dist) -> tuple[Any, Any]:
    """Tokenized train and held-out sets (never overlapping)."""
    from playground.train import data

    ds = spec.blueprint.dataset
    seed = int(spec.setting("seed"))
    num_eval = spec.setting("num_eval_examples")
    num_train = spec.setting("num_train_examples")
    if spec.dataset_source.startswith("synthetic://"):
        global_batch = spec.setting("batch_size") * spec.setting("gradient_accumulation_steps") * dist.world_size
        train, held = data.synthetic_splits(
            spec.dataset_source.removeprefix("synthetic://"),
            ds.options,
            num_train=int(num_train or min(spec.setting("max_steps") * global_batch, MAX_SYNTHETIC_ROWS)),
            num_eval=int(num_eval),
            seed=seed,
        )
    else:
        rows = data.load_rows(spec.dataset_source, ds.split)
        eval_rows = data.load_rows(spec.dataset_source, ds.eval_split) if ds.eval_split else None
        train, held = data.file_splits(
            rows,
            eval_rows,
            fmt=ds.format,
            eval_fraction=ds.eval_fraction,
            num_train=num_train,
            num_eval=num_eval,
            seed=seed,
        )
    max_len = int(spec.setting("max_seq_length"))
    return data.tokenize(train, tokenizer, max_len), data.tokenize(held, tokenizer, max_len)


def run(spec: TrainSpec, reporter: Reporter) -> dict[str, Any]:
    """Train, evaluate and save; returns the final metrics (also written to metrics.json)."""
    import torch

    from playground.train import checkpoint, evaluate
    from playground.train.data import Batches
    from playground.train.model import apply_lora, build_model, configure_generation, load_tokenizer, parse_source
    from playground.train.save import save_model_dir, unwrap

    wall_start = time.perf_counter()
    dist = init_distributed()
    reporter.enabled = reporter.enabled and dist.main
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{dist.local_rank}" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(cpu_threads())
    # bf16 on GPU (autocast over fp32 masters for scratch models, bf16 weights for hub models);
    # float32 on CPU, where bf16 matmuls are slow and gain nothing at these sizes.
    bf16 = cuda and torch.cuda.is_bf16_supported()
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    seed = int(spec.setting("seed"))
    torch.manual_seed(seed)
    output = spec.output
    blueprint = spec.blueprint

    # --- tokenizer, data, model ------------------------------------------------------------
    kind, ref = parse_source(spec.model_source)
    tokenizer = load_tokenizer(kind, ref, blueprint.model)
    train_set, eval_set = load_data(spec, tokenizer, dist)
    reporter.log(
        f"data: {len(train_set)} training and {len(eval_set)} held-out examples from {spec.dataset_source} "
        f"(up to {train_set.input_ids.shape[1]} tokens each)"
    )
    weights_dtype = torch.bfloat16 if (bf16 and kind != "scratch") else torch.float32
    model = build_model(kind, ref, blueprint.model, tokenizer, dtype=weights_dtype, seed=seed)
    configure_generation(model, tokenizer, blueprint.serving.max_new_tokens)
    if kind == "scratch" and dist.main and not (output / "base-model").exists():
        save_model_dir(model, tokenizer, output / "base-model")  # the untrained model, for base-vs-tuned chat
    if blueprint.method.kind == "lora":
        model = apply_lora(model, blueprint.method, spec.params)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    trainable = [p for p in model.parameters() if p.requires_grad]
    reporter.log(
        f"model: {spec.model_source} ({n_params / 1e6:.2f}M parameters, {sum(p.numel() for p in trainable) / 1e6:.2f}M "
        f"trainable, {blueprint.method.kind}) on {device} in {'bf16' if bf16 else 'float32'}, "
        f"{torch.get_num_threads() if not cuda else dist.world_size} {'threads' if not cuda else 'GPUs'}"
    )

    # --- optimizer and schedule --------------------------------------------------------------
    max_steps = int(spec.setting("max_steps"))
    accum = int(spec.setting("gradient_accumulation_steps"))
    batch_size = int(spec.setting("batch_size"))
    warmup = spec.setting("warmup_steps")
    warmup = int(warmup) if warmup is not None else min(100, max(1, max_steps // 20))
    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": float(spec.setting("weight_decay"))},
            {"params": no_decay, "weight_decay": 0},
        ],
        lr=float(spec.setting("learning_rate")),
        betas=(0.9, 0.95),
        fused=cuda or None,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(warmup, max_steps))
    batches = Batches(train_set, batch_size=batch_size, seed=seed, rank=dist.rank, world_size=dist.world_size)

    # --- resume ------------------------------------------------------------------------------
    ckpt_root = output / "checkpoints"
    start_step = 0
    history: list[dict[str, Any]] = []
    clock = Clock()
    if spec.resume:
        latest = checkpoint.latest_checkpoint(ckpt_root)
        if latest is None:
            reporter.log("resume: no checkpoint yet; starting from step 0")
        else:
            state = checkpoint.load_checkpoint(latest, model=model, optimizer=optimizer, scheduler=scheduler)
            start_step = int(state["step"])
            history = list(state["extra"].get("history", []))
            clock.wall = float(state["extra"].get("train_seconds", 0.0))
            clock.cpu = float(state["extra"].get("train_cpu_seconds", 0.0))
            reporter.log(f"resume: continuing from {latest.relative_to(output)} (step {start_step})")

    train_model = model
    if dist.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(model, device_ids=[dist.local_rank] if cuda else None)

    # Small tensors: keep the whole tokenized set on the device, index it there.
    train_set.input_ids = train_set.input_ids.to(device)
    train_set.labels = train_set.labels.to(device)

    log_every = max(1, int(spec.setting("log_every")))
    checkpoint_every = int(spec.setting("checkpoint_every"))
    eval_every = int(spec.setting("eval_every"))
    peak = next((f for name, f in PEAK_FLOPS.items() if cuda and name in torch.cuda.get_device_name(device)), None)
    exact = blueprint.dataset.format == "synthetic"
    gen_tokens = min(blueprint.serving.max_new_tokens, _longest_answer(eval_set) + 2)

    def run_eval(step: int) -> dict[str, float]:
        """Held-out metrics on rank 0, reported as Metric events and kept in the history."""
        results: dict[str, float] = {}
        trained_seconds = clock.wall_total()  # before the eval's own time
        if dist.main:
            bare = unwrap(model)
            results["eval_loss"] = evaluate.eval_loss(
                bare, eval_set, batch_size=max(batch_size, 32), device=device, autocast=autocast
            )
            if exact:
                with autocast():
                    answers = evaluate.generate_answers(
                        bare, tokenizer, eval_set.prompt_ids, max_new_tokens=gen_tokens, device=device
                    )
                results["eval_exact_match"] = evaluate.exact_match(answers, [s.answer for s in eval_set.samples])
            for name, value in results.items():
                reporter.metric(name, value)
            history.append({"step": step, "train_seconds": round(trained_seconds, 3), **results})
        if dist.world_size > 1:
            torch.distributed.barrier()
        return results

    # --- the loop ----------------------------------------------------------------------------
    reporter.phase(JobPhase.TRAINING)
    train_model.train()
    window_loss = torch.zeros((), device=device)
    window_steps = window_tokens = 0
    clock.lap()  # training time starts now
    last_loss = math.nan
    for step in range(start_step + 1, max_steps + 1):
        for micro in range(accum):
            ids, labels, n_tokens = batches.batch((step - 1) * accum + micro)
            sync = micro == accum - 1 or dist.world_size == 1
            with contextlib.nullcontext() if sync else train_model.no_sync(), autocast():
                loss = train_model(input_ids=ids, labels=labels).loss / accum
            loss.backward()
            window_loss += loss.detach()
            window_tokens += n_tokens
        torch.nn.utils.clip_grad_norm_(trainable, MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        window_steps += 1

        if step % log_every == 0 or step == max_steps:
            if dist.world_size > 1:
                torch.distributed.all_reduce(window_loss)
                window_loss /= dist.world_size
            last_loss = float(window_loss) / window_steps  # the only device sync of the window
            elapsed = clock.lap()
            tps = window_tokens * dist.world_size / elapsed if elapsed > 0 else None
            reporter.progress(
                Progress(
                    step=step,
                    total_steps=max_steps,
                    epoch=round(batches.epoch_float(step * accum), 4),
                    loss=last_loss,
                    learning_rate=scheduler.get_last_lr()[0],
                    tokens_per_second=tps,
                    eta_seconds=(max_steps - step) * elapsed / window_steps,
                    gpu_memory_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
                    mfu=(tps * 6 * n_params / (peak * dist.world_size)) if (peak and tps) else None,
                )
            )
            if not math.isfinite(last_loss):
                raise FloatingPointError(f"loss became {last_loss} at step {step}; try a lower learning_rate")
            window_loss.zero_()
            window_steps = window_tokens = 0
        if eval_every and step % eval_every == 0 and step < max_steps:
            with clock.paused():  # eval time is not training time
                run_eval(step)
        if checkpoint_every and step % checkpoint_every == 0:
            with clock.paused():
                if dist.main:
                    checkpoint.save_checkpoint(
                        ckpt_root,
                        step=step,
                        model=model,
                        optimizer=optimizer,
                        scheduler=scheduler,
                        data_position=dict(zip(("epoch", "batch"), batches.position(step * accum), strict=True)),
                        extra={
                            "history": history,
                            "train_seconds": clock.wall_total(),
                            "train_cpu_seconds": clock.cpu_total(),
                            "loss": last_loss,
                        },
                    )
                if dist.world_size > 1:
                    torch.distributed.barrier()

    # --- final eval, save --------------------------------------------------------------------
    clock.lap()
    train_seconds, train_cpu_seconds = clock.wall, clock.cpu
    final = run_eval(max_steps)
    reporter.phase(JobPhase.SAVING)
    metrics: dict[str, Any] = {}
    if dist.main:
        save_dtype = torch.bfloat16 if weights_dtype == torch.bfloat16 else None
        save_model_dir(model, tokenizer, output / "model", dtype=save_dtype)
        metrics = {
            **final,
            "train_loss": last_loss,
            "steps": max_steps,
            "train_seconds": round(train_seconds, 3),
            "train_cpu_seconds": round(train_cpu_seconds, 3),
            "wall_seconds": round(time.perf_counter() - wall_start, 3),
            "num_train_examples": len(train_set),
            "num_eval_examples": len(eval_set),
            "parameters": n_params,
            "device": str(device),
            "world_size": dist.world_size,
            "resumed_from_step": start_step or None,
            "history": history,
        }
        tmp = output / ".metrics.json.tmp"
        tmp.write_text(json.dumps(_finite_json(metrics), indent=2, allow_nan=False, default=str) + "\n")
        tmp.replace(output / "metrics.json")
    if dist.world_size > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
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
