"""Local backend latency: ``submit`` → first Progress event, and ``tiny-llama-cpu`` to its quality bar.

    python benchmarks/submit_latency.py [--runs N] [--max-steps N] [--blueprint ID] [--json]

Each run submits ``tiny-llama-cpu`` (or ``--blueprint``; default parameters unless ``--max-steps``) through
``LocalBackend`` in a fresh ``PLAYGROUND_HOME`` and follows its event stream, timing on the
caller's clock:

- ``submit_s``: the ``submit`` call itself (validation, state dir, detached supervisor start);
- ``first_progress_s``: submit → first Progress event (process start, imports, data, model, first steps);
- ``training_phase_s``: submit → Phase Training;
- ``bar_s``: submit → the job Succeeded with the quality metric at or above the bar (what a person
  waits for), and ``train_s``: the trainer's own Training → Saving span from the events.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def one_run(max_steps: int | None, blueprint_id: str = "tiny-llama-cpu") -> dict:
    from playground.api import make_request
    from playground.backends.local import LocalBackend
    from playground.blueprints import get_blueprint
    from playground.events import JobPhase, Metric, Phase, Progress

    blueprint = get_blueprint(blueprint_id)
    params = {"max_steps": max_steps} if max_steps else {}
    with tempfile.TemporaryDirectory(prefix="bench-submit-") as home:
        backend = LocalBackend(home=Path(home))
        request = make_request(blueprint.id, params)
        t0 = time.perf_counter()
        job = backend.submit(request)
        result: dict = {"job": job.id, "submit_s": time.perf_counter() - t0}
        phase_times: dict[str, float] = {}
        for event in backend.events(job.id, follow=True):
            now = time.perf_counter() - t0
            if isinstance(event, Progress) and "first_progress_s" not in result:
                result["first_progress_s"] = now
            elif isinstance(event, Phase):
                phase_times.setdefault(str(event.phase), event.time)
                if event.phase == JobPhase.TRAINING:
                    result["training_phase_s"] = now
            elif isinstance(event, Metric) and event.name == blueprint.quality.metric:
                result["metric"] = event.value
        end = time.perf_counter() - t0
        job = backend.get(job.id)
        result["phase"] = str(job.phase)
        result["metric"] = job.metrics.get(blueprint.quality.metric, result.get("metric"))
        result["passed"] = job.phase == JobPhase.SUCCEEDED and blueprint.quality.passed(result["metric"] or 0.0)
        result["bar_s"] = end if result["passed"] else None
        if "Training" in phase_times and "Saving" in phase_times:
            result["train_s"] = phase_times["Saving"] - phase_times["Training"]
        result["steps"] = job.progress.step if job.progress else 0
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None, help="default: the blueprint's (the accuracy bar)")
    parser.add_argument("--blueprint", default="tiny-llama-cpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    runs = [one_run(args.max_steps, args.blueprint) for _ in range(args.runs)]
    if args.json:
        json.dump(runs, sys.stdout, indent=2)
        print()
        return 0
    load = os.getloadavg()[0]
    print(f"{args.blueprint} through LocalBackend, {args.runs} run(s), {os.cpu_count()} CPU(s), load {load:.1f}")
    for key, label in [
        ("submit_s", "submit() call"),
        ("training_phase_s", "submit -> Phase Training"),
        ("first_progress_s", "submit -> first Progress"),
        ("train_s", "Training -> Saving (trainer)"),
        ("bar_s", "submit -> Succeeded at the bar"),
    ]:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            median = statistics.median(values)
            print(f"  {label:<32} median {median:8.2f} s   (min {min(values):.2f}, max {max(values):.2f})")
        else:
            print(f"  {label:<32} n/a")
    for r in runs:
        print(f"  run {r['job']}: {r['phase']}, {r['steps']} steps, metric {r['metric']}, passed {r['passed']}")
    return 0 if all(r["phase"] == "Succeeded" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
