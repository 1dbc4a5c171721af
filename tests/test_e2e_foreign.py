"""``playground e2e`` on notebooks that are not the project's (issue 19): notebooks written here in the
shape of Kubeflow Trainer's examples (no parameters cell; a parameters cell expecting ``num_gpu``; the
Kubeflow SDK's ``TrainerClient`` against the Kubernetes emulator; one failing mid-way; a kernelspec that
does not exist; two ``mnist.ipynb`` in two folders), run through the CLI as a real subprocess and
through a run file. Three runs in all (two side by side), shared at module scope."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
from _k8s_sim import Cluster, Fault, Scenario, synthetic_trainer_log
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from playground.cli import main

REPO = Path(__file__).resolve().parents[1]
NS = "ml"
PROJECT_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "PLAYGROUND_HOME", "PLAYGROUND_E2E_RUN")
PYTHONPATH_MARKER = "/nonexistent/runner-pythonpath-marker"
KERNEL_SETS = {"TERM", "CLICOLOR", "PAGER", "GIT_PAGER", "MPLBACKEND"}  # ipykernel sets these for any notebook
MISSING_KERNEL = "no-such-kernel-e2e"
FAILING_JOB = "bad-data-run"
CONTROLLER_POD = "trainer-controller-manager-7c9d"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# -------------------------------------------------------------------------------------- notebooks

RECORD = """
import json, os, sys
record = {"env": dict(os.environ), "cwd": os.getcwd(), "kernel": sys.executable}
with open(f"record-{TAG}.json", "w") as fh:
    json.dump(record, fh)
"""


def _notebook(path: Path, *cells, parameters: str | None = None, kernel: str = "python3") -> Path:
    nb = new_notebook(metadata={"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}})
    nb.cells.append(new_markdown_cell(f"# {path.stem} (written for the e2e runner's tests)"))
    if parameters is not None:
        nb.cells.append(new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    nb.cells += [new_code_cell(textwrap.dedent(c).strip()) for c in cells]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def _record(tag: str) -> str:
    return f"TAG = {tag!r}\n" + RECORD


SDK_TRAIN = """
from kubeflow.trainer import CustomTrainer, TrainerClient
from kubeflow.trainer.options import Name

client = TrainerClient()  # the kubeconfig in $KUBECONFIG, its context's namespace


def train_mnist():
    print("training")


options = [Name(JOB_NAME)] if JOB_NAME else None
job_name = client.train(runtime="playground-torch", trainer=CustomTrainer(func=train_mnist), options=options)
print("submitted", job_name)
"""
SDK_WAIT = """
job = client.wait_for_job_status(job_name, polling_interval=1, timeout=120)
print("TrainJob", job_name, job.status)
"""


@pytest.fixture(scope="module")
def nbs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("foreign")
    examples = root / "examples"
    return {
        "root": root,
        # no parameters cell: whatever the run gives is injected all the same
        "pytorch": _notebook(examples / "pytorch" / "mnist.ipynb", "print('epoch 1: loss 0.3')", _record("pytorch")),
        # a parameters cell that expects num_gpu from the command line / the run file
        "jax": _notebook(
            examples / "jax" / "mnist.ipynb",
            "assert num_gpu == 2, f'expected 2 GPUs, got {num_gpu}'",
            _record("jax"),
            parameters="num_gpu = 0  # GPUs per node\nnum_nodes = 1",
        ),
        "fails": _notebook(
            examples / "fails-midway.ipynb",
            "print('step 1 ok')",
            """
            def download(url):
                raise OSError(f"503 Service Unavailable: {url}")

            try:
                download("https://datasets.example/mnist.tar.gz")
            except OSError as exc:
                raise RuntimeError("could not prepare the dataset") from exc
            """,
            "print('never reached')",
        ),
        "kernel": _notebook(examples / "other-kernel.ipynb", _record("kernel"), kernel=MISSING_KERNEL),
        # one of the project's (declares headless and out_dir): gets its parameters and environment
        "own": _notebook(
            root / "own-style.ipynb",
            _record("own"),
            "import pathlib\npathlib.Path(out_dir, 'result.json').write_text(json.dumps({'passed': True}))",
            parameters='headless = False\nout_dir = "."',
        ),
        "sdk_ok": _notebook(examples / "sdk-train.ipynb", "JOB_NAME = None\n" + SDK_TRAIN, SDK_WAIT),
        "sdk_fail": _notebook(examples / "sdk-fails.ipynb", f"JOB_NAME = {FAILING_JOB!r}\n" + SDK_TRAIN, SDK_WAIT),
    }


def _env(**extra: str) -> dict[str, str]:
    """The runner's environment: without the project's variables (so a leak shows), a marker PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in PROJECT_ENV and k != "GITHUB_STEP_SUMMARY"}
    return env | {"PYTHONPATH": PYTHONPATH_MARKER} | extra


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "playground.cli", "e2e", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen, out: Path, cwd: Path, env: dict[str, str]) -> dict:
    try:
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=60)
    metrics = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").exists() else {}
    return {
        "rc": proc.returncode,
        "stdout": stdout,
        "stderr": stderr,
        "out": out,
        "cwd": cwd,
        "env": env,
        "by_name": {nb["name"]: nb for nb in metrics.get("notebooks", [])},
    }


