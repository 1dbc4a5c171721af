"""Where runs are tracked: ``MLFLOW_TRACKING_URI``, else a SQLite store under ``$PLAYGROUND_HOME``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from playground.paths import playground_home

TRACKING_ENV = "MLFLOW_TRACKING_URI"
DISABLE_ENV = "PLAYGROUND_MLFLOW"  # "0" / "off" / "false": jobs log no run
DB_FILENAME = "mlflow.db"
ARTIFACTS_DIRNAME = "mlartifacts"
_OFF = {"0", "off", "false", "no"}

# Tags every run carries (read back by `playground runs`, the app and `playground register`).
TAG_JOB = "playground.job_id"
TAG_BACKEND = "playground.backend"
TAG_OWNER = "playground.owner"
TAG_BLUEPRINT = "playground.blueprint"
TAG_MODEL_DIR = "playground.model_dir"
TAG_MODEL_URI = "playground.model_uri"
TAG_VERDICT = "playground.verdict"
TAG_QUALITY = "playground.quality"

# What a backend tells the trainer about its job (env of the trainer process / pod).
JOB_ID_ENV = "PLAYGROUND_JOB_ID"
JOB_BACKEND_ENV = "PLAYGROUND_JOB_BACKEND"
JOB_OWNER_ENV = "PLAYGROUND_JOB_OWNER"
MODEL_URI_ENV = "PLAYGROUND_MODEL_URI"


def default_tracking_uri(home: Path | None = None) -> str:
    """``sqlite:////abs/path/mlflow.db`` under ``home`` (default ``$PLAYGROUND_HOME``)."""
    return f"sqlite:///{(home or playground_home()).expanduser().resolve() / DB_FILENAME}"


def tracking_enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in _OFF


def store_uri(home: Path | None = None) -> str:
    """The run store: ``MLFLOW_TRACKING_URI``, else the default SQLite store (what is read and registered to)."""
    return os.environ.get(TRACKING_ENV) or default_tracking_uri(home)


def tracking_uri(home: Path | None = None) -> str | None:
    """The store new runs go to; None when tracking is switched off (``PLAYGROUND_MLFLOW=0``)."""
    return store_uri(home) if tracking_enabled() else None


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other stores)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: ``mlartifacts/`` beside a SQLite file; None (the
    server's default) for a tracking server."""
    db = sqlite_path(uri)
    return (db.parent / ARTIFACTS_DIRNAME).as_uri() if db is not None else None


def safe_uri(uri: str) -> str:
    """``uri`` without credentials (user:password@, query tokens), for messages and tags."""
    parts = urlsplit(uri)
    if not parts.netloc or ("@" not in parts.netloc and not parts.query):
        return uri
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def mlflow_ui_command(uri: str) -> str:
    """The command that browses ``uri``'s runs in MLflow's own UI (needs the full ``mlflow`` package)."""
    if sqlite_path(uri) is not None:
        return f"mlflow ui --backend-store-uri {uri}"
    return f"open {safe_uri(uri)}"


_USERINFO = re.compile(r"//[^/@\s]+@")


def scrub(text: str) -> str:
    """``text`` (an error message) with any ``user:password@`` of a URL in it removed."""
    return _USERINFO.sub("//", text)
