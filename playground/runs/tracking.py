"""The trainer's MLflow run (rank 0 only), logged from a background thread.

The training loop only appends to a queue; a worker thread opens the run (import mlflow, the
store, the experiment), then sends whatever has piled up as one ``log_batch`` per wake-up. The worker
opens the run once the first progress point is queued (or the run ends), not at start: importing
mlflow and opening its store beside the trainer's own imports held the GIL and put the first
progress point ~4 s later (SmolLM2 on 2 cores: Training at 9.8 s with it, 5.8 s without). A store
that cannot be reached never fails or stalls training: an ``http(s)`` server is probed once up front
(a TCP connect with a short timeout) and MLflow's HTTP retries are capped; the first error turns
tracking off for the rest of the run and leaves one warning line, which the trainer prints from its
main thread (:meth:`RunTracker.take_warning`).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from playground.events import Progress
from playground.runs import settings as rs

PROBE_TIMEOUT = 3.0  # seconds to connect to a tracking server before giving up on it
CLOSE_TIMEOUT = 30.0  # the most the trainer waits at its end for the run's last records
# A cancelled trainer's wait for them: within the local backend's 10 s grace before SIGKILL, and long enough to open
# the run (import mlflow, the store) when the cancel comes before the first progress point.
CANCEL_CLOSE_TIMEOUT = 8.0
MAX_BATCH = 1000  # MLflow's log_batch limit on metrics per request
FLUSH_SECONDS = 1.0  # the worker sends at most one batch per second
PROGRESS_METRICS = ("loss", "learning_rate", "tokens_per_second", "mfu")


class TrackingUnavailable(Exception):
    """The tracking store cannot be used (down, refused, misconfigured)."""


def probe(uri: str, timeout: float = PROBE_TIMEOUT) -> None:
    """Raise TrackingUnavailable unless an ``http(s)`` tracking server accepts a connection."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "localhost", port), timeout=timeout):
            pass
    except OSError as exc:
        raise TrackingUnavailable(exc.strerror or type(exc).__name__) from None


def _limit_http_retries() -> None:
    """MLflow retries a failed request for minutes by default: a few short tries here."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def open_client(uri: str):
    """An ``MlflowClient`` for ``uri`` (tracking and registry). A new SQLite store is created (its
    schema migrated) under a file lock, so concurrent trainers never race on it."""
    _limit_http_retries()
    import logging

    from mlflow.tracking import MlflowClient

    for name in ("mlflow.store.db.utils", "alembic"):  # "Creating initial MLflow database tables..."
        logging.getLogger(name).setLevel(logging.WARNING)
    db = rs.sqlite_path(uri)
    if db is None:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    from filelock import FileLock

    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(db) + ".lock", timeout=120):
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        SqlAlchemyStore(uri, rs.artifact_root(uri))  # creates and migrates the schema, once; artifacts beside it
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def experiment_id(client: Any, name: str, artifact_location: str | None) -> str:
    """The experiment called ``name``, created when missing (another process may create it first)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def quality_verdict(quality: Any, metrics: Mapping[str, float]) -> str:
    """``passed`` / ``failed`` against the blueprint's quality bar, ``unknown`` without its metric."""
    value = metrics.get(quality.metric)
    if value is None or not math.isfinite(value):
        return "unknown"
    return "passed" if quality.passed(value) else "failed"


