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
from playground.runs.tracking import RunTracker

SHORT = {"max_steps": 10, "log_every": 2, "checkpoint_every": 0, "num_eval_examples": 10, "learning_rate": 5e-3}


def _train(backend: LocalBackend, params: dict):
    with mlflow_tracking():  # on for this job (the suite's default is off: conftest.mlflow_store)
        job = backend.submit(make_request("tiny-llama-cpu", params))
    for _ in backend.events(job.id, follow=True):
        pass
    return backend.get(job.id)


def _run_of(client: MlflowClient, job_id: str):
    experiment = client.get_experiment_by_name("tiny-llama-cpu")
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{TAG_JOB}` = '{job_id}'")
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
    assert table[-1].startswith("browse: mlflow ui --backend-store-uri sqlite:///")

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
    backend = LocalBackend(home=home, cancel_grace=10)
    with mlflow_tracking():
        job = backend.submit(make_request("tiny-llama-cpu", {**SHORT, "max_steps": 5000}))
    for event in backend.events(job.id, follow=True):
        if isinstance(event, Progress):
            break
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