def _record_of(run: dict, tag: str) -> dict:
    return json.loads((run["cwd"] / f"record-{tag}.json").read_text())


@pytest.fixture(scope="module")
def local_runs(nbs: dict[str, Path]) -> dict[str, dict]:
    """Side by side: (a) the CLI over five notebooks with papermill's parameter forms; (b) a run file's
    gpu group under a matrix prefix, --quiet, with --kernel overriding a missing kernelspec."""
    root = nbs["root"]
    params_file = root / "params.yaml"
    params_file.write_text("num_nodes: 1\nbatch: 64\n")
    run_file = root / "run.yaml"
    run_file.write_text(
        textwrap.dedent(
            f"""\
            name: Kubeflow Trainer notebooks (test)
            root: examples
            cell_timeout: 120
            notebooks:
              - path: pytorch/mnist.ipynb
                group: cpu
              - path: jax/mnist.ipynb
                parameters: {{num_gpu: 2}}
                gpu: true
                timeout: 300
              - path: {nbs["kernel"]}
                name: custom-kernel
                groups: [gpu, nightly]
            """
        )
    )
    env = _env()
    a_cwd, b_cwd = root / "cwd-a", root / "cwd-b"
    a_out, b_out = root / "out-a", root / "out-b"
    cli_notebooks = [nbs[k] for k in ("pytorch", "jax", "fails", "kernel", "own")]
    a = _cli(
        [
            *map(str, cli_notebooks[:1]),
            "--out",
            str(a_out),
            "-p",
            "num_gpu",
            "2",
            *map(str, cli_notebooks[1:]),  # notebooks after `-p NAME VALUE` are notebooks still
            "-r",
            "tag",
            "007",
            "-y",
            "{lr: 0.5}",
            "-f",
            str(params_file),
            "-p",
            "batch=32",  # today's NAME=VALUE form; -p after -f: it wins, as in papermill
            *("--jobs", "3"),  # three notebooks at once: their reports as when run one by one
        ],
        a_cwd,
        env,
    )
    b = _cli(
        [
            *("--run-file", str(run_file), "--group", "gpu", "--prefix", "1.33.1", "--kernel", "python3"),
            *("--out", str(b_out), "--quiet"),
        ],
        b_cwd,
        env,
    )
    return {"a": _finish(a, a_out, a_cwd, env), "b": _finish(b, b_out, b_cwd, env), "nbs_root": root}


# ------------------------------------------------------------------------- verdicts and parameters


def test_papermill_outcome_is_the_verdict_without_result_json(local_runs: dict) -> None:
    a = local_runs["a"]
    assert a["rc"] == 1, a["stderr"][-3000:]
    status = {name: nb["status"] for name, nb in a["by_name"].items()}
    assert status == {
        "pytorch/mnist": "passed",
        "jax/mnist": "passed",
        "fails-midway": "failed",
        "other-kernel": "failed",
        "own-style": "passed",
    }
    assert not (a["out"] / "pytorch__mnist" / "result.json").exists(), "passed without writing one"
    assert a["by_name"]["own-style"]["result_json"], "the project's notebook wrote its result.json, and it was read"


def test_same_named_notebooks_get_their_own_folders_and_test_names(local_runs: dict) -> None:
    out = local_runs["a"]["out"]
    for folder in ("pytorch__mnist", "jax__mnist"):
        assert (out / folder / "mnist.ipynb").is_file() and (out / folder / "papermill.log").is_file()
    b = local_runs["b"]
    assert set(b["by_name"]) == {"1.33.1/jax/mnist", "1.33.1/custom-kernel"}, "the gpu group under the prefix"
    assert (b["out"] / "1.33.1__jax__mnist" / "mnist.ipynb").is_file()


