"""The ``playground`` CLI in-process (``playground.cli.main``): catalog, train --follow, jobs, logs, bad input.

Bad input must give exit 2, one ``playground: error: ...`` line naming the field and the allowed
values, and start nothing (no job directory).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from _fixtures import catalog_variant

from playground.backends.local import LocalBackend, detect_gpus
from playground.blueprints import get_blueprint, load_catalog
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
        assert "needs 1 GPU and this machine has none" in llama

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


def test_can_it_run_here_has_one_wording_everywhere(capsys, isolated_home, tmp_path, monkeypatch):
    """The catalog table, `blueprints show`, the CLI refusal, the trainer's own refusal and the app's
    card all say what playground.blueprints.fit.local_fit says."""
    from playground.blueprints.fit import local_fit
    from playground.train.__main__ import main as trainer_main
    from widgets.state import blueprint_notes

    monkeypatch.setenv("PLAYGROUND_GPU_COUNT", "0")  # a GPU machine refuses as one without GPUs does
    llama = get_blueprint("llama-3.2-1b-lora-alpaca")
    fit = local_fit(llama, 0)
    assert not fit.runnable and fit.note == "needs 1 GPU and this machine has none"
    # what the catalog offers instead: CPU blueprints of the same method first
    cpu_ids = [bp.id for bp in load_catalog().values() if not bp.needs_gpu and bp.method.objective == "sft"][:2]
    assert cpu_ids == ["smollm2-135m-lora-kubectl", "tiny-llama-cpu"]
    grpo_fit = local_fit(get_blueprint("llama-3.2-1b-grpo-kubectl"), 0)
    assert grpo_fit.advice().startswith(f"{grpo_fit.note}; try 'smollm2-135m-grpo-kubectl' or ")
    instead = " or ".join(repr(i) for i in cpu_ids)
    assert fit.advice() == f"{fit.note}; try {instead} (runs on CPU) or the kubernetes backend"

    code, _, err = run(capsys, "train", llama.id)
    assert_one_line_error(code, err)
    assert err.strip() == f"playground: error: blueprint {llama.id!r} {fit.advice()}"
    assert no_jobs(isolated_home)
    code, out, _ = run(capsys, "blueprints")
    assert next(r for r in out.splitlines() if r.startswith(llama.id)).endswith(fit.note)
    code, out, _ = run(capsys, "blueprints", "show", llama.id)
    assert f"[{fit.note}]" in out and out.rstrip().endswith(f"note: {fit.advice()}")
    assert fit.advice() in blueprint_notes(llama, "local", gpus=0)

    monkeypatch.chdir(tmp_path)
    assert trainer_main(["--blueprint", llama.id, "--output", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"playground.train: error: blueprint {llama.id!r} {fit.advice()}"
    assert not (tmp_path / "out").exists()


def test_gpu_count_setting_replaces_detection(capsys, isolated_home, monkeypatch):
    """PLAYGROUND_GPU_COUNT is the count every fit check takes for this machine's; a bad value is one line."""
    from playground.train.__main__ import gpu_count

    for value, count in (("0", 0), (" 2 ", 2)):
        monkeypatch.setenv("PLAYGROUND_GPU_COUNT", value)
        assert detect_gpus() == gpu_count() == count
    code, out, _ = run(capsys, "blueprints")
    assert code == 0 and next(r for r in out.splitlines() if r.startswith("llama-")).endswith("runs here (2 GPUs)")
    for bad in ("two", "-1", "1.5"):
        monkeypatch.setenv("PLAYGROUND_GPU_COUNT", bad)
        code, _, err = run(capsys, "blueprints")
        assert_one_line_error(code, err, f"PLAYGROUND_GPU_COUNT: {bad!r} is not a GPU count", "integer >= 0")


@pytest.mark.parametrize(
    ("need", "have", "stand_in", "runnable", "processes", "note"),
    [
        (0, 0, False, True, 1, "runs here (CPU)"),
        (1, 0, False, False, 1, "needs 1 GPU and this machine has none"),
        (2, 1, False, False, 2, "needs 2 GPUs and this machine has 1"),
        (2, 4, False, True, 2, "runs here (4 GPUs)"),
        (1, 0, True, True, 1, "runs here with the local stand-in model"),
        (4, 2, True, True, 2, "runs here with the local stand-in model"),
    ],
)
def test_local_fit_rule(need, have, stand_in, runnable, processes, note):
    from playground.blueprints.fit import LocalFit

    fit = LocalFit("bp", need, have, stand_in)
    assert (fit.runnable, fit.processes, fit.note) == (runnable, processes, note)


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
    """A bad file in PLAYGROUND_BLUEPRINTS is reported for that blueprint only; the rest keeps working."""
    extra = tmp_path / "blueprints"
    extra.mkdir()
    (extra / "broken.yaml").write_text(text)
    monkeypatch.setenv("PLAYGROUND_BLUEPRINTS", str(extra))
    for argv in (["train", "broken", "--dry-run"], ["blueprints", "show", "broken"]):
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, *needles)
    code, out, _ = run(capsys, "train", "tiny-llama-cpu", "--dry-run")
    assert code == 0 and "tiny-llama-cpu" in out
    code, out, err = run(capsys, "blueprints")
    assert code == 0 and any(row.startswith("tiny-llama-cpu ") for row in out.splitlines())
    (warning,) = err.strip().splitlines()
    assert warning.startswith("playground: warning: skipped ") and all(n in warning for n in needles), warning
    assert no_jobs(isolated_home)


