"""The real cause, once, in one line (issue 62): a torchvision that does not fit the installed torch reaches a
trainer as transformers' "Could not import module 'LlamaConfig'"; the job's Failed reason, the CLI, a booth
visitor's Log panel and ``playground doctor`` must name torchvision and the fix instead.

The stand-in ``torchvision`` below is a real package first on ``PYTHONPATH`` (with its dist-info, version 0.28.0,
no ``+cpu`` build tag) whose import raises what a CUDA torchvision raises beside a CPU torch; transformers'
own lazy import wraps it, in real trainer and doctor processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from playground.diagnostics import (
    Cause,
    cause_in_text,
    companion_mismatch,
    explain,
    explain_exception,
    explain_log,
    without_tracebacks,
)

NMS = "operator torchvision::nms does not exist"
TORCH = metadata.version("torch")


@pytest.fixture(scope="module")
def broken_torchvision(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory holding a torchvision whose import fails as a build for another torch does."""
    site = tmp_path_factory.mktemp("broken-torchvision")
    (site / "torchvision").mkdir()
    (site / "torchvision" / "__init__.py").write_text(f'__version__ = "0.28.0"\nraise RuntimeError("{NMS}")\n')
    info = site / "torchvision-0.28.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    return site


def _env(site: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | extra
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return env


def _assert_names_torchvision_and_the_fix(line: str) -> None:
    assert "torchvision 0.28.0" in line and f"torch {TORCH}" in line, line
    assert "pip uninstall torchvision" in line, line
    assert "LlamaConfig" not in line and "\n" not in line, line


# -- the engine on real exceptions and real logs ------------------------------------------------------------


def test_transformers_lazy_import_is_explained_by_its_innermost_cause(broken_torchvision: Path) -> None:
    script = textwrap.dedent(
        """
        import traceback
        from playground.diagnostics import explain_exception
        try:
            from transformers import LlamaConfig
        except Exception as exc:
            traceback.print_exc()
            print("OUTER", type(exc).__name__, str(exc).splitlines()[0])
            print("EXPLAINED", explain_exception(exc))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=_env(broken_torchvision), capture_output=True, text=True, timeout=300
    )
    outer = next(line for line in proc.stdout.splitlines() if line.startswith("OUTER"))
    assert "ModuleNotFoundError Could not import module 'LlamaConfig'" in outer  # what the user used to see
    explained = next(line for line in proc.stdout.splitlines() if line.startswith("EXPLAINED"))
    _assert_names_torchvision_and_the_fix(explained)
    assert "does not match" in explained  # 0.28.0 without +cpu: a CUDA build beside a CPU torch
    # the same from the printed traceback alone (what a log keeps)
    cause = cause_in_text(proc.stderr)
    assert cause == Cause("RuntimeError", NMS, "torchvision", "0.28.0")  # its version read beside its files
    _assert_names_torchvision_and_the_fix(explain_log(proc.stderr) or "")


def test_generic_causes_and_chains() -> None:
    def fail() -> None:
        try:
            {}["missing"]
        except KeyError as exc:
            raise RuntimeError("training failed") from exc

    with pytest.raises(RuntimeError) as caught:
        fail()
    assert explain_exception(caught.value) == "KeyError: 'missing'"
    try:
        import no_such_module_for_the_test  # noqa: F401
    except ModuleNotFoundError as exc:
        line = explain_exception(exc)
    assert line == (
        "ModuleNotFoundError: No module named 'no_such_module_for_the_test': install it "
        "(pip install no_such_module_for_the_test)"
    )
    assert explain(Cause("ModuleNotFoundError", "No module named 'flask'")).endswith(
        "(pip install mlflow (the full package, not mlflow-skinny))"
    )
    assert explain_log("all fine\nno traceback here\n") is None


@pytest.mark.parametrize(
    ("torch", "torchvision", "matches"),
    [
        ("2.13.0+cpu", "0.28.0+cpu", True),
        ("2.13.0", "0.28.1", True),
        ("2.13.0+cpu", "0.28.0", False),  # PyPI's CUDA build beside the CPU torch
        ("2.13.0+cpu", "0.27.0+cpu", False),  # another release line
        ("2.5.1+cu124", "0.20.1+cu124", True),
    ],
)
def test_companion_versions(torch: str, torchvision: str, matches: bool) -> None:
    line = companion_mismatch("torchvision", {"torch": torch, "torchvision": torchvision})
    assert (line is None) == matches, line
    if not matches:
        assert line.startswith(f"torchvision {torchvision} does not match torch {torch}: uninstall it")
        assert "0.28.*" in line or "0.20.*" in line or "0.27" not in line


def test_visitor_log_keeps_one_line_per_traceback_even_from_the_middle() -> None:
    log = [
        "data: 128 training examples",
        "Traceback (most recent call last):",
        '  File "/srv/venv/lib/python3.11/site-packages/transformers/image_utils.py", line 59, in <module>',
        "    from torchvision.transforms import InterpolationMode",
        '  File "/srv/site/torchvision/__init__.py", line 2, in <module>',
        "    raise RuntimeError(...)",
        "    ^^^^^^^^^^^^^^^^^^^^^^^",
        f"RuntimeError: {NMS}",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "/srv/venv/lib/python3.11/site-packages/transformers/utils/import_utils.py", line 2810',
        "    raise ModuleNotFoundError(import_error_message) from e",
        "ModuleNotFoundError: Could not import module 'LlamaConfig'. Are this object's requirements defined correctly?",
        "job Failed",
    ]
    shown = without_tracebacks(log)
    assert shown[0] == "data: 128 training examples" and shown[-1] == "job Failed"
    assert len(shown) == 3 and shown[1].startswith("error: torchvision"), shown
    assert not any("File " in line or "Traceback" in line or "/srv/" in line for line in shown)
    # a tail window that starts inside the frames: no code line or frame leaks either
    window = without_tracebacks(log[3:])
    assert not any(line.startswith((" ", "Traceback")) or "/srv/" in line for line in window), window
    # the cause said once: a later line that says it already (the trainer's error line) keeps it
    said = without_tracebacks([*log, f"playground.train: error: {shown[1].removeprefix('error: ')}"])
    assert sum("torchvision" in line for line in said) == 1, said


# -- a real trainer, through the CLI and the local backend, and the booth's Log panel -----------------------


@pytest.fixture(scope="module")
def failed_launch(broken_torchvision: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    home = tmp_path_factory.mktemp("broken-home")
    env = _env(
        broken_torchvision,
        PLAYGROUND_HOME=str(home),
        MLFLOW_TRACKING_URI=f"sqlite:///{home}/mlflow.db",
        HF_HUB_OFFLINE="1",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "playground.cli", "train", "tiny-llama-cpu", "--set", "max_steps=2", "--follow"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return {"home": home, "proc": proc}


def test_a_failed_launch_names_the_cause_and_the_fix(failed_launch: dict) -> None:
    from playground.backends import get_backend
    from playground.events import JobPhase

    proc = failed_launch["proc"]
    assert proc.returncode != 0, proc.stdout + proc.stderr
    final = [line for line in (proc.stdout + proc.stderr).splitlines() if " Failed" in line]
    assert final, proc.stdout + proc.stderr
    _assert_names_torchvision_and_the_fix(final[-1])  # the CLI's last word on the job
    backend = get_backend("local", home=failed_launch["home"])
    (job,) = backend.list()
    assert job.phase == JobPhase.FAILED
    _assert_names_torchvision_and_the_fix(job.message)  # the Failed reason the supervisor records
    train_log = failed_launch["home"] / "jobs" / job.id / "train.log"
    logs = train_log.read_text() if train_log.exists() else "\n".join(job.log_tail)
    assert "Traceback (most recent call last):" in logs  # the operator's log keeps the frames


def test_a_booth_visitor_sees_the_cause_not_the_frames(failed_launch: dict) -> None:
    from playground.backends import get_backend
    from widgets.monitor import JobMonitor

    backend = get_backend("local", home=failed_launch["home"])
    (job,) = backend.list()
    assert any(line.startswith('  File "') for line in job.log_tail)  # the tail holds frames to hide
    monitor = JobMonitor(backend, job, operator=False)
    assert monitor.wait(60)
    shown = monitor.logs.value
    assert "Traceback" not in shown and "File &quot;" not in shown and 'File "' not in shown, shown
    assert "site-packages" not in shown and str(failed_launch["home"]) not in shown
    assert "torchvision 0.28.0 does not match" in shown or "torchvision 0.28.0 fails" in shown
    text = monitor.progress_text.value
    assert "waiting for the first progress point" not in text
    assert "torchvision 0.28.0" in text and "pip uninstall torchvision" in text, text


# -- playground doctor ----------------------------------------------------------------------------------------


def test_doctor_exit_codes_and_the_apps_background_check(broken_torchvision: Path) -> None:
    """`playground doctor --fast` with and without the stand-in; and what `playground app` starts before Voila
    takes over: a detached check whose problems reach the app's stderr when known."""
    command = [sys.executable, "-m", "playground.cli", "doctor", "--fast"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    broken = subprocess.Popen(command, env=_env(broken_torchvision), **pipes)
    background = subprocess.Popen(
        [sys.executable, "-c", "from playground.commands.doctor import check_in_background; check_in_background()"],
        env=_env(broken_torchvision),
        **pipes,
    )
    healthy = subprocess.run(command, env=_env(None), capture_output=True, text=True, timeout=300)
    out, err = broken.communicate(timeout=300)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    (line,) = healthy.stdout.splitlines()
    assert line.startswith(f"ok: torch {TORCH}, transformers ")
    assert broken.returncode == 1, out + err
    problems = out.splitlines()
    assert len(problems) == 1, problems  # one line per problem: the import failures share its cause
    assert problems[0].startswith("problem: torchvision 0.28.0 does not match torch")
    _assert_names_torchvision_and_the_fix(problems[0])
    said_out, said = background.communicate(timeout=300)  # ends when the detached check closed the pipe
    assert background.returncode == 0 and said_out == ""  # the caller (the app) went on at once
    (said_line,) = said.splitlines()
    assert said_line.startswith("doctor: problem: torchvision 0.28.0 does not match torch")


def test_the_start_check_remembers_a_healthy_environment_and_never_a_broken_one(
    broken_torchvision: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `playground app` and `playground e2e` run at start: the imports once per healthy environment (then
    remembered, no child started), again where PYTHONPATH changes it, and every time where they fail."""
    from playground.commands import doctor

    monkeypatch.setenv("PLAYGROUND_VLLM_CACHE", str(tmp_path / "cache"))  # the store lives beside vLLM's env
    monkeypatch.delenv("PYTHONPATH", raising=False)
    first = doctor.fast_problems(full=True, remember=True)
    assert first.ok and not first.remembered and first.import_seconds > 0, first.problems
    again = doctor.fast_problems(full=True, remember=True)
    assert again.ok and again.remembered and again.import_seconds == 0 and again.imported == first.imported
    assert doctor.fast_problems(full=True).import_seconds > 0  # `playground doctor` always imports
    monkeypatch.setenv("PYTHONPATH", str(broken_torchvision))  # another environment: checked, failing
    broken = doctor.fast_problems(full=True, remember=True)
    assert not broken.remembered and any("torchvision 0.28.0" in line for line in broken.problems), broken.problems
    key = doctor.healthy_key(doctor.fast_modules(full=True))
    assert key is not None and key not in doctor.healthy_store().read_text().split()  # so checked again next time
    assert len(doctor.healthy_store().read_text().split()) == 1


def test_doctor_reports_requirements_that_do_not_hold(tmp_path: Path) -> None:
    """A peft whose metadata (first on the path, as an upstream notebook's `pip install --target` leaves it)
    requires a transformers that is not installed: one line naming both and the fix; nothing imported."""
    info = tmp_path / "peft-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: peft\nVersion: 0.0.1\nRequires-Dist: transformers>=99\n"
        'Requires-Dist: torch<1; extra == "old"\n'  # an extra's requirement does not count
    )
    script = "from playground.commands.doctor import version_problems; print(*version_problems(), sep='\\n')"
    proc = subprocess.run(
        [sys.executable, "-c", script], env=_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    transformers = metadata.version("transformers")
    assert proc.stdout.splitlines() == [
        f"peft 0.0.1 needs transformers>=99 but transformers {transformers} is installed: "
        f"pip install 'transformers>=99' (or a peft made for transformers {transformers})"
    ]


def test_e2e_diagnostics_name_the_cause_of_a_notebooks_failure() -> None:
    """A failing cell's traceback as nbclient records it (IPython's layout, ANSI colours): the e2e report's
    cause is the innermost error with the fix, not transformers' wrapper."""
    from playground.e2e.diagnostics import root_cause

    traceback = [
        "\x1b[0;31m---------------------------------------------------------------------------\x1b[0m",
        "\x1b[0;31mRuntimeError\x1b[0m                              Traceback (most recent call last)",
        "File \x1b[0;32m/srv/venv/lib/python3.11/site-packages/torchvision/__init__.py:10\x1b[0m",
        f"\x1b[0;31mRuntimeError\x1b[0m: {NMS}",
        "\nThe above exception was the direct cause of the following exception:\n",
        "\x1b[0;31mModuleNotFoundError\x1b[0m: Could not import module 'LlamaConfig'. Are this object's requirements",
    ]
    cause = root_cause(traceback) or ""
    assert cause.startswith("torchvision") and "pip uninstall torchvision" in cause and "LlamaConfig" not in cause
    assert root_cause(["OSError: 503 Service Unavailable", "RuntimeError: training failed"]) == (
        "OSError: 503 Service Unavailable"
    )
    assert root_cause(["RuntimeError: training failed"]) is None  # nothing deeper than the error itself


def test_a_trainer_dead_before_it_could_report_is_explained_from_its_log(
    broken_torchvision: Path, tmp_path: Path
) -> None:
    """A trainer that dies while importing (before it can report Failed itself) leaves only a traceback in
    train.log: the supervisor's Failed reason is that traceback's innermost cause, not its last line."""
    from playground.backends.local import state
    from playground.backends.local.supervisor import Supervisor

    for name in (state.SPEC, state.STATUS):
        (tmp_path / name).write_text("{}")
    with open(tmp_path / state.LOG, "wb") as log:  # a real interpreter's traceback, as a dying trainer writes it
        code = "from transformers import LlamaConfig"
        proc = subprocess.run(
            [sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, env=_env(broken_torchvision)
        )
    assert proc.returncode != 0
    log_text = (tmp_path / state.LOG).read_text()
    assert "LlamaConfig" in log_text.strip().splitlines()[-1]  # the last line names the wrapper, not the cause
    _assert_names_torchvision_and_the_fix(Supervisor(tmp_path)._cause_in_log() or "")
    (tmp_path / state.LOG).write_text("no traceback here\n")
    assert Supervisor(tmp_path)._cause_in_log() is None