def test_parameter_forms_and_a_foreign_notebook_gets_exactly_what_the_run_gave(local_runs: dict) -> None:
    a = local_runs["a"]
    expected = {"num_gpu": 2, "tag": "007", "lr": 0.5, "num_nodes": 1, "batch": 32}
    for folder in ("pytorch__mnist", "jax__mnist"):
        executed = nbformat.read(a["out"] / folder / "mnist.ipynb", as_version=4)
        assert executed.metadata.papermill.parameters == expected  # no headless, out_dir, backend...
    own = nbformat.read(a["out"] / "own-style" / "own-style.ipynb", as_version=4).metadata.papermill.parameters
    assert own["headless"] is True and own["out_dir"] == str((a["out"] / "own-style").resolve())
    # the run file gives num_gpu to the jax notebook only
    jax_b = nbformat.read(local_runs["b"]["out"] / "1.33.1__jax__mnist" / "mnist.ipynb", as_version=4)
    assert jax_b.metadata.papermill.parameters == {"num_gpu": 2}
    assert local_runs["b"]["by_name"]["1.33.1/jax/mnist"]["status"] == "passed"


def test_project_environment_reaches_only_the_projects_notebooks(local_runs: dict) -> None:
    a = local_runs["a"]
    for tag in ("pytorch", "jax"):
        record = _record_of(a, tag)
        for name, value in a["env"].items():
            assert record["env"].get(name) == value or name in KERNEL_SETS, f"{tag}: {name} changed"
        assert not set(PROJECT_ENV) & set(record["env"]), f"{tag}: the project's environment leaked"
        assert record["cwd"] == str(a["cwd"]), "a foreign notebook runs where the runner runs, as papermill's CLI"
    own = json.loads((local_runs["nbs_root"] / "record-own.json").read_text())
    assert own["cwd"] == str(local_runs["nbs_root"]), "the project's notebooks run in their own folder"
    assert own["env"]["HF_HUB_OFFLINE"] == "1" and own["env"]["PLAYGROUND_HOME"]
    assert own["env"]["PYTHONPATH"].split(os.pathsep)[:2] == [str(REPO), PYTHONPATH_MARKER]


def test_kernelspec_is_honoured_and_kernel_overrides_it(local_runs: dict) -> None:
    nb = local_runs["a"]["by_name"]["other-kernel"]
    assert nb["message"].startswith("NoSuchKernel") and MISSING_KERNEL in nb["message"]
    assert nb["first_error"] == nb["message"]
    assert not (local_runs["a"]["cwd"] / "record-kernel.json").exists(), "it never ran in another kernel"
    b = local_runs["b"]["by_name"]["1.33.1/custom-kernel"]
    assert b["status"] == "passed" and b["kernel"] == "python3"  # --kernel python3, as papermill -k
    assert _record_of(local_runs["b"], "kernel")["kernel"] == sys.executable


def test_failing_notebook_reports_its_error_and_cause_once(local_runs: dict) -> None:
    a = local_runs["a"]
    nb = a["by_name"]["fails-midway"]
    assert nb["message"] == "RuntimeError: could not prepare the dataset"
    assert nb["cause"].startswith("OSError: 503 Service Unavailable")
    md = (a["out"] / "fails-midway" / "diagnostics.md").read_text()
    assert md.splitlines()[2] == "**failed** — RuntimeError: could not prepare the dataset", "its own error on top"
    assert "first error (the cause): `OSError: 503 Service Unavailable" in md
    assert "backend `local`" in md
    assert md.count("The above exception was the direct cause") == 1, "the traceback once"
    assert "never reached" not in (a["out"] / "fails-midway" / "papermill.log").read_text()


