"""The slim `playground e2e` install for CI runners and the composite GitHub Action (issue 19, items 4-5).

The slim install is `pip install -r requirements/e2e.txt` + the project with `--no-deps`: no torch,
transformers, Voila or Kubeflow SDK. Here it is imitated by an import blocker (a ``sitecustomize`` on
``PYTHONPATH``, so the runner's notebook processes and kernels get it too) that makes those packages
unimportable: whatever the runner imports from them fails the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
import yaml

from playground.cli import FULL_INSTALL_PACKAGES

REPO = Path(__file__).resolve().parents[1]
ACTION = REPO / "action.yml"
SLIM_REQUIREMENTS = REPO / "requirements" / "e2e.txt"

BLOCKER = """
import importlib.abc
import sys

BLOCKED = {blocked!r}


class _SlimInstall(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (slim install)", name=name)
        return None


sys.meta_path.insert(0, _SlimInstall())
"""


def _requirement_names(lines: list[str]) -> dict[str, str]:
    names = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            name = re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0]
            names[name.lower().replace("_", "-")] = line
    return names


def test_slim_requirements_are_a_subset_of_the_full_install_without_heavy_packages() -> None:
    import tomllib

    slim = _requirement_names(SLIM_REQUIREMENTS.read_text().splitlines())
    full = _requirement_names(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    assert {"papermill", "ipykernel", "nbformat", "kubernetes"} <= set(slim)
    assert set(slim) <= set(full), f"slim requirements missing from the full install: {set(slim) - set(full)}"
    heavy = {name.replace("_", "-") for name in FULL_INSTALL_PACKAGES} | {"kubeflow-trainer-api"}
    assert not set(slim) & heavy, "the slim install must not bring torch, transformers, Voila or the SDK"
    assert "kubeflow" not in slim, "no Kubeflow SDK pin: upstream installs its own"


@pytest.fixture(scope="module")
def slim_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("slim-site")
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(FULL_INSTALL_PACKAGES)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    probe = subprocess.run(
        [sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert probe.returncode != 0 and "slim install" in probe.stderr, "the import blocker must be active"
    return env


def _foreign_notebook(path: Path) -> Path:
    """A notebook shaped like upstream's examples: a parameters cell with ``num_gpu``, no result.json."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("num_gpu = 0\nnum_nodes = 1")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Train on the cluster (slim runner check)"),
        params,
        nbformat.v4.new_code_cell(
            "import json, os, sys\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'voila') if m in sys.modules)\n"
            "assert num_gpu == 2, num_gpu\n"
            "print('trained on', num_gpu, 'GPUs', heavy)"
        ),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_slim_runner_runs_a_foreign_notebook_without_torch_transformers_voila_or_sdk(
    slim_env: dict[str, str], tmp_path: Path
) -> None:
    notebook = _foreign_notebook(tmp_path / "examples" / "jax" / "mnist.ipynb")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "playground.cli",
            "e2e",
            str(notebook),
            "--out",
            str(out),
            "--quiet",
            "-p",
            "num_gpu",
            "2",
        ],
        env=slim_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "slim install" not in proc.stdout + proc.stderr
    junit = next(out.glob("junit*.xml")).read_text()
    assert 'failures="0"' in junit and 'errors="0"' in junit
    executed = next(out.rglob("mnist*.ipynb"))
    text = json.dumps(nbformat.read(executed, as_version=4).cells[-1]["outputs"])
    assert "trained on 2 GPUs []" in text


