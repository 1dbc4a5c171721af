"""GPU benchmark of the hub blueprints' training path: Llama-3.2-1B and Qwen2.5-1.5B architectures at full
size (LlamaConfig / Qwen2Config with the real dimensions, random init, no hub), a bounded number of LoRA
steps through the project's trainer (``python -m playground.train``), and the Hugging Face ``Trainer`` on
the same model, data, LoRA settings and device in the same run as the baseline.

Records device, tokens/s, MFU, peak GPU memory and wall time into ``benchmarks/results/*.json`` and prints
them. Needs a CUDA GPU (H100/H200 class); on a machine without one it exits with a message, and
``--tiny`` runs the same script end to end on small CPU stand-ins to prove it works (its figures mean
nothing).

    python benchmarks/gpu_blueprints.py                    # GPU: both architectures, 30 steps each
    python benchmarks/gpu_blueprints.py --arch llama --steps 50
    python benchmarks/gpu_blueprints.py --tiny --out /tmp/bench   # CPU smoke of the script
    python benchmarks/gpu_blueprints.py --nproc 8 --distributed fsdp   # the project's trainer on 8 GPUs, FSDP2

MFU = tokens/s per device × model FLOPs per token / the device's dense bf16 peak, with the FLOPs per
token of ``playground/train/flops.py`` (the trainer's own ``mfu`` field uses the same counter): 6 per
trainable and 4 per frozen ``nn.Linear`` weight (LoRA: the frozen base weights get no weight gradient),
no embedding lookup, plus the attention term ``12·layers·heads·head_dim·T``. Every example is longer
than ``max_seq_length``, so all batches are full (no padding) for both trainers and ``T`` is that length.
``--nproc N`` runs the project's trainer under ``torchrun`` on N GPUs (``--distributed`` picks DDP or
FSDP2; ``auto`` is the trainer's rule). ``--batch-size`` is the global batch, split over the N GPUs
(pass 8·N to keep 8 per GPU); the HF ``Trainer`` baseline stays on one GPU with the per-GPU share
(``--batch-size / N``), so the throughput ratio compares tokens/s per device at the same per-device batch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The real dimensions (the hub configs of meta-llama/Llama-3.2-1B-Instruct and Qwen/Qwen2.5-1.5B-Instruct).
ARCHS: dict[str, dict[str, Any]] = {
    "llama": {
        "blueprint": "llama-3.2-1b-lora-alpaca",
        "name": "Llama-3.2-1B",
        "config_class": "LlamaConfig",
        "config": {
            "vocab_size": 128256,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "tie_word_embeddings": True,
            "hidden_act": "silu",
        },
    },
    "qwen": {
        "blueprint": "qwen2.5-1.5b-lora-alpaca",
        "name": "Qwen2.5-1.5B",
        "config_class": "Qwen2Config",
        "config": {
            "vocab_size": 151936,
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "hidden_act": "silu",
            "use_sliding_window": False,
        },
    },
}
TINY_DIMS = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
TINY_HEADS = {
    "llama": {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
    "qwen": {"num_attention_heads": 4, "num_key_value_heads": 2},
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
        info.update(device=f"cpu ({os.cpu_count()} threads)", peak_bf16_flops=None)
    return info


def build_model_dir(arch: str, target: Path, *, tiny: bool) -> tuple[Path, int]:
    """Save a random-init model of the architecture (bf16 on GPU) with a locally built tokenizer."""
    import torch
    import transformers

    from playground.train.tokenizer import build_char_tokenizer, save_tokenizer

    spec = ARCHS[arch]
    config_kwargs = dict(spec["config"])
    if tiny:
        config_kwargs.update(TINY_DIMS, **TINY_HEADS[arch])
        config_kwargs.pop("rope_scaling", None)
    tokenizer = build_char_tokenizer()  # ids stay far below the real vocabulary: the compute does not care
    config_cls = getattr(transformers, spec["config_class"])
    config = config_cls(
        **config_kwargs,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if torch.cuda.is_available() and not tiny else torch.float32
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(target, safe_serialization=True)
    save_tokenizer(tokenizer, target)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return target, n_params


def write_rows(path: Path, n: int, seed: int = 0) -> Path:
    """Alpaca-format rows, each longer than any max_seq_length used here (full batches, no padding)."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for i in range(n):
            # a short prompt (the trainer trains on the answer only) and an answer longer than any sequence
            instruction = f"Write note {i}."
            output = " ".join(rng.choices(WORDS, k=600))
            fh.write(json.dumps({"instruction": instruction, "input": "", "output": output}) + "\n")
    return path


