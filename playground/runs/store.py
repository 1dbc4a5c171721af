"""Reading runs back: ``playground runs``, the app's loss chart, a job's whole run (:func:`job_run`).

A default SQLite store that does not exist yet means "no runs": nothing is created and mlflow is not
imported (``import mlflow`` takes ~2 s).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from playground.errors import UserError, shown
from playground.runs import settings as rs
from playground.runs.ui import UiLink, ui_link

FINAL_METRICS = ("loss", "eval_loss", "eval_exact_match", "train_seconds", "tokens_per_second")


@dataclass
class RunSummary:
    """One job's run as `playground runs` shows it."""

    run_id: str
    experiment_id: str
    blueprint: str
    job_id: str
    backend: str
    owner: str | None
    status: str  # RUNNING, FINISHED, FAILED, KILLED
    verdict: str  # passed / failed / unknown
    start_time: float
    params: dict[str, str]
    metrics: dict[str, float]  # the latest value of each
    model_uri: str | None
    link: str
    differing_params: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Curve:
    """One run's loss against the step."""

    job_id: str
    run_id: str
    steps: list[int]
    values: list[float]


@dataclass(frozen=True)
class MetricCurve:
    """Every logged point of one metric, in step order."""

    key: str
    steps: list[int]
    values: list[float]


@dataclass(frozen=True)
class RunRecord:
    """A job's MLflow run as the app shows it: status, parameters, final metrics, every curve, where to browse it."""

    run_id: str
    experiment_id: str
    job_id: str
    blueprint: str
    status: str  # RUNNING, FINISHED, FAILED, KILLED
    verdict: str  # passed / failed / unknown
    start_time: float  # seconds since the epoch
    end_time: float | None
    params: dict[str, str]
    metrics: dict[str, float]  # the latest value of each
    curves: list[MetricCurve]  # the metrics logged at two or more steps, by key
    link: UiLink

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def store_exists(uri: str) -> bool:
    db = rs.sqlite_path(uri)
    return db is None or db.is_file()


