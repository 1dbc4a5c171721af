"""What several backends share, so that no backend imports another's internals: job ids, the check that this Python
can train, CPU quantities, and local paths told apart from URIs (``scheme://...``)."""

from __future__ import annotations

import os
import re
import secrets
import string
from pathlib import Path

from playground.errors import UserError
from playground.owner import Owner

TRAINER_PACKAGES = ("torch", "transformers", "peft")
_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits


def new_job_id(blueprint_id: str) -> str:
    """``<blueprint-id>-<5 random chars>``, a valid Kubernetes name (DNS-1035 label, ≤ 63 chars)."""
    prefix = re.sub(r"[^a-z0-9-]+", "-", blueprint_id.lower()).strip("-")
    if not prefix or not prefix[0].isalpha():
        prefix = f"job-{prefix}".rstrip("-")
    prefix = prefix[:57].rstrip("-")
    suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))
    return f"{prefix}-{suffix}"


def check_trainer_installed() -> None:
    """The trainer runs in this interpreter (the local backend, a local Ray): refuse, before anything starts, where
    it cannot (the slim ``playground e2e`` install of requirements/e2e.txt has no torch)."""
    import importlib.util

    for name in TRAINER_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UserError(
                f"the local backend trains in this Python environment, which lacks {name} (the slim e2e install?); "
                "allowed: the full install (pip install blueprint-playground) or --backend kubernetes",
                field="backend",
            )


def cpu_cores(quantity: str | None) -> float | None:
    """A Kubernetes CPU quantity ("2", "500m") as cores; None when unset or unreadable."""
    if not quantity:
        return None
    try:
        return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    except ValueError:
        return None


def is_uri(source: str) -> bool:
    """Whether a model or dataset source is a URI (``hf://``, ``scratch://``, ``pkg://``...), not a local path."""
    return "://" in source


def absolute_source(source: str | None) -> str | None:
    """A local path made absolute (the trainer runs elsewhere: a job dir, a Ray worker); URIs and None unchanged."""
    if not source or is_uri(source):
        return source
    return str(Path(source).expanduser().resolve())


def package_pythonpath() -> str:
    """``PYTHONPATH`` for a trainer started from this checkout (a job's process, a local Ray's workers): the
    directory holding the ``playground`` package first, then whatever the caller's ``PYTHONPATH`` holds."""
    import playground

    package_root = str(Path(playground.__file__).resolve().parents[1])
    return os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)


def run_env(job_id: str, backend: str, owner: Owner, home: Path | None) -> dict[str, str]:
    """What the trainer's MLflow run records (playground/runs): the job, its backend, the owner, and, with ``home``
    (a trainer on this machine), this home's SQLite store unless MLFLOW_TRACKING_URI names one (inherited, never
    written here)."""
    from playground.runs import settings as rs

    env = {rs.JOB_ID_ENV: job_id, rs.JOB_BACKEND_ENV: backend}
    if owner.id is not None:
        env[rs.JOB_OWNER_ENV] = owner.id
    if home is not None and not os.environ.get(rs.TRACKING_ENV):
        env[rs.TRACKING_ENV] = rs.default_tracking_uri(home)
    return env
