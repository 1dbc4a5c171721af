"""Booth mode on the local backend: the queue's wait estimates against the real waits, and what the
quota check costs ``submit``.

    python benchmarks/booth_queue.py [--jobs N] [--max-steps N] [--json]

In a fresh ``PLAYGROUND_HOME`` with one training slot (``BoothPolicy()`` defaults): one job runs first
so the machine knows the blueprint's pace, then ``--jobs`` visitors submit ``tiny-llama-cpu`` at once.
For each queued job it records every ``Queued`` event (position, estimate, when) and when the job
really started (its trainer's start), and prints the first estimate once known against the real wait.
Then ``submit`` latency with booth mode off and on (quota check, submission ledger, file lock, queue
entry), median of 5 each (those jobs are cancelled at once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def queue_run(jobs: int, max_steps: int) -> list[dict]:
    from playground.api import make_request
    from playground.backends.local import LocalBackend
    from playground.booth import BoothPolicy
    from playground.events import Queued

    params = {"max_steps": max_steps}
    with tempfile.TemporaryDirectory(prefix="bench-booth-") as home:
        backend = LocalBackend(home=Path(home), policy=BoothPolicy(max_running_per_owner=1))
        first = backend.submit(make_request("tiny-llama-cpu", params))
        for _ in backend.events(first.id, follow=True):
            pass
        submitted = [backend.submit(make_request("tiny-llama-cpu", params, owner=f"v{i}")) for i in range(jobs + 1)]
        records: dict[str, list] = {job.id: [] for job in submitted}

        def follow(job_id: str) -> None:
            for event in backend.events(job_id, follow=True):
                if isinstance(event, Queued):
                    records[job_id].append((event.position, event.estimated_wait_seconds, event.time))

        threads = [threading.Thread(target=follow, args=(job.id,)) for job in submitted]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = []
        for job in submitted[1:]:  # the first one took the free slot at once
            final = backend.get(job.id)
            known = [(p, e, t) for p, e, t in records[job.id] if p > 0 and e is not None]
            if not known or final.started_at is None:
                results.append({"job": job.id, "phase": str(final.phase), "estimate_s": None})
                continue
            position, estimate, at = known[0]
            actual = final.started_at - at
            results.append(
                {
                    "job": job.id,
                    "position": position,
                    "estimate_s": round(estimate, 1),
                    "actual_wait_s": round(actual, 1),
                    "error_pct": round(100 * (estimate - actual) / actual, 1) if actual > 0 else None,
                    "queued_events": len(records[job.id]),
                    "phase": str(final.phase),
                }
            )
        return results


def submit_latency(booth: bool, runs: int = 5) -> float:
    from playground.api import make_request
    from playground.backends.local import LocalBackend
    from playground.booth import BoothPolicy

    times = []
    with tempfile.TemporaryDirectory(prefix="bench-booth-submit-") as home:
        policy = BoothPolicy(max_jobs_per_owner_per_hour=100) if booth else None
        backend = LocalBackend(home=Path(home), policy=policy, cancel_grace=2)
        for i in range(runs):
            request = make_request("tiny-llama-cpu", {"max_steps": 50}, owner=f"visitor-{i}" if booth else None)
            t0 = time.perf_counter()
            job = backend.submit(request)
            times.append(time.perf_counter() - t0)
            backend.cancel(job.id)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="queued jobs (behind one running job)")
    parser.add_argument("--max-steps", type=int, default=150, help="max_steps of every job")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = queue_run(args.jobs, args.max_steps)
    latency = {"submit_off_s": submit_latency(False), "submit_booth_s": submit_latency(True)}
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"queue": results, **latency, "load": load}, indent=2))
        return
    print(f"load average {load:.1f}; {args.jobs} queued jobs of {args.max_steps} steps behind one running")
    for r in results:
        if r["estimate_s"] is None:
            print(f"  {r['job']}: no estimate ({r['phase']})")
            continue
        print(
            f"  {r['job']}: position {r['position']}, first estimate {r['estimate_s']:.1f} s, "
            f"waited {r['actual_wait_s']:.1f} s (error {r['error_pct']:+.0f} %), {r['queued_events']} Queued events"
        )
    print(f"submit: {latency['submit_off_s'] * 1000:.0f} ms booth off, {latency['submit_booth_s'] * 1000:.0f} ms on")


if __name__ == "__main__":
    main()
