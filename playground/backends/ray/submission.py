"""Submitting a Ray job (the ``ray`` backend): Ray's refusal while its job agent starts, tried again; the runtime
environment the trainer gets from the submitter's."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from playground.backends.common import package_pythonpath, run_env
from playground.backends.ray import cluster as rc
from playground.owner import Owner

# Ray's head refuses a submission ("No available agent to submit job, please try again later.") while its node's
# job agent has not registered yet: it waits only 10 s for it, and a freshly started Ray on a loaded machine
# needs longer. Nothing was submitted then, so the same submission is tried again, up to AGENT_WAIT seconds.
AGENT_NOT_READY = "No available agent to submit job"
AGENT_WAIT = rc.START_TIMEOUT
AGENT_RETRY_INTERVAL = 1.0
# What a Ray job's trainer gets from the submitter's environment: offline switches, caches, tracking. Never a
# token: the runtime env is stored by Ray and shown by its dashboard (a remote cluster's nodes carry their own).
JOB_ENV_PREFIXES = ("HF_HUB_", "HF_DATASETS_", "TRANSFORMERS_", "TOKENIZERS_", "PLAYGROUND_TRAIN_", "OMP_")
JOB_ENV_NAMES = frozenset(
    {"HF_HOME", "PLAYGROUND_GPU_COUNT", "PLAYGROUND_MLFLOW", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"}
)


def submit_when_agent_ready(client: Any, job: dict[str, Any], *, wait: float = AGENT_WAIT) -> str:
    """``client.submit_job(**job)``, tried again while the head has no job agent yet, for up to ``wait`` seconds
    (Ray's refusal then is "please try again later" and nothing was submitted); Ray's submission id."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return client.submit_job(**job)
        except Exception as exc:
            if AGENT_NOT_READY not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(AGENT_RETRY_INTERVAL)


def job_env(job_id: str, backend: str, owner: Owner, local_home: Path | None) -> dict[str, str]:
    """The trainer's environment variables: the allowed ones of the submitter's, Ray's logging settings, the run's
    (:func:`~playground.backends.common.run_env`); for the local Ray (``local_home``) this checkout on the
    ``PYTHONPATH`` and the home's tracking store."""
    env = {k: v for k, v in os.environ.items() if k in JOB_ENV_NAMES or k.startswith(JOB_ENV_PREFIXES)}
    env.update(
        PYTHONUNBUFFERED="1",
        RAY_DEDUP_LOGS="0",
        RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0",
        RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING="0",
    )
    # Ray Train's workers load torch (libgomp) before the trainer's own setdefault can act: sleeping, not
    # spinning, OpenMP waits must be in their environment (playground/train/__init__.py says why)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.update(run_env(job_id, backend, owner, local_home))
    if local_home is not None:
        env["PYTHONPATH"] = package_pythonpath()
    return env
