"""GPU benchmark of the hub blueprints' training path: the Llama-3.2-1B and Qwen2.5-1.5B architectures at full
size (``playground.train.standins.HUB_ARCHITECTURES``: the hub configs' dimensions, random init, no hub), a
bounded number of steps of LoRA and of full fine-tuning through the project's trainer
(``python -m playground.train``, as the platform runs it) and through the Hugging Face ``Trainer`` on the same
model, the same tokenized examples, the same method settings and device, in the same run.

Records device, tokens/s, MFU, peak GPU memory, wall time and both loss curves in
``benchmarks/results/*.json`` (written again after every run, so a run cut short keeps what it measured) and
prints a table. Needs a CUDA GPU (H100/H200 class); ``--tiny`` runs the whole script on small CPU stand-ins to
prove it works (its figures mean nothing).

    python benchmarks/gpu_blueprints.py                          # both archs, LoRA + full, 40 steps, 4 x 2048
    python benchmarks/gpu_blueprints.py --arch llama --method full --steps 60 --time-budget 300
    python benchmarks/gpu_blueprints.py --tiny --out /tmp/bench  # CPU smoke of the script
    python benchmarks/gpu_blueprints.py --nproc 8 --distributed fsdp --hf none  # project trainer, 8 GPUs, FSDP2

Data shapes (``--shapes``): ``full``: every example is longer than ``--seq-len``, so every batch is full
(no padding) for both trainers: pure compute, where MFU is meaningful. ``alpaca``: Alpaca-like lengths
(log-normal answers, median ~35 words, at the blueprint's batch 8 x 512), where padding costs what it costs
on the real dataset; tokens/s counts real (non-padding) tokens only, for both trainers.

Several GPUs (``--nproc N``): the project's trainer runs under ``torchrun --standalone --nproc-per-node N``
and ``--distributed`` (auto, ddp, fsdp) goes into the blueprint's fixed training settings, so the trainer
picks DDP or FSDP2 (``fully_shard``; ``auto`` is the trainer's rule, playground/train/parallel.py; one process
wraps nothing). ``--batch-size`` (and the alpaca shape's 8) is per device: the project's global batch is that
times N, while the HF ``Trainer`` baseline stays on one device at the per-device batch, so tokens/s per device,
MFU and the ratio to HF compare the same per-device work (the loss curves then differ by the global batch and
are not compared with HF's).

MFU = model FLOPs per second per device / the device's dense bf16 peak (989 TFLOP/s for H100/H200 SXM;
``PLAYGROUND_PEAK_FLOPS`` overrides). Model FLOPs per token come from the trainer's own counter,
``playground/train/flops.py`` (the PaLM appendix B count): 6 FLOPs per trainable and 4 per frozen ``nn.Linear``
weight (LoRA's base weights get no weight gradient; its adapters count 6), none for the embedding lookup,
plus 12 * L * d_attn * T for the attention scores and values, with T the span a token attends over (the
window for the full shape; for variable lengths E[n^2]/E[n] over the examples). The attention term counts the
full T x T score matrix (no causal halving), as PaLM and torchtitan do. The first ``--warmup-steps`` optimizer
steps (CUDA/cuBLAS warm-up, compilation) are left out of tokens/s for both trainers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BLUEPRINTS = {"llama": "llama-3.2-1b-lora-alpaca", "qwen2": "qwen2.5-1.5b-lora-alpaca"}
NAMES = {"llama": "Llama-3.2-1B", "qwen2": "Qwen2.5-1.5B"}
TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    arch: {
        "vocab_size": 1024,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        **({"head_dim": 16} if arch == "llama" else {}),
    }
    for arch in ("llama", "qwen2")
}
_TEXT = (
    "the model learns to follow instructions by reading many short examples of a task and its answer; "
    "a blueprint fixes the data, the method and bounded parameters so that every run is comparable"
)
WORDS = _TEXT.replace(";", "").replace(",", "").split(" ")


def log(message: str) -> None:
    print(f"[gpu-bench] {message}", flush=True)


def device_info() -> dict[str, Any]:
    import torch

    from playground.train.flops import peak_flops

    info: dict[str, Any] = {
        "cuda": torch.cuda.is_available(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    try:
        import peft
        import transformers

        info["transformers"] = transformers.__version__
        info["peft"] = peft.__version__
    except ImportError:
        pass
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=torch.cuda.get_device_name(0),
            device_count=torch.cuda.device_count(),
            device_memory_bytes=props.total_memory,
            cuda_version=torch.version.cuda,
        )
        info["peak_bf16_flops"] = peak_flops(info["device"])  # the trainer's table (playground/train/flops.py)
    else:
        info.update(device=f"cpu ({os.cpu_count()} threads)", peak_bf16_flops=peak_flops(None))
    return info


def measured_matmul_flops() -> float | None:
    """bf16 8192^3 matmul rate on this device (median of 20): the practical ceiling next to the datasheet."""
    import torch

    if not torch.cuda.is_available():
        return None
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 8192**3 / statistics.median(times)


# --- data -----------------------------------------------------------------------------------------------


def write_rows(path: Path, n: int, shape: str, seed: int = 0) -> Path:
    """Alpaca-format rows: ``full`` answers longer than any window; ``alpaca`` Alpaca-like lengths."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for i in range(n):
            if shape == "full":
                instruction, words = f"Write note {i}.", 1500
            else:
                instruction = " ".join(rng.choices(WORDS, k=rng.randint(6, 24))).capitalize() + "."
                words = min(400, max(1, round(rng.lognormvariate(math.log(35), 0.9))))
            output = " ".join(rng.choices(WORDS, k=words))
            fh.write(json.dumps({"instruction": instruction, "input": "", "output": output}) + "\n")
    return path