def run_project_trainer(
    arch: str, model_dir: Path, rows: Path, out: Path, *, steps: int, batch: int, seq: int, log_every: int,
    nproc: int = 1, blueprint: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The project's trainer as the platform runs it: a subprocess printing progress events."""
    from playground.events import Progress, parse_line

    cmd = [
        *trainer_launch(nproc),
        "playground.train",
        "--blueprint",
        blueprint or ARCHS[arch]["blueprint"],
        "--output",
        str(out),
        "--model-source",
        str(model_dir),
        "--dataset-source",
        str(rows),
    ]
    for key, value in {
        "max_steps": steps,
        "batch_size": batch,
        "max_seq_length": seq,
        "log_every": log_every,
        "checkpoint_every": 0,
        "seed": 0,
    }.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    progress: list[Progress] = []
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        event = parse_line(line)
        if isinstance(event, Progress):
            progress.append(event)
        else:
            tail = [*tail[-30:], line.rstrip()]
    proc.wait()
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not progress:
        raise RuntimeError(f"trainer failed ({proc.returncode}):\n" + "\n".join(tail))
    # the first window includes CUDA/cuBLAS warm-up: leave it out when there is more than one
    steady = progress[1:] if len(progress) > 1 else progress
    tps = [p.tokens_per_second for p in steady if p.tokens_per_second]
    mfus = [p.mfu for p in steady if p.mfu]
    return {
        "tokens_per_second": statistics.mean(tps) if tps else None,
        "tokens_per_second_windows": [round(t, 1) for t in tps],
        "trainer_reported_mfu": statistics.mean(mfus) if mfus else None,
        "peak_memory_bytes": max((p.gpu_memory_bytes or 0) for p in progress) or None,
        "wall_seconds": round(wall, 2),
        "final_loss": progress[-1].loss,
        "steps": progress[-1].step,
    }


def run_hf_trainer(
    arch: str, model_dir: Path, rows: Path, out: Path, *, steps: int, batch: int, seq: int, warmup_steps: int
) -> dict[str, Any]:
    """The baseline: transformers.Trainer + peft LoRA on the same model, rows, LoRA settings and device."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

    from playground.blueprints import get_blueprint

    blueprint = get_blueprint(ARCHS[arch]["blueprint"])
    defaults = blueprint.defaults()
    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    examples = []
    for line in rows.read_text().splitlines():
        row = json.loads(line)
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["instruction"]}, {"role": "assistant", "content": row["output"]}],
            tokenize=False,
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:seq]
        assert len(ids) == seq, "rows are written longer than max_seq_length"
        examples.append({"input_ids": torch.tensor(ids), "labels": torch.tensor(ids)})

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(examples)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return examples[i]

    dtype = torch.bfloat16 if cuda else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    method = blueprint.method
    model = get_peft_model(
        model,
        LoraConfig(
            r=int(defaults.get("lora_rank", method.rank)),
            lora_alpha=int(defaults.get("lora_alpha", method.alpha)),
            lora_dropout=method.dropout,
            target_modules=list(method.target_modules),
            task_type="CAUSAL_LM",
        ),
    )
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
        learning_rate=float(defaults.get("learning_rate", 2e-4)),
        lr_scheduler_type="cosine",
        warmup_steps=min(100, max(1, steps // 20)),
        weight_decay=0.0,
        max_grad_norm=1.0,
        bf16=cuda,
        use_cpu=not cuda,
        optim="adamw_torch_fused" if cuda else "adamw_torch",
        logging_steps=max(1, steps // 5),
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Clock()])
    start = time.perf_counter()
    output = trainer.train()
    wall = time.perf_counter() - start
    first = min(warmup_steps, steps - 1)
    timed_steps = steps - first
    seconds = marks[steps] - marks[first] if first >= 1 else marks[steps] - start
    result = {
        "tokens_per_second": timed_steps * batch * seq / seconds if seconds > 0 else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "wall_seconds": round(wall, 2),
        "final_loss": output.training_loss,
        "steps": steps,
        "timed_steps": f"{first + 1}..{steps}",
    }
    del trainer, model
    if cuda:
        torch.cuda.empty_cache()
    return result


# --- several processes (DDP / FSDP2 under torchrun) and the FLOP counter (issue 11) -------------------


def trainer_launch(nproc: int) -> list[str]:
    """``python -m`` (the module name follows), under ``torchrun --standalone`` for ``nproc > 1``."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    return [sys.executable, *torchrun, "-m"]


def blueprint_with_distributed(arch: str, distributed: str, work: Path) -> str:
    """The architecture's blueprint id, or a copy of its YAML whose ``training.distributed`` is set."""
    import yaml

    from playground.blueprints.loader import CATALOG_DIR

    blueprint = ARCHS[arch]["blueprint"]
    if distributed == "auto":
        return blueprint
    spec = yaml.safe_load((CATALOG_DIR / f"{blueprint}.yaml").read_text())
    spec.setdefault("training", {})["distributed"] = distributed
    path = work / distributed / f"{blueprint}.yaml"  # the file name is the id
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def flop_counter(arch: str, model_dir: Path) -> Any:
    """The trainer's FlopCounter for the model as it trains (LoRA applied), built on the meta device."""
    import torch
    import transformers

    from playground.blueprints import get_blueprint
    from playground.train.flops import count_flops
    from playground.train.model import apply_lora

    blueprint = get_blueprint(ARCHS[arch]["blueprint"])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(model_dir))
        model = apply_lora(model, blueprint.method, blueprint.defaults())
    return count_flops(model)


