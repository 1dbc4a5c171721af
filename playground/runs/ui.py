"""Where a run can be browsed in MLflow's own UI, from wherever the app runs.

A tracking server (``http(s)`` store) is linked as it is. A SQLite store has no server: its UI is ``mlflow
ui``, which needs the full ``mlflow`` package (its web server and UI files; the core install has only
``mlflow-skinny``). In a notebook pod (Kubeflow Notebooks, JupyterHub) ``127.0.0.1`` is the user's laptop,
so the UI is reached through the notebook server's own base URL: jupyter-server-proxy starts it on the first
visit of ``{base_url}mlflow/`` (:func:`jupyter_proxy_server`, this package's ``jupyter_serverproxy_servers``
entry point). Without what that needs, one line names the package to install instead of a dead link.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from playground.runs import settings as rs

PROXY_NAME = "mlflow"  # jupyter-server-proxy serves the UI at {base_url}mlflow/
LOCAL_PORT = 5000  # `mlflow ui`'s default port, outside a notebook pod
# The base URL of the notebook server, as the platforms set it: Kubeflow Notebooks (NB_PREFIX, e.g.
# /notebook/team-ml/my-notebook), JupyterHub (JUPYTERHUB_SERVICE_PREFIX, /user/NAME/), Voila's kernels (VOILA_BASE_URL).
BASE_URL_ENVS = ("NB_PREFIX", "JUPYTERHUB_SERVICE_PREFIX", "VOILA_BASE_URL")
INSTALL_MLFLOW = "install mlflow (the full package) to browse runs in MLflow's UI: pip install mlflow"
INSTALL_PROXY = (
    "install jupyter-server-proxy to browse runs in MLflow's UI through this notebook server: "
    "pip install jupyter-server-proxy, then restart the notebook server"
)


@dataclass(frozen=True)
class UiLink:
    """A run's page in MLflow's UI: ``url`` when one is reachable from the user's browser, else None and
    ``note`` says what to install; ``note`` otherwise says how the UI is started (may be empty)."""

    url: str | None
    note: str = ""

    def text(self) -> str:
        """One line: the URL (and how it is started), or what to install."""
        if self.url is None:
            return self.note
        return f"{self.url}  ({self.note})" if self.note else self.url


def full_mlflow_installed() -> bool:
    """The full ``mlflow`` package, with the UI's server (flask) and its built web files (mlflow-skinny has neither)."""
    try:
        importlib.metadata.distribution("mlflow")
        spec = importlib.util.find_spec("mlflow")
    except (importlib.metadata.PackageNotFoundError, ValueError, ImportError):
        return False
    if spec is None or spec.origin is None or importlib.util.find_spec("flask") is None:
        return False
    return (Path(spec.origin).parent / "server" / "js" / "build" / "index.html").is_file()


def server_proxy_installed() -> bool:
    return importlib.util.find_spec("jupyter_server_proxy") is not None


def notebook_base_url(env: Mapping[str, str] | None = None) -> str | None:
    """The notebook server's base URL (``/notebook/team-ml/my-notebook/``), from the variables the platforms set;
    None outside a notebook pod (a local Jupyter, a terminal)."""
    env = os.environ if env is None else env
    for name in BASE_URL_ENVS:
        value = env.get(name, "").strip()
        if value:
            return "/" + value.strip("/") + "/" if value.strip("/") else "/"
    return None


def run_fragment(experiment_id: str, run_id: str) -> str:
    return f"#/experiments/{experiment_id}/runs/{run_id}"


def ui_link(
    uri: str,
    experiment_id: str | None = None,
    run_id: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    mlflow_ui: bool | None = None,
    server_proxy: bool | None = None,
) -> UiLink:
    """Where the user's browser can open run ``run_id`` of store ``uri`` (without ids: the store's front page).
    ``mlflow_ui`` / ``server_proxy``: whether the full mlflow / jupyter-server-proxy are installed (default: look)."""
    fragment = run_fragment(experiment_id, run_id) if experiment_id and run_id else ""
    if uri.startswith(("http://", "https://")):
        return UiLink(f"{rs.safe_uri(uri).rstrip('/')}/{fragment}")
    if not (full_mlflow_installed() if mlflow_ui is None else mlflow_ui):
        return UiLink(None, INSTALL_MLFLOW)
    base = notebook_base_url(env)
    if server_proxy_installed() if server_proxy is None else server_proxy:
        note = "jupyter-server-proxy starts MLflow's UI on the first visit"
        return UiLink(f"{base or '/'}{PROXY_NAME}/{fragment}", note)
    if base is not None:  # a notebook pod: 127.0.0.1 would be the user's own machine
        return UiLink(None, INSTALL_PROXY)
    return UiLink(f"http://127.0.0.1:{LOCAL_PORT}/{fragment}", f"start it: {rs.mlflow_ui_command(uri)}")


def ui_command(uri: str, port: int | str) -> list[str]:
    """MLflow's UI on ``uri``, on 127.0.0.1:``port`` only (reached through the notebook server's authenticated proxy,
    which forwards the browser's Host and Origin: both allowed)."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--allowed-hosts",
        "*",
        "--cors-allowed-origins",
        "*",
    ]


def jupyter_proxy_server() -> dict:
    """jupyter-server-proxy's server process for ``{base_url}mlflow/``: MLflow's UI on the playground's store,
    started on the first visit (``{port}`` is filled in by jupyter-server-proxy)."""
    return {
        "command": ui_command(rs.store_uri(), "{port}"),
        "timeout": 180,  # `import mlflow` and its server start: over 60 s on a busy 2-core machine
        "absolute_url": False,
        "launcher_entry": {"title": "MLflow runs"},
    }
