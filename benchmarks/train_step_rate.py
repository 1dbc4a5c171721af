"""The training entrypoint's step rate vs a bare PyTorch loop on the same model and data, same run.

    python benchmarks/train_step_rate.py [--blueprint tiny-llama-cpu] [--steps 200] [--repeats 3]

Both run as child processes with the same thread settings, alternated (entrypoint, bare, entrypoint,
bare, ...) so drifting machine load hits both alike; the headline ratio is the median of the paired
(same-repeat) ratios. Goal: ratio ≥ 0.95.
Two rates each: steps per wall second, and steps per CPU second of the process (the load-robust
figure on a shared machine; the entrypoint reports both for its loop in metrics.json, eval and
checkpoint time excluded). Both cover every step, warm-up included, for both loops.

The bare loop builds the model, tokenizer and batches with the trainer's own setup code (so model
and data are identical) and then runs only forward, backward, AdamW step, zero_grad.
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


def bare_rate(blueprint_id: str, steps: int) -> tuple[float, float]:
    """The same model, tokenizer and batches; a loop with nothing but the essentials."""
    import torch

    from playground.blueprints import get_blueprint
    from playground.train.data import Batches
    from playground.train.model import apply_lora, build_model, load_tokenizer, parse_source
    from playground.train.recipe import Dist, TrainSpec, cpu_threads, load_data

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blueprint", default="tiny-llama-cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bare-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the trainer sets it
    if args.bare_child:
        print(json.dumps({"rates": bare_rate(args.blueprint, args.steps)}))
        return
    load_before = os.getloadavg()
    entry, bare = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            entry.append(entrypoint_rate(args.blueprint, args.steps, Path(tmp) / f"run{i}"))
            child = subprocess.run(
                [sys.executable, __file__, "--bare-child", "--blueprint", args.blueprint, "--steps", str(args.steps)],
                capture_output=True, text=True, check=True, cwd=REPO,
            )  # fmt: skip
            bare.append(tuple(json.loads(child.stdout.strip().splitlines()[-1])["rates"]))
            print(
                f"repeat {i + 1}: entrypoint {entry[-1][0]:.2f} steps/s ({entry[-1][1]:.2f}/CPU-s), "
                f"bare loop {bare[-1][0]:.2f} steps/s ({bare[-1][1]:.2f}/CPU-s)",
                flush=True,
            )
    e_wall, b_wall = statistics.median(r[0] for r in entry), statistics.median(r[0] for r in bare)
    e_cpu, b_cpu = statistics.median(r[1] for r in entry), statistics.median(r[1] for r in bare)
    paired_wall = statistics.median(e[0] / b[0] for e, b in zip(entry, bare, strict=True))
    paired_cpu = statistics.median(e[1] / b[1] for e, b in zip(entry, bare, strict=True))
    result = {
        "blueprint": args.blueprint,
        "steps": args.steps,
        "threads": os.environ.get("PLAYGROUND_TRAIN_THREADS", "all usable cores"),
        "entrypoint_steps_per_s": round(e_wall, 3),
        "bare_loop_steps_per_s": round(b_wall, 3),
        "ratio_wall": round(paired_wall, 3),
        "entrypoint_steps_per_cpu_s": round(e_cpu, 3),
        "bare_loop_steps_per_cpu_s": round(b_cpu, 3),
        "ratio_cpu": round(paired_cpu, 3),
        "goal": 0.95,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