def mfu(tokens_per_second: float | None, flops_per_token: int, peak: float | None, devices: int = 1) -> float | None:
    """MFU of one device: its share of the tokens/s × model FLOPs per token / its dense bf16 peak."""
    if not tokens_per_second or not peak:
        return None
    return round(tokens_per_second / devices * flops_per_token / peak, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=[*ARCHS, "all"], default="all")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per trainer (bounded)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--tiny", action="store_true", help="small CPU stand-ins: proves the script runs, no figures")
    parser.add_argument("--keep", action="store_true", help="keep the model directories and trainer outputs")
    parser.add_argument("--nproc", type=int, default=1, help="GPUs (processes under torchrun) for the project trainer")
    parser.add_argument("--distributed", choices=["auto", "ddp", "fsdp"], default="auto", help="with --nproc > 1")
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
    if args.nproc < 1 or (not args.tiny and args.nproc > torch.cuda.device_count()):
        print(f"gpu_blueprints: --nproc {args.nproc}: allowed 1 to {torch.cuda.device_count()} (the GPUs here)")
        return 2
    if args.tiny:
        args.steps, args.batch_size, args.seq_len = min(args.steps, 4), min(args.batch_size, 2), min(args.seq_len, 64)
    log_every = max(1, args.steps // 6)
    warmup_steps = max(1, args.steps // 6)
    archs = list(ARCHS) if args.arch == "all" else [args.arch]
    info = device_info()
    log(f"device: {info['device']}; torch {info['torch']}; {', '.join(archs)}; {args.steps} steps")
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    results: dict[str, Any] = {
        "benchmark": "gpu_blueprints",
        "mode": "tiny-cpu-smoke" if args.tiny else "full-size",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": info,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "nproc": args.nproc,
        "distributed": args.distributed,
        "mfu_flops_per_token": "playground/train/flops.py: 6/4 per trainable/frozen matmul weight + attention",
        "architectures": {},
    }
    try:
        rows = write_rows(work / "alpaca-rows.jsonl", max(64, args.batch_size * 8))
        for arch in archs:
            spec = ARCHS[arch]
            log(f"{spec['name']}: building the random-init model directory")
            model_dir, n_params = build_model_dir(arch, work / f"model-{arch}", tiny=args.tiny)
            counter = flop_counter(arch, model_dir)
            log(f"{spec['name']}: {n_params / 1e6:,.1f}M parameters; the project's trainer on {args.nproc} device(s)")
            project = run_project_trainer(
                arch,
                model_dir,
                rows,
                work / f"project-{arch}",
                steps=args.steps,
                batch=args.batch_size,
                seq=args.seq_len,
                log_every=log_every,
                nproc=args.nproc,
                blueprint=blueprint_with_distributed(arch, args.distributed, work),
            )
            log(f"{spec['name']}: HF Trainer baseline")
            hf = run_hf_trainer(
                arch,
                model_dir,
                rows,
                work / f"hf-{arch}",
                steps=args.steps,
                batch=max(1, args.batch_size // args.nproc),  # one GPU: the per-GPU share of the global batch
                seq=args.seq_len,
                warmup_steps=warmup_steps,
            )
            flops_per_token, peak = counter.per_token(args.seq_len), info.get("peak_bf16_flops")
            for figures, devices in ((project, args.nproc), (hf, 1)):
                figures["mfu"] = mfu(figures["tokens_per_second"], flops_per_token, peak, devices)
            ratio = (
                round(project["tokens_per_second"] / args.nproc / hf["tokens_per_second"], 3)
                if project["tokens_per_second"] and hf["tokens_per_second"]
                else None
            )
            results["architectures"][arch] = {
                "name": spec["name"],
                "blueprint": spec["blueprint"],
                "parameters": n_params,
                "flops_per_token": flops_per_token,
                "config": {k: v for k, v in spec["config"].items() if k != "rope_scaling"}
                if not args.tiny
                else TINY_DIMS,
                "project_trainer": project,
                "hf_trainer": hf,
                "throughput_ratio_project_over_hf": ratio,
            }
            log(
                f"{spec['name']}: project {project['tokens_per_second'] or 0:,.0f} tok/s "
                f"(MFU {project['mfu']}), HF Trainer {hf['tokens_per_second'] or 0:,.0f} tok/s (MFU {hf['mfu']}), "
                f"ratio {ratio}; peak memory {(project['peak_memory_bytes'] or 0) / 2**30:.1f} / "
                f"{(hf['peak_memory_bytes'] or 0) / 2**30:.1f} GiB; "
                f"wall {project['wall_seconds']} / {hf['wall_seconds']} s"
            )
            if not args.keep:
                shutil.rmtree(model_dir, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "tiny-cpu" if args.tiny else info["device"].replace("NVIDIA ", "").replace(" ", "-").lower()
    path = args.out / f"gpu_blueprints-{slug}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    log(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
