"""`playground plan` against reality on every CPU blueprint (issue 21, item 4; goal: within 20 %).

For each blueprint, in a fresh PLAYGROUND_HOME, through the local backend:
  A. plan the default run with no history (sizes from config, padded width from the chat template, time
     from FLOPs at the stated CPU throughput), then train it and read what the trainer measured;
  B. plan a run with other parameters (twice the batch, other steps) from A's measured rate, then train it;
  C. plan a third (half the batch) from A and B (fixed + per-FLOP seconds per step fitted), then train it.
Prints predicted vs measured peak memory (the trainer's peak RSS) and time (wall: setup + training + final
evaluation + saving), with the ratio predicted/measured.

    python benchmarks/plan_vs_measured.py [--blueprints tiny-llama-cpu smollm2-135m-lora-kubectl] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RUNS: dict[str, list[dict[str, Any]]] = {
    # A: the defaults; B: planned from A's measured rate; C: planned from A and B
    "tiny-llama-cpu": [{}, {"batch_size": 128, "max_steps": 150}, {"batch_size": 32, "max_steps": 200}],
    "smollm2-135m-lora-kubectl": [{}, {"batch_size": 16, "max_steps": 20}, {"batch_size": 4, "max_steps": 40}],
}


def _train(home: Path, blueprint_id: str, params: dict[str, Any]) -> dict[str, Any]:
    from playground.api import make_request
    from playground.backends.local import LocalBackend
    from playground.events import JobPhase

    backend = LocalBackend(home=home)
    job = backend.submit(make_request(blueprint_id, params))
    for _ in backend.events(job.id, follow=True):
        pass
    job = backend.get(job.id)
    if job.phase != JobPhase.SUCCEEDED:
        raise SystemExit(f"{blueprint_id} {params}: {job.phase} {job.message}")
    return json.loads((home / "jobs" / job.id / "output" / "metrics.json").read_text())


def _row(name: str, plan: Any, measured: dict[str, Any]) -> dict[str, Any]:
    memory, seconds = measured["peak_memory_bytes"], measured["wall_seconds"]
    step = measured["train_seconds"] / measured["steps"]
    return {
        "run": name,
        "memory_predicted_gb": round(plan.memory.total / 1e9, 3),
        "memory_measured_gb": round(memory / 1e9, 3),
        "memory_ratio": round(plan.memory.total / memory, 3),
        "time_predicted_s": round(plan.seconds, 1),
        "time_measured_s": round(seconds, 1),
        "time_ratio": round(plan.seconds / seconds, 3),
        "step_predicted_s": round(plan.seconds_per_step, 4),
        "step_measured_s": round(step, 4),
        "time_basis": plan.time_basis,
        "tokens_basis": plan.tokens_basis,
        "memory_basis": plan.memory_basis,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blueprints", nargs="*", default=list(RUNS))
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    from playground.blueprints import get_blueprint
    from playground.blueprints.plan import make_plan

    rows = []
    for blueprint_id in args.blueprints:
        blueprint = get_blueprint(blueprint_id)
        home = Path(tempfile.mkdtemp(prefix="plan-bench-"))
        os.environ["PLAYGROUND_HOME"] = str(home)
        for label, params in zip("ABC", RUNS[blueprint_id], strict=True):
            plan = make_plan(blueprint, blueprint.resolve_params(params), home=home)
            basis = {"A": "no history", "B": "from A", "C": "from A and B"}[label]
            rows.append(
                _row(
                    f"{blueprint_id} {label} {params or 'defaults'} ({basis})", plan, _train(home, blueprint_id, params)
                )
            )
        for row in rows[-3:]:
            print(
                f"{row['run']}\n  memory {row['memory_predicted_gb']} GB predicted / {row['memory_measured_gb']} GB "
                f"measured = {row['memory_ratio']}; time {row['time_predicted_s']} s / {row['time_measured_s']} s = "
                f"{row['time_ratio']} (step {row['step_predicted_s']} / {row['step_measured_s']} s)\n"
                f"  time basis: {row['time_basis']}; tokens: {row['tokens_basis']}; memory: {row['memory_basis']}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
