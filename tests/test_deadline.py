"""A booth job's deadline never throws finished work away (issue 62).

Real supervisors and real ``tiny-llama-cpu`` trainers: a deadline that arrives during training stops it at the next
step and the job still evaluates, saves and ends Succeeded ("stopped at the deadline (step N of M)"), also beside a
CPU hog; a deadline that arrives while the job saves changes nothing. The deadline is sized from the plan
(unit tests of :func:`playground.booth.job_deadline`, and the spec a booth backend writes).
"""

from __future__ import annotations

import io
import json
import math
import re
import time
from pathlib import Path

import pytest
import yaml
from _hooks import install_sitecustomize
from _train_helpers import busy_processes, run_trainer

from playground.api import make_request
from playground.backends.local import LocalBackend
from playground.booth import (
    DEADLINE_FLOOR_SECONDS,
    DEADLINE_SLACK,
    BoothPolicy,
    deadline_grace,
    job_deadline,
)
from playground.commands.jobs import summarize
from playground.events import JobPhase, Log, Phase, Progress
from playground.stopping import STOP_FILE, StopWatch, answer_in_time, write_stop_request

STOPPED = re.compile(r"^stopped at the deadline \(step (\d+) of (\d+)\)$")


# -- sizing -----------------------------------------------------------------------------------------------------
def test_the_deadline_is_the_plans_time_with_slack_within_the_floor_and_the_cap():
    assert job_deadline(100.0, 900) == math.ceil(DEADLINE_SLACK * 100) == 200
    assert job_deadline(41.8, 900) == DEADLINE_FLOOR_SECONDS  # a short plan: the floor (a cold start)
    assert job_deadline(1000.0, 900) == 900  # the operator's cap
    assert job_deadline(100.0, 30) == 30  # a cap below the floor wins
    for unknown in (None, 0.0, -5.0, math.nan, math.inf):
        assert job_deadline(unknown, 900) == 900, unknown
    assert deadline_grace(None, 300) == 300 and deadline_grace(40.0, 300) == 300
    assert deadline_grace(150.0, 300) == 450  # three times the last measured evaluation and save