def test_dry_run_prints_the_plan_and_starts_nothing(capsys, isolated_home):
    code, out, _ = run(capsys, "train", "tiny-llama-cpu", "--set", "max_steps=7", "--dry-run")
    assert code == 0
    assert '"max_steps":7' in out and "playground.train" in out and "backend: local" in out  # the run request
    assert no_jobs(isolated_home)


@pytest.mark.parametrize("text", ["\u0663", "\uff13", "1_0", "0x10", "1e2", "3.0"])
def test_numbers_are_ascii_digits_only_in_the_cli_the_form_and_notebooks(capsys, isolated_home, text):
    """`max_steps=٣` / `３` / `1_0`: refused with the same line by --set, the launch form and the
    notebooks' path (make_request), because all three call the one parser."""
    from playground.api import make_request
    from playground.errors import ParameterError
    from widgets.state import FormModel

    code, _, err = run(capsys, "train", "tiny-llama-cpu", "--set", f"max_steps={text}")
    assert_one_line_error(code, err, "parameter 'max_steps'", repr(text), "allowed: an integer from 1 to 5000")
    cli_message = err.strip().removeprefix("playground: error: ")
    form = FormModel(get_blueprint("tiny-llama-cpu")).validate({"max_steps": text})
    assert form.errors == {"max_steps": cli_message}
    with pytest.raises(ParameterError) as notebook:
        make_request("tiny-llama-cpu", {"max_steps": text})
    assert str(notebook.value) == cli_message
    assert no_jobs(isolated_home)
    assert get_blueprint("tiny-llama-cpu").resolve_params({"max_steps": " +7 "})["max_steps"] == 7


def test_error_lines_cap_what_they_echo(capsys, isolated_home):
    huge = "9" * 131_072
    code, _, err = run(capsys, "train", "tiny-llama-cpu", "--set", f"max_steps={huge}")
    assert_one_line_error(code, err, "parameter 'max_steps'", "(131,072 characters)", "an integer from 1 to 5000")
    assert len(err) < 300
    for argv in (["train", "x" * 200_000], ["logs", "y" * 200_000], ["train", "tiny-llama-cpu", "--set", "z" * 10**6]):
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err)
        assert len(err) < 1200, len(err)
    with pytest.raises(Exception) as api:  # the Python API: a 1 MB value, typed
        get_blueprint("tiny-llama-cpu").resolve_params({"learning_rate": "1" * 10**6})
    assert len(str(api.value)) < 300 and "(1,000,000 characters)" in str(api.value)
    with pytest.raises(Exception) as api:
        get_blueprint("tiny-llama-cpu").resolve_params({"max_steps": 10**5000})
    assert str(api.value).startswith("parameter 'max_steps': a 5001-digit integer is out of range")


def test_shown_caps_any_echo():
    from playground.errors import UserError, shown

    assert shown("abc") == "'abc'" and shown(42) == "42"
    assert shown("a" * 100, 10) == "'aaaaaaaaaa'… (100 characters)"
    assert shown("/p" * 200, 10, quoted=False) == "/p/p/p/p/p… (400 characters)"
    line = str(UserError("head " + "x" * 5000 + " tail\nsecond"))
    assert "\n" not in line and line.startswith("head ") and line.endswith(" tail second") and len(line) < 1100


@pytest.mark.slow
def test_train_a_blueprint_file_outside_the_catalog(capsys, home, tmp_path, monkeypatch):
    """`playground train FILE.yaml`: the backend trains that file, not a catalog id it was swapped for."""
    catalog_variant(tmp_path, "tiny-llama-cpu", {"id": "my-reverse"})
    monkeypatch.chdir(tmp_path)
    argv = ["train", "my-reverse.yaml", "--set", "max_steps=3", "--set", "num_eval_examples=10", "--follow"]
    code, out, err = run(capsys, *argv)
    assert code == 0, out + err
    job_id = out.splitlines()[0]
    assert job_id.startswith("my-reverse-") and f"job {job_id} Succeeded" in out
    spec = json.loads((home / "jobs" / job_id / "spec.json").read_text())
    assert spec["blueprint_id"] == "my-reverse" and spec["params"]["max_steps"] == 3
    code, _, err = run(capsys, "train", "no-such-file.yaml")
    assert_one_line_error(code, err, "no-such-file.yaml", "cannot read")


def test_a_reader_that_goes_away_is_not_a_traceback(tmp_path):
    """`playground blueprints --json | head -0`: the pipe is closed before anything is written."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: EPIPE, deterministically
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run(
        [sys.executable, "-m", "playground.cli", "blueprints", "--json"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=120,
    )
    os.close(write_end)
    assert proc.stderr == "" and proc.returncode == 141


def test_trainer_refuses_an_empty_output(capsys, tmp_path, monkeypatch):
    from playground.train.__main__ import main as trainer_main

    monkeypatch.chdir(tmp_path)
    assert trainer_main(["--blueprint", "tiny-llama-cpu", "--output", ""]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "playground.train: error: --output is empty; allowed: a directory path (created if missing)"
    assert list(tmp_path.iterdir()) == []


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
    """A GPU blueprint with a local stand-in runs on CPU; a broken stand-in crashes the real trainer (it passes
    the checks before launch: a Llama config and a tokenizer config, but no tokenizer or weights behind them)."""
    stand_in = tmp_path / "broken-model"
    stand_in.mkdir()
    (stand_in / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (stand_in / "tokenizer_config.json").write_text("{}")
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
