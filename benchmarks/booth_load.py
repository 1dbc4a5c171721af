"""A booth under load: several visitors launch the default blueprint at once beside a CPU hog, under the booth's
own policy (``BoothPolicy.from_env()``: one training slot, the queue, the deadline sized from the plan).

    python benchmarks/booth_load.py [--visitors 4] [--blueprint ID] [--max-steps N] [--no-hog] [--json PATH]

In a fresh ``PLAYGROUND_HOME`` (local backend), a busy-loop process runs for the whole benchmark (from 75 s before the
visitors come, so that the load average the plan reads has seen it); the visitors (ids shaped like the booth
cookie's, ``v-`` + 16 hex), their pages open (a presence heartbeat each, as the app's kernel sends), submit at the
same moment, each with the blueprint's defaults. For each visitor it records what the page promised when they
pressed Launch (the plan's time for the run, and the queue's first wait estimate) against what happened: when the
trainer started, when the job ended, its final phase and message, whether it has a model to chat with and the
headline metric the page shows.

Goal (issue 62, item 7): every run ends with a model and a headline (0 lost).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_BLUEPRINT = "smollm2-135m-lora-kubectl"
HOG_HEAD_START_SECONDS = 75.0


def start_hog() -> subprocess.Popen:
    """One busy-loop process (a CPU hog on one core), stopped by the caller."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def visitor_id() -> str:
    return "v-" + secrets.token_hex(8)


def run(visitors: int, blueprint_id: str, params: dict, hog: bool) -> dict:
    from playground.api import make_request, plan_run
    from playground.backends.local import LocalBackend
    from playground.blueprints.loader import get_blueprint
    from playground.booth import BoothPolicy, Heartbeat, touch_presence
    from playground.events import Phase, Queued

    blueprint = get_blueprint(blueprint_id)
    metric = blueprint.quality.metric if blueprint.quality else None
    hog_proc = start_hog() if hog else None
    if hog_proc is not None:  # the hog was there before the visitors came: the load average (1 min) shows it
        time.sleep(HOG_HEAD_START_SECONDS)
    load_before = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-booth-load-") as home:
            os.environ["PLAYGROUND_HOME"] = home  # the plan, the queue and the runs all read this fresh home
            policy = BoothPolicy.from_env()
            backend = LocalBackend(home=Path(home), policy=policy)
            owners = [visitor_id() for _ in range(visitors)]
            records: dict[str, dict] = {}
            lock = threading.Lock()

            def launch(owner: str) -> None:
                plan = plan_run(blueprint_id, params)  # what the card and the plan panel show at Launch
                pressed = time.time()
                job = backend.submit(make_request(blueprint_id, params, owner=owner))
                record = {
                    "owner": owner,
                    "job": job.id,
                    "pressed_at": pressed,
                    "plan_seconds": round(plan.seconds, 1),
                    "plan_breakdown": dataclasses.asdict(plan.time) if plan.time is not None else None,
                    "first_wait_estimate_s": None,
                    "phases": [],
                }
                with lock:
                    records[job.id] = record
                for event in backend.events(job.id, follow=True):
                    if isinstance(event, Queued) and event.position > 0 and event.estimated_wait_seconds is not None:
                        if record["first_wait_estimate_s"] is None:
                            record["first_wait_estimate_s"] = round(event.estimated_wait_seconds, 1)
                    elif isinstance(event, Phase):
                        record["phases"].append([str(event.phase), round(event.time - pressed, 1), event.reason])

            # each visitor's page stays open: their kernel shows presence every 30 s, as the app's does (a queued job
            # of a visitor unseen for visitor_gone_seconds leaves the queue)
            beats = [Heartbeat(functools.partial(touch_presence, home, owner), 30.0).start() for owner in owners]
            threads = [threading.Thread(target=launch, args=(owner,)) for owner in owners]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for beat in beats:
                beat.stop()

            results = []
            for job_id, record in records.items():
                job = backend.get(job_id)
                model_ok = bool(job.model_dir) and Path(job.model_dir).is_dir()
                headline = job.metrics.get(metric) if metric else None
                spec = json.loads((Path(home) / "jobs" / job_id / "spec.json").read_text())
                started = (job.started_at - record["pressed_at"]) if job.started_at else None
                ended = (job.finished_at - record["pressed_at"]) if job.finished_at else None
                promised = record["plan_seconds"] + (record["first_wait_estimate_s"] or 0.0)
                results.append(
                    {
                        **record,
                        "phase": str(job.phase),
                        "message": job.message,
                        "has_model": model_ok,
                        "headline": {metric: headline} if metric else None,
                        "started_after_s": round(started, 1) if started is not None else None,
                        "ended_after_s": round(ended, 1) if ended is not None else None,
                        "run_seconds": round(job.finished_at - job.started_at, 1)
                        if job.finished_at and job.started_at
                        else None,
                        "promised_total_s": round(promised, 1),
                        "measured_over_promised": round(ended / promised, 2) if ended and promised else None,
                        "stopped_at_deadline": "deadline" in (job.message or "").lower(),
                        "deadline_s": spec.get("deadline_seconds"),
                        "deadline_planned_s": spec.get("planned_seconds"),
                    }
                )
            results.sort(key=lambda r: r["pressed_at"])
    finally:
        if hog_proc is not None:
            hog_proc.kill()
            hog_proc.wait()
    lost = sum(1 for r in results if not (r["has_model"] and r["headline"] and None not in r["headline"].values()))
    return {
        "benchmark": "booth_load",
        "blueprint": blueprint_id,
        "params": params,
        "visitors": visitors,
        "hog": hog,
        "cpus": os.cpu_count(),
        "policy": {k: getattr(policy, k) for k in ("max_concurrent_trainings", "job_deadline_seconds", "max_queued")},
        "load_average_at_start": [round(x, 2) for x in load_before],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "lost": lost,
        "runs": results,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--visitors", type=int, default=4)
    parser.add_argument("--blueprint", default=DEFAULT_BLUEPRINT)
    parser.add_argument("--max-steps", type=int, default=None, help="override the blueprint's default steps")
    parser.add_argument("--no-hog", action="store_true", help="no CPU hog beside the runs")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    params = {"max_steps": args.max_steps} if args.max_steps else {}
    result = run(args.visitors, args.blueprint, params, hog=not args.no_hog)
    print(f"{result['visitors']} visitors, {args.blueprint}, hog={result['hog']}, lost={result['lost']}")
    print("visitor      phase       model  headline  plan(s)  wait est(s)  started(s)  ended(s)  measured/promised")
    for r in result["runs"]:
        headline = next(iter(r["headline"].values())) if r["headline"] else None
        print(
            f"{r['owner'][:10]:<12} {r['phase']:<11} {('yes' if r['has_model'] else 'NO'):<6} "
            f"{headline if headline is not None else '-'!s:<9} {r['plan_seconds']:<8} "
            f"{r['first_wait_estimate_s'] if r['first_wait_estimate_s'] is not None else '-'!s:<12} "
            f"{r['started_after_s']!s:<11} {r['ended_after_s']!s:<9} {r['measured_over_promised']}"
        )
        print(f"             {r['message']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["lost"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
