"""The ``playground`` CLI in-process (``playground.cli.main``): catalog, train --follow, jobs, logs, bad input.

Bad input must give exit 2, one ``playground: error: ...`` line naming the field and the allowed
values, and start nothing (no job directory).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from playground.backends.local import LocalBackend, detect_gpus
from playground.blueprints import get_blueprint
from playground.cli import main
from playground.commands.jobs import ProgressPrinter
from playground.events import JobPhase, Phase, Progress


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("playground: error: "), err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def no_jobs(home: Path) -> bool:
    return not (home / "jobs").exists() or not any((home / "jobs").iterdir())


# -- catalog --------------------------------------------------------------------------------------
def test_blueprints_table_and_json(capsys, isolated_home):
    code, out, _ = run(capsys, "blueprints")
    assert code == 0
    header, *rows = out.strip().splitlines()
    assert header.split()[:3] == ["ID", "TITLE", "TASK"] and "GPUS" in header
    tiny = next(r for r in rows if r.startswith("tiny-llama-cpu "))
    assert "scratch://llama" in tiny and "runs here (CPU)" in tiny
    llama = next(r for r in rows if r.startswith("llama-3.2-1b-lora-alpaca "))
    assert "lora r8" in llama and "hf://meta-llama/Llama-3.2-1B-Instruct" in llama
    if detect_gpus() == 0:
        assert "needs 1 GPU; none here" in llama

    code, out, _ = run(capsys, "blueprints", "--json")
    items = {b["id"]: b for b in json.loads(out)}
    assert {"tiny-llama-cpu", "llama-3.2-1b-lora-alpaca", "qwen2.5-1.5b-lora-alpaca"} <= set(items)
    assert items["tiny-llama-cpu"]["runnable_here"] is True


def test_blueprints_show_human_and_json(capsys, isolated_home):
    code, out, _ = run(capsys, "blueprints", "show", "tiny-llama-cpu")
    assert code == 0
    assert "quality bar: eval_exact_match >= 0.9" in out
    max_steps = next(line for line in out.splitlines() if line.strip().startswith("max_steps"))
    default = get_blueprint("tiny-llama-cpu").parameters["max_steps"]
    assert f"int    {default.default} " in max_steps and f"int 1 to {default.max:g}" in max_steps
    assert "'reverse: kube' -> 'ebuk'" in out

    code, out, _ = run(capsys, "blueprints", "show", "qwen2.5-1.5b-lora-alpaca", "--json")
    data = json.loads(out)
    assert data["model"]["source"] == "hf://Qwen/Qwen2.5-1.5B-Instruct"
    assert data["parameters"]["learning_rate"]["max"] == 1e-2
    assert {"prompt": "What is the capital of France?", "expected": "Paris"} in data["examples"]


# -- bad input: exit 2, one line, nothing started -------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["train", "nope"], ["unknown blueprint 'nope'", "known:", "tiny-llama-cpu"]),
        (["blueprints", "show", "nope"], ["unknown blueprint 'nope'", "tiny-llama-cpu"]),
        (["train", "tiny-llama-cpu", "--set", "foo=1"], ["unknown parameter 'foo'", "allowed:", "max_steps"]),
        (["train", "tiny-llama-cpu", "--set", "max_steps=lots"], ["'max_steps'", "an integer from 1 to 5000"]),
        (["train", "tiny-llama-cpu", "--set", "max_steps=0"], ["'max_steps'", "out of range", "1 to 5000"]),
        (["train", "tiny-llama-cpu", "--set", "learning_rate=5"], ["'learning_rate'", "out of range", "1e-05 to 0.1"]),
        (["train", "tiny-llama-cpu", "--set", "max_steps"], ["--set 'max_steps'", "KEY=VALUE"]),
        (["train", "tiny-llama-cpu", "--model-source", "/no/such/dir"], ["--model-source", "/no/such/dir"]),
        (["train", "tiny-llama-cpu", "--namespace", "x"], ["--namespace", "--backend kubernetes"]),
        (["train", "tiny-llama-cpu", "--backend", "slurm"], ["unknown backend 'slurm'", "local, kubernetes"]),
        (["logs", "tiny-llama-cpu-zzzzz"], ["unknown job 'tiny-llama-cpu-zzzzz'"]),
        (["cancel", "../../etc"], ["unknown job '../../etc'"]),
        (["delete", "nope-00000"], ["unknown job 'nope-00000'"]),
    ],
)
def test_bad_input_is_one_line_exit_2_and_starts_nothing(capsys, isolated_home, argv, needles):
    code, out, err = run(capsys, *argv)
    assert_one_line_error(code, err, *needles)
    assert out == ""
    assert no_jobs(isolated_home)


def test_gpu_blueprint_on_a_cpu_machine_suggests_tiny(capsys, isolated_home):
    if detect_gpus():
        pytest.skip("this machine has a GPU")
    code, _, err = run(capsys, "train", "llama-3.2-1b-lora-alpaca")
    assert_one_line_error(code, err, "'llama-3.2-1b-lora-alpaca'", "needs 1 GPU(s), none found", "tiny-llama-cpu")
    assert no_jobs(isolated_home)


def test_unwritable_state_dir_names_the_dir(capsys, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PLAYGROUND_HOME", str(blocker / "home"))
    code, _, err = run(capsys, "train", "tiny-llama-cpu", "--set", "max_steps=1")
    assert_one_line_error(code, err, "state dir", str(blocker / "home" / "jobs"), "not writable", "PLAYGROUND_HOME")


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("id: broken\ntitle: [unclosed\n", ["broken.yaml", "line", "malformed YAML"]),
        (
            "id: broken\ntitle: t\ntask: x\nmodel: {source: scratch://llama}\n"
            "dataset: {source: synthetic://reverse, format: synthetic}\nmethod: {kind: full}\n"
            "parameters:\n  max_steps: {type: int, default: 5, min: 1}\n"
            "quality: {metric: m, threshold: 1}\nexamples: [{prompt: p}]\n",
            ["broken.yaml", "field 'parameters.max_steps'", "'min' and 'max'"],
        ),
        (
            "id: broken\ntitle: t\ntask: x\nmodel: {source: scratch://llama}\n"
            "dataset: {source: synthetic://reverse, format: tabular}\nmethod: {kind: full}\nparameters: {}\n"
            "quality: {metric: m, threshold: 1}\nexamples: [{prompt: p}]\n",
            ["broken.yaml", "field 'dataset.format'", "'alpaca', 'chat' or 'synthetic'"],
        ),
    ],
)
def test_malformed_blueprint_yaml_names_file_and_field(capsys, isolated_home, tmp_path, monkeypatch, text, needles):
    extra = tmp_path / "blueprints"
    extra.mkdir()
    (extra / "broken.yaml").write_text(text)
    monkeypatch.setenv("PLAYGROUND_BLUEPRINTS", str(extra))
    for argv in (["train", "tiny-llama-cpu"], ["blueprints"]):
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, *needles)
    assert no_jobs(isolated_home)


def test_dry_run_prints_the_plan_and_starts_nothing(capsys, isolated_home):
    code, out, _ = run(capsys, "train", "tiny-llama-cpu", "--set", "max_steps=7", "--dry-run")
    assert code == 0
    assert "- max_steps=7" in out and "playground.train" in out and "backend: local" in out
    assert no_jobs(isolated_home)


# -- train --follow, jobs, logs, cancel, delete ---------------------------------------------------
@pytest.mark.slow
def test_train_follow_prints_progress_and_final_metrics(capsys, home):
    code, out, err = run(
        capsys, "train", "tiny-llama-cpu", "--set", "max_steps=12", "--set", "log_every=2", "--set",
        "num_eval_examples=10", "--follow",
    )  # fmt: skip
    assert code == 0, out + err
    lines = out.splitlines()
    job_id = lines[0]
    assert job_id.startswith("tiny-llama-cpu-")
    assert "phase: Initializing" in lines and "phase: Training" in lines
    bars = [line for line in lines if "step " in line and "[" in line]
    assert bars and "step 12/12" in bars[-1] and "100%" in bars[-1]
    assert all("loss " in b and "tok/s" in b and "ETA " in b for b in bars), bars
    assert any(line.startswith(f"job {job_id} Succeeded in ") for line in lines)
    assert any(line.strip().startswith("eval_exact_match = ") for line in lines)
    assert f"  model: {home}/jobs/{job_id}/output/model" in lines

    # jobs / logs / cancel / delete on the finished job
    code, out, _ = run(capsys, "jobs", "--json")
    (job,) = json.loads(out)
    assert job["id"] == job_id and job["phase"] == "Succeeded" and job["progress"]["step"] == 12
    code, out, _ = run(capsys, "jobs")
    assert job_id in out and "Succeeded" in out and "12/12 (100%)" in out
    code, out, _ = run(capsys, "logs", job_id)
    assert code == 0
    log = out.splitlines()
    assert log[0] == "[phase] Pending" and log[-1] == "[phase] Succeeded"
    assert "[progress] step 2/12" in "\n".join(log) and any("eval_exact_match" in line for line in log)
    code, out, _ = run(capsys, "cancel", job_id)
    assert code == 0 and out.strip() == f"job {job_id} Succeeded"
    code, out, _ = run(capsys, "delete", job_id)
    assert code == 0 and not (home / "jobs" / job_id).exists()
    code, _, err = run(capsys, "logs", job_id)
    assert_one_line_error(code, err, f"unknown job {job_id!r}")


@pytest.mark.slow
def test_crashing_trainer_fails_with_the_error_line_json_follow(capsys, home, tmp_path):
    """A GPU blueprint with a local stand-in runs on CPU; a broken stand-in crashes the real trainer."""
    stand_in = tmp_path / "broken-model"
    stand_in.mkdir()
    (stand_in / "config.json").write_text("{ this is not json")
    code, out, err = run(
        capsys, "train", "llama-3.2-1b-lora-alpaca", "--model-source", str(stand_in), "--follow", "--json"
    )
    assert code == 1, err
    records = [json.loads(line) for line in out.splitlines()]
    first, last = records[0], records[-1]
    assert first["type"] == "job" and first["phase"] == "Pending" and first["base_model"] == str(stand_in)
    assert last["type"] == "job" and last["phase"] == "Failed" and last["model_dir"] is None
    events = records[1:-1]
    assert events[0] == {**events[0], "type": "phase", "phase": "Pending"}
    assert events[-1]["type"] == "phase" and events[-1]["phase"] == "Failed"
    assert last["message"].startswith("trainer exited with code 1: ")
    assert any("error" in line.lower() for line in last["log_tail"]), last["log_tail"]
    assert any(last["message"].split(": ", 1)[1] in line for line in last["log_tail"])
    code, out, _ = run(capsys, "jobs")
    assert first["id"] in out and "Failed" in out


# -- the progress renderer ---------------------------------------------------------------------------
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _progress(step: int) -> Progress:
    return Progress(step=step, total_steps=100, loss=2.0 / step, tokens_per_second=1234.0, eta_seconds=100 - step)


def test_progress_printer_draws_a_bar_on_a_terminal_and_lines_otherwise():
    term = _Terminal()
    printer = ProgressPrinter(term)
    printer.event(Phase(JobPhase.TRAINING))
    for step in range(1, 101):
        printer.event(_progress(step))
    printer.event(Phase(JobPhase.SUCCEEDED))
    printer.close()
    text = term.getvalue()
    assert "phase: Training\n" in text and "\r\033[K" in text
    assert "step 100/100" in text and "ETA 0:00" in text and "1,234 tok/s" in text

    plain = io.StringIO()
    printer = ProgressPrinter(plain)
    for step in range(1, 101):
        printer.event(_progress(step))
    printer.event(Phase(JobPhase.SUCCEEDED))
    lines = plain.getvalue().splitlines()
    assert "\r" not in plain.getvalue()
    assert 10 <= len(lines) <= 12, lines  # about every 10%, plus the last point
    assert "step 100/100" in lines[-1] and "loss 0.0200" in lines[-1] and "ETA 0:00" in lines[-1]


def test_jobs_and_logs_of_the_shared_trained_job(capsys, monkeypatch, session_home, trained_tiny_job):
    monkeypatch.setenv("PLAYGROUND_HOME", str(session_home))
    code, out, _ = run(capsys, "jobs", "--json")
    jobs = {j["id"]: j for j in json.loads(out)}
    job = jobs[trained_tiny_job.id]
    assert job["phase"] == "Succeeded" and job["metrics"]["eval_exact_match"] >= 0.9
    assert job["model_dir"] == trained_tiny_job.model_dir
    code, out, _ = run(capsys, "logs", trained_tiny_job.id, "-f")
    assert code == 0 and out.splitlines()[-1] == "[phase] Succeeded"
    assert LocalBackend(home=session_home).get(trained_tiny_job.id).phase == JobPhase.SUCCEEDED