def test_summary_junit_and_the_verdict_line(local_runs: dict) -> None:
    a, b = local_runs["a"], local_runs["b"]
    summary = (a["out"] / "summary.md").read_text()
    assert summary.startswith("## Notebook e2e: 3/5 notebooks passed — FAILED")
    assert "Blueprint e2e" not in summary and "| blueprint |" not in summary and "?" not in summary
    assert "| `fails-midway` | ❌ failed |" in summary and "RuntimeError: could not prepare the dataset |" in summary
    assert "| `jax/mnist` | ✅ passed |" in summary
    suite = ET.parse(a["out"] / "junit.xml").getroot().find("testsuite")
    assert suite.get("name") == "Notebook e2e" and suite.get("tests") == "5" and suite.get("failures") == "2"
    failures = {c.get("name"): c.find("failure") for c in suite.findall("testcase")}
    assert failures["fails-midway"].get("message") == "RuntimeError: could not prepare the dataset"
    assert failures["other-kernel"].get("message").startswith("NoSuchKernel")
    assert failures["jax/mnist"] is None

    err = a["stderr"]
    assert err.count("[fails-midway] FAILED in") == 1, "each notebook's verdict once"
    final = [line for line in err.splitlines() if line.startswith("playground e2e: FAILED")]
    assert len(final) == 1 and "3/5 notebooks passed" in final[0] and "fails-midway: failed" in final[0]

    assert b["rc"] == 0, b["stderr"][-3000:]
    lines = b["stderr"].strip().splitlines()  # --quiet: the verdict alone
    assert len(lines) == 1 and lines[0].startswith("playground e2e: passed — 2/2 notebooks passed"), lines
    assert (b["out"] / "summary.md").read_text().startswith("## Kubeflow Trainer notebooks (test): 2/2 notebooks")
    b_suite = ET.parse(b["out"] / "junit.xml").getroot().find("testsuite")
    assert b_suite.get("name") == "Kubeflow Trainer notebooks (test)"
    assert {c.get("name") for c in b_suite.findall("testcase")} == {"1.33.1/jax/mnist", "1.33.1/custom-kernel"}


# --------------------------------------------------------------------------------- bad input (no kernels)


def _one_line_error(capsys: pytest.CaptureFixture, argv: list[str], *needles: str) -> str:
    assert main(["e2e", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("playground: error: "), err
    assert all(n in err[0] for n in needles), err[0]
    return err[0]


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        ("notebooks:\n  - path: A\n    timout: 3\n", ("notebooks[0].timout", "unknown field", "timeout")),
        ("notebooks:\n  - path: A\n    timeout: soon\n", ("notebooks[0].timeout", "integer")),
        ("notebooks:\n  - path: A\n    timeout: 0\n", ("notebooks[0].timeout", "greater than 0")),
        ("notebooks:\n  - path: A\n    parameters: {hf_token: x}\n", ("notebooks[0].parameters", "secret")),
        ("notebooks:\n  - path: A\n    name: 'a b'\n", ("notebooks[0].name", "allowed")),
        ("notebooks:\n  - path: missing.ipynb\n", ("notebooks[0].path", "does not exist")),
        ("notebooks: []\n", ("notebooks", "at least 1")),
        ("title: x\nnotebooks:\n  - path: A\n", ("title", "unknown field", "name")),
        ("notebooks: [\n", ("not valid YAML",)),
    ],
)
def test_run_file_errors_name_the_field(
    nbs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, body: str, needles: tuple[str, ...]
) -> None:
    run_file = tmp_path / "run.yaml"
    run_file.write_text(body.replace("path: A", f"path: {nbs['pytorch']}"))
    _one_line_error(capsys, ["--run-file", str(run_file), "--out", str(tmp_path / "o")], "run file", *needles)
    assert not (tmp_path / "o").exists(), "nothing started"


