"""The trainer under ``torchrun --nproc-per-node 2`` (gloo, CPU) with DDP and with FSDP2, against one
process on the same global batch; a killed FSDP2 run resumes; resume refuses changed settings and
accepts the changes meant to be allowed.

Tolerance (``REL``): the 2-process runs compute the same global-batch, token-mean loss as the single
process (the global batch is fixed; each micro-batch's summed token loss is divided by the step's
answer-token count). Only the order of floating-point sums differs (two half-batch gradients
all-reduced instead of one batch), ~1e-7 relative per step, which AdamW amplifies once the learning
rate is high (measured over 100 steps: 1e-6 at step 30, 1e-3 at 50; benchmarks/README.md), so the
runs stay within the warm-up: the largest relative gap measured over these 16 steps was 1.6e-7
(DDP, FSDP2 and the resumes alike).
``rel=1e-5`` keeps a margin of ~60× for that and still catches the subtlest bug in reach: a loss
averaged per micro-batch instead of per answer token is already 1.1-1.8e-4 off in the first steps
(measured, while the untrained model's token losses are still nearly uniform); a different data
order, batch size or learning rate moves the losses by percents.

Cost: five short runs (16 steps of tiny-llama-cpu, 10 eval examples); the startup (importing torch
and transformers) dominates, so the independent runs go in two concurrent waves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from _train_helpers import REPO_ROOT, TrainRun, describe, run_trainer, trainer_command, trainer_env

from playground.blueprints.loader import CATALOG_DIR
from playground.events import Progress, parse_line
from playground.train.__main__ import main

STEPS, CKPT, KILL_AT = 16, 4, 5
ARGS = ["--set", f"max_steps={STEPS}", "--set", "log_every=1", "--set", "batch_size=8"]
ARGS += ["--set", f"checkpoint_every={CKPT}", "--set", "num_eval_examples=10"]
REL = 1e-5


def _blueprint_file(directory: Path, **training: Any) -> Path:
    """tiny-llama-cpu with ``training`` merged into its fixed ``training`` block."""
    spec = yaml.safe_load((CATALOG_DIR / "tiny-llama-cpu.yaml").read_text())
    spec["training"].update(training)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tiny-llama-cpu.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _losses(run: TrainRun) -> dict[int, float]:
    return {p.step: p.loss for p in run.progress}


def _checkpoints(output: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in (output / "checkpoints").glob("step-*"))


def _run_until_killed(args: list[str], kill_after_step: int) -> tuple[int, list[Progress]]:
    """Start a 2-process run and SIGKILL torchrun and both ranks (their own process group) as soon
    as the Progress event of ``kill_after_step`` is read; the run has many steps to go then."""
    proc = subprocess.Popen(
        trainer_command(*args, nproc=2),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=trainer_env(),
        cwd=REPO_ROOT,
        start_new_session=True,
    )
    watchdog = threading.Timer(600, os.killpg, (proc.pid, signal.SIGKILL))  # a hang fails, never blocks CI
    watchdog.start()
    seen: list[Progress] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = parse_line(line)
            if isinstance(event, Progress):
                seen.append(event)
                if event.step == kill_after_step:
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
        return proc.wait(timeout=60), seen
    finally:
        watchdog.cancel()
        proc.stdout.close()


@dataclass
class Runs:
    root: Path
    single: TrainRun  # one process, the reference curve
    ddp: TrainRun  # 2 processes, distributed: auto (DDP on CPU)
    killed_rc: int
    killed: list[Progress]  # 2 processes, FSDP2, killed after step KILL_AT
    leftovers: list[int]  # the checkpoint steps the kill left
    left_a_model: bool  # whether the killed run got as far as writing model/
    resumed: TrainRun  # the killed FSDP2 run resumed on 2 processes
    changed: TrainRun  # the killed run resumed with allowed changes: 1 process, another split and cadence


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("dist")
    fsdp = ["--blueprint", str(_blueprint_file(root / "bp-fsdp", distributed="fsdp")), *ARGS]
    fsdp += ["--output", str(root / "fsdp")]
    with ThreadPoolExecutor(2) as pool:  # wave 1: three independent runs
        single = pool.submit(run_trainer, "--blueprint", "tiny-llama-cpu", *ARGS, "--output", str(root / "single"))
        ddp = pool.submit(
            run_trainer, "--blueprint", "tiny-llama-cpu", *ARGS, "--output", str(root / "ddp"), nproc=2, timeout=600
        )
        killed_rc, killed = _run_until_killed(fsdp, KILL_AT)
        single_run, ddp_run = single.result(), ddp.result()
    assert single_run.returncode == 0, describe(single_run)
    assert ddp_run.returncode == 0, describe(ddp_run)
    leftovers, left_a_model = _checkpoints(root / "fsdp"), (root / "fsdp" / "model").exists()
    shutil.copytree(root / "fsdp", root / "changed")
    # The same global batch (4 × 2 accumulation steps = 8) split another way, in one process, without
    # FSDP2, logging every 2 steps: none of that is what a resume must keep.
    changed_args = ["--blueprint", str(_blueprint_file(root / "bp-split", gradient_accumulation_steps=2)), *ARGS]
    changed_args += ["--set", "batch_size=4", "--set", "log_every=2", "--output", str(root / "changed"), "--resume"]
    with ThreadPoolExecutor(1) as pool:  # wave 2: two resumes of copies of the killed run
        changed = pool.submit(run_trainer, *changed_args)
        resumed = run_trainer(*fsdp, "--resume", nproc=2, timeout=600)
        changed_run = changed.result()
    assert resumed.returncode == 0, describe(resumed)
    assert changed_run.returncode == 0, describe(changed_run)
    return Runs(root, single_run, ddp_run, killed_rc, killed, leftovers, left_a_model, resumed, changed_run)


def test_ddp_matches_one_process_on_the_same_global_batch(runs: Runs) -> None:
    logs = "\n".join(runs.ddp.logs)
    assert "2 process(es) × 1 threads, DDP" in logs  # auto picks DDP where nothing is short of memory
    assert "global batch 8 = 2 process(es) × 1 micro-batch(es) × 4" in logs
    single = _losses(runs.single)
    assert list(_losses(runs.ddp)) == list(range(1, STEPS + 1))
    assert _losses(runs.ddp) == pytest.approx(single, rel=REL)
    assert single[STEPS] < 0.8 * single[1]  # it learns, so the curve says something
    assert runs.ddp.metrics["eval_loss"] == pytest.approx(runs.single.metrics["eval_loss"], rel=REL)
    metrics = json.loads((runs.root / "ddp" / "metrics.json").read_text())
    assert (metrics["world_size"], metrics["strategy"], metrics["global_batch_size"]) == (2, "ddp", 8)


def test_killed_fsdp_run_resumes_and_continues_the_step_count(runs: Runs) -> None:
    single = _losses(runs.single)
    assert runs.killed_rc != 0 and [p.step for p in runs.killed] == list(range(1, KILL_AT + 1))
    killed = {p.step: p.loss for p in runs.killed}
    assert killed == pytest.approx({s: single[s] for s in range(1, KILL_AT + 1)}, rel=REL)
    # The step-4 checkpoint was written before step 5 was reported; how far the ranks got before
    # the kill landed may vary, but never to the end of the run.
    last = runs.leftovers[-1]
    assert runs.leftovers[0] == CKPT and last < STEPS and not runs.left_a_model
    logs = "\n".join(runs.resumed.logs)
    assert ", FSDP2" in logs and f"resume: continuing from checkpoints/step-{last} (step {last})" in logs
    assert list(_losses(runs.resumed)) == list(range(last + 1, STEPS + 1))
    assert _losses(runs.resumed) == pytest.approx({s: single[s] for s in range(last + 1, STEPS + 1)}, rel=REL)
    assert runs.resumed.metrics["eval_loss"] == pytest.approx(runs.single.metrics["eval_loss"], rel=REL)
    metrics = json.loads((runs.root / "fsdp" / "metrics.json").read_text())
    assert (metrics["strategy"], metrics["world_size"], metrics["resumed_from_step"]) == ("fsdp", 2, last)
    assert metrics["steps"] == STEPS
    assert _checkpoints(runs.root / "fsdp") == [8, 12, 16]  # rewritten after the resume, the 3 newest kept
    assert not list((runs.root / "fsdp" / "checkpoints").glob(".tmp-*"))  # a kill mid-save left nothing behind


def test_saved_models_load_and_generate_in_plain_transformers(runs: Runs) -> None:
    """FSDP2 and DDP runs' ``model/`` load with AutoModelForCausalLM / AutoTokenizer alone, hold the
    single process's weights (FSDP2: gathered from the shards), and generate."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def prompt(directory: Path) -> Any:
        chat = [{"role": "user", "content": "reverse: kube"}]
        tokenizer = AutoTokenizer.from_pretrained(directory)
        return tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True, return_tensors="pt")

    reference = AutoModelForCausalLM.from_pretrained(runs.root / "single" / "model")
    reference_prompt = prompt(runs.root / "single" / "model")
    expected_answer = reference.generate(**reference_prompt, max_new_tokens=6, do_sample=False)
    assert expected_answer.shape[1] > reference_prompt["input_ids"].shape[1]  # new tokens
    for name in ("fsdp", "ddp"):
        directory = runs.root / name / "model"
        model = AutoModelForCausalLM.from_pretrained(directory)
        state, expected = model.state_dict(), reference.state_dict()
        assert set(state) == set(expected), name
        for key, value in expected.items():
            torch.testing.assert_close(state[key], value, rtol=1e-3, atol=1e-5, msg=f"{name}: {key}")
        answer = model.generate(**prompt(directory), max_new_tokens=6, do_sample=False)
        torch.testing.assert_close(answer, expected_answer, msg=name)


