"""`playground plan` against reality.

``time`` (issue 62, item 2; the default): the plan's time for the default run (start-up, training, evaluation,
saving, under the machine's load at launch) against the job's measured wall time (submit → Succeeded) and phases, for
tiny-llama-cpu and the default smollm2-135m-lora-kubectl, on an idle machine and beside a CPU hog (goal: within 25 %
in both). Per blueprint, in one fresh PLAYGROUND_HOME, in order: ``idle`` (no run measured yet: stated throughput),
``hog`` (a busy-loop process started first and the load average let settle, the first run measured under another
load), then ``idle-again`` when asked. The load average at plan time and its mean over the run are recorded: this
machine may be loaded by other work too.

    python benchmarks/plan_vs_measured.py time [--blueprints tiny-llama-cpu smollm2-135m-lora-kubectl]
        [--conditions idle hog idle-again] [--hogs 1] [--json FILE]

``memory`` (issue 21, item 4): for each blueprint, A = the defaults planned with no history, B = other parameters
planned from A, C = a third planned from A and B; predicted vs measured peak memory and time, ratio
predicted/measured.

    python benchmarks/plan_vs_measured.py memory [--blueprints ...] [--json FILE]

Rows are written to ``--json`` or ``benchmarks/results/plan_vs_measured-<mode>-cpu<cores>-<date>.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
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


def memory_main(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Issue 21's A/B/C runs: memory and time predicted from no history, one run, two runs."""
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
    return rows


# --------------------------------------------------------------------------------------------------- time (issue 62)

TIME_BLUEPRINTS = ["tiny-llama-cpu", "smollm2-135m-lora-kubectl"]


def start_hogs(count: int) -> list[subprocess.Popen]:
    """``count`` busy-loop processes (a CPU hog each on one core), stopped by :func:`stop_hogs`."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.terminate()
        hog.wait(timeout=10)


def settle(target: float, *, rising: bool, limit: float = 120.0) -> float:
    """Wait (up to ``limit`` s) until the 1-minute load average has risen to / fallen below ``target``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        load = os.getloadavg()[0]
        if (load >= target) if rising else (load <= target):
            return load
        time.sleep(2.0)
    return os.getloadavg()[0]


