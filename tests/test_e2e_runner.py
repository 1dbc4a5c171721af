"""``playground e2e``: the papermill runner over the real per-blueprint notebooks (smoke profile), plus
notebooks written here that hang, fail with a real failed job, and print a canary secret. The CLI runs
as a real subprocess, twice in total (module fixture); the tests read what it left behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import psutil
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_notebook

from playground.api import DEFAULT_BLUEPRINT
from playground.blueprints import load_catalog
from playground.e2e.runner import default_notebooks
from playground.e2e.scrub import Scrubber, looks_like_secret_name

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
CATALOG = load_catalog()
EXPECTED_NOTEBOOKS = set(CATALOG)  # one notebook per blueprint, whatever the catalog holds
HUB_NOTEBOOKS = {bp.id for bp in CATALOG.values() if bp.model.source.startswith("hf://")}
SMOKE_RUN = len(EXPECTED_NOTEBOOKS) + 1  # the real notebooks plus the canary
# The smoke profile trains the default blueprint (SmolLM2) with its full defaults: minutes on 2 cores, which
# this test of the runner does not need. Its notebook runs headless in test_notebooks.py, its bar is
# checked in test_smollm2_blueprint.py and by benchmarks/smollm2_kubectl.py.
# The DPO and GRPO blueprints likewise (4 and 9 minutes with their defaults; their notebooks run in
# test_notebooks.py with reduced steps, their bars in benchmarks/methods.py); their GPU variants share the recipe.
METHOD_BLUEPRINTS = {bp.id for bp in CATALOG.values() if bp.method.objective != "sft"}
# The Llama blueprint's stand-in (the real SmolLM2 weights) runs headless in test_notebooks.py too: the runner's
# handling of hub notebooks (stand-ins, 3 steps, bar not asserted) is checked on the Qwen one alone.
# tiny-llama-cpu with its full defaults (300 steps, bar asserted) runs headless in test_notebooks.py as well; here the
# runner's parameters for it are checked (test_smoke_profile_parameters), so this run trains only the Qwen stand-in.
RUN_ELSEWHERE = {DEFAULT_BLUEPRINT, "llama-3.2-1b-lora-alpaca", "tiny-llama-cpu"}
RUN_NOTEBOOKS = EXPECTED_NOTEBOOKS - RUN_ELSEWHERE - METHOD_BLUEPRINTS
RUN_NAME = "qwen2.5-1.5b-lora-alpaca"
CANARY = "e2e-canary-7d1f0c9a4b2e"
QUOTED_CANARY = 'quoted"canary\\e2e-55aa'  # JSON and repr() escape it: those forms must go too
HF_CANARY = "hf_" + "Zq8" * 12  # shaped like a Hugging Face token
HANG_TIMEOUT = 90  # the broken run's --timeout, for both its notebooks: the failing one starts papermill, a kernel
# and a trainer that fails (~15 s idle); beside a CPU hog, the smoke run and the other lane that took more than 30 s
# (its job ended Failed, then papermill was killed at 30 s: a timeout). The smoke run beside it takes longer anyway.

# ~1 min on 2 idle cores; the limit leaves room for a loaded machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def _write_notebook(path: Path, body: str) -> Path:
    params = new_code_cell(
        'backend = "local"\nheadless = False\nassert_quality = True\nout_dir = "."',
        metadata={"tags": ["parameters"]},
    )
    nb = new_notebook(
        cells=[params, new_code_cell(body)],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, path)
    return path


CANARY_BODY = """
import json, os, pathlib
secrets = [os.environ["E2E_CANARY_TOKEN"], os.environ["E2E_QUOTED_SECRET"], os.environ["HF_TOKEN"]]
for s in secrets:
    print("leaking", s)