def test_a_booth_spec_carries_the_planned_deadline_and_the_cap_applies(home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PLAYGROUND_BOOTH", "1")
    spec = yaml.safe_load(LocalBackend(home=home).render_train(make_request("tiny-llama-cpu", {"max_steps": 600})))
    planned = spec["planned_seconds"]
    cap = BoothPolicy().job_deadline_seconds
    assert planned > 0 and spec["deadline_seconds"] == job_deadline(planned, cap) <= cap
    assert spec["deadline_grace_seconds"] == 300 and spec["env"]["PLAYGROUND_STOP_FILE"].endswith(STOP_FILE)
    longer = yaml.safe_load(LocalBackend(home=home).render_train(make_request("tiny-llama-cpu", {"max_steps": 1200})))
    assert longer["planned_seconds"] > planned and longer["deadline_seconds"] >= spec["deadline_seconds"]

    monkeypatch.setenv("PLAYGROUND_BOOTH_JOB_DEADLINE_SECONDS", "150")  # the operator's cap
    capped = yaml.safe_load(LocalBackend(home=home).render_train(make_request("tiny-llama-cpu", {"max_steps": 5000})))
    assert capped["deadline_seconds"] == 150
    monkeypatch.delenv("PLAYGROUND_BOOTH")
    operator = yaml.safe_load(LocalBackend(home=home).render_train(make_request("tiny-llama-cpu")))
    assert operator["deadline_seconds"] is None  # no booth, no deadline


def test_the_stop_file_and_answering_in_the_time_left(tmp_path: Path):
    watch = StopWatch(tmp_path / STOP_FILE)
    assert watch.requested() is None and StopWatch.from_env({}).requested() is None
    finish_by = time.time() + 100
    write_stop_request(tmp_path / STOP_FILE, "deadline", finish_by=finish_by)
    request = watch.requested()
    assert request is not None and request.reason == "deadline" and request.finish_by == pytest.approx(finish_by)
    assert request.describe(120, 240) == "stopped at the deadline (step 120 of 240)"
    assert 60 < request.eval_finish_by() - time.time() <= 70  # most of the time left; the rest for the save

    def slow(prompts, progress):  # 0.05 s per request
        time.sleep(0.05 * len(prompts))
        if progress is not None:
            progress(len(prompts), len(prompts))
        return [str(p) for p in prompts]

    seen: list[tuple[int, int]] = []
    answers = answer_in_time(
        slow, list(range(100)), finish_by=time.time() + 1.0, chunk=4, on_progress=lambda d, t: seen.append((d, t))
    )
    assert 8 <= len(answers) <= 24 and answers == [str(i) for i in range(len(answers))]  # ~1 s of 5 s of answers
    assert seen == [(done, 100) for done in range(4, len(answers) + 1, 4)]  # counted over all the requests
    assert answer_in_time(slow, list(range(6)), finish_by=None) == [str(i) for i in range(6)]
    assert answer_in_time(slow, list(range(6)), finish_by=time.time() - 1, chunk=4) == ["0", "1", "2", "3"]


# -- real runs ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_deadline_during_training_beside_a_cpu_hog_stops_there_and_still_evaluates_and_saves(home: Path):
    deadline = 25  # seconds from the trainer's start: start-up, the base eval and a part of 2000 steps
    backend = LocalBackend(home=home, policy=BoothPolicy(job_deadline_seconds=deadline), cancel_grace=2)
    # batch 8: 2000 steps (minutes beside the hog) without generating 50,000 training rows first
    params = {"max_steps": 2000, "batch_size": 8, "log_every": 5, "num_eval_examples": 20, "checkpoint_every": 0}
    with busy_processes(1):
        job = backend.submit(make_request("tiny-llama-cpu", params, owner="frank"))
        events = list(backend.events(job.id, follow=True))
    job = backend.get(job.id)
    assert job.phase == JobPhase.SUCCEEDED, (job.message, job.log_tail)
    match = STOPPED.match(job.message)
    assert match, job.message
    step, total = int(match[1]), int(match[2])
    assert 1 <= step < total == 2000
    assert job.model_dir and (Path(job.model_dir) / "config.json").is_file()
    assert {"eval_loss", "eval_exact_match"} <= set(job.metrics)
    metrics = json.loads((backend.job_dir(job.id) / "output" / "metrics.json").read_text())
    assert metrics["steps"] == step and metrics["stopped"]["step"] == step
    assert metrics["stopped"]["eval_examples_answered"] == 20  # time enough for every held-out request
    assert job.progress is not None and job.progress.step == step  # the last point is where it stopped
    assert job.finished_at - job.started_at < deadline + 120  # stopped near the deadline, not at the end
    phases = [e for e in events if isinstance(e, Phase)]
    evaluating = [p for p in phases if p.phase == JobPhase.EVALUATING]
    assert evaluating and all(STOPPED.match(p.reason.split(" · ")[0]) for p in evaluating), evaluating
    assert [p.phase for p in phases][-1] == JobPhase.SUCCEEDED
    assert max(e.step for e in events if isinstance(e, Progress)) == step
    out = io.StringIO()
    summarize(job, out)  # the CLI's last lines of ``train --follow``
    assert "Succeeded in " in out.getvalue() and f": stopped at the deadline (step {step} of 2000)" in out.getvalue()


SAVE_HOLD_HOOK = """
import os, sys, time
if os.environ.get("PLAYGROUND_TEST_HOLD_SAVE") and b"playground.train" in open("/proc/self/cmdline", "rb").read():
    def _hold(event, args):
        # The model directory's first write (save_model_dir's temporary sibling): wait for the deadline to pass.
        if event == "os.mkdir" and os.path.basename(str(args[0])).startswith(".model.tmp-"):
            sys.audit_hold_done = True
            end = time.monotonic() + 120
            while time.monotonic() < end:
                with open("train.log", "rb") as log:
                    if b"[supervisor] deadline of" in log.read():
                        return
                time.sleep(0.2)
    sys.addaudithook(lambda event, args: None if getattr(sys, "audit_hold_done", False) else _hold(event, args))
"""


@pytest.mark.slow
def test_a_job_saving_when_the_deadline_passes_is_not_killed(home: Path, tmp_path: Path, monkeypatch):
    install_sitecustomize(tmp_path / "hook", SAVE_HOLD_HOOK, monkeypatch)
    monkeypatch.setenv("PLAYGROUND_TEST_HOLD_SAVE", "1")
    deadline = 40  # far beyond 6 steps: the run is done training long before, and waits in Saving for it
    backend = LocalBackend(home=home, policy=BoothPolicy(job_deadline_seconds=deadline), cancel_grace=2)
    params = {"max_steps": 6, "log_every": 2, "num_eval_examples": 10, "checkpoint_every": 0}
    job = backend.submit(make_request("tiny-llama-cpu", params, owner="gina"))
    list(backend.events(job.id, follow=True))
    job = backend.get(job.id)
    jobdir = backend.job_dir(job.id)
    log = (jobdir / "train.log").read_text()
    assert job.phase == JobPhase.SUCCEEDED and job.message == "", (job.message, job.log_tail)
    assert f"[supervisor] deadline of {deadline} s reached while Saving: training is done" in log
    assert not (jobdir / STOP_FILE).exists()  # nothing asked the trainer to stop
    assert job.model_dir and json.loads((jobdir / "output" / "metrics.json").read_text())["steps"] == 6
    assert job.finished_at - job.started_at >= deadline


@pytest.mark.slow
def test_a_trl_method_stops_at_the_next_step_and_still_evaluates_and_saves(tmp_path: Path):
    """DPO on TRL (GRPO shares the callback): a stop file present from the start ends training after step 1."""
    from playground.train.standins import build_standin

    model = build_standin("qwen2", tmp_path / "qwen2")
    stop = tmp_path / STOP_FILE
    write_stop_request(stop, "deadline", finish_by=time.time() + 600)
    sets = ("max_steps=6", "batch_size=4", "checkpoint_every=0", "log_every=1", "num_eval_examples=10")
    run = run_trainer(
        "--blueprint", "smollm2-135m-dpo-kubectl", "--model-source", str(model), "--output", str(tmp_path / "out"),
        *(x for s in sets for x in ("--set", s)),
        env={"PLAYGROUND_STOP_FILE": str(stop), "PLAYGROUND_TRAIN_THREADS": "1"}, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert [p.step for p in run.progress] == [1]
    assert any(isinstance(e, Log) and e.line.startswith("stopped at the deadline (step 1 of 6)") for e in run.events)
    evaluating = [e for e in run.events if isinstance(e, Phase) and e.phase == JobPhase.EVALUATING]
    assert evaluating and evaluating[0].reason.startswith("stopped at the deadline (step 1 of 6) · ")
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["steps"] == 1 and metrics["stopped"]["message"] == "stopped at the deadline (step 1 of 6)"
    # DPO with LoRA saves its adapter (the job's model), complete even when stopped at the deadline
    assert isinstance(metrics["eval_exact_match"], float)
    assert (tmp_path / "out" / "model" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_with_no_time_left_the_sft_trainer_scores_fewer_held_out_requests_and_still_saves(tmp_path: Path):
    stop = tmp_path / STOP_FILE
    write_stop_request(stop, "deadline", finish_by=time.time())  # the grace already spent: one chunk of answers
    sets = ("max_steps=50", "num_eval_examples=100", "checkpoint_every=0", "log_every=5")
    run = run_trainer(
        "--blueprint", "tiny-llama-cpu", "--output", str(tmp_path / "out"), *(x for s in sets for x in ("--set", s)),
        env={"PLAYGROUND_STOP_FILE": str(stop)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert [p.step for p in run.progress] == [1]  # stopped after the first step
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    stopped = metrics["stopped"]
    assert stopped["step"] == 1 and stopped["eval_examples"] == 100
    assert 1 <= stopped["eval_examples_answered"] < 100
    assert f"evaluation: {stopped['eval_examples_answered']} of 100 held-out requests answered" in " ".join(run.logs)
    assert 0.0 <= metrics["eval_exact_match"] <= 1.0 and (tmp_path / "out" / "model" / "config.json").is_file()