class RunTracker:
    """One training job's MLflow run. Every method is cheap and never raises."""

    def __init__(
        self,
        uri: str,
        *,
        experiment: str,
        run_name: str,
        tags: Mapping[str, str],
        params: Mapping[str, Any],
        artifacts: Mapping[str, str] | None = None,
        quality: Any = None,
        job_id: str | None = None,
    ) -> None:
        self.uri = uri
        self.experiment = experiment
        self.run_name = run_name
        self.tags = dict(tags)
        self.params = {k: str(v)[:6000] for k, v in params.items()}
        self.artifacts = dict(artifacts or {})
        self.quality = quality
        self.job_id = job_id
        self.run_id: str | None = None
        self.metrics: dict[str, float] = {}
        self._step = 0
        self._pending: list[tuple[str, float, int, int]] = []  # (key, value, timestamp ms, step)
        self._finish: tuple[str, dict[str, str]] | None = None
        self._warning: str | None = None
        self._failed = False
        self._cond = threading.Condition()
        self._closed = False
        self._progressed = False  # the first progress point is queued: the worker may open the run (or at the end)
        try:
            probe(uri)
        except TrackingUnavailable as exc:
            self._fail(exc)
            return
        self._thread = threading.Thread(target=self._run, name="mlflow-run", daemon=True)
        self._thread.start()

    # -- what the trainer calls (main thread) ----------------------------------------------------
    def progress(self, progress: Progress) -> None:
        self._step = progress.step
        stamp = int(progress.time * 1000)
        values = [(name, getattr(progress, name)) for name in PROGRESS_METRICS]
        values += [(f"train_{name}", value) for name, value in progress.metrics.items()]
        self._add([(k, float(v), stamp, progress.step) for k, v in values if _finite(v)], progressed=True)

    def metric(self, name: str, value: float) -> None:
        if _finite(value):
            self.metrics[name] = float(value)
            self._add([(name, float(value), int(time.time() * 1000), self._step)])

    def summary(self, metrics: Mapping[str, Any]) -> None:
        """The run's final figures (``metrics.json``): numbers only; lists and text are left out."""
        stamp = int(time.time() * 1000)
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        self._add([(k, v, stamp, self._step) for k, v in numbers.items() if _finite(v) and k not in self.metrics])

    def finish(self, status: str) -> None:
        """End the run: ``FINISHED`` / ``FAILED`` / ``KILLED``, with the quality verdict."""
        tags = {}
        if self.quality is not None:
            tags[rs.TAG_VERDICT] = quality_verdict(self.quality, self.metrics)
        with self._cond:
            self._finish = (status, tags)
            self._cond.notify()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Wait (at most ``timeout``) for the worker to deliver what is queued."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread = getattr(self, "_thread", None)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                self._fail(TrackingUnavailable(f"no answer within {timeout:.0f} s; the last records are lost"))

    def take_warning(self) -> str | None:
        """The one warning line (once), for the trainer's log."""
        with self._cond:
            warning, self._warning = self._warning, None
            return warning

    # -- the worker ---------------------------------------------------------------------------------
    def _add(self, items: list[tuple[str, float, int, int]], *, progressed: bool = False) -> None:
        if self._failed or not (items or progressed):
            return
        with self._cond:
            self._progressed |= progressed
            self._pending.extend(items)
            self._cond.notify()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._failed:
                return
            self._failed = True
            self._pending.clear()
            reason = rs.scrub(str(exc)).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            self._warning = (
                f"warning: MLflow tracking at {rs.safe_uri(self.uri)} is unavailable ({reason}); "
                "training continues without run tracking"
            )

    def _run(self) -> None:
        try:
            with self._cond:
                while not self._progressed and self._finish is None and not self._closed:
                    self._cond.wait()
            client = self._open()
            last_sent = -FLUSH_SECONDS
            while True:
                with self._cond:
                    while not self._pending and self._finish is None and not self._closed:
                        self._cond.wait()
                    # one request per FLUSH_SECONDS at most: the points of that second go together
                    deadline = last_sent + FLUSH_SECONDS
                    while self._finish is None and not self._closed and (wait := deadline - time.monotonic()) > 0:
                        self._cond.wait(wait)
                    batch, self._pending = self._pending, []
                    finish, self._finish = self._finish, None
                    closed = self._closed
                self._send(client, batch)
                last_sent = time.monotonic()
                if finish is not None:
                    status, tags = finish
                    for key, value in tags.items():
                        client.set_tag(self.run_id, key, value)
                    client.set_terminated(self.run_id, status=status)
                if closed and not self._pending:
                    return
        except Exception as exc:
            self._fail(exc)

    def _open(self) -> Any:
        from mlflow.entities import Param, RunTag

        client = open_client(self.uri)
        exp_id = experiment_id(client, self.experiment, rs.artifact_root(self.uri))
        run = self._existing_run(client, exp_id)
        if run is None:
            run = client.create_run(exp_id, run_name=self.run_name, tags=self.tags)
            params = [Param(k, v) for k, v in self.params.items()]
            for start in range(0, len(params), 100):
                client.log_batch(run.info.run_id, params=params[start : start + 100])
            for path, text in self.artifacts.items():
                client.log_text(run.info.run_id, text, path)
        else:  # --resume: the job's run continues
            client.update_run(run.info.run_id, status="RUNNING")
            client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in self.tags.items()])
        self.run_id = run.info.run_id
        return client

    def _existing_run(self, client: Any, exp_id: str) -> Any:
        if not self.job_id:
            return None
        runs = client.search_runs([exp_id], filter_string=f"tags.`{rs.TAG_JOB}` = '{_quoted(self.job_id)}'")
        return runs[0] if runs else None

    def _send(self, client: Any, batch: list[tuple[str, float, int, int]]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(key, value, stamp, step) for key, value, stamp, step in batch]
        for start in range(0, len(metrics), MAX_BATCH):
            client.log_batch(self.run_id, metrics=metrics[start : start + MAX_BATCH])


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def start_run(spec: Any, settings: Any) -> RunTracker | None:
    """The trainer's run for ``spec`` (a TrainSpec), or None when tracking is off."""
    import yaml

    uri = rs.tracking_uri()
    if uri is None:
        return None
    blueprint = spec.blueprint
    job_id = os.environ.get(rs.JOB_ID_ENV) or None
    model_dir = spec.output / "model"
    tags = {
        rs.TAG_BLUEPRINT: blueprint.id,
        rs.TAG_BACKEND: os.environ.get(rs.JOB_BACKEND_ENV) or "none",
        rs.TAG_MODEL_DIR: str(model_dir),
        rs.TAG_MODEL_URI: os.environ.get(rs.MODEL_URI_ENV) or str(model_dir),
        rs.TAG_QUALITY: f"{blueprint.quality.metric} {'>=' if blueprint.quality.higher_is_better else '<='} "
        f"{blueprint.quality.threshold}",
        "mlflow.source.name": "playground.train",
        "mlflow.source.type": "JOB",
    }
    if job_id:
        tags[rs.TAG_JOB] = job_id
    if owner := os.environ.get(rs.JOB_OWNER_ENV):
        tags[rs.TAG_OWNER] = owner
    params: dict[str, Any] = {
        "blueprint": blueprint.id,
        "method": blueprint.method.kind,
        "model_source": spec.model_source,
        "dataset_source": spec.dataset_source,
        **{name: getattr(settings, name) for name in settings.__dataclass_fields__},
        **spec.params.as_dict(),
    }
    return RunTracker(
        uri,
        experiment=blueprint.id,
        run_name=job_id or spec.output.name or blueprint.id,
        tags=tags,
        params=params,
        artifacts={"blueprint.yaml": yaml.safe_dump(blueprint.model_dump(mode="json"), sort_keys=False)},
        quality=blueprint.quality,
        job_id=job_id,
    )