def tokenized_train_set(arch: str, model_dir: Path, rows: Path, seq: int) -> Any:
    """The training examples exactly as the project's trainer builds them (same split, same tokens)."""
    from transformers import AutoTokenizer

    from playground.blueprints import get_blueprint
    from playground.train import data
    from playground.train.tokenizer import ensure_chat_template

    blueprint = get_blueprint(BLUEPRINTS[arch])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ensure_chat_template(tokenizer, blueprint.model.chat_template)
    train, _ = data.file_splits(
        data.load_rows(str(rows), blueprint.dataset.split),
        None,
        fmt="alpaca",
        eval_fraction=blueprint.dataset.eval_fraction,
        num_train=None,
        num_eval=200,
        seed=0,
    )
    return data.tokenize(train, tokenizer, seq), tokenizer


def flop_counter(arch: str, method: str, config: Any) -> Any:
    """The trainer's FlopCounter for the model as it trains (LoRA applied for ``lora``), on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    from playground.blueprints import get_blueprint
    from playground.train.flops import count_flops
    from playground.train.model import apply_lora

    blueprint = get_blueprint(BLUEPRINTS[arch])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        if method == "lora":
            model = apply_lora(model, blueprint.method, blueprint.defaults())
    return count_flops(model)


# --- the two trainers ------------------------------------------------------------------------------------


def blueprint_file(arch: str, method: str, training: dict[str, Any], target: Path) -> Path:
    """The hub blueprint's YAML, with ``method: full`` for full fine-tuning and extra fixed settings."""
    import yaml

    from playground.blueprints import get_blueprint

    spec = get_blueprint(BLUEPRINTS[arch]).model_dump(mode="json", exclude_none=True)
    if method == "full":
        spec["method"] = {"kind": "full"}
        spec["parameters"].pop("lora_rank", None)
        spec["parameters"].pop("lora_alpha", None)
    spec["training"] = {**spec.get("training", {}), **training}
    target.write_text(yaml.safe_dump(spec, sort_keys=False))
    return target


