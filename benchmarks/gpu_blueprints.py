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

MFU = tokens/s × FLOPs per token / the device's dense bf16 peak, with FLOPs per token = 4·N for LoRA
(forward 2·N plus the activation gradients 2·N; the frozen base weights get no weight gradients) over the
N parameters of the base model. The trainer's own ``mfu`` field uses 6·N; it is recorded as reported.
Every example is longer than ``max_seq_length``, so all batches are full (no padding) for both trainers.
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
# Dense bf16 peak FLOP/s (no sparsity), by a substring of torch.cuda.get_device_name().
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "GH200": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}
_TEXT = (
    "the model learns to follow instructions by reading many short examples of a task and its answer; "
    "a blueprint fixes the data, the method and bounded parameters so that every run is comparable"
)
WORDS = _TEXT.replace(";", "").replace(",", "").split(" ")


def log(message: str) -> None:
    print(f"[gpu-bench] {message}", flush=True)


def device_info() -> dict[str, Any]:
    import torch

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
        info["peak_bf16_flops"] = next((f for k, f in PEAK_BF16_FLOPS.items() if k in info["device"]), None)
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
    arch: str, model_dir: Path, rows: Path, out: Path, *, steps: int, batch: int, seq: int, log_every: int
) -> dict[str, Any]:
    """The project's trainer as the platform runs it: a subprocess printing progress events."""
    from playground.events import Progress, parse_line

    cmd = [
        sys.executable,
        "-m",
        "playground.train",
        "--blueprint",
        ARCHS[arch]["blueprint"],
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


def mfu(tokens_per_second: float | None, n_params: int, peak: float | None) -> float | None:
    if not tokens_per_second or not peak:
        return None
    return round(tokens_per_second * 4 * n_params / peak, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=[*ARCHS, "all"], default="all")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per trainer (bounded)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--tiny", action="store_true", help="small CPU stand-ins: proves the script runs, no figures")
    parser.add_argument("--keep", action="store_true", help="keep the model directories and trainer outputs")
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
        "mfu_flops_per_token": "4 x base-model parameters (LoRA: frozen weights get no weight gradients)",
        "architectures": {},
    }
    try:
        rows = write_rows(work / "alpaca-rows.jsonl", max(64, args.batch_size * 8))
        for arch in archs:
            spec = ARCHS[arch]
            log(f"{spec['name']}: building the random-init model directory")
            model_dir, n_params = build_model_dir(arch, work / f"model-{arch}", tiny=args.tiny)
            log(f"{spec['name']}: {n_params / 1e6:,.1f}M parameters; the project's trainer")
            project = run_project_trainer(
                arch,
                model_dir,
                rows,
                work / f"project-{arch}",
                steps=args.steps,
                batch=args.batch_size,
                seq=args.seq_len,
                log_every=log_every,
            )
            log(f"{spec['name']}: HF Trainer baseline")
            hf = run_hf_trainer(
                arch,
                model_dir,
                rows,
                work / f"hf-{arch}",
                steps=args.steps,
                batch=args.batch_size,
                seq=args.seq_len,
                warmup_steps=warmup_steps,
            )
            for figures in (project, hf):
                figures["mfu"] = mfu(figures["tokens_per_second"], n_params, info.get("peak_bf16_flops"))
            ratio = (
                round(project["tokens_per_second"] / hf["tokens_per_second"], 3)
                if project["tokens_per_second"] and hf["tokens_per_second"]
                else None
            )
            results["architectures"][arch] = {
                "name": spec["name"],
                "blueprint": spec["blueprint"],
                "parameters": n_params,
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
