"""The blueprint notebooks' headless papermill runs (tests/test_notebooks.py): their parameters, started side by side.

Tried and left (2026-11-26): starting them with the session in the background (nice 10, then Linux's SCHED_IDLE
class), in the ~30 % of 2 cores the other tests leave idle. It cut a full run from 22:24 to 20:18, but the tests
beside them slowed even in the idle class (the session's tiny run took 143 s instead of 41, measured: this
machine's two CPUs are not independent): test_plan's measured step time failed in both runs, a websocket's close
within 30 s in one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from playground.blueprints import load_catalog

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
CANARY = "hf_canary_token_must_never_appear_0123456789"
KERNEL_START_GAP = 2.0  # seconds between kernel starts: jupyter_client's port picking races when many start at once
RUN_TIMEOUT = 1200  # seconds per notebook; ~4 min for all on 2 free cores, much more on a loaded machine

QUALITY_OVERRIDE = 10.0  # above ln(vocab) = 6.2 of the stand-in: an untrained model meets it, not the 2.0 bar
STANDIN_PARAMS = {
    "model_source": "standin",
    "dataset_source": "standin",
    "max_steps": 3,
    "batch_size": 2,
    "max_seq_length": 64,
    "log_every": 1,
    "checkpoint_every": 0,
    "assert_quality": False,
    "max_new_tokens": 8,
}
DEFAULT = "smollm2-135m-lora-kubectl"
# DPO and GRPO on real SmolLM2 weights through their notebooks (the local backend), few steps: the figures
# move the right way (held-out preference accuracy / reward above the base model's); benchmarks/ has the bars.
METHOD_PARAMS = {
    "smollm2-135m-dpo-kubectl": {"max_steps": 4, "log_every": 2, "num_eval_examples": 12, "assert_quality": False,
                                 "max_new_tokens": 24, "quality_metric": "eval_preference_accuracy",
                                 "quality_threshold": 0.5},
    "smollm2-135m-grpo-kubectl": {"max_steps": 2, "batch_size": 2, "warm_start_steps": 8, "log_every": 1,
                                  "sample_every": 1, "num_eval_examples": 12, "assert_quality": False,
                                  "max_new_tokens": 24},
}  # fmt: skip
# The GPU variants of DPO/GRPO are not executed here: the same recipe and notebook as the CPU ones on a hub
# model (their TrainJobs are checked against the CRDs in tests/test_kubernetes_conformance.py). The Qwen LoRA
# notebook runs on its stand-ins through the e2e runner in tests/test_e2e_runner.py (the same checks as
# test_hub_notebooks_headless_on_standins), not twice.
NOT_EXECUTED = {"qwen2.5-1.5b-dpo-kubectl", "llama-3.2-1b-grpo-kubectl", "qwen2.5-1.5b-lora-alpaca"}
# The embedded default on real SmolLM2 weights, a few steps: the path end to end, not the bar (the
# local-backend test and the benchmark check the metric). Every notebook runs on the local backend: a Ray Train
# worker costs ~250 CPU-seconds more for these 4 steps (its runtime-env set-up, the worker, the raylet's helpers,
# measured); test_ray_backend.py trains, follows and serves a notebook's job on Ray (`playground e2e --backend
# ray`) and compares 2 Ray workers against one process.
# tiny-llama-cpu's defaults but 150 of its 300 steps (held-out exact match 0.935 at 150, 0.96 at 200; the bar is
# 0.8): the full defaults train in the session's trained_tiny_job (conftest.py), whose exact match test_serving.py
# asserts.
TINY_PARAMS = {"max_steps": 150}
# 6 steps, not 4: at 4 (still in the 6-step warmup) the model on the widened wide task answers two of the examples
# with nothing at all (measured 2026-11-27); at 6 it answers every one with text.
SMOLLM2_PARAMS = {
    "max_steps": 6,
    "num_eval_examples": 10,
    "log_every": 2,
    "assert_quality": False,
    "max_new_tokens": 24,
}


def blueprint_notebooks() -> list[str]:
    return sorted(load_catalog())


def notebook_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment a notebook runs in: the session's (offline hub, model cache), its own home, this checkout."""
    return {
        **os.environ,
        "PLAYGROUND_HOME": str(home),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        **extra,
    }