def run_project_trainer(
    arch: str,
    method: str,
    model_dir: Path,
    rows: Path,
    out: Path,
    *,
    steps: int,
    batch: int,
    seq: int,
    log_every: int,
    warmup_steps: int,
    training: dict[str, Any],
    timeout: float,
    nproc: int = 1,
) -> dict[str, Any]:
    """The project's trainer as the platform runs it: a subprocess printing progress events (under
    ``torchrun`` with ``nproc`` processes; ``batch`` is then the global batch)."""
    from playground.events import Metric, Progress, parse_line

    out.mkdir(parents=True, exist_ok=True)
    bp = blueprint_file(arch, method, training, out / f"{BLUEPRINTS[arch]}.yaml")
    cmd = [*trainer_launch(nproc), "playground.train", "--blueprint", str(bp)]
    cmd += ["--output", str(out / "run"), "--model-source", str(model_dir), "--dataset-source", str(rows)]
    sets = {"max_steps": steps, "batch_size": batch, "max_seq_length": seq, "log_every": log_every}
    sets |= {"checkpoint_every": 0, "seed": 0}
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    progress: list[Progress] = []
    metrics: dict[str, float] = {}
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        event = parse_line(line)
        if isinstance(event, Progress):
            progress.append(event)
        elif isinstance(event, Metric):
            metrics[event.name] = event.value
        else:
            tail = [*tail[-40:], line.rstrip()]
        if time.perf_counter() - start > timeout:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun's workers too
            break
    proc.wait()
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not progress:
        raise RuntimeError(f"trainer failed ({proc.returncode}):\n" + "\n".join(tail))
    steady = [p for p in progress if p.step > warmup_steps]
    tps = [p.tokens_per_second for p in steady if p.tokens_per_second]
    mfus = [p.mfu for p in steady if p.mfu]
    saved = json.loads((out / "run" / "metrics.json").read_text())
    return {
        "tokens_per_second": statistics.mean(tps) if tps else None,
        "tokens_per_second_windows": [round(t, 1) for t in tps],
        "trainer_reported_mfu": round(statistics.mean(mfus), 4) if mfus else None,  # per device, its own windows
        "peak_memory_bytes": max((p.gpu_memory_bytes or 0) for p in progress) or None,
        "wall_seconds": round(wall, 2),
        "loss_curve": [[p.step, round(p.loss, 4)] for p in progress if p.loss is not None],
        "final_loss": progress[-1].loss,
        "eval_loss": metrics.get("eval_loss"),
        "steps": progress[-1].step,
        "timed_steps": f"{warmup_steps + 1}..{progress[-1].step}",
        "training_settings": training,
        "strategy": saved.get("strategy"),  # what the trainer chose: single, ddp or fsdp
        "global_batch_size": saved.get("global_batch_size"),
    }


