"""The trainer under Ray Train on CPU: 1 and 2 workers against the local backend's one process and
``torchrun --nproc-per-node 2``, on the same global batch; and Ray's start-up overhead.

    python benchmarks/ray_cpu.py [--blueprint tiny-llama-cpu] [--steps 100] [--repeats 2]

Contenders (the same blueprint, steps and global batch; the order rotated every repeat):
- ``local 1 process``: the local backend (one trainer process, every usable core as threads);
- ``torchrun 2``: ``python -m torch.distributed.run --standalone --nproc-per-node 2`` (DDP over gloo), as the
  local backend runs a multi-GPU blueprint;
- ``ray 1 worker`` and ``ray 2 workers``: the ray backend on a local Ray (started once, cold start timed),
  1 worker × all CPUs or 2 workers × half of them each.

Figures per run, from the trainer's ``metrics.json``: steps per CPU-second of the training loop (rank 0's loop
CPU × the number of processes, which do the same work: the load-robust figure) and per wall second, the final
training loss (the same global batch gives the same curve), and for the backends, submit → first progress point
(what a person waits for after Launch). The headline ratios are medians of same-repeat ratios to the local
backend's one process.
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
CONTENDERS = ("local 1 process", "torchrun 2", "ray 1 worker", "ray 2 workers")
BASELINE = "local 1 process"


def figures(metrics: dict[str, Any], steps: int, nproc: int, first_progress: float | None) -> dict[str, float]:
    result = {
        "steps_per_cpu_s": steps / (metrics["train_cpu_seconds"] * nproc),
        "steps_per_s": steps / metrics["train_seconds"],
        "train_loss": metrics["train_loss"],
    }
    if first_progress is not None:
        result["submit_to_first_progress_s"] = first_progress
    return result


def follow(backend: Any, job_id: str, submitted: float) -> tuple[Any, float]:
    """Follow a job to its end; (the job, seconds from submit to its first progress point)."""
    from playground.events import Progress

    first = None
    for event in backend.events(job_id, follow=True):
        if first is None and isinstance(event, Progress):
            first = time.monotonic() - submitted
    job = backend.get(job_id)
    if job.phase != "Succeeded":
        raise SystemExit(f"{job_id}: {job.phase}: {job.message}\n" + "\n".join(job.log_tail))
    return job, first if first is not None else float("nan")


def run_backend(backend: Any, blueprint: str, params: dict[str, Any], nproc: int, steps: int) -> dict[str, float]:
    from playground.api import make_request

    submitted = time.monotonic()
    job = backend.submit(make_request(blueprint, params))
    job, first = follow(backend, job.id, submitted)
    metrics = json.loads((Path(job.model_dir).parent / "metrics.json").read_text())
    return figures(metrics, steps, nproc, first)


def run_torchrun(blueprint: str, params: dict[str, Any], steps: int, out: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["-m", "playground.train", "--blueprint", blueprint, "--output", str(out)]
    for key, value in params.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return figures(json.loads((out / "metrics.json").read_text()), steps, 2, None)


def main() -> None:
    from playground.backends.local import LocalBackend
    from playground.backends.ray.backend import RayBackend

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blueprint", default="tiny-llama-cpu")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["PLAYGROUND_MLFLOW"] = "0"  # tracking costs every run ~3 s alike; off for all
    params = {"max_steps": args.steps, "log_every": 10, "checkpoint_every": 0, "num_eval_examples": 10}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in CONTENDERS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        local = LocalBackend(home=work / "local")
        ray_one = RayBackend(work / "ray", workers=1, cpus_per_worker=cores)
        ray_two = RayBackend(work / "ray", workers=2, cpus_per_worker=max(1, cores // 2))
        started = time.monotonic()
        ray_one.local_ray.ensure()
        ray_start = time.monotonic() - started
        print(f"local Ray cold start: {ray_start:.1f} s", flush=True)
        try:
            for i in range(args.repeats):
                order = CONTENDERS[i % len(CONTENDERS) :] + CONTENDERS[: i % len(CONTENDERS)]
                for name in order:
                    if name == "local 1 process":
                        result = run_backend(local, args.blueprint, params, 1, args.steps)
                    elif name == "torchrun 2":
                        result = run_torchrun(args.blueprint, params, args.steps, work / f"torchrun-{i}")
                    elif name == "ray 1 worker":
                        result = run_backend(ray_one, args.blueprint, params, 1, args.steps)
                    else:
                        result = run_backend(ray_two, args.blueprint, params, 2, args.steps)
                    runs[name].append(result)
                    print(f"repeat {i + 1}: {name}: {json.dumps({k: round(v, 4) for k, v in result.items()})}")
        finally:
            ray_one.stop_local_ray()

    def paired(name: str, figure: str) -> float:
        ratios = (a[figure] / b[figure] for a, b in zip(runs[name], runs[BASELINE], strict=True))
        return round(statistics.median(ratios), 3)

    result: dict[str, Any] = {"blueprint": args.blueprint, "steps": args.steps, "repeats": args.repeats}
    result["local_ray_cold_start_s"] = round(ray_start, 1)
    for name, values in runs.items():
        result[name] = {figure: round(statistics.median(v[figure] for v in values), 4) for figure in values[0]}
        if name != BASELINE:
            result[name]["ratio_to_local_cpu"] = paired(name, "steps_per_cpu_s")
            result[name]["ratio_to_local_wall"] = paired(name, "steps_per_s")
    result["load_average_before"] = [round(x, 2) for x in load_before]
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["cpus"] = cores
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
