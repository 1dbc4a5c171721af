"""The trainer's step rate on CPU: 2 processes under ``torchrun`` (gloo; DDP and FSDP2) against 1 process.

    python benchmarks/distributed_cpu.py [--blueprint tiny-llama-cpu] [--steps 100] [--repeats 2]

All three train the same global batch (the blueprint's ``batch_size``; 2 processes take half each)
on the same cores: one process with every usable core as threads, or two processes with half of
them each (the trainer's own thread rule). Each contender runs the entrypoint as a backend does, the
order rotated every repeat so drifting machine load hits all alike; the headline ratios are the
medians of the paired (same-repeat) ratios to the 1-process run.

Figures per run: steps per wall second of the training loop (``metrics.json``: eval and checkpoint
time left out, startup too) and steps per CPU-second (rank 0's loop CPU × the number of processes,
which do the same work), and the final training loss (equal across the three: the same global
batch gives the same curve). On GPUs the same comparison is what ``gpu_blueprints.py --nproc``
measures; on CPU it shows the cost of the gradient all-reduce (DDP) or the per-layer all-gather and
reduce-scatter (FSDP2) over gloo when the model is too small to gain from a second process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CONTENDERS = {"1 process": (1, None), "2 x DDP": (2, "ddp"), "2 x FSDP2": (2, "fsdp")}


def blueprint_file(blueprint: str, work: Path, distributed: str) -> Path:
    """A copy of the blueprint's YAML with ``training.distributed`` set (a fixed setting, not a parameter)."""
    from playground.blueprints import get_blueprint
    from playground.blueprints.loader import CATALOG_DIR

    source = Path(blueprint) if blueprint.endswith((".yaml", ".yml")) else CATALOG_DIR / f"{blueprint}.yaml"
    spec = yaml.safe_load(source.read_text())
    spec.setdefault("training", {})["distributed"] = distributed
    path = work / distributed / f"{get_blueprint(blueprint).id}.yaml"  # the file name is the id
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec))
    return path


def train(blueprint: str, nproc: int, steps: int, out: Path) -> dict[str, float]:
    """One run of the entrypoint (under torchrun when ``nproc > 1``); its loop figures."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    cmd = [sys.executable, *launcher, "-m", "playground.train", "--blueprint", blueprint, "--output", str(out)]
    for key, value in {"max_steps": steps, "log_every": 10, "checkpoint_every": 0, "num_eval_examples": 10}.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {
        "steps_per_s": steps / metrics["train_seconds"],
        "steps_per_cpu_s": steps / (metrics["train_cpu_seconds"] * nproc),
        "train_loss": metrics["train_loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blueprint", default="tiny-llama-cpu")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in CONTENDERS}
    names = list(CONTENDERS)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = {
            name: str(blueprint_file(args.blueprint, work, how)) if how else args.blueprint
            for name, (_, how) in CONTENDERS.items()
        }
        for i in range(args.repeats):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                out = work / f"{name.replace(' ', '')}-{i}"
                runs[name].append(train(files[name], CONTENDERS[name][0], args.steps, out))
            print(
                f"repeat {i + 1}: "
                + ", ".join(f"{k} {v[-1]['steps_per_s']:.2f} steps/s" for k, v in runs.items() if len(v) > i),
                flush=True,
            )

    def paired(name: str, figure: str) -> float:
        ratios = (a[figure] / b[figure] for a, b in zip(runs[name], runs["1 process"], strict=True))
        return round(statistics.median(ratios), 3)

    result: dict[str, Any] = {"blueprint": args.blueprint, "steps": args.steps, "repeats": args.repeats}
    for name, values in runs.items():
        result[name] = {
            figure: round(statistics.median(v[figure] for v in values), 4)
            for figure in ("steps_per_s", "steps_per_cpu_s", "train_loss")
        }
        if name != "1 process":
            result[name]["ratio_to_1_process_wall"] = paired(name, "steps_per_s")
            result[name]["ratio_to_1_process_cpu"] = paired(name, "steps_per_cpu_s")
    result["load_average_before"] = [round(x, 2) for x in load_before]
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