def trainer_launch(nproc: int) -> list[str]:
    """``python -m`` (the module name follows), under ``torchrun --standalone`` for ``nproc > 1``."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    return [sys.executable, *torchrun, "-m"]


def run_hf_trainer(
    arch: str,
    method: str,
    model_dir: Path,
    train_set: Any,
    tokenizer: Any,
    out: Path,
    *,
    steps: int,
    batch: int,
    log_every: int,
    warmup_steps: int,
    compile_model: bool = False,
) -> dict[str, Any]:
    """The baseline: transformers.Trainer (+ peft LoRA) on the same examples, settings and device."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from playground.blueprints import get_blueprint
    from playground.train.model import apply_lora
    from playground.train.recipe import lr_lambda
    from playground.train.settings import default_warmup, resolve_setting

    blueprint = get_blueprint(BLUEPRINTS[arch])
    defaults = blueprint.defaults()
    cuda = torch.cuda.is_available()
    pad_id = tokenizer.pad_token_id
    examples = [
        (train_set.input_ids[i, : int(n)], train_set.labels[i, : int(n)]) for i, n in enumerate(train_set.lengths)
    ]
    batch_tokens: list[int] = []  # real tokens per collated batch, in order

    def collate(items: list[tuple[Any, Any]]) -> dict[str, Any]:
        """Pad to the longest row of the batch (input pad id, labels -100, attention mask), as
        DataCollatorForSeq2Seq does."""
        width = max(len(ids) for ids, _ in items)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        labels = torch.full((len(items), width), -100, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, (x, y) in enumerate(items):
            ids[row, : len(x)], labels[row, : len(y)], mask[row, : len(x)] = x, y, 1
        batch_tokens.append(int(mask.sum()))
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    dtype = torch.bfloat16 if cuda else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    if method == "lora":
        model = apply_lora(model, blueprint.method, defaults)
    # The optimizer and schedule the project's trainer uses (fused AdamW, betas 0.9/0.95, linear warmup,
    # cosine to 10%), so the two loss curves differ only by the data order.
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=float(resolve_setting(blueprint, defaults, "learning_rate")),
        betas=(0.9, 0.95),
        weight_decay=0.0,
        fused=cuda or None,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(default_warmup(steps), steps))
    marks: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            marks[state.global_step] = time.perf_counter()

    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=batch,
        max_grad_norm=1.0,
        bf16=cuda,
        use_cpu=not cuda,
        logging_steps=log_every,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        remove_unused_columns=False,
        torch_compile=compile_model,
        seed=0,
        disable_tqdm=True,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=examples,
        data_collator=collate,
        callbacks=[Clock()],
        optimizers=(optimizer, scheduler),
    )
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    first = min(warmup_steps, steps - 1)
    seconds = marks[steps] - marks[first] if first >= 1 else marks[steps] - start
    tokens = sum(batch_tokens[first:steps])
    curve = [[h["step"], round(h["loss"], 4)] for h in trainer.state.log_history if "loss" in h]
    result = {
        "tokens_per_second": tokens / seconds if seconds > 0 else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "wall_seconds": round(wall, 2),
        "loss_curve": curve,
        "final_loss": curve[-1][1] if curve else None,
        "steps": steps,
        "timed_steps": f"{first + 1}..{steps}",
        "torch_compile": compile_model,
    }
    del trainer, model, optimizer, scheduler
    if cuda:
        torch.cuda.empty_cache()
    return result


def curve_gap(a: list[list[float]], b: list[list[float]]) -> float | None:
    """Largest relative difference between two loss curves at the steps both logged."""
    other = {int(s): v for s, v in b}
    gaps = [abs(v - other[int(s)]) / max(abs(other[int(s)]), 1e-9) for s, v in a if int(s) in other]
    return round(max(gaps), 4) if gaps else None


# --- the run ---------------------------------------------------------------------------------------------