def test_cli_errors(nbs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = ["--out", str(tmp_path / "o")]
    nb = str(nbs["pytorch"])
    _one_line_error(capsys, [nb, *out, "-p", "num_gpu"], "-p 'num_gpu'", "NAME VALUE")
    _one_line_error(capsys, [nb, *out, "-p", "hf_token", "abc12345"], "looks like a secret")
    _one_line_error(capsys, [nb, *out, "-y", "[1, 2]"], "-y", "mapping")
    _one_line_error(capsys, [nb, *out, "--namespace", "ml"], "--namespace only applies to --backend kubernetes")
    _one_line_error(capsys, [nb, *out, "--prefix", "1.33 rc"], "--prefix", "allowed")
    _one_line_error(capsys, [nb, *out, "--group", "gpu"], "--group", "--run-file")
    run_file = tmp_path / "run.yaml"
    run_file.write_text(f"notebooks:\n  - path: {nb}\n    gpu: true\n")
    _one_line_error(capsys, ["--run-file", str(run_file), *out, "--group", "cpu"], "'cpu'", "allowed: gpu")
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def k8s_run(nbs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two notebooks creating TrainJobs through the Kubeflow SDK (one fails on the cluster), run with
    --backend kubernetes --cleanup; an older TrainJob and a Trainer controller with logs are there first."""
    root = tmp_path_factory.mktemp("k8s-run")
    with Cluster(namespace=NS) as cluster:
        cluster.install_runtimes(REPO / "deploy" / "runtimes" / "playground-torch.yaml")
        cluster.sim.scenario = Scenario(node_log=synthetic_trainer_log(), line_delay=0.002)
        failing = Scenario(node_log=synthetic_trainer_log(fail=True), exit_code=1, line_delay=0.002)
        cluster.call(lambda: cluster.sim.scenarios.update({FAILING_JOB: failing}))
        older = {"metadata": {"name": "older-job"}, "spec": {"runtimeRef": {"name": "playground-torch"}}}
        cluster.put("trainjobs", older)
        controller = {"metadata": {"name": CONTROLLER_POD, "labels": {"app.kubernetes.io/name": "trainer"}}}
        controller["spec"] = {"containers": [{"name": "manager", "image": "trainer-controller"}]}
        running = {"name": "manager", "image": "trainer-controller", "imageID": "", "ready": True, "restartCount": 0}
        running["state"] = {"running": {"startedAt": "2025-01-01T00:00:00Z"}}
        controller["status"] = {"phase": "Running", "containerStatuses": [running]}
        cluster.put("pods", controller, namespace="kubeflow-system")
        for line in (
            f'ERROR\tReconciler error\t{{"trainJob": "{NS}/{FAILING_JOB}"}} controller-says: runtime patch applied',
            'INFO\treconciling\t{"trainJob": "other-ns/unrelated-job"}',
        ):
            cluster.call(lambda line=line: cluster.emu.append_log("kubeflow-system", CONTROLLER_POD, line))
        time.sleep(1.1)  # the older job's creationTimestamp is a second before the run starts
        kubeconfig = cluster.kubeconfig(root / "kubeconfig")
        env = _env(KUBECONFIG=str(kubeconfig))
        env.pop("KUBERNETES_SERVICE_HOST", None)
        out = root / "out"
        proc = _cli(
            [
                *(str(nbs["sdk_ok"]), str(nbs["sdk_fail"])),
                *("--backend", "kubernetes", "--namespace", NS, "--cleanup", "--out", str(out), "--quiet"),
            ],
            root / "cwd",
            env,
        )
        run = _finish(proc, out, root / "cwd", env)
        run["left"] = sorted(job["metadata"]["name"] for job in cluster.items("trainjobs"))
        run["kubeconfig"] = kubeconfig
        run["cluster"] = cluster
        yield run


def test_sdk_notebooks_on_the_cluster(k8s_run: dict) -> None:
    assert k8s_run["rc"] == 1, k8s_run["stderr"][-3000:]
    ok, bad = k8s_run["by_name"]["sdk-train"], k8s_run["by_name"]["sdk-fails"]
    assert ok["status"] == "passed", ok["message"]
    assert [job["state"] for job in ok["trainjobs"]] == ["Complete"], "its own TrainJob, not the older one"
    assert bad["status"] == "failed" and FAILING_JOB in bad["message"]
    assert [job["name"] for job in bad["trainjobs"]] == [FAILING_JOB]


def test_diagnostics_of_an_sdk_created_trainjob(k8s_run: dict) -> None:
    md = (k8s_run["out"] / "sdk-fails" / "diagnostics.md").read_text()
    assert "backend `kubernetes`" in md and f"namespace `{NS}`: 1 TrainJob(s) created" in md
    assert f"## TrainJob `{FAILING_JOB}`: Failed" in md
    assert "condition Failed: FailedJobs" in md
    assert "Warning FailedJobs" in md  # its events
    assert "Failing step `node`, last lines:" in md and "CUDA out of memory" in md
    assert "Trainer controller, lines about this TrainJob:" in md
    assert "controller-says: runtime patch applied" in md and "unrelated-job" not in md
    assert "older-job" not in md
    assert md.index("RuntimeError") < md.index("## TrainJob"), "the notebook's own error on top"


def test_cleanup_deletes_what_the_notebooks_created_and_nothing_older(k8s_run: dict) -> None:
    assert k8s_run["left"] == ["older-job"]


def test_controller_logs_forbidden_is_one_line(k8s_run: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from playground.e2e.cluster import Cluster as E2ECluster
    from playground.e2e.cluster import Window

    cluster = k8s_run["cluster"]
    monkeypatch.setenv("KUBECONFIG", str(k8s_run["kubeconfig"]))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    fault = Fault("GET", "pods", 403, "Forbidden", "pods is forbidden", name=CONTROLLER_POD, subresource="log")
    cluster.call(lambda: cluster.emu.faults.append(fault))
    api = E2ECluster()
    try:
        assert api.namespace == NS  # the kubeconfig context's
        lines = api._controller_lines([FAILING_JOB])
        assert lines == {"": ["controller logs skipped: forbidden (RBAC) to read pods in kubeflow-system"]}
        # the window: a TrainJob that existed at the start is never in it, even created in the same second
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        window = Window(namespace=NS, started_at=now, before={"uid-old"})
        job = {"metadata": {"uid": "uid-old", "creationTimestamp": stamp}}
        assert not window.contains(job)
        assert window.contains({"metadata": {"uid": "uid-new", "creationTimestamp": stamp}})
        earlier = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 5))
        assert not Window(namespace=NS, started_at=now).contains({"metadata": {"creationTimestamp": earlier}})
    finally:
        api.close()
        cluster.clear_faults()


# ------------------------------------------------------------- what a foreign notebook does to the environment

INSTALLS = """
import os, pathlib, shutil
site = pathlib.Path(os.environ["PYTHONPATH"].split(os.pathsep)[0])  # a site dir every interpreter here sees
def dist(name, version):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n")
dist("upstream-extra", "9.9.9")  # as `pip install --target` would leave it
shutil.rmtree(site / "upstream_pinned-1.0.dist-info")  # an upgrade: 1.0 out, 2.0 in
dist("upstream-pinned", "2.0")
"""


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A tiny pure-Python wheel, built by hand (no network, no build backend)."""
    import base64
    import hashlib
    import zipfile

    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={digest(text)},{len(text.encode())}\n" for path, text in files.items())
    files[f"{name}-{version}.dist-info/RECORD"] = record + f"{name}-{version}.dist-info/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
    return path


def test_the_summary_reports_what_a_foreign_notebook_installed(tmp_path: Path) -> None:
    """A notebook that adds one distribution and upgrades another (dist-info written into a site directory on
    the kernel's PYTHONPATH: no network), and one that pip-installs a local wheel under --isolated-env: the first
    run's summary names both changes; the second's install stays in its throwaway environment."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "upstream_pinned-1.0.dist-info").mkdir()
    (site / "upstream_pinned-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: upstream-pinned\nVersion: 1.0\n"
    )
    installs = _notebook(tmp_path / "nbs" / "installs.ipynb", INSTALLS)
    wheel = _wheel(tmp_path, "upstream_wheel", "3.1.4")
    pip = _notebook(
        tmp_path / "nbs" / "pip-installs.ipynb",
        f"%pip install --no-index --no-deps --quiet {wheel}",
        "import upstream_wheel; assert upstream_wheel.VERSION == '3.1.4'",
    )
    env = _env(PYTHONPATH=str(site))
    other_env = _env(PYTHONPATH=str(tmp_path / "no-site"))  # side by side: what one adds, the other must not see
    plain = _cli([str(installs), "--out", str(tmp_path / "out-plain")], tmp_path / "cwd-plain", env)
    isolated = _cli(
        [str(pip), "--isolated-env", "--out", str(tmp_path / "out-isolated")], tmp_path / "cwd-isolated", other_env
    )
    a = _finish(plain, tmp_path / "out-plain", tmp_path / "cwd-plain", env)
    b = _finish(isolated, tmp_path / "out-isolated", tmp_path / "cwd-isolated", other_env)

    assert a["rc"] == 0, a["stderr"][-3000:]
    changes = a["by_name"]["installs"]["environment_changes"]
    assert changes["installed"] == {"upstream-extra": "9.9.9"}
    assert changes["changed"] == {"upstream-pinned": {"before": "1.0", "after": "2.0"}}
    assert changes["removed"] == {}
    summary = (a["out"] / "summary.md").read_text()
    assert "### Environment" in summary
    assert (
        "**installs** changed the environment: installed upstream-extra 9.9.9; changed upstream-pinned 1.0 → 2.0"
        in summary
    )
    assert "the environment changed by installs" in a["stderr"].strip().splitlines()[-1]

    assert b["rc"] == 0, b["stderr"][-3000:]
    nb = b["by_name"]["pip-installs"]
    assert nb["isolated_env"] is True
    assert nb["environment_changes"]["installed"] == {"upstream-wheel": "3.1.4"}
    assert (
        "changed the environment (in its throwaway environment): installed upstream-wheel 3.1.4"
        in (b["out"] / "summary.md").read_text()
    )
    main_env = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.metadata as m; print([d.metadata['Name'] for d in m.distributions()])",
        ],
        env=other_env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "upstream_wheel" not in main_env and "upstream-wheel" not in main_env  # the main environment kept as it was