def test_resume_accepts_another_world_size_strategy_split_and_cadence(runs: Runs) -> None:
    """Checkpoints hold full tensors: the killed 2-process FSDP2 run continues in one process with
    the global batch split as 4 × 2 accumulation steps and a Progress event every 2 steps, on the
    single process's loss curve (each event: the mean of its 2 steps)."""
    single = _losses(runs.single)
    last = runs.leftovers[-1]
    assert "global batch 8 = 1 process(es) × 2 micro-batch(es) × 4" in "\n".join(runs.changed.logs)
    assert list(_losses(runs.changed)) == list(range(last + 2, STEPS + 1, 2))
    expected = {s: (single[s - 1] + single[s]) / 2 for s in range(last + 2, STEPS + 1, 2)}
    assert _losses(runs.changed) == pytest.approx(expected, rel=REL)
    metrics = json.loads((runs.root / "changed" / "metrics.json").read_text())
    assert (metrics["strategy"], metrics["world_size"], metrics["resumed_from_step"]) == ("single", 1, last)


@pytest.fixture
def checkpointed(runs: Runs, tmp_path: Path) -> Path:
    """A copy of the finished single-process output (checkpoints at steps 8, 12, 16)."""
    out = tmp_path / "out"
    shutil.copytree(runs.root / "single", out)
    return out


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        ("seed=1", "seed", "set seed=0"),
        ("batch_size=16", "global_batch_size", "set batch_size × gradient_accumulation_steps = 8"),
        (f"max_steps={STEPS + 10}", "max_steps", f"set max_steps={STEPS}"),
        ("learning_rate=0.01", "learning_rate", "set learning_rate=0.003"),
        ("num_eval_examples=20", "num_eval_examples", "set num_eval_examples=10"),  # other training rows
        ("training.max_seq_length=48", "max_seq_length", "set max_seq_length=64"),  # other tokenization
    ],
)
def test_resume_refuses_a_changed_seed_batch_data_or_schedule(
    checkpointed: Path, change: str, field: str, fix: str, capsys
) -> None:
    """One line naming the field and its value in the checkpoint, exit 2, nothing written."""
    before = sorted(str(p.relative_to(checkpointed)) for p in checkpointed.rglob("*"))
    blueprint, sets = "tiny-llama-cpu", ["--set", change]
    if change.startswith("training."):  # a fixed setting of the blueprint, not a parameter
        name, value = change.removeprefix("training.").split("=")
        blueprint, sets = str(_blueprint_file(checkpointed.parent / "bp", **{name: int(value)})), []
    args = ["--blueprint", blueprint, *ARGS, *sets, "--output", str(checkpointed), "--resume"]
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured
    assert lines[0].startswith(f"playground.train: error: resume: {field}=") and f"step-{STEPS}" in lines[0]
    assert f"; {fix} or use a fresh --output" in lines[0]
    assert sorted(str(p.relative_to(checkpointed)) for p in checkpointed.rglob("*")) == before  # nothing written


def test_a_global_batch_that_cannot_split_over_the_processes_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    """What each torchrun rank checks before starting anything (WORLD_SIZE as torchrun sets it)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ["--blueprint", "tiny-llama-cpu", "--set", "batch_size=3", "--output", str(tmp_path / "out")]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert "batch_size=3" in captured.err and "cannot be split evenly over 2 processes" in captured.err
    assert not (tmp_path / "out").exists()
