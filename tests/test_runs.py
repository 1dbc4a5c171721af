"""Every run in MLflow, `playground runs`, `playground register` (MLflow registry, Kubeflow Hub), serving a
registered model by reference. Real MLflow on the session's SQLite store (conftest.mlflow_store), read back
with MLflow's own client; real training through the local backend; Kubeflow Hub over real HTTP against an
emulator built from the API's generated models (tests/_hub_emulator.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from _fixtures import unused_port
from _hub_emulator import HubEmulator
from _waiting import wait_for
from conftest import mlflow_tracking
from mlflow.tracking import MlflowClient

from playground.api import make_request
from playground.backends.local import LocalBackend
from playground.blueprints import get_blueprint
from playground.cli import main as cli
from playground.events import JobPhase, Progress
from playground.runs import default_tracking_uri, safe_uri, tracking_uri
from playground.runs.registry import parse_reference, resolve_job
from playground.runs.settings import TAG_JOB
from playground.runs.store import job_run
from playground.runs.tracking import RunTracker
from playground.runs.ui import (
    INSTALL_MLFLOW,
    INSTALL_PROXY,
    full_mlflow_installed,
    jupyter_proxy_server,
    notebook_base_url,
    server_proxy_installed,
    ui_link,
)

SHORT = {"max_steps": 10, "log_every": 2, "checkpoint_every": 0, "num_eval_examples": 10, "learning_rate": 5e-3}


def _train(backend: LocalBackend, params: dict):
    with mlflow_tracking():  # on for this job (the suite's default is off: conftest.mlflow_store)
        job = backend.submit(make_request("tiny-llama-cpu", params))
    for _ in backend.events(job.id, follow=True):
        pass
    return backend.get(job.id)


def _runs_of(client: MlflowClient, job_id: str) -> list:
    experiment = client.get_experiment_by_name("tiny-llama-cpu")
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], filter_string=f"tags.`{TAG_JOB}` = '{job_id}'")


def _run_of(client: MlflowClient, job_id: str):
    runs = _runs_of(client, job_id)
    assert len(runs) == 1, f"one run for {job_id}, found {len(runs)}"
    return runs[0]


@pytest.fixture(scope="module")
def client(mlflow_store: str) -> MlflowClient:
    return MlflowClient(tracking_uri=mlflow_store, registry_uri=mlflow_store)


@pytest.fixture(scope="module")
def short_job(session_home: Path, trained_tiny_job):
    """A second, short tiny-llama-cpu run (other max_steps and learning rate) in the session's store."""
    job = _train(LocalBackend(home=session_home), SHORT)
    assert job.phase == JobPhase.SUCCEEDED, job.log_tail
    return job


def test_tracking_uri_defaults_to_sqlite_under_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("PLAYGROUND_MLFLOW")
    monkeypatch.setenv("PLAYGROUND_HOME", str(tmp_path))
    assert tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow.db" == default_tracking_uri()
    monkeypatch.setenv("PLAYGROUND_MLFLOW", "off")
    assert tracking_uri() is None
    assert safe_uri("https://alice:s3cret@mlflow.example:5000/x?token=abc") == "https://mlflow.example:5000/x"


def test_training_job_is_an_mlflow_run(trained_tiny_job, session_home: Path, client: MlflowClient) -> None:
    job = trained_tiny_job
    run = _run_of(client, job.id)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["playground.backend"] == "local" and tags["playground.blueprint"] == "tiny-llama-cpu"
    assert tags["playground.model_dir"] == job.model_dir and run.info.run_name == job.id
    blueprint = get_blueprint("tiny-llama-cpu")
    quality = blueprint.quality
    assert tags["playground.verdict"] == ("passed" if quality.passed(job.metrics[quality.metric]) else "failed")
    # the resolved parameters, the blueprint's fixed settings included
    params = run.data.params
    assert {k: params[k] for k in job.params} == {k: str(v) for k, v in job.params.items()}
    assert params["warmup_steps"] == "20" and params["max_seq_length"] == "64"
    # every logged step, the same steps as the progress events
    points = [e for e in LocalBackend(home=session_home).events(job.id) if isinstance(e, Progress)]
    assert len(points) == 300 // 5
    for name in ("loss", "learning_rate", "tokens_per_second"):
        history = sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)
        assert [m.step for m in history] == [p.step for p in points], name
        assert [m.value for m in history] == pytest.approx([getattr(p, name) for p in points], rel=1e-6), name
    for name in ("eval_loss", "eval_exact_match"):
        assert run.data.metrics[name] == pytest.approx(job.metrics[name])
    assert run.data.metrics["train_seconds"] > 0
    artifact = Path(client.download_artifacts(run.info.run_id, "blueprint.yaml", str(session_home)))
    assert yaml.safe_load(artifact.read_text())["id"] == "tiny-llama-cpu"


