"""The local backend end to end, with the real trainer: accuracy bar, cancel, kill -9, reattach.

Every job here is a real ``python -m playground.train`` run under the detached supervisor.
Only the accuracy test trains long (the shared ``trained_tiny_job``); the others use a few steps.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from _waiting import wait_for

from playground.api import make_request
from playground.backends.local import LocalBackend
from playground.backends.local.backend import new_job_id
from playground.errors import JobNotFound, UserError
from playground.events import JobPhase, Log, Metric, Phase, Progress
from playground.processes import process_alive

pytestmark = pytest.mark.slow

FAST = {"num_eval_examples": 10, "checkpoint_every": 0}
# Still running when a test acts on it after its first step, yet cheap to start: the trainer builds
# max_steps x batch_size synthetic rows up front, so thousands of steps would cost minutes of setup.
LONG = {"max_steps": 400, "log_every": 1, **FAST}


def status_of(backend: LocalBackend, job_id: str) -> dict:
    return json.loads((backend.job_dir(job_id) / "status.json").read_text())


def wait_for_progress(backend: LocalBackend, job_id: str, timeout: float = 420) -> None:
    def training() -> bool:
        job = backend.get(job_id)
        assert not job.done, f"job ended early: {job.phase} {job.message} {job.log_tail[-5:]}"
        return job.progress is not None

    wait_for(training, timeout, f"the first progress event of {job_id}")


def test_job_ids_are_kubernetes_names():
    for blueprint_id in ("tiny-llama-cpu", "qwen2.5-1.5b-lora-alpaca", "9lives", "x" * 63):
        job_id = new_job_id(blueprint_id)
        assert len(job_id) <= 63
        assert job_id[0].isalpha() and job_id[-1].isalnum()
        assert all(c.islower() or c.isdigit() or c == "-" for c in job_id), job_id
    assert new_job_id("tiny-llama-cpu").startswith("tiny-llama-cpu-")
    assert new_job_id("tiny-llama-cpu") != new_job_id("tiny-llama-cpu")


def test_tiny_llama_reaches_the_bar_through_the_local_backend(trained_tiny_job, session_home: Path):
    job = trained_tiny_job
    assert job.phase == JobPhase.SUCCEEDED and job.backend == "local"
    assert job.metrics["eval_exact_match"] >= 0.9, job.metrics

    model = Path(job.model_dir)
    assert model == session_home / "jobs" / job.id / "output" / "model"
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json"):
        assert (model / name).is_file(), f"{name} missing from {sorted(p.name for p in model.iterdir())}"
    template = (model / "chat_template.jinja").is_file() or "chat_template" in (
        model / "tokenizer_config.json"
    ).read_text()
    assert template, "the tokenizer carries no chat template"
    base = Path(job.base_model)
    assert base == model.parent / "base-model" and (base / "config.json").is_file()
    assert (base / "model.safetensors").is_file()

    # A fresh backend instance (another reader) sees the same history, from the beginning.
    backend = LocalBackend(home=session_home)
    assert job.id in [j.id for j in backend.list()]
    events = list(backend.events(job.id))
    phases = [e.phase for e in events if isinstance(e, Phase)]
    assert phases[0] == JobPhase.PENDING and phases[-1] == JobPhase.SUCCEEDED
    assert phases.index(JobPhase.INITIALIZING) < phases.index(JobPhase.TRAINING) < phases.index(JobPhase.SUCCEEDED)
    assert phases.count(JobPhase.SUCCEEDED) == 1
    steps = [e.step for e in events if isinstance(e, Progress)]
    assert steps and all(a < b for a, b in itertools.pairwise(steps)), steps
    assert steps[-1] == job.params["max_steps"] == job.progress.step
    assert len(steps) >= job.params["max_steps"] // job.params["log_every"]
    losses = [e.loss for e in events if isinstance(e, Progress)]
    assert losses[-1] < losses[0] / 2, (losses[0], losses[-1])
    metrics = {e.name: e.value for e in events if isinstance(e, Metric)}
    assert metrics["eval_exact_match"] == pytest.approx(job.metrics["eval_exact_match"])
    status = status_of(backend, job.id)
    assert status["exit_code"] == 0 and status["finished_at"] >= status["started_at"] >= status["created_at"]


def test_cancel_stops_the_trainer_and_ends_cancelled(home: Path):
    backend = LocalBackend(home=home, cancel_grace=5)
    job = backend.submit(make_request("tiny-llama-cpu", LONG))
    wait_for_progress(backend, job.id)
    status = status_of(backend, job.id)
    trainer, supervisor = status["trainer_pid"], status["supervisor_pid"]
    assert process_alive(trainer) and process_alive(supervisor)

    job = backend.cancel(job.id)
    assert job.phase == JobPhase.CANCELLED and job.done
    assert job.model_dir is None and job.finished_at
    assert not process_alive(trainer), "the trainer survived cancel"
    assert not process_alive(supervisor)
    events = list(LocalBackend(home=home).events(job.id, follow=True))  # ends: the job is terminal
    assert isinstance(events[-1], Phase) and events[-1].phase == JobPhase.CANCELLED
    assert backend.cancel(job.id).phase == JobPhase.CANCELLED  # cancelling a finished job changes nothing
    with pytest.raises(UserError, match=r"is Cancelled; it can be served once it has Succeeded"):
        backend.serve(job.id)
    backend.delete(job.id)
    assert not (home / "jobs" / job.id).exists()
    with pytest.raises(JobNotFound):
        backend.get(job.id)


def test_kill_9_of_the_trainer_fails_the_job_and_keeps_its_log_tail(home: Path):
    backend = LocalBackend(home=home)
    job = backend.submit(make_request("tiny-llama-cpu", LONG))
    wait_for_progress(backend, job.id)
    trainer = status_of(backend, job.id)["trainer_pid"]
    os.kill(trainer, signal.SIGKILL)
    last = list(backend.events(job.id, follow=True))[-1]
    assert isinstance(last, Phase) and last.phase == JobPhase.FAILED
    job = backend.get(job.id)
    assert job.phase == JobPhase.FAILED and "SIGKILL" in job.message, job.message
    assert job.model_dir is None
    assert any(line.startswith("[progress] step") for line in job.log_tail), job.log_tail
    assert status_of(backend, job.id)["signal"] == "SIGKILL"


def test_job_outlives_the_submitting_process_and_a_fresh_backend_follows_it(home: Path):
    """The console script submits and exits; this process attaches mid-run and sees it all."""
    exe = shutil.which("playground")
    assert exe, "the `playground` console script is not installed (pip install -e .)"
    env = {**os.environ, "PLAYGROUND_HOME": str(home)}
    sets = ["--set", "max_steps=80", "--set", "log_every=2", "--set", "num_eval_examples=10"]
    done = subprocess.run([exe, "train", "tiny-llama-cpu", *sets], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert job_id.startswith("tiny-llama-cpu-") and "\n" not in job_id

    backend = LocalBackend(home=home)  # a new instance in another process than the submitter
    wait_for_progress(backend, job_id)
    assert not backend.get(job_id).done  # attaching to a running job
    events = list(backend.events(job_id, follow=True))
    steps = [e.step for e in events if isinstance(e, Progress)]
    assert steps[0] == 2 and steps[-1] == 80, steps  # from the first step to the last
    assert isinstance(events[0], Phase) and events[0].phase == JobPhase.PENDING
    assert isinstance(events[-1], Phase) and events[-1].phase == JobPhase.SUCCEEDED
    assert any(isinstance(e, Log) and e.line.startswith("[supervisor] starting") for e in events)
    job = backend.get(job_id)
    assert job.phase == JobPhase.SUCCEEDED and Path(job.model_dir, "config.json").is_file()


def test_a_dead_supervisor_is_reconciled_to_failed(home: Path):
    backend = LocalBackend(home=home)
    job = backend.submit(make_request("tiny-llama-cpu", LONG))
    wait_for_progress(backend, job.id)
    status = status_of(backend, job.id)
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    job = wait_for(lambda: (j := LocalBackend(home=home).get(job.id)).done and j, 30, "reconcile")
    assert job.phase == JobPhase.FAILED and job.message.startswith("supervisor exited unexpectedly")
    assert job.log_tail and job.model_dir is None
    wait_for(lambda: not process_alive(status["trainer_pid"]), 10, "the orphaned trainer to be stopped")