def test_slim_runner_names_the_full_install_for_training_commands(slim_env: dict[str, str]) -> None:
    help_proc = subprocess.run(
        [sys.executable, "-m", "playground.cli", "e2e", "--help"],
        env=slim_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert help_proc.returncode == 0 and "--out" in help_proc.stdout, help_proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "playground.cli", "train", "tiny-llama-cpu"],
        env=slim_env | {"PLAYGROUND_HOME": str(Path(slim_env.get("TMPDIR", "/tmp")) / "slim-home-unused")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "lacks torch" in lines[0] and "pip install blueprint-playground" in lines[0]
    assert "Traceback" not in proc.stderr
    chat = subprocess.run(
        [sys.executable, "-m", "playground.cli", "chat", "some-job", "hello"],
        env=slim_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = chat.stderr.strip().splitlines()
    assert chat.returncode == 2 and len(lines) == 1, chat.stderr
    assert "`playground chat` needs the full install" in lines[0] and "is missing" in lines[0]


# ------------------------------------------------------------------------------------ the action


def _action() -> dict:
    return yaml.safe_load(ACTION.read_text())


@pytest.mark.parametrize("tool", ["zizmor", "check-jsonschema"])
def test_action_lint_clean(tool: str) -> None:
    exe = shutil.which(tool)
    assert exe, f"{tool} is in the test extra"
    if tool == "zizmor":
        cmd = [exe, "--offline", "--no-progress", str(ACTION)]
    else:
        cmd = [exe, "--builtin-schema", "vendor.github-actions", str(ACTION)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if tool == "zizmor":
        assert "No findings to report" in proc.stdout


def test_action_installs_slim_uploads_always_and_fails_last() -> None:
    action = _action()
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    install, _run, upload, verdict = steps
    assert "requirements/e2e.txt" in install["run"] and "--no-deps" in install["run"]
    assert upload["if"] == "always()" and upload["uses"].startswith("actions/upload-artifact@")
    assert len(upload["uses"].split("@", 1)[1].split()[0]) == 40, "pinned to a commit"
    assert verdict["shell"] == "bash" and "exit 1" in verdict["run"]
    for step in steps:
        assert "${{" not in step.get("run", ""), f"inputs reach scripts through env only: {step['name']}"


def _step_script(name: str) -> str:
    return next(s for s in _action()["runs"]["steps"] if s["name"] == name)["run"]


@pytest.mark.slow
def test_action_run_step_records_the_verdict_and_keeps_going(slim_env: dict[str, str], tmp_path: Path) -> None:
    """The action's own run script, executed by bash as the runner would, on a failing run file."""
    good = _foreign_notebook(tmp_path / "nb" / "good.ipynb")
    bad = nbformat.v4.new_notebook()
    bad.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    bad.cells = [nbformat.v4.new_code_cell("raise RuntimeError('download failed: 503')")]
    nbformat.write(bad, tmp_path / "nb" / "bad.ipynb")
    run_file = tmp_path / "run.yaml"
    run_file.write_text(
        textwrap.dedent(
            f"""\
            name: Action check
            notebooks:
              - path: {good}
                parameters: {{num_gpu: 2}}
              - path: {tmp_path / "nb" / "bad.ipynb"}
                group: gpu
            """
        )
    )
    github_output = tmp_path / "github_output"
    env = slim_env | {
        "PY": sys.executable,
        "RUN_FILE": str(run_file),
        "GROUP": "",
        "PREFIX": "1.33.1",
        "BACKEND": "local",
        "NAMESPACE": "",
        "CLEANUP": "false",
        "OUT": str(tmp_path / "out"),
        "GITHUB_OUTPUT": str(github_output),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    }
    proc = subprocess.run(
        ["bash", "-e", "-c", _step_script("Run the notebooks")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, "the run step itself never fails: the verdict step does, after the upload"
    assert github_output.read_text().strip() == "exit-code=1", proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = (tmp_path / "summary.md").read_text()
    assert "Action check" in summary and "download failed: 503" in summary
    verdict = subprocess.run(
        ["bash", "-e", "-c", _step_script("Verdict")],
        env={"CODE": "1", "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=False,
    )
    assert verdict.returncode == 1 and "notebook e2e failed" in verdict.stdout


# ------------------------------------------------------------------- upstream's jobs, ready to copy

UPSTREAM = REPO / "deploy" / "ci" / "kubeflow-trainer"


def test_upstream_run_file_mirrors_their_two_jobs_and_matches_the_docs() -> None:
    from playground.e2e.runfile import RunFileModel

    text = (UPSTREAM / "e2e-notebooks.yaml").read_text()
    run = RunFileModel.model_validate(yaml.safe_load(text))
    cpu = [n for n in run.notebooks if n.group == "cpu"]
    gpu = [n for n in run.notebooks if n.gpu]
    assert len(cpu) == 7 and len(gpu) == 2 and run.cell_timeout == 1800
    jax = next(n for n in gpu if "jax" in n.path)
    assert jax.parameters == {"num_cpu": 8, "num_gpu": 2, "num_nodes": 1}
    assert all(not n.parameters for n in run.notebooks if n is not jax), "num_gpu goes to the jax notebook only"
    assert text in (REPO / "docs" / "ci" / "kubeflow-notebooks.md").read_text(), "the docs show this file"


@pytest.mark.parametrize("tool", ["zizmor", "check-jsonschema"])
def test_upstream_gpu_workflow_lint_clean(tool: str) -> None:
    workflow = UPSTREAM / "test-e2e-gpu.yaml"
    if tool == "zizmor":
        cmd = [shutil.which("zizmor") or "zizmor", "--offline", "--no-progress", str(workflow)]
    else:
        cmd = [shutil.which("check-jsonschema") or "check-jsonschema", "--builtin-schema", "vendor.github-workflows"]
        cmd.append(str(workflow))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_upstream_gpu_workflow_is_label_gated_and_calls_the_action() -> None:
    wf = yaml.safe_load((UPSTREAM / "test-e2e-gpu.yaml").read_text())
    on = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as True
    assert on == {"pull_request": {"types": ["labeled", "synchronize"]}} and wf["permissions"] == {}
    job = wf["jobs"]["gpu-e2e-test"]
    assert "ok-to-test-gpu-runner" in job["if"] and job["permissions"] == {"contents": "read"}
    step = next(s for s in job["steps"] if "blueprint-playground" in str(s.get("uses", "")))
    inputs = set(_action()["inputs"])
    assert set(step["with"]) <= inputs and {"run-file", "group"} <= set(step["with"])
    assert step["with"]["group"] == "gpu" and step["with"]["cleanup"] == "true"
    unlabel = wf["jobs"]["remove-approval"]
    assert "synchronize" in unlabel["if"] and all("uses" not in s for s in unlabel["steps"])