class LoadSampler(threading.Thread):
    """The 1-minute load average every 2 s while a run goes."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(2.0):
            self.samples.append(os.getloadavg()[0])

    def mean(self) -> float:
        return round(sum(self.samples) / len(self.samples), 2) if self.samples else os.getloadavg()[0]


def timed_run(home: Path, blueprint_id: str, condition: str) -> dict[str, Any]:
    """Plan the default run now, launch it, and time its phases from the job's own events."""
    from playground.api import make_request
    from playground.backends.local import LocalBackend
    from playground.blueprints import get_blueprint
    from playground.blueprints.plan import make_plan
    from playground.events import JobPhase, Phase, Progress

    blueprint = get_blueprint(blueprint_id)
    load_at_plan = os.getloadavg()[0]
    plan = make_plan(blueprint, blueprint.resolve_params({}), home=home)
    backend = LocalBackend(home=home)
    sampler = LoadSampler()
    sampler.start()
    submitted = time.time()
    job = backend.submit(make_request(blueprint_id, {}))
    entered: dict[str, float] = {}
    etas: list[tuple[int, float, float]] = []  # step, ETA, when
    for event in backend.events(job.id, follow=True):
        if isinstance(event, Phase):
            entered.setdefault(str(event.phase), event.time)
        elif isinstance(event, Progress) and event.eta_seconds is not None:
            etas.append((event.step, round(event.eta_seconds, 1), event.time))
    ended = time.time()
    sampler.stopped.set()
    sampler.join()
    job = backend.get(job.id)
    if job.phase != JobPhase.SUCCEEDED:
        raise SystemExit(f"{blueprint_id} ({condition}): {job.phase} {job.message}")
    metrics = json.loads((home / "jobs" / job.id / "output" / "metrics.json").read_text())
    done = entered.get(str(JobPhase.SUCCEEDED), ended)
    measured = {
        "startup": entered[str(JobPhase.TRAINING)] - submitted,
        "training": entered[str(JobPhase.EVALUATING)] - entered[str(JobPhase.TRAINING)],
        "evaluation": entered[str(JobPhase.SAVING)] - entered[str(JobPhase.EVALUATING)],
        "saving": done - entered[str(JobPhase.SAVING)],
    }
    wall = done - submitted
    # each ETA against the one before it counted down by the time between them (a 2x swing: 15:04 -> 24:50 -> 15:04)
    swings = [
        max(now, then - (t1 - t0)) / min(now, then - (t1 - t0))
        for (_, then, t0), (_, now, t1) in itertools.pairwise(etas)
        if min(now, then - (t1 - t0)) > 1.0
    ]
    quarter = next(((eta, at) for step, eta, at in etas if step >= plan.max_steps // 4), None)  # the ETA at 25 %
    return {
        "blueprint": blueprint_id,
        "condition": condition,
        "planned_s": plan.seconds,
        "measured_s": round(wall, 1),
        "ratio": round(plan.seconds / wall, 3),
        "planned_phases_s": {k: getattr(plan.time, k) for k in ("startup", "training", "evaluation", "saving")},
        "measured_phases_s": {k: round(v, 1) for k, v in measured.items()},
        "planned_slowdown": plan.time.slowdown,
        "load_at_plan": round(load_at_plan, 2),
        "load_mean_during_run": sampler.mean(),
        "trainer_load_factor": metrics.get("load_factor"),
        "eta_max_step_to_step_swing": round(max(swings), 3) if swings else None,
        "eta_at_25pct_s": quarter[0] if quarter else None,
        "left_at_25pct_s": round(done - quarter[1], 1) if quarter else None,  # what the ETA should have said
        "time_basis": plan.time_basis,
        "etas": [[step, eta, round(at - submitted, 1)] for step, eta, at in etas],  # step, ETA, seconds in
    }


def time_main(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each blueprint's conditions in order; the rows are written after every run (a run cut short keeps them)."""
    rows: list[dict[str, Any]] = []
    for blueprint_id in args.blueprints:
        home = Path(tempfile.mkdtemp(prefix="plan-time-bench-"))
        os.environ["PLAYGROUND_HOME"] = str(home)
        for condition in args.conditions:
            hogs: list[subprocess.Popen] = []
            if condition == "hog":
                hogs = start_hogs(args.hogs)
                settle(os.getloadavg()[0] + 0.8 * args.hogs, rising=True)  # the plan reads the 1-minute average
            try:
                row = timed_run(home, blueprint_id, condition)
            finally:
                stop_hogs(hogs)
            rows.append(row)
            args.out.write_text(json.dumps(rows, indent=2) + "\n")
            print(
                f"{blueprint_id} [{condition}] planned {row['planned_s']} s / measured {row['measured_s']} s = "
                f"{row['ratio']} (load {row['load_at_plan']} at plan, {row['load_mean_during_run']} mean; "
                f"slowdown planned {row['planned_slowdown']}, trainer saw {row['trainer_load_factor']})\n"
                f"  phases planned {row['planned_phases_s']}\n  phases measured {row['measured_phases_s']}\n"
                f"  ETA: largest step-to-step swing {row['eta_max_step_to_step_swing']}x, at 25 % "
                f"{row['eta_at_25pct_s']} s; basis: {row['time_basis']}",
                flush=True,
            )
            if condition == "hog":
                settle(max(1.0, row["load_at_plan"] - 0.8 * args.hogs), rising=False, limit=90.0)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=("time", "memory"), default="time")
    parser.add_argument("--blueprints", nargs="*", default=None)
    parser.add_argument("--conditions", nargs="*", default=["idle", "hog"], choices=("idle", "hog", "idle-again"))
    parser.add_argument("--hogs", type=int, default=1, help="busy-loop processes beside the run in 'hog'")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here (default: benchmarks/results/)")
    args = parser.parse_args()
    args.blueprints = args.blueprints or (TIME_BLUEPRINTS if args.mode == "time" else list(RUNS))
    args.out = args.json or Path(__file__).parent / "results" / (
        f"plan_vs_measured-{args.mode}-cpu{os.cpu_count()}-{time.strftime('%Y%m%dT%H%M')}.json"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = time_main(args) if args.mode == "time" else memory_main(args)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"rows: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