print({"repr": secrets})
pathlib.Path(out_dir, "leak.txt").write_text("\\n".join(secrets))
pathlib.Path(out_dir, "result.json").write_text(json.dumps({"passed": True, "secrets": secrets}))
"""

HANG_BODY = """
import os, pathlib, time
pathlib.Path(out_dir, "kernel.pid").write_text(str(os.getpid()))
print("about to hang", flush=True)
time.sleep(3600)
"""

# A real job that fails in its trainer: tiny-llama-cpu pointed at a model directory that passes the checks made
# before launch (a causal LM's config.json, a tokenizer file) but holds no loadable tokenizer or weights.
FAILJOB_BODY = """
import json, pathlib, tempfile
from playground.headless import run_blueprint
broken = pathlib.Path(tempfile.mkdtemp(prefix="no-weights-"))
config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 100}
(broken / "config.json").write_text(json.dumps(config))
(broken / "tokenizer.json").write_text("{}")
result = run_blueprint("tiny-llama-cpu", {"max_steps": 5}, backend=backend, model_source=str(broken), out_dir=out_dir)
"""


def _cli(args: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "playground.cli", "e2e", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory, artifacts_dir: Path, request: pytest.FixtureRequest) -> dict:
    """Run the CLI once over the real notebooks (+ canary), and once over a hanging and a failing one."""
    with contextlib.suppress(pytest.skip.Exception):  # the Llama stand-in is SmolLM2: converted once, first
        request.getfixturevalue("smollm2_dir")
    root = tmp_path_factory.mktemp("e2e")
    toys = root / "toys"
    toys.mkdir()
    canary_nb = _write_notebook(toys / "canary-secret.ipynb", CANARY_BODY)
    hang_nb = _write_notebook(toys / "hanging.ipynb", HANG_BODY)
    fail_nb = _write_notebook(toys / "failing-job.ipynb", FAILJOB_BODY)
    step_summary = root / "step-summary.md"
    step_summary.write_text("# earlier step\n")
    env = {
        **os.environ,
        "E2E_CANARY_TOKEN": CANARY,
        "E2E_QUOTED_SECRET": QUOTED_CANARY,
        "HF_TOKEN": HF_CANARY,
        "GITHUB_STEP_SUMMARY": str(step_summary),
        "HF_HUB_OFFLINE": "1",
    }
    real = [nb for nb in default_notebooks() if nb.stem in RUN_NOTEBOOKS]
    out_a, out_b = root / "smoke", root / "broken"
    # the broken run mostly sleeps: run it beside the smoke run, its two notebooks at once (--jobs 2)
    broken = _cli(
        ["--out", str(out_b), "--jobs", "2", "--timeout", str(HANG_TIMEOUT), str(hang_nb), str(fail_nb)],
        {k: v for k, v in env.items() if k != "GITHUB_STEP_SUMMARY"},
    )
    smoke = _cli(["--profile", "smoke", "--out", str(out_a), *map(str, real), str(canary_nb)], env)
    try:
        a_out, a_err = smoke.communicate(timeout=2100)
        b_out, b_err = broken.communicate(timeout=300)
    finally:
        for proc in (smoke, broken):  # SIGTERM: the runner stops its kernels and jobs before it exits
            if proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=60)
    for out in (out_a, out_b):
        shutil.copytree(out, artifacts_dir / "e2e" / out.name, dirs_exist_ok=True)
    return {
        "real": real,
        "smoke": {"rc": smoke.returncode, "out": out_a, "stdout": a_out, "stderr": a_err},
        "broken": {"rc": broken.returncode, "out": out_b, "stdout": b_out, "stderr": b_err},
        "step_summary": step_summary,
        "root": root,
    }


def _metrics(run: dict) -> dict:
    return json.loads((run["out"] / "metrics.json").read_text())


def _by_name(run: dict) -> dict[str, dict]:
    return {nb["name"]: nb for nb in _metrics(run)["notebooks"]}


def test_default_notebooks_are_the_per_blueprint_ones() -> None:
    names = {p.stem for p in default_notebooks()}
    assert names == EXPECTED_NOTEBOOKS, "playground.ipynb is excluded; one notebook per blueprint"


def test_smoke_profile_passes_every_real_notebook(e2e: dict) -> None:
    run = e2e["smoke"]
    assert run["rc"] == 0, run["stderr"][-4000:]
    for nb in e2e["real"]:
        folder = run["out"] / nb.stem
        result = json.loads((folder / "result.json").read_text())
        assert result["passed"] is True and result["phase"] == "Succeeded", result.get("error")
        assert result["blueprint"] == nb.stem and result["backend"] == "local"
        assert result["chat"], "the headless path chats with the served models"
        executed = nbformat.read(folder / nb.name, as_version=4)
        params = executed.metadata.papermill.parameters
        assert params["headless"] is True and params["out_dir"] == str(folder.resolve())
        assert (folder / "papermill.log").stat().st_size > 0
        assert not (folder / "diagnostics.md").exists()
        assert nb.stem in HUB_NOTEBOOKS  # a stand-in for 3 steps (the local ones: test_smoke_profile_parameters)
        assert params["model_source"] == "standin" and params["dataset_source"] == "standin"
        assert params["max_steps"] == 3 and params["assert_quality"] is False
        assert result["params"]["max_steps"] == 3 and result["quality"]["asserted"] is False
        # what test_notebooks.py checks of the hub notebooks it executes (this one runs only here)
        blueprint = CATALOG[nb.stem]
        assert result["sources"] == {"model": "standin", "dataset": "standin"}
        assert result["quality"]["metric"] == blueprint.quality.metric
        assert result["quality"]["threshold"] == blueprint.quality.threshold
        assert isinstance(result["metrics"].get("eval_loss"), float)
        assert {e["kind"] for e in result["endpoints"]} == {"fine-tuned", "base"}
        assert [row["prompt"] for row in result["chat"]] == [ex.prompt for ex in blueprint.examples]
        assert all(isinstance(row["fine-tuned"], str) and isinstance(row["base"], str) for row in result["chat"])


def test_live_log_output(e2e: dict) -> None:
    err = e2e["smoke"]["stderr"]
    assert f"[{RUN_NAME}] Executing Cell" in err  # papermill --log-output, streamed with a prefix
    assert f"[{RUN_NAME}] step " in err  # the notebook's own progress lines, live


def test_junit_xml(e2e: dict) -> None:
    smoke = ET.parse(e2e["smoke"]["out"] / "junit.xml").getroot()
    suite = smoke.find("testsuite")
    assert suite is not None and suite.get("name") == "playground-e2e.smoke"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == RUN_NOTEBOOKS | {"canary-secret"}
    assert suite.get("tests") == str(len(RUN_NOTEBOOKS) + 1) and suite.get("failures") == "0"
    assert all(c.find("failure") is None and float(c.get("time")) > 0 for c in cases.values())

    broken = ET.parse(e2e["broken"]["out"] / "junit.xml").getroot().find("testsuite")
    assert broken.get("tests") == "2" and broken.get("failures") == "2"
    failures = {c.get("name"): c.find("failure") for c in broken.findall("testcase")}
    assert failures["hanging"].get("type") == "timeout"
    assert f"after {HANG_TIMEOUT}s" in failures["hanging"].get("message")
    assert failures["failing-job"].get("type") == "failed"
    assert "ended Failed" in failures["failing-job"].get("message")
    assert "diagnostics:" in failures["failing-job"].text


def test_metrics_json(e2e: dict) -> None:
    metrics = _metrics(e2e["smoke"])
    assert metrics["schema"] == "playground-e2e-metrics/v1" and metrics["profile"] == "smoke"
    assert metrics["wall_seconds"] > 0
    assert metrics["totals"]["passed"] == len(RUN_NOTEBOOKS) + 1 and metrics["totals"]["failed"] == 0
    assert metrics["gpu"]["present"] is False  # no GPU here: NVML figures are absent, not zero
    assert metrics["resources"]["cpu_avg_percent"] is not None
    by_name = _by_name(e2e["smoke"])
    for name in RUN_NOTEBOOKS:
        nb = by_name[name]
        assert nb["status"] == "passed" and nb["wall_seconds"] > 0
        assert nb["train_seconds"] is not None and 0 < nb["train_seconds"] < nb["wall_seconds"]
        assert nb["queue_wait_seconds"] is not None and nb["queue_wait_seconds"] >= 0
        assert nb["job_id"] and nb["job_id"] == nb["result"]["job_id"]
        assert nb["cpu_avg_percent"] is not None and nb["samples"] >= 1
        assert nb["gpu_util_avg_percent"] is None and nb["gpu_memory_peak_bytes"] is None
    assert metrics["totals"]["train_seconds"] >= by_name[RUN_NAME]["train_seconds"]


def test_summary_markdown_and_step_summary(e2e: dict) -> None:
    summary = (e2e["smoke"]["out"] / "summary.md").read_text()
    total = len(RUN_NOTEBOOKS) + 1
    assert summary.startswith(f"## Blueprint e2e (smoke): {total}/{total} notebooks passed")
    for name in RUN_NOTEBOOKS:
        assert f"| `{name}` | `{name}` | ✅ passed |" in summary
    step = e2e["step_summary"].read_text()
    assert step.startswith("# earlier step\n") and summary in step  # appended, not overwritten

    broken = (e2e["broken"]["out"] / "summary.md").read_text()
    assert "0/2 notebooks passed — FAILED" in broken and "### Failures" in broken


def test_hanging_notebook_is_killed_and_reported(e2e: dict) -> None:
    run = e2e["broken"]
    assert run["rc"] == 1
    nb = _by_name(run)["hanging"]
    assert nb["status"] == "timeout" and "kernel killed" in nb["message"]
    assert HANG_TIMEOUT <= nb["wall_seconds"] < HANG_TIMEOUT + 30
    pid = int((run["out"] / "hanging" / "kernel.pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    executed = (run["out"] / "hanging" / "hanging.ipynb").read_text()
    assert "about to hang" in executed  # saved as cells ran, so the partial notebook is an artifact
    assert (run["out"] / "hanging" / "diagnostics.md").exists()
    # the run went on after the timeout
    assert _by_name(run)["failing-job"]["status"] == "failed"


def test_failing_notebook_diagnostics(e2e: dict) -> None:
    folder = e2e["broken"]["out"] / "failing-job"
    diag = json.loads((folder / "diagnostics.json").read_text())
    assert diag["status"] == "failed" and diag["backend"] == "local"
    assert diag["job"]["phase"] == "Failed" and diag["job"]["id"]
    assert any(p["phase"] == "Failed" for p in diag["phases"])
    assert diag["failing_step"] == "trainer"
    assert any("KeyError: 'added_tokens'" in line for line in diag["failing_step_logs"])  # the trainer's own error
    assert diag["failing_cell"]["ename"] == "RuntimeError"
    md = (folder / "diagnostics.md").read_text()
    assert "phase **Failed**" in md and "## Logs: trainer" in md
    result = json.loads((folder / "result.json").read_text())
    assert result["passed"] is False and result["job_id"] == diag["job"]["id"]


def _forms(secret: str) -> list[bytes]:
    forms = {secret, json.dumps(secret)[1:-1], repr(secret)[1:-1], json.dumps(repr(secret)[1:-1])[1:-1]}
    return [f.encode() for f in forms]


def test_canary_secret_absent_from_every_artifact(e2e: dict) -> None:
    leak = e2e["smoke"]["out"] / "canary-secret"
    assert _by_name(e2e["smoke"])["canary-secret"]["status"] == "passed"
    assert "leaking ***" in (leak / "papermill.log").read_text()  # it was printed, then scrubbed
    files = [p for p in e2e["root"].rglob("*") if p.is_file() and "toys" not in p.parts]
    assert len(files) > 20
    blobs = [(p, p.read_bytes()) for p in files]
    blobs += [(Path(f"<{k} {s}>"), e2e[k][s].encode()) for k in ("smoke", "broken") for s in ("stdout", "stderr")]
    for secret in (CANARY, QUOTED_CANARY, HF_CANARY):
        for form in _forms(secret):
            leaked = [str(p) for p, data in blobs if form in data]
            assert not leaked, f"secret form {form!r} found in {leaked}"


def test_scrubber_forms_and_secret_names() -> None:
    scrub = Scrubber([QUOTED_CANARY])
    assert scrub.text(json.dumps({"v": QUOTED_CANARY})) == '{"v": "***"}'
    assert scrub.text(repr(QUOTED_CANARY)) == "'***'"
    assert Scrubber([]).text("token hf_abcdefghijklmnopqrstuvwxyz0123 end") == "token *** end"
    assert looks_like_secret_name("HF_TOKEN") and looks_like_secret_name("openai_api_key")
    assert looks_like_secret_name("AWS_SECRET_ACCESS_KEY") and looks_like_secret_name("db-password")
    assert not looks_like_secret_name("TOKENIZERS_PARALLELISM") and not looks_like_secret_name("max_steps")


def test_secret_looking_parameter_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "playground.cli", "e2e", "--out", str(out), "-p", "hf_token=abc123456"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'hf_token' looks like a secret" in lines[0] and "environment" in lines[0]
    assert not out.exists(), "nothing started"


def test_gpu_profile_needs_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAYGROUND_GPU_COUNT", "0")  # a GPU machine refuses as one without GPUs does
    proc = _run_cli(["--profile", "gpu", "--out", str(tmp_path / "o")])
    assert_one_line_exit_2(proc, "needs an NVIDIA GPU", "--profile smoke")
    assert not (tmp_path / "o").exists()


def _run_cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "playground.cli", "e2e", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def assert_one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("playground: error: "), proc.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def test_a_file_that_is_not_a_notebook_is_named_not_echoed(tmp_path: Path) -> None:
    line = assert_one_line_exit_2(_run_cli(["/etc/passwd", "--out", str(tmp_path / "o")]), "/etc/passwd", ".ipynb")
    assert "root:" not in line
    fake = tmp_path / "fake.ipynb"
    fake.write_text("private-content-3f9a, not JSON at all\n" * 100)
    line = assert_one_line_exit_2(_run_cli([str(fake), "--out", str(tmp_path / "o")]), str(fake), "not a readable")
    assert "private-content" not in line
    assert not (tmp_path / "o").exists()


def test_out_must_be_a_writable_folder(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    notebook = str(default_notebooks()[0])
    for out, needle in ((a_file, "is not a directory"), ("/dev/null", "is not a directory")):
        assert_one_line_exit_2(_run_cli([notebook, "--out", str(out)]), f"--out '{out}'", needle, "--out")
    assert_one_line_exit_2(_run_cli([notebook, "--out", str(a_file / "sub")]), "not writable")
    assert_one_line_exit_2(_run_cli([notebook, "--out", ""]), "--out is empty")


def test_param_numbers_follow_the_blueprint_parser() -> None:
    from playground.e2e.commands import parse_value

    assert parse_value("3") == 3 and parse_value("1e-3") == "1e-3" and parse_value("2.5") == 2.5
    assert parse_value("1_0") == "1_0" and parse_value("0x10") == "0x10"  # YAML's ints: text, refused later
    assert parse_value("true") is True and parse_value("[1, 2]") == [1, 2] and parse_value("") == ""


def test_verdict_comes_from_papermills_outcome(tmp_path: Path) -> None:
    """A real papermill run whose cell outlives --timeout-cell: the child records nbclient's
    CellTimeoutError and the verdict is a cell timeout (no log reading involved)."""
    from playground.e2e.execute import outcome_of
    from playground.e2e.profiles import get_profile
    from playground.e2e.runner import verdict
    from playground.e2e.types import NotebookRun, PapermillOutcome, RunOptions

    notebook = _write_notebook(tmp_path / "slow-cell.ipynb", "import time\ntime.sleep(120)")
    request = {
        "input": str(notebook),
        "output": str(tmp_path / "executed.ipynb"),
        "parameters": {"out_dir": str(tmp_path)},
        "kernel": "python3",
        "cwd": str(tmp_path),
        "cell_timeout": 3,
        "outcome": str(tmp_path / "outcome.json"),
    }
    (tmp_path / "request.json").write_text(json.dumps(request))
    proc = subprocess.run(
        [sys.executable, "-m", "playground.e2e.execute", str(tmp_path / "request.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    outcome = PapermillOutcome.from_dict(json.loads((tmp_path / "outcome.json").read_text()))
    assert outcome.exception == "CellTimeoutError" and outcome.cell_timed_out

    options = RunOptions(profile=get_profile("smoke"), out=tmp_path, cell_timeout=3)
    run = NotebookRun(name="n", notebook=notebook, out_dir=tmp_path, blueprint_id=None, parameters={})
    assert verdict(run, outcome, timed_out=False, options=options)[0] == "timeout"
    assert verdict(run, outcome, timed_out=True, options=options)[1].startswith("whole-run timeout")
    failed = outcome_of(type("PapermillExecutionError", (Exception,), {"ename": "RuntimeError", "evalue": "job x"})())
    assert verdict(run, failed, timed_out=False, options=options) == ("failed", "RuntimeError: job x")
    assert verdict(run, None, timed_out=False, options=options)[1].startswith("papermill exited with code")
    run.result = {"passed": False, "error": "quality bar not met"}
    assert verdict(run, PapermillOutcome(), timed_out=False, options=options) == (
        "failed",
        "result.json reports failure: quality bar not met",
    )
    run.result = {"passed": True}
    assert verdict(run, PapermillOutcome(), timed_out=False, options=options) == ("passed", "")


def test_smoke_profile_parameters() -> None:
    """smoke: the blueprints built locally run their full defaults with the bar asserted (tiny-llama-cpu's notebook
    meets it in test_notebooks.py); hub notebooks get stand-ins for 3 steps, bar not asserted."""
    from playground.e2e.profiles import get_profile
    from playground.e2e.runner import RunOptions, plan_parameters

    options = RunOptions(profile=get_profile("smoke"), out=Path("unused"))
    for nb in default_notebooks():
        _, params, dropped, _ = plan_parameters(nb, options)
        # DPO/GRPO notebooks have no max_seq_length parameter (their prompts and answers are short and fixed)
        assert dropped == (["max_seq_length"] if nb.stem in HUB_NOTEBOOKS & METHOD_BLUEPRINTS else []), nb.name
        if nb.stem in HUB_NOTEBOOKS:
            assert params["model_source"] == params["dataset_source"] == "standin"
            assert params["max_steps"] == 3 and params["assert_quality"] is False
        else:
            assert "max_steps" not in params and "model_source" not in params
            assert params["assert_quality"] is True and params["headless"] is True


def test_gpu_config_profile_parameters() -> None:
    """gpu-config: hub notebooks get the full-size from-config model, the task stand-in, bounded steps and
    the random-init bar, all declared by the notebooks (none dropped); tiny-llama-cpu runs its defaults."""
    from playground.e2e.profiles import CONFIG_QUALITY_THRESHOLD, get_profile
    from playground.e2e.runner import RunOptions, plan_parameters

    options = RunOptions(profile=get_profile("gpu-config"), out=Path("unused"))
    for nb in default_notebooks():
        _, params, dropped, own = plan_parameters(nb, options)
        assert own, "notebooks/ holds the project's own notebooks"
        assert dropped == [], f"{nb.name} does not declare {dropped}"
        if nb.stem in HUB_NOTEBOOKS and nb.stem in METHOD_BLUEPRINTS:  # DPO/GRPO: their own data
            assert params["model_source"] == "config" and params["dataset_source"] is None
            if "dpo" in nb.stem:  # a bar on held-out preference accuracy, measured on random init
                assert params["quality_metric"] == "eval_preference_accuracy" and params["assert_quality"] is True
                assert 0.5 < params["quality_threshold"] < 1
            else:  # GRPO: no bar a random-init model meets
                assert params["quality_threshold"] is None and params["assert_quality"] is False
                assert "quality_metric" not in params
        elif nb.stem in HUB_NOTEBOOKS:
            assert params["model_source"] == "config" and params["dataset_source"] == "standin"
            assert params["quality_threshold"] == CONFIG_QUALITY_THRESHOLD and params["assert_quality"] is True
            assert 1 <= params["max_steps"] <= 200
        else:
            assert "model_source" not in params and "quality_threshold" not in params
            assert params["assert_quality"] is True


class _FakeNvml:
    """The two pynvml memory calls: v1 ``used`` includes the driver's reserved memory, v2's does not
    (as read on an idle H100: v1 480 MiB, v2 0 MiB, reserved 480 MiB, nvidia-smi 0 MiB)."""

    nvmlMemory_v2 = 0x2000028

    def __init__(self, has_v2: bool) -> None:
        self.has_v2 = has_v2

    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None):
        from types import SimpleNamespace

        if version is None:
            return SimpleNamespace(used=480 * 2**20 + 1000)
        if not self.has_v2:
            raise RuntimeError("NVMLError_FunctionNotFound")
        assert version == self.nvmlMemory_v2
        return SimpleNamespace(used=1000, reserved=480 * 2**20)


def test_gpu_memory_used_leaves_out_reserved_memory_like_nvidia_smi() -> None:
    from playground.e2e.metrics import memory_used

    assert memory_used(_FakeNvml(has_v2=True), handle=None) == 1000
    assert memory_used(_FakeNvml(has_v2=False), handle=None) == 480 * 2**20 + 1000  # old drivers: v1


# ------------------------------------------------------------------------------------- workflows


def _workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


@pytest.mark.parametrize("tool", ["zizmor", "check-jsonschema"])
def test_workflows_lint_clean(tool: str) -> None:
    exe = shutil.which(tool)
    assert exe, f"{tool} is in the test extra"
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yaml"))
    assert {Path(f).name for f in files} >= {"ci.yaml", "gpu-e2e.yaml"}
    if tool == "zizmor":
        cmd = [exe, "--offline", "--no-progress", *files]
    else:
        cmd = [exe, "--builtin-schema", "vendor.github-workflows", *files]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if tool == "zizmor":
        assert "No findings to report" in proc.stdout


def test_gpu_workflow_is_label_gated_and_fork_safe() -> None:
    wf = _workflow("gpu-e2e.yaml")
    assert wf["on"] == {"pull_request": {"types": ["labeled", "synchronize"]}}
    assert "pull_request_target" not in wf["on"]
    assert wf["permissions"] == {}
    gpu = wf["jobs"]["gpu-e2e"]
    assert "github.event.action == 'labeled'" in gpu["if"] and "ok-to-test-gpu-runner" in gpu["if"]
    assert gpu["permissions"] == {"contents": "read"}
    assert gpu["runs-on"] == "arc-gpu-runners" and gpu["timeout-minutes"] > 0
    assert gpu["concurrency"]["cancel-in-progress"] is False
    checkout = next(s for s in gpu["steps"] if str(s.get("uses", "")).startswith("actions/checkout@"))
    assert checkout["with"] == {"ref": "${{ github.event.pull_request.head.sha }}", "persist-credentials": False}
    run_step = next(s for s in gpu["steps"] if "playground e2e" in s.get("run", ""))
    assert "--profile gpu" in run_step["run"] and "${{" not in run_step["run"]
    assert run_step["env"]["HF_TOKEN"] == "${{ secrets.HF_TOKEN }}"
    upload = next(s for s in gpu["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()"
    unlabel = wf["jobs"]["remove-approval"]
    assert "synchronize" in unlabel["if"] and unlabel["permissions"] == {"pull-requests": "write"}
    assert all("uses" not in s for s in unlabel["steps"]), "runs no PR code: no checkout"
    for job in (_workflow("gpu-e2e.yaml")["jobs"] | _workflow("ci.yaml")["jobs"]).values():
        for step in job["steps"]:
            if "uses" in step:
                ref = step["uses"].split("@", 1)[1]
                assert len(ref) == 40 and all(c in "0123456789abcdef" for c in ref), step["uses"]


def test_ci_workflow_runs_the_readme_test_command() -> None:
    wf = _workflow("ci.yaml")
    steps = wf["jobs"]["test"]["steps"]
    assert any(s.get("run") == "bash scripts/test.sh" for s in steps)
    assert wf["permissions"] == {"contents": "read"}