def test_down_tracking_server_never_fails_training(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = unused_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:pw@127.0.0.1:{port}")
    backend = LocalBackend(home=home)
    started = time.monotonic()
    job = _train(backend, {**SHORT, "max_steps": 4})
    assert job.phase == JobPhase.SUCCEEDED, job.log_tail
    assert time.monotonic() - started < 60
    log = (home / "jobs" / job.id / "train.log").read_text()
    warnings = [line for line in log.splitlines() if "MLflow" in line]
    assert warnings == [
        f"warning: MLflow tracking at http://127.0.0.1:{port} is unavailable (Connection refused); "
        "training continues without run tracking"
    ]
    assert "pw@" not in log


def test_runs_lists_and_compares(trained_tiny_job, short_job, capsys: pytest.CaptureFixture) -> None:
    assert cli(["runs", "--blueprint", "tiny-llama-cpu", "--json"]) == 0
    runs = {run["job_id"]: run for run in json.loads(capsys.readouterr().out)}
    long, short = runs[trained_tiny_job.id], runs[short_job.id]
    assert short["differing_params"]["max_steps"] == "10" and long["differing_params"]["max_steps"] == "300"
    assert short["differing_params"]["learning_rate"] == "0.005"
    assert "seed" not in short["differing_params"]  # the same in every run
    assert short["metrics"]["eval_exact_match"] == pytest.approx(short_job.metrics["eval_exact_match"])
    assert short["status"] == "FINISHED" and short["verdict"] in ("passed", "failed")

    assert cli(["runs", "--blueprint", "tiny-llama-cpu"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["JOB", "BLUEPRINT", "STATUS", "VERDICT"]
    row = next(line for line in table if line.startswith(short_job.id))
    assert "max_steps=10" in row and "learning_rate=0.005" in row
    assert table[-1] == f"browse: {INSTALL_MLFLOW}"  # mlflow-skinny only here: no UI to open, the package named

    assert cli(["runs", "--blueprint", "no-such-blueprint"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--blueprint 'no-such-blueprint'" in err[0] and "tiny-llama-cpu" in err[0]


def test_register_in_mlflow_and_serve_by_reference(
    trained_tiny_job, client: MlflowClient, capsys: pytest.CaptureFixture
) -> None:
    job = trained_tiny_job
    assert cli(["register", job.id, "--name", "tiny-reverse", "--json"]) == 0
    registered = json.loads(capsys.readouterr().out)
    version = client.get_model_version("tiny-reverse", registered["version"])
    assert version.source == job.model_dir and Path(version.source, "config.json").is_file()
    assert version.run_id == _run_of(client, job.id).info.run_id
    assert version.tags[TAG_JOB] == job.id
    assert float(version.tags["metric.eval_exact_match"]) == pytest.approx(job.metrics["eval_exact_match"])
    # `playground serve models:/NAME/VERSION` serves the job that made it (serving a job: test_serving.py)
    assert parse_reference("models:/tiny-reverse/1") == ("tiny-reverse", "1")
    assert resolve_job(f"models:/tiny-reverse/{version.version}") == job.id
    assert resolve_job(f"tiny-reverse@{version.version}") == job.id
    assert resolve_job(job.id) == job.id
    assert cli(["serve", "models:/tiny-reverse/999"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no such registered model version" in err and "tiny-reverse" in err


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["register", "no-such-job"], "unknown job 'no-such-job'"),
        (
            ["register", "JOB", "--registry", "dockerhub"],
            "--registry 'dockerhub' is unknown; allowed: mlflow, kubeflow-hub",
        ),
        (["register", "JOB", "--registry", "kubeflow-hub"], "--registry-url '' is not valid"),
        (["register", "JOB", "--registry", "kubeflow-hub", "--registry-url", "ftp://x"], "--registry-url 'ftp://x'"),
        (["register", "JOB", "--name", "bad name!"], "--name 'bad name!' is not valid"),
    ],
)
def test_register_bad_input(trained_tiny_job, argv, field: str, capsys: pytest.CaptureFixture) -> None:
    argv = [trained_tiny_job.id if arg == "JOB" else arg for arg in argv]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0], err


def test_register_in_kubeflow_hub(
    trained_tiny_job, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    job = trained_tiny_job
    monkeypatch.setenv("PLAYGROUND_REGISTRY_TOKEN", "hub-token-do-not-print")
    with HubEmulator() as hub:
        argv = ["register", job.id, "--registry", "kubeflow-hub", "--registry-url", hub.url, "--name", "tiny-reverse"]
        assert cli([*argv, "--json"]) == 0
        out = capsys.readouterr()
        registered = json.loads(out.out)
        assert (registered["name"], registered["version"], registered["source"]) == (
            "tiny-reverse",
            job.id,
            job.model_dir,
        )
        [model] = hub.registered_models.values()
        [version] = hub.model_versions.values()
        [[artifact]] = hub.artifacts.values()
        assert model["name"] == "tiny-reverse" and version["name"] == job.id
        assert version["registeredModelId"] == model["id"]
        assert artifact["uri"] == job.model_dir and artifact["artifactType"] == "model-artifact"
        assert artifact["modelFormatName"] == "huggingface"
        props = version["customProperties"]
        assert props["metric.eval_exact_match"]["double_value"] == pytest.approx(job.metrics["eval_exact_match"])
        assert props["playground.job_id"]["string_value"] == job.id
        assert all(h.get("Authorization") == "Bearer hub-token-do-not-print" for h in hub.headers)
        # the same version twice: one line, exit 2; the token never printed
        assert cli(argv) == 2
        out2 = capsys.readouterr()
        assert "already exists" in out2.err and len(out2.err.strip().splitlines()) == 1
        assert "hub-token-do-not-print" not in out.out + out.err + out2.out + out2.err
    port = unused_port()  # a Hub that is not there: one line naming --registry-url, exit 2
    started = time.monotonic()
    assert cli([*argv[:4], "--registry-url", f"http://u:pw@127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"Kubeflow Hub at http://127.0.0.1:{port} failed" in err[0] and "pw@" not in err[0]
    assert time.monotonic() - started < 30


def test_trainjob_passes_tracking_server_and_workspace(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://alice:s3cret@mlflow.example:5000")
    monkeypatch.setenv("PLAYGROUND_MLFLOW", "1")
    argv = ["train", "tiny-llama-cpu", "--backend", "kubernetes", "--namespace", "team-a", "--dry-run"]
    assert cli(argv) == 0
    out = capsys.readouterr().out
    trainjob = yaml.safe_load(out)
    env = {e["name"]: e.get("value") for e in trainjob["spec"]["trainer"]["env"]}
    name = trainjob["metadata"]["name"]
    assert env["MLFLOW_TRACKING_URI"] == "https://mlflow.example:5000" and "s3cret" not in out
    assert env["MLFLOW_WORKSPACE"] == "team-a"  # KEP-897: namespace = MLflow workspace
    assert env["PLAYGROUND_JOB_ID"] == name and env["PLAYGROUND_JOB_BACKEND"] == "kubernetes"
    assert env["PLAYGROUND_MODEL_URI"] == f"pvc://workspace-{name}/output/model"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # no tracking server: no SQLite file inside the pod
    assert cli(argv) == 0
    env = {e["name"]: e.get("value") for e in yaml.safe_load(capsys.readouterr().out)["spec"]["trainer"]["env"]}
    assert env["PLAYGROUND_MLFLOW"] == "0" and "MLFLOW_TRACKING_URI" not in env


def test_monitor_shows_previous_runs_the_run_and_registers(
    session_home: Path, trained_tiny_job, short_job, client: MlflowClient
) -> None:
    from playground.runs.store import loss_curves, run_for_job
    from widgets.monitor import JobMonitor

    backend = LocalBackend(home=session_home)
    monitor = JobMonitor(backend, short_job, blueprint=get_blueprint("tiny-llama-cpu"))
    assert monitor.wait(60)
    curves = loss_curves("tiny-llama-cpu", exclude_job=short_job.id)
    assert curves and all(curve.job_id != short_job.id for curve in curves)
    expected = [x for curve in curves for x in [*curve.steps, None]]
    wait_for(lambda: list(monitor.chart.data[2].x) == expected, 30, "the previous runs' curves")
    assert list(monitor.chart.data[0].x) == list(range(2, 11, 2))  # this run's own curve, unchanged
    run = run_for_job(short_job.id)
    wait_for(lambda: run.run_id in monitor.run_link.value, 30, "the run link")
    # the Register button (operator view): a version of the blueprint's registered model, from this job
    assert not monitor.register_button.disabled
    monitor.register_button.click()
    wait_for(lambda: "registered" in monitor.status.value, 30, "the registration")
    [version] = [v for v in client.search_model_versions("name='tiny-llama-cpu'") if v.source == short_job.model_dir]
    assert version.run_id == run.run_id and f"version {version.version}" in monitor.status.value
    booth_view = JobMonitor(backend, short_job, operator=False, autostart=False)
    assert booth_view.register_button.layout.display == "none"


def test_cancelled_job_ends_its_run_killed(home: Path, client: MlflowClient) -> None:
    # 30 s to end the run on SIGTERM: under load ~10 on 2 cores the tracker's worker, still importing mlflow when the
    # cancel came, once took longer than 10 s and was killed before it could open and end the run (seen 2026-12-07)
    backend = LocalBackend(home=home, cancel_grace=30)
    with mlflow_tracking():
        job = backend.submit(make_request("tiny-llama-cpu", {**SHORT, "max_steps": 5000}))
    for event in backend.events(job.id, follow=True):
        if isinstance(event, Progress):
            break
    # the run opens at the first progress point (its worker imports mlflow then): cancelled once it is open, as a
    # run a user sees and stops (a fresh-clone run beside 2 other busy lanes cancelled mid-import and found none)
    wait_for(lambda: _runs_of(client, job.id), 120, "the run to open")
    assert backend.cancel(job.id).phase == JobPhase.CANCELLED
    run = wait_for(lambda: (r := _run_of(client, job.id)).info.status != "RUNNING" and r, 30, "the run's end")
    assert run.info.status == "KILLED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")][:1] == [2]


def test_the_run_opens_at_the_first_progress_point(client: MlflowClient, mlflow_store: str) -> None:
    """The worker imports mlflow and opens the run only once training reports (or the run ends): done beside the
    trainer's own imports it held the GIL and delayed the first progress point by ~4 s. Nothing is lost."""
    tracker = RunTracker(mlflow_store, experiment="opened-late", run_name="a", tags={TAG_JOB: "late-a"}, params={})
    tracker.metric("base_eval_exact_match", 0.25)
    time.sleep(2.0)  # the store exists and mlflow is imported here: an eager worker opens the run in well under 1 s
    assert tracker.run_id is None and client.get_experiment_by_name("opened-late") is None
    tracker.progress(Progress(step=1, total_steps=4, loss=2.5))
    wait_for(lambda: tracker.run_id, 30, "the run to open at the first progress point")
    tracker.finish("FINISHED")
    tracker.close()
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[TAG_JOB] == "late-a"
    assert run.data.metrics["base_eval_exact_match"] == 0.25 and run.data.metrics["loss"] == 2.5

    failed = RunTracker(mlflow_store, experiment="opened-late", run_name="b", tags={TAG_JOB: "late-b"}, params={})
    failed.metric("base_eval_exact_match", 0.5)  # a trainer that fails before its first step still gets its run
    failed.finish("FAILED")
    failed.close()
    run = client.get_run(failed.run_id)
    assert run.info.status == "FAILED" and run.data.metrics == {"base_eval_exact_match": 0.5}
    assert failed.take_warning() is None and tracker.take_warning() is None


# -- a job's whole run, and where to browse it (a notebook pod reaches MLflow's UI through its own base URL) -----


def test_job_run_is_the_whole_run_read_with_mlflows_client(
    trained_tiny_job, session_home: Path, client: MlflowClient, mlflow_store: str, tmp_path: Path
) -> None:
    record = job_run(trained_tiny_job.id)
    run = _run_of(client, trained_tiny_job.id)
    assert (record.run_id, record.experiment_id, record.job_id) == (
        run.info.run_id,
        run.info.experiment_id,
        trained_tiny_job.id,
    )
    assert record.status == "FINISHED" and record.blueprint == "tiny-llama-cpu"
    assert record.verdict == run.data.tags["playground.verdict"] and record.end_time >= record.start_time > 0
    assert record.params == run.data.params and record.params["max_steps"] == "300"
    assert record.metrics == run.data.metrics
    assert record.metrics["eval_exact_match"] == pytest.approx(trained_tiny_job.metrics["eval_exact_match"])
    # every point of every curve: the progress events' steps and values (60 points: 300 steps, one every 5)
    curves = {curve.key: curve for curve in record.curves}
    assert {"loss", "learning_rate", "tokens_per_second"} <= set(curves) and "eval_exact_match" not in curves
    points = [e for e in LocalBackend(home=session_home).events(trained_tiny_job.id) if isinstance(e, Progress)]
    assert curves["loss"].steps == [p.step for p in points] and len(points) == 60
    assert curves["loss"].values == pytest.approx([p.loss for p in points], rel=1e-6)
    for key, curve in curves.items():
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert curve.steps == [m.step for m in history] and curve.values == [m.value for m in history], key
    # mlflow-skinny only here: no UI to link to, the package to install instead of a dead 127.0.0.1 link
    assert not full_mlflow_installed(), "this environment has mlflow-skinny only"
    assert record.link.url is None and record.link.note == INSTALL_MLFLOW
    assert record.to_dict()["curves"][0]["key"] == record.curves[0].key
    # no such job, no store: None, and nothing is created
    assert job_run("no-such-job") is None
    missing = tmp_path / "none" / "mlflow.db"
    assert job_run(trained_tiny_job.id, uri=f"sqlite:///{missing}") is None and not missing.parent.exists()


KUBEFLOW_PREFIX = "/notebook/team-ml/my-notebook"  # Kubeflow Notebooks' NB_PREFIX (the server's --base-url)


@pytest.mark.parametrize(
    "env, base",
    [
        ({"NB_PREFIX": KUBEFLOW_PREFIX}, KUBEFLOW_PREFIX + "/"),
        ({"NB_PREFIX": KUBEFLOW_PREFIX + "/", "JUPYTERHUB_SERVICE_PREFIX": "/user/x/"}, KUBEFLOW_PREFIX + "/"),
        ({"JUPYTERHUB_SERVICE_PREFIX": "/user/alice/"}, "/user/alice/"),
        ({"VOILA_BASE_URL": "/"}, "/"),
        ({}, None),
    ],
)
def test_the_notebook_base_url_comes_from_the_platforms_variables(env: dict, base: str | None, monkeypatch) -> None:
    for name in ("NB_PREFIX", "JUPYTERHUB_SERVICE_PREFIX", "VOILA_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert notebook_base_url() == base


def test_the_run_link_goes_through_the_notebooks_base_url(monkeypatch: pytest.MonkeyPatch, mlflow_store: str) -> None:
    run = "#/experiments/3/runs/abc"
    monkeypatch.setenv("NB_PREFIX", KUBEFLOW_PREFIX)
    # the full mlflow (its UI) is not installed here: one line naming the package, under Kubeflow and locally
    assert ui_link(mlflow_store, "3", "abc").url is None
    assert ui_link(mlflow_store, "3", "abc").text() == INSTALL_MLFLOW
    # with it and jupyter-server-proxy: the notebook server's own base URL, never 127.0.0.1 (the user's laptop)
    link = ui_link(mlflow_store, "3", "abc", mlflow_ui=True, server_proxy=True)
    assert link.url == f"{KUBEFLOW_PREFIX}/mlflow/{run}" and "jupyter-server-proxy" in link.note
    assert ui_link(mlflow_store, mlflow_ui=True, server_proxy=True).url == f"{KUBEFLOW_PREFIX}/mlflow/"
    # in the pod without jupyter-server-proxy: what to install, no link
    assert ui_link(mlflow_store, "3", "abc", mlflow_ui=True, server_proxy=False).text() == INSTALL_PROXY
    # on one's own machine (no notebook base URL): the local UI, and the command that starts it
    local = ui_link(mlflow_store, "3", "abc", env={}, mlflow_ui=True, server_proxy=False)
    assert (
        local.url == f"http://127.0.0.1:5000/{run}"
        and local.note == f"start it: mlflow ui --backend-store-uri {mlflow_store}"
    )
    # a tracking server is linked as it is (no credentials), whatever is installed
    server = ui_link("https://alice:s3cret@mlflow.example:5000/", "3", "abc", mlflow_ui=False)
    assert server.url == f"https://mlflow.example:5000/{run}" and server.text() == server.url


def test_jupyter_server_proxy_starts_mlflows_ui_on_the_store(mlflow_store: str) -> None:
    """The ``jupyter_serverproxy_servers`` entry point: ``{base_url}mlflow/`` runs MLflow's UI on the playground's
    store, bound to 127.0.0.1, with options MLflow's own CLI accepts (checked by it: ``--help`` after them)."""
    import subprocess
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    entry = pyproject["project"]["entry-points"]["jupyter_serverproxy_servers"]["mlflow"]
    assert entry == "playground.runs.ui:jupyter_proxy_server"
    server = jupyter_proxy_server()
    command = server["command"]
    assert command[command.index("--backend-store-uri") + 1] == mlflow_store
    assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("--port") + 1] == "{port}"
    real = [part.replace("{port}", "5000") for part in command]
    checked = subprocess.run([*real, "--help"], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr[-500:]


@pytest.mark.skipif(
    not (full_mlflow_installed() and server_proxy_installed()),
    reason="needs the full mlflow and jupyter-server-proxy (the core install has mlflow-skinny only)",
)
def test_the_run_link_opens_the_run_through_jupyter_server_proxy(
    client: MlflowClient, mlflow_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Jupyter server under Kubeflow's base URL, jupyter-server-proxy configured with this package's entry point:
    the app's link answers MLflow's UI, and the run (its metric history) through MLflow's REST API behind it."""
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    experiment = client.create_experiment(f"through-proxy-{tmp_path.name}", (tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    for step in range(1, 4):
        client.log_metric(run_id, "loss", 3.0 / step, step=step)
    monkeypatch.setenv("NB_PREFIX", KUBEFLOW_PREFIX)
    link = ui_link(mlflow_store, experiment, run_id)
    assert link.url == f"{KUBEFLOW_PREFIX}/mlflow/#/experiments/{experiment}/runs/{run_id}"
    config = tmp_path / "jupyter_server_config.py"
    config.write_text(
        "from playground.runs.ui import jupyter_proxy_server\n"
        "c.ServerProxy.servers = {'mlflow': jupyter_proxy_server()}\n"
        "c.ServerApp.jpserver_extensions = {'jupyter_server_proxy': True}\n"
    )
    port = unused_port()
    argv = [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser", "--allow-root"]
    argv += [f"--ServerApp.base_url={KUBEFLOW_PREFIX}/", "--IdentityProvider.token=tok", f"--config={config}"]
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    with open(tmp_path / "server.log", "w") as log:
        server = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    page = f"http://127.0.0.1:{port}{link.url.split('#')[0]}"

    def read(url: str, timeout: float = 200) -> bytes:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers={"Authorization": "token tok"}), timeout=timeout
        ) as r:
            return r.read()

    try:
        wait_for(
            lambda: _answers(read, f"http://127.0.0.1:{port}{KUBEFLOW_PREFIX}/api/status"), 60, "the Jupyter server"
        )
        assert b"<html" in read(page).lower()  # the first visit starts MLflow's UI (22-43 s at load 10 on 2 cores)
        history = json.loads(read(f"{page}ajax-api/2.0/mlflow/metrics/get-history?run_id={run_id}&metric_key=loss"))
        assert [m["step"] for m in history["metrics"]] == [1, 2, 3]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def _answers(read, url: str) -> bool:
    try:
        read(url, timeout=5)
        return True
    except OSError:
        return False