def run_papermill(name: str, params: dict, workdir: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start papermill on ``notebooks/<name>`` with ``params`` (their output in ``workdir``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    params_file = workdir / "params.yaml"
    params_file.write_text(yaml.safe_dump({**params, "out_dir": str(workdir)}))
    log = open(workdir / "papermill.log", "w")  # noqa: SIM115 - the child holds it; closed with this process
    command = [sys.executable, "-m", "papermill", str(NOTEBOOKS / name), str(workdir / "executed.ipynb")]
    command += ["-f", str(params_file), "--cwd", str(workdir), "--execution-timeout", str(RUN_TIMEOUT)]
    command += ["-k", "python3"]
    return subprocess.Popen(
        command,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def headless_params(blueprint_id: str) -> dict:
    """The parameters each blueprint notebook runs with here (see the constants above)."""
    blueprint = load_catalog()[blueprint_id]
    params = {"headless": True, **METHOD_PARAMS.get(blueprint_id, {})}
    if blueprint.model.source.startswith("hf://"):
        params.update(STANDIN_PARAMS)
    if blueprint_id == "llama-3.2-1b-lora-alpaca":  # the bar asserted with a replaced threshold
        params.update(assert_quality=True, quality_threshold=QUALITY_OVERRIDE)
    elif blueprint_id == DEFAULT:
        params.update(SMOLLM2_PARAMS)
    elif blueprint_id == "tiny-llama-cpu":
        params.update(TINY_PARAMS)
    return params


@dataclass
class NotebookRuns:
    """Every executed blueprint notebook's papermill process, under one ``root`` (their shared home: root/home)."""

    root: Path
    procs: dict[str, tuple[subprocess.Popen, Path, float]] = field(default_factory=dict)  # with its start

    @classmethod
    def start(cls, root: Path) -> NotebookRuns:
        env = notebook_env(root / "home", HF_TOKEN=CANARY)  # a secret in the environment must never reach an output
        runs = cls(root)
        # the longest runs (DPO, GRPO: TRL on SmolLM2) start first: the others finish while they still run
        ids = sorted(set(blueprint_notebooks()) - NOT_EXECUTED, key=lambda b: (b not in METHOD_PARAMS, b))
        for blueprint_id in ids:
            workdir = root / blueprint_id
            params = headless_params(blueprint_id)
            proc = run_papermill(f"{blueprint_id}.ipynb", params, workdir, env)
            runs.procs[blueprint_id] = (proc, workdir, time.monotonic())
            time.sleep(KERNEL_START_GAP)
        return runs

    def wait(self, artifacts_dir: Path) -> dict[str, Path]:
        """Wait for every run, each at most RUN_TIMEOUT from its start (then it is killed, and fails its test);
        each one's seconds and exit code are written as it ends (where the time goes)."""
        running = dict(self.procs)
        while running:
            for blueprint_id, (proc, workdir, started) in list(running.items()):
                if proc.poll() is None and time.monotonic() < started + RUN_TIMEOUT:
                    continue
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                (workdir / "seconds").write_text(f"{time.monotonic() - started:.1f}")
                (workdir / "rc").write_text(str(proc.returncode))
                del running[blueprint_id]
            time.sleep(0.5)
        from playground.serving.local import LocalServers

        left = [endpoint.to_dict() for endpoint in LocalServers(self.root / "home").endpoints()]
        (self.root / "servers-left.json").write_text(json.dumps(left))  # what the runs left, before stop() cleans up
        seconds = {bid: float((workdir / "seconds").read_text()) for bid, (_, workdir, _) in self.procs.items()}
        (artifacts_dir / "notebook-seconds.json").write_text(json.dumps(seconds, indent=1))
        return {bid: workdir for bid, (_, workdir, _) in self.procs.items()}

    def stop(self) -> None:
        """Interrupted or timed out: leave no kernel, job or server behind."""
        for proc, _, _ in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        from playground.backends.local import LocalBackend
        from playground.facade import Playground

        backend = Playground(LocalBackend(home=self.root / "home"))
        for job in backend.list():
            if not job.done:
                backend.cancel(job.id)
        for endpoint in backend.endpoints():
            backend.unserve(endpoint.url)
