"""``playground app``: the Voila app (notebooks/playground.ipynb) with safe settings."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import playground
from playground.errors import UserError

APP_NOTEBOOK = "playground.ipynb"


def notebooks_dir() -> Path:
    """Where the notebooks live: ``$PLAYGROUND_NOTEBOOKS``, the repo checkout, or ``./notebooks``."""
    candidates = []
    if os.environ.get("PLAYGROUND_NOTEBOOKS"):
        candidates.append(Path(os.environ["PLAYGROUND_NOTEBOOKS"]).expanduser())
    candidates.append(Path(playground.__file__).resolve().parents[1] / "notebooks")  # repo / editable install
    candidates.append(Path.cwd() / "notebooks")
    for path in candidates:
        if (path / APP_NOTEBOOK).is_file():
            return path.resolve()
    tried = ", ".join(str(p) for p in candidates)
    raise UserError(
        f"cannot find notebooks/{APP_NOTEBOOK} (tried {tried}); run from a checkout of the repository "
        "or set PLAYGROUND_NOTEBOOKS",
        field="notebooks",
    )


def voila_command(
    notebook: Path,
    *,
    port: int,
    ip: str,
    open_browser: bool,
    cull_idle_seconds: int = 600,
) -> list[str]:
    """The Voila command line: sources stripped, no tracebacks to visitors, idle kernels culled."""
    command = [
        sys.executable,
        "-m",
        "voila",
        str(notebook),
        f"--port={port}",
        f"--Voila.ip={ip}",
        "--strip_sources=True",
        "--show_tracebacks=False",
        "--theme=light",
        f"--MappingKernelManager.cull_idle_timeout={cull_idle_seconds}",
        "--MappingKernelManager.cull_interval=60",
        "--MappingKernelManager.cull_connected=False",
    ]
    if not open_browser:
        command.append("--no-browser")
    return command


def app_environment(args: argparse.Namespace, repo_root: Path) -> dict[str, str]:
    """Voila's environment: the repo importable, the backend, and the preselected blueprint
    (``--blueprint``, else ``$PLAYGROUND_BLUEPRINT``, else the embedded default)."""
    from playground.api import DEFAULT_BLUEPRINT

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root), env.get("PYTHONPATH", "")) if p)
    if args.backend:
        env["PLAYGROUND_BACKEND"] = args.backend
    env["PLAYGROUND_BLUEPRINT"] = args.blueprint or env.get("PLAYGROUND_BLUEPRINT") or DEFAULT_BLUEPRINT
    return env


def cmd_app(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UserError(f"--port {args.port}: allowed: 1 to 65535", field="--port")
    if shutil.which("voila") is None and not _has_module("voila"):
        raise UserError("voila is not installed; allowed: pip install voila", field="voila")
    from playground.backends import BACKENDS

    if args.backend and args.backend not in BACKENDS:
        raise UserError(f"--backend {args.backend!r}: allowed: {', '.join(BACKENDS)}", field="--backend")
    notebooks = notebooks_dir()
    if args.blueprint:
        from playground.blueprints import get_blueprint

        get_blueprint(args.blueprint)  # unknown ids: one line listing the known ones
    env = app_environment(args, notebooks.parent)
    command = voila_command(notebooks / APP_NOTEBOOK, port=args.port, ip=args.ip, open_browser=not args.no_browser)
    print(f"Blueprint Playground on http://{args.ip}:{args.port}/  (Ctrl-C stops it)", flush=True)
    os.chdir(notebooks)
    os.execvpe(command[0], command, env)  # Voila takes over this process (signals, exit code)
    return 0  # pragma: no cover


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``playground app`` to the CLI."""
    parser = subparsers.add_parser(
        "app",
        help="open the Voila app (pick a blueprint, train, watch, serve, chat)",
        description="Serve notebooks/playground.ipynb with Voila: sources stripped, no tracebacks shown to "
        "visitors, localhost only unless --ip says otherwise, idle kernels culled.",
    )
    parser.add_argument("--port", type=int, default=8866, help="port (default 8866)")
    parser.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine only)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a web browser")
    parser.add_argument("--backend", default=None, help="local (default) or kubernetes; env PLAYGROUND_BACKEND")
    parser.add_argument(
        "--blueprint",
        default=None,
        help="preselect this blueprint (default: smollm2-135m-lora-kubectl; env PLAYGROUND_BLUEPRINT)",
    )
    parser.set_defaults(func=cmd_app)