def client_for(uri: str | None = None):
    """An MlflowClient on the store (None when the SQLite file does not exist)."""
    uri = uri or rs.store_uri()
    if not store_exists(uri):
        return None
    from playground.runs.tracking import _limit_http_retries

    _limit_http_retries()
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def run_link(uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page as one line: a URL the user's browser reaches (:func:`playground.runs.ui.ui_link`), or what
    to install to get one."""
    return ui_link(uri, experiment_id, run_id).text()


def _summary(uri: str, run: Any) -> RunSummary:
    tags = run.data.tags
    return RunSummary(
        run_id=run.info.run_id,
        experiment_id=run.info.experiment_id,
        blueprint=tags.get(rs.TAG_BLUEPRINT, ""),
        job_id=tags.get(rs.TAG_JOB, run.info.run_name or ""),
        backend=tags.get(rs.TAG_BACKEND, ""),
        owner=tags.get(rs.TAG_OWNER),
        status=run.info.status,
        verdict=tags.get(rs.TAG_VERDICT, "unknown"),
        start_time=(run.info.start_time or 0) / 1000,
        params=dict(run.data.params),
        metrics=dict(run.data.metrics),
        model_uri=tags.get(rs.TAG_MODEL_URI),
        link=run_link(uri, run.info.experiment_id, run.info.run_id),
    )


def _search(client: Any, blueprint: str | None, extra: str = "", max_results: int = 200) -> list[Any]:
    if blueprint is not None:
        experiment = client.get_experiment_by_name(blueprint)
        ids = [experiment.experiment_id] if experiment is not None else []
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    if not ids:
        return []
    query = f"tags.`{rs.TAG_BLUEPRINT}` != ''" + (f" and {extra}" if extra else "")
    return client.search_runs(
        ids, filter_string=query, max_results=max_results, order_by=["attributes.start_time DESC"]
    )


def list_runs(blueprint: str | None = None, *, uri: str | None = None, max_results: int = 200) -> list[RunSummary]:
    """The playground's runs, newest first (those of one blueprint with ``blueprint``), each with the
    parameters in which it differs from the other runs of its blueprint."""
    uri = uri or rs.store_uri()
    client = client_for(uri)
    if client is None:
        return []
    runs = [_summary(uri, run) for run in _search(client, blueprint, max_results=max_results)]
    by_blueprint: dict[str, list[RunSummary]] = {}
    for run in runs:
        by_blueprint.setdefault(run.blueprint, []).append(run)
    for group in by_blueprint.values():
        keys = {key for run in group for key in run.params}
        differing = {key for key in keys if len({run.params.get(key) for run in group}) > 1}
        for run in group:
            run.differing_params = {key: run.params.get(key, "–") for key in sorted(differing)}
    return runs


def run_for_job(job_id: str, *, uri: str | None = None) -> RunSummary | None:
    """The run a job logged (None: no store, or no run with that job id)."""
    uri = uri or rs.store_uri()
    client = client_for(uri)
    if client is None:
        return None
    found = _job_search(client, job_id)
    return _summary(uri, found[0]) if found else None


def _job_search(client: Any, job_id: str) -> list[Any]:
    """The run tagged with ``job_id`` (a list of at most one)."""
    from playground.runs.tracking import _quoted

    return _search(client, None, f"tags.`{rs.TAG_JOB}` = '{_quoted(job_id)}'", max_results=1)


def job_run(job_id: str, *, uri: str | None = None) -> RunRecord | None:
    """Job ``job_id``'s run read back with MLflow's client: every metric's history, the parameters, the status and a
    link to MLflow's UI where one is reachable (None: no store, or no run with that job id)."""
    uri = uri or rs.store_uri()
    client = client_for(uri)
    if client is None:
        return None
    found = _job_search(client, job_id)
    if not found:
        return None
    run = found[0]
    curves = []
    for key in sorted(run.data.metrics):
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.step, m.timestamp))
        if len({m.step for m in history}) >= 2:
            curves.append(MetricCurve(key, [m.step for m in history], [m.value for m in history]))
    tags = run.data.tags
    return RunRecord(
        run_id=run.info.run_id,
        experiment_id=run.info.experiment_id,
        job_id=tags.get(rs.TAG_JOB, run.info.run_name or ""),
        blueprint=tags.get(rs.TAG_BLUEPRINT, ""),
        status=run.info.status,
        verdict=tags.get(rs.TAG_VERDICT, "unknown"),
        start_time=(run.info.start_time or 0) / 1000,
        end_time=run.info.end_time / 1000 if run.info.end_time else None,
        params=dict(sorted(run.data.params.items())),
        metrics=dict(run.data.metrics),
        curves=curves,
        link=ui_link(uri, run.info.experiment_id, run.info.run_id),
    )


def loss_curves(
    blueprint: str, *, exclude_job: str | None = None, limit: int = 3, uri: str | None = None
) -> list[Curve]:
    """The loss curves of the latest finished runs of ``blueprint`` (other than ``exclude_job``)."""
    uri = uri or rs.store_uri()
    client = client_for(uri)
    if client is None:
        return []
    curves = []
    for run in _search(client, blueprint, "attributes.status = 'FINISHED'", max_results=limit + 1):
        job_id = run.data.tags.get(rs.TAG_JOB, run.info.run_name or "")
        if job_id == exclude_job or len(curves) >= limit:
            continue
        history = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
        curves.append(Curve(job_id, run.info.run_id, [m.step for m in history], [m.value for m in history]))
    return curves


def check_blueprint_filter(blueprint: str | None, runs: list[RunSummary]) -> None:
    """``--blueprint ID`` must be a catalog blueprint or one that has runs."""
    if blueprint is None or runs:
        return
    from playground.blueprints import load_catalog

    catalog = load_catalog()
    if blueprint not in catalog:
        raise UserError(
            f"--blueprint {shown(blueprint)}: unknown blueprint with no runs; allowed: {', '.join(sorted(catalog))}",
            field="--blueprint",
        )


def age(seconds_since_epoch: float) -> str:
    seconds = max(0.0, time.time() - seconds_since_epoch)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"
