"""The training entrypoint's step rate vs a bare PyTorch loop on the same model and data, same run.

    python benchmarks/train_step_rate.py [--blueprint tiny-llama-cpu] [--steps 200] [--repeats 3]

Both run as child processes with the same thread settings, alternated (entrypoint, bare, entrypoint,
bare, ...) so drifting machine load hits both alike; each rate is measured in steady state (after
the first ``log_every`` window) and the medians are compared. Goal: ratio ≥ 0.95.

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
WARMUP = 10


def entrypoint_rate(blueprint: str, steps: int, out: Path) -> float:
    """Steps/s between the first and the last Progress line (pure training: no eval, no checkpoint)."""
    from playground.events import Progress, parse_line

    cmd = [sys.executable, "-m", "playground.train", "--blueprint", blueprint, "--output", str(out)]
    for key, value in {"max_steps": steps, "log_every": WARMUP, "checkpoint_every": 0}.items():
        cmd += ["--set", f"{key}={value}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode:
        raise SystemExit(f"entrypoint failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    points = [e for e in map(parse_line, proc.stdout.splitlines()) if isinstance(e, Progress)]
    first, last = points[0], points[-1]
    return (last.step - first.step) / (last.time - first.time)


def bare_rate(blueprint_id: str, steps: int) -> float:
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
    for step in range(steps):
        if step == WARMUP:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        ids, labels, _ = batches.batch(step)
        with autocast:
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    float(loss)  # sync
    return (steps - WARMUP) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blueprint", default="tiny-llama-cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bare-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the trainer sets it
    if args.bare_child:
        print(json.dumps({"rate": bare_rate(args.blueprint, args.steps)}))
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
            bare.append(json.loads(child.stdout.strip().splitlines()[-1])["rate"])
            print(f"repeat {i + 1}: entrypoint {entry[-1]:.2f} steps/s, bare loop {bare[-1]:.2f} steps/s", flush=True)
    e, b = statistics.median(entry), statistics.median(bare)
    result = {
        "blueprint": args.blueprint,
        "steps": args.steps,
        "entrypoint_steps_per_s": round(e, 3),
        "bare_loop_steps_per_s": round(b, 3),
        "ratio": round(e / b, 3),
        "goal": 0.95,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