def parse_variants(items: list[str]) -> dict[str, dict[str, Any]]:
    """``NAME`` or ``NAME:key=value,key=value``: the project trainer's fixed training settings per variant."""
    import yaml

    variants: dict[str, dict[str, Any]] = {}
    for item in items:
        name, _, rest = item.partition(":")
        settings = {}
        for pair in filter(None, rest.split(",")):
            key, _, value = pair.partition("=")
            settings[key.strip()] = yaml.safe_load(value)
        variants[name.strip()] = settings
    return variants


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="llama,qwen2", help="comma list of: llama, qwen2")
    parser.add_argument("--method", default="lora,full", help="comma list of: lora, full")
    parser.add_argument("--shapes", default="full", help="comma list of data shapes: full, alpaca")
    parser.add_argument("--alpaca-shape-methods", default="lora", help="methods also run on the alpaca shape")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per trainer (bounded)")
    parser.add_argument("--warmup-steps", type=int, default=10, help="steps left out of tokens/s")
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=4, help="per-device batch of the full shape")
    parser.add_argument("--seq-len", type=int, default=2048, help="window of the full shape")
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["baseline"],
        help="project trainer variants: NAME or NAME:key=value,... (fixed training settings)",
    )
    parser.add_argument(
        "--alpaca-variants",
        nargs="*",
        default=["baseline", "packing:packing=true"],
        help="project trainer variants on the alpaca shape",
    )
    parser.add_argument(
        "--skip", nargs="*", default=[], help="runs to leave out: prefixes of ARCH/SHAPE/METHOD/TRAINER"
    )
    parser.add_argument("--hf", default="plain", help="HF Trainer runs: comma list of plain, compile, none")
    parser.add_argument(
        "--nproc", type=int, default=1, help="devices (processes under torchrun) for the project trainer"
    )
    parser.add_argument(
        "--distributed",
        choices=["auto", "ddp", "fsdp"],
        default="auto",
        help="the project trainer's data parallelism with --nproc > 1 (training setting 'distributed')",
    )
    parser.add_argument("--time-budget", type=float, default=1e9, help="seconds; no new run starts past it")
    parser.add_argument("--run-timeout", type=float, default=600, help="seconds one project run may take")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--tag", default="", help="added to the result file name")
    parser.add_argument("--tiny", action="store_true", help="small CPU stand-ins: proves the script runs, no figures")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available() and not args.tiny:
        print(
            "gpu_blueprints: no CUDA GPU here (torch.cuda.is_available() is False). This benchmark runs the "
            "full-size Llama-3.2-1B and Qwen2.5-1.5B architectures and needs an H100/H200-class GPU; "
            "run it there, or use --tiny for a CPU smoke run of the script.",
            file=sys.stderr,
        )
        return 2
    most = torch.cuda.device_count() if torch.cuda.is_available() else os.cpu_count() or 1
    if not 1 <= args.nproc <= most:
        where = "the GPUs here" if torch.cuda.is_available() else "the CPU cores here"
        print(f"gpu_blueprints: --nproc {args.nproc} is not allowed; allowed: 1 to {most} ({where})", file=sys.stderr)
        return 2
    if args.tiny:
        args.steps, args.batch_size, args.seq_len = min(args.steps, 4), min(args.batch_size, 2), min(args.seq_len, 64)
        args.warmup_steps, args.log_every = 1, 1
    from transformers import AutoConfig

    from playground.train.flops import attention_span
    from playground.train.standins import build_from_config

    t0 = time.perf_counter()
    archs = args.arch.split(",")
    methods = args.method.split(",")
    variants = {"full": parse_variants(args.variants), "alpaca": parse_variants(args.alpaca_variants)}
    if args.distributed != "auto":  # into every project run's fixed training settings (a variant may override)
        variants = {
            shape: {name: {"distributed": args.distributed, **training} for name, training in named.items()}
            for shape, named in variants.items()
        }
    hf_modes = [m for m in args.hf.split(",") if m != "none"]
    info = device_info()
    info["measured_bf16_matmul_flops"] = measured_matmul_flops()
    peak = info.get("peak_bf16_flops")
    matmul = (info["measured_bf16_matmul_flops"] or 0) / 1e12
    log(f"device: {info['device']}; torch {info['torch']}; bf16 matmul {matmul:.0f} TFLOP/s")
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    results: dict[str, Any] = {
        "benchmark": "gpu_blueprints",
        "mode": "tiny-cpu-smoke" if args.tiny else "full-size",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": info,
        "steps": args.steps,
        "warmup_steps_excluded": args.warmup_steps,
        "nproc": args.nproc,
        "distributed": args.distributed,
        "batch_size": "per device; the project trainer's global batch is batch_size x nproc",
        "flops_per_token": "playground/train/flops.py: 6/4 per trainable/frozen matmul weight + 12*L*d_attn*T, "
        "T=seq (full shape) or E[n^2]/E[n]; MFU per device",
        "runs": [],
        "skipped": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "tiny-cpu" if args.tiny else info["device"].replace("NVIDIA ", "").replace(" ", "-").lower()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = args.out / f"gpu_blueprints-{slug}{'-' + args.tag if args.tag else ''}-{stamp}.json"

    def save() -> None:
        path.write_text(json.dumps(results, indent=2) + "\n")

    def over_budget(what: str) -> bool:
        if any(what.startswith(prefix) for prefix in args.skip):
            return True
        if time.perf_counter() - t0 > args.time_budget:
            results["skipped"].append(what)
            log(f"skipped (time budget): {what}")
            return True
        return False

    models: dict[str, tuple[Path, Any, int]] = {}

    def model_of(arch: str) -> tuple[Path, Any, int]:
        """Build each architecture's random-init model directory once."""
        if arch not in models:
            from transformers import AutoModelForCausalLM

            overrides = TINY_OVERRIDES[arch] if args.tiny else None
            model_dir = build_from_config(arch, work / f"model-{arch}", overrides=overrides)
            config = AutoConfig.from_pretrained(model_dir)
            with torch.device("meta"):
                n_params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
            log(f"{NAMES[arch]}: {n_params / 1e6:,.1f}M parameters at {model_dir}")
            models[arch] = (model_dir, config, n_params)
        return models[arch]

    try:
        for shape in args.shapes.split(","):
            batch, seq = (args.batch_size, args.seq_len) if shape == "full" else (8, 512 if not args.tiny else 64)
            shape_methods = methods if shape == "full" else [m for m in methods if m in args.alpaca_shape_methods]
            rows = write_rows(work / f"rows-{shape}.jsonl", max(64, batch * 16) if shape == "full" else 2000, shape)
            for arch in archs:
                if over_budget(f"{shape}/{arch}: all"):
                    continue
                model_dir, config, _ = model_of(arch)
                train_set, tokenizer = tokenized_train_set(arch, model_dir, rows, seq)
                lengths = [int(n) for n in train_set.lengths]
                span = attention_span(lengths)
                for method in shape_methods:
                    fpt = flop_counter(arch, method, config).mean_per_token(lengths)
                    hf_curve = base_curve = None
                    for mode in hf_modes:
                        what = f"{arch}/{shape}/{method}/hf-{mode}"
                        if over_budget(what):
                            continue
                        log(f"{what}: batch {batch} x {seq}")
                        try:
                            figures = run_hf_trainer(
                                arch, method, model_dir, train_set, tokenizer, work / "hf",
                                steps=args.steps, batch=batch, log_every=args.log_every,
                                warmup_steps=args.warmup_steps, compile_model=mode == "compile",
                            )  # fmt: skip
                        except Exception as exc:  # an OOM or a compile failure is a result too
                            figures = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                            if torch.cuda.is_available():
                                torch.cuda.empty_cache()
                        hf_curve = figures.get("loss_curve") if mode == "plain" else hf_curve
                        _finish(results, figures, arch, shape, method, f"hf-{mode}", batch, seq, fpt, span, peak, 1)
                        save()
                    for name, training in variants[shape].items():
                        what = f"{arch}/{shape}/{method}/project-{name}"
                        if over_budget(what):
                            continue
                        log(f"{what}: batch {args.nproc} x {batch} x {seq} {training or ''}")
                        try:
                            figures = run_project_trainer(
                                arch, method, model_dir, rows, work / "project",
                                steps=args.steps, batch=batch * args.nproc, seq=seq, log_every=args.log_every,
                                warmup_steps=args.warmup_steps, training=training, timeout=args.run_timeout,
                                nproc=args.nproc,
                            )  # fmt: skip
                        except Exception as exc:
                            figures = {"error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
                        if hf_curve and figures.get("loss_curve") and args.nproc == 1:  # same global batch only
                            figures["loss_curve_gap_to_hf"] = curve_gap(figures["loss_curve"], hf_curve)
                        if name == "baseline":
                            base_curve = figures.get("loss_curve")
                        elif base_curve and figures.get("loss_curve"):  # same data order: should match closely
                            figures["loss_curve_gap_to_baseline"] = curve_gap(figures["loss_curve"], base_curve)
                        _finish(
                            results, figures, arch, shape, method, f"project-{name}", batch, seq, fpt, span, peak,
                            args.nproc,
                        )  # fmt: skip
                        save()
                        shutil.rmtree(work / "project", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        results["wall_seconds"] = round(time.perf_counter() - t0, 1)
        _ratios(results)
        save()
    _print_table(results)
    log(f"results: {path}")
    return 0


def _finish(
    results: dict[str, Any],
    figures: dict[str, Any],
    arch: str,
    shape: str,
    method: str,
    trainer: str,
    batch: int,
    seq: int,
    fpt: float,
    span: float,
    peak: float | None,
    nproc: int,
) -> None:
    """One result row: MFU per device from the per-device share of tokens/s and the FLOP counter."""
    from playground.train.flops import mfu

    tps = figures.get("tokens_per_second")
    per_device = tps / nproc if tps else None
    device_mfu = mfu(per_device * fpt, 1.0, peak) if per_device else None
    row = {
        "arch": arch,
        "model": NAMES[arch],
        "shape": shape,
        "method": method,
        "trainer": trainer,
        "nproc": nproc,
        "batch_size_per_device": batch,
        "seq_len": seq,
        "attention_span": round(span, 1),
        "flops_per_token": round(fpt),
        **figures,
        "tokens_per_second_per_device": per_device,
        "mfu": round(device_mfu, 4) if device_mfu is not None else None,
    }
    results["runs"].append(row)
    mem = (figures.get("peak_memory_bytes") or 0) / 2**30
    log(
        f"  -> {trainer} on {nproc} ({figures.get('strategy', 'single')}): {tps or 0:,.0f} tok/s "
        f"({per_device or 0:,.0f} per device), MFU {row['mfu']}"
        f" (trainer's own: {figures.get('trainer_reported_mfu')}), peak {mem:.1f} GiB, "
        f"wall {figures.get('wall_seconds')} s" + (f", ERROR {figures['error'][:300]}" if "error" in figures else "")
    )


def _ratios(results: dict[str, Any]) -> None:
    """Each project run's tokens/s per device over the plain HF Trainer's (one device) in the same
    arch/shape/method."""
    hf = {(r["arch"], r["shape"], r["method"]): r for r in results["runs"] if r["trainer"] == "hf-plain"}
    for run in results["runs"]:
        base = hf.get((run["arch"], run["shape"], run["method"]))
        mine, theirs = run.get("tokens_per_second_per_device"), (base or {}).get("tokens_per_second")
        if run["trainer"].startswith("project") and mine and theirs:
            run["throughput_ratio_to_hf"] = round(mine / theirs, 3)


def _print_table(results: dict[str, Any]) -> None:
    head = f"{'model':14} {'shape':6} {'method':5} {'trainer':26} {'dev':>3} {'tok/s':>9} {'MFU':>6} {'x HF':>5}"
    head += f" {'GiB':>5}"
    print(f"\n{head} {'wall':>6} loss curve")
    for r in results["runs"]:
        curve = " ".join(f"{v:.2f}" for _, v in r.get("loss_curve", []))
        print(
            f"{r['model']:14} {r['shape']:6} {r['method']:5} {r['trainer']:26} {r['nproc']:3} "
            f"{r.get('tokens_per_second') or 0:9.0f} "
            f"{r.get('mfu') or 0:6.3f} {r.get('throughput_ratio_to_hf') or 0:5.2f} "
            f"{(r.get('peak_memory_bytes') or 0) / 2**30:5.1f} {r.get('wall_seconds') or 0:6.1f} {curve}"
            + (f" ERROR {r['error'][:120]}" if "error" in r else "")
        )


if __name__ == "__main__":
    sys.exit(main())
