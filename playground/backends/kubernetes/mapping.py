"""A TrainJob (and its pods) → the common :class:`~playground.types.Job`, read through the Trainer's typed API models
(``kubeflow_trainer_api`` ``from_dict``, as the Kubeflow SDK reads TrainJobs). The phase rules that also read pods
and live watch objects stay in :mod:`.status`."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from playground.backends.kubernetes.status import cluster_phase, trainer_progress
from playground.cluster import manifests as m
from playground.cluster.manifests import blueprint_id
from playground.errors import BackendError
from playground.events import EVENT_PREFIX, JobPhase
from playground.types import Job

BACKEND = "kubernetes"


def typed(obj: dict[str, Any]) -> Any:
    """The TrainJob as ``TrainerV1alpha1TrainJob``; a one-line BackendError for one the API models cannot read."""
    from kubeflow_trainer_api import models
    from pydantic import ValidationError

    try:
        return models.TrainerV1alpha1TrainJob.from_dict(obj)
    except ValidationError as exc:
        name = (obj.get("metadata") or {}).get("name", "?")
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BackendError(f"TrainJob {name!r} is not readable: {where}: {first['msg']}") from None


def seconds(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def finished_at(trainjob: Any) -> float | None:
    """When the TrainJob's Complete or Failed condition turned true."""
    found = None
    for condition in (trainjob.status.conditions if trainjob.status else None) or []:
        if condition.type in ("Complete", "Failed") and condition.status == "True":
            found = seconds(condition.last_transition_time)
    return found


def to_job(obj: dict[str, Any], pods: list[dict[str, Any]] | None, tail: list[str] | None = None) -> Job:
    """The Job a TrainJob is: phase (with its pods), progress and metrics (``status.trainerStatus``), the model
    directory once Succeeded, and the last log lines of a failed one (``tail``)."""
    trainjob = typed(obj)
    meta = trainjob.metadata
    labels, annotations = meta.labels or {}, meta.annotations or {}
    phase, reason = cluster_phase(obj, pods or [])
    starts = [(p.get("status") or {}).get("startTime") for p in pods or []]
    progress, metrics = trainer_progress(obj)
    log_tail = list(tail or [])
    message = reason
    plain = [line for line in log_tail if EVENT_PREFIX not in line]
    if phase == JobPhase.FAILED and plain:
        message = f"{reason}; last log line: {plain[-1]}"
    ended = finished_at(trainjob)
    ttl = annotations.get(m.ANN_TTL)  # set at submit (booth mode, or the option)
    try:
        params = json.loads(annotations.get(m.ANN_PARAMS, "{}"))
    except ValueError:
        params = {}
    return Job(
        id=meta.name or "",
        blueprint_id=blueprint_id(labels),
        backend=BACKEND,
        phase=phase,
        params=params,
        created_at=seconds(meta.creation_timestamp) or time.time(),
        started_at=min((s for s in (_iso(t) for t in starts) if s), default=None),
        finished_at=ended,
        message=message,
        progress=progress,
        metrics={k: v for k, v in metrics.items() if k.startswith("eval")},
        model_dir=annotations.get(m.ANN_OUTPUT) if phase == JobPhase.SUCCEEDED else None,
        base_model=annotations.get(m.ANN_BASE),
        log_tail=log_tail,
        labels={k[len(m.LABEL_PREFIX) :]: v for k, v in labels.items() if k.startswith(m.LABEL_PREFIX)},
        owner=annotations.get(m.ANN_OWNER),
        expires_at=ended + int(ttl) if ttl is not None and ended is not None else None,
    )


def _iso(text: str | None) -> float | None:
    """A pod's RFC 3339 time (pods are read as plain JSON)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
