"""The training entrypoint's step rate vs a bare PyTorch loop on the same model and data, same run.

    python benchmarks/train_step_rate.py [--blueprint tiny-llama-cpu] [--steps 200] [--repeats 3] [--hf-trainer]

Each contender runs as a child process with the same thread settings, alternated, the order rotated
every repeat, so drifting machine load hits all alike; the headline ratio is the median of the
paired (same-repeat) ratios. Goal: entrypoint / bare ≥ 0.95.

Two rates each: steps per wall second, and steps per CPU second of the process (the load-robust
figure on a shared machine; the entrypoint reports both for its loop in metrics.json, eval and
checkpoint time excluded). Both cover every step, warm-up included.

The bare loop builds the model, tokenizer and batches with the trainer's own setup code (so model
and data are identical) and then runs only forward, backward, AdamW step, zero_grad (transformers' loss
over every position's logits, where the entrypoint computes only the answer positions' logits: see
playground/train/perf.py).
``--hf-trainer`` adds ``transformers.Trainer`` on the same model and the same batches (the
baseline the hand-written loop was chosen over).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
LOG_EVERY = 5  # the blueprints' usual cadence


def entrypoint_rate(blueprint: str, steps: int, out: Path) -> tuple[float, float]:
    """(steps per wall second, steps per CPU second) of the entrypoint's training loop."""
    cmd = [sys.executable, "-m", "playground.train", "--blueprint", blueprint, "--output", str(out)]
    for key, value in {"max_steps": steps, "log_every": LOG_EVERY, "checkpoint_every": 0}.items():
        cmd += ["--set", f"{key}={value}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode:
        raise SystemExit(f"entrypoint failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return steps / metrics["train_seconds"], steps / metrics["train_cpu_seconds"]


def _setup(blueprint_id: str, steps: int) -> dict[str, Any]:
    """Model, batches and device exactly as the trainer builds them."""
    import torch

    from playground.blueprints import get_blueprint
    from playground.train.data import Batches
    from playground.train.model import apply_lora, build_model, load_tokenizer, parse_source
    from playground.train.recipe import Dist, cpu_threads, load_data
    from playground.train.settings import TrainSpec

    blueprint = get_blueprint(blueprint_id)
    params = blueprint.resolve_params({"max_steps": steps})
    spec = TrainSpec(blueprint, params, Path(tempfile.gettempdir()), blueprint.model.source, blueprint.dataset.source)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(cpu_threads())
    seed = int(spec.setting("seed"))
    kind, ref = parse_source(spec.model_source)
    tokenizer = load_tokenizer(kind, ref, blueprint.model)
    train_set, _ = load_data(spec, tokenizer, Dist())
    dtype = torch.bfloat16 if cuda and kind != "scratch" else torch.float32
    model = build_model(kind, ref, blueprint.model, tokenizer, dtype=dtype, seed=seed)
    if blueprint.method.kind == "lora":
        model = apply_lora(model, blueprint.method, params)
    model.to(device).train()
    train_set.input_ids, train_set.labels = train_set.input_ids.to(device), train_set.labels.to(device)
    batches = Batches(train_set, batch_size=int(spec.setting("batch_size")), seed=seed)
    return {"model": model, "batches": batches, "cuda": cuda, "spec": spec}


def bare_rate(blueprint_id: str, steps: int) -> tuple[float, float]:
    """The same model, tokenizer and batches; a loop with nothing but the essentials."""
    import torch

    s = _setup(blueprint_id, steps)
    model, batches, cuda = s["model"], s["batches"], s["cuda"]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, fused=cuda or None)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    start, cpu_start = time.perf_counter(), time.process_time()
    for step in range(steps):
        ids, labels, _ = batches.batch(step)
        with autocast:
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    float(loss)  # sync
    return steps / (time.perf_counter() - start), steps / (time.process_time() - cpu_start)


def hf_trainer_rate(blueprint_id: str, steps: int) -> tuple[float, float]:
    """``transformers.Trainer`` on the same model and the same batches (one pre-built batch per item)."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    s = _setup(blueprint_id, steps)
    model, batches, cuda, spec = s["model"], s["batches"], s["cuda"], s["spec"]

    class SameBatches(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return steps

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids, labels, _ = batches.batch(i)
            return {"input_ids": ids, "labels": labels}

    class Clock(TrainerCallback):  # time the training steps only, as for the other loops
        start = cpu_start = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_train_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.wall, self.cpu = time.perf_counter() - self.start, time.process_time() - self.cpu_start

    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=1,
            learning_rate=float(spec.setting("learning_rate")),
            warmup_steps=int(spec.setting("warmup_steps") or 0),
            lr_scheduler_type="cosine",
            max_grad_norm=1.0,
            logging_steps=LOG_EVERY,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            bf16=cuda,
            use_cpu=not cuda,
            dataloader_num_workers=0,
            dataloader_pin_memory=False,
        )
        trainer = Trainer(
            model=model, args=args, train_dataset=SameBatches(), data_collator=lambda rows: rows[0], callbacks=[clock]
        )
        trainer.train()
    return steps / clock.wall, steps / clock.cpu


CHILDREN = {"bare": bare_rate, "hf": hf_trainer_rate}


def _child(kind: str, blueprint: str, steps: int) -> tuple[float, float]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--blueprint", blueprint, "--steps", str(steps)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    if proc.returncode:
        raise SystemExit(f"{kind} loop failed:\n{proc.stderr[-3000:]}")
    return tuple(json.loads(proc.stdout.strip().splitlines()[-1])["rates"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blueprint", default="tiny-llama-cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf-trainer", action="store_true", help="also time transformers.Trainer")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the trainer sets it
    if args.child:
        print(json.dumps({"rates": CHILDREN[args.child](args.blueprint, args.steps)}))
        return
    load_before = os.getloadavg()
    runs: dict[str, list[tuple[float, float]]] = {"entrypoint": [], "bare": [], "hf": []}
    with tempfile.TemporaryDirectory() as tmp:
        contenders = ["entrypoint", "bare"] + (["hf"] if args.hf_trainer else [])
        for i in range(args.repeats):
            for name in contenders[i % len(contenders) :] + contenders[: i % len(contenders)]:
                if name == "entrypoint":
                    runs[name].append(entrypoint_rate(args.blueprint, args.steps, Path(tmp) / f"run{i}"))
                else:
                    runs[name].append(_child(name, args.blueprint, args.steps))
            print(
                f"repeat {i + 1}: "
                + ", ".join(f"{k} {v[-1][0]:.2f} steps/s ({v[-1][1]:.2f}/CPU-s)" for k, v in runs.items() if v),
                flush=True,
            )

    def paired(a: str, b: str, which: int) -> float:
        return round(statistics.median(x[which] / y[which] for x, y in zip(runs[a], runs[b], strict=True)), 3)

    result: dict[str, Any] = {"blueprint": args.blueprint, "steps": args.steps, "repeats": args.repeats}
    result["threads"] = os.environ.get("PLAYGROUND_TRAIN_THREADS", "all usable cores")
    for name, values in runs.items():
        if values:
            result[f"{name}_steps_per_s"] = round(statistics.median(v[0] for v in values), 3)
            result[f"{name}_steps_per_cpu_s"] = round(statistics.median(v[1] for v in values), 3)
    result["ratio_wall"] = paired("entrypoint", "bare", 0)
    result["ratio_cpu"] = paired("entrypoint", "bare", 1)
    if runs["hf"]:
        result["hf_trainer_vs_bare_wall"] = paired("hf", "bare", 0)
        result["hf_trainer_vs_bare_cpu"] = paired("hf", "bare", 1)
        result["entrypoint_vs_hf_trainer_wall"] = paired("entrypoint", "hf", 0)
        result["entrypoint_vs_hf_trainer_cpu"] = paired("entrypoint", "hf", 1)
    result["goal"] = 0.95
    result["load_average_before"] = [round(x, 2) for x in load_before]
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["cpus"] = os.cpu_count()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
