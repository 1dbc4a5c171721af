"""Time for ``tiny-llama-cpu`` to reach its quality bar (held-out exact match ≥ 0.9), in steps and seconds.

    python benchmarks/tiny_time_to_bar.py [--seeds 0] [--eval-every 25] [--max-steps N]

Runs the real entrypoint with the blueprint's defaults plus ``eval_every`` and reads the eval
history from ``metrics.json``: the first eval at or above the bar gives the step and the training
seconds so far (eval and checkpoint time excluded). Also prints the default run's totals and the
machine's load average, since on a shared machine the seconds depend on it (the steps do not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def one_run(seed: int, eval_every: int, max_steps: int | None, out: Path) -> dict:
    from playground.blueprints import get_blueprint

    blueprint = get_blueprint("tiny-llama-cpu")
    bar = blueprint.quality.threshold
    sets = {"seed": seed, "eval_every": eval_every, "checkpoint_every": 0}
    if max_steps:
        sets["max_steps"] = max_steps
    cmd = [sys.executable, "-m", "playground.train", "--blueprint", "tiny-llama-cpu", "--output", str(out)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"training failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    reached = next((h for h in metrics["history"] if h.get("eval_exact_match", 0) >= bar), None)
    return {
        "seed": seed,
        "bar": bar,
        "bar_step": reached["step"] if reached else None,
        "bar_train_seconds": reached["train_seconds"] if reached else None,
        "final_step": metrics["steps"],
        "final_exact_match": metrics["eval_exact_match"],
        "final_train_seconds": metrics["train_seconds"],
        "ms_per_step": round(1000 * metrics["train_seconds"] / metrics["steps"], 1),
        "process_wall_seconds": round(wall, 1),
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "history": [(h["step"], h["train_seconds"], h.get("eval_exact_match")) for h in metrics["history"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--max-steps", type=int, default=None, help="default: the blueprint's")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            result = one_run(seed, args.eval_every, args.max_steps, Path(tmp) / f"seed{seed}")
            results.append(result)
            print(json.dumps(result), flush=True)
    print(
        json.dumps(
            {
                "cpus": os.cpu_count(),
                "threads": os.environ.get("PLAYGROUND_TRAIN_THREADS", "all usable cores"),
                "bar_steps": [r["bar_step"] for r in results],
                "bar_train_seconds": [r["bar_train_seconds"] for r in results],
                "final_exact_match": [r["final_exact_match"] for r in results],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
