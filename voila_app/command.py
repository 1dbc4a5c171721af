"""``playground app``: the Voila app (notebooks/playground.ipynb) with safe settings."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import playground
from playground.commands.setup import prepare_model
from playground.errors import UserError, shown

if TYPE_CHECKING:
    from voila_app.limits import Limits

APP_NOTEBOOK = "playground.ipynb"
BOOTH_MAX_KERNELS = 16  # ~165 MB per visitor kernel: 16 fit a 4 GB app budget with the Voila server
BOOTH_CULL_SECONDS = 60  # a kernel whose browser left is culled after this (even while its job trains)
BOOTH_PREHEAT = 1  # warm kernels: a page load takes one instead of waiting ~2 s for a kernel and the app imports


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
    booth_max_kernels: int | None = None,
    booth_limits: Limits | None = None,
    booth_preheat: int = BOOTH_PREHEAT,
) -> list[str]:
    """The Voila command line: sources stripped, no tracebacks to visitors, idle kernels culled.

    ``booth_max_kernels`` turns on booth mode: Voila as :mod:`voila_app`'s ``BoothVoila`` (kernel routes
    only for their visitor, bounded websocket frames and message rate, a rate limit on new visitors, plain 404s) with
    ``booth_limits``, the visitor-cookie hook and the capped kernel manager (its ``voila.py`` config
    file), ``booth_preheat`` warm kernels (the app imported before anyone comes), faster culling.
    """
    from voila_app import CONFIG_DIR, TEMPLATE
    from voila_app.limits import Limits

    booth = booth_max_kernels is not None
    command = [
        sys.executable,
        "-m",
        "voila_app" if booth else "voila",
        str(notebook),
        f"--port={port}",
        "--Voila.port_retries=0",  # the port printed is the port served: we pick a free one first
        f"--Voila.ip={ip}",
        "--strip_sources=True",
        "--show_tracebacks=False",
        "--theme=light",
        f"--template={TEMPLATE}",  # voila_app's template: a page title, no stylesheets from a CDN
        f"--MappingKernelManager.cull_idle_timeout={cull_idle_seconds}",
        f"--MappingKernelManager.cull_interval={30 if booth else 60}",
        "--MappingKernelManager.cull_connected=False",
    ]
    if booth:
        command += [f"--Voila.config_file_paths={CONFIG_DIR}", f"--BoothKernelManager.max_kernels={booth_max_kernels}",
                    f"--BoothVoila.preheat_kernels={booth_preheat}"]  # fmt: skip
        bounds = booth_limits or Limits()
        command += [
            f"--BoothVoila.new_visitors_per_minute={bounds.new_visitors_per_minute:g}",
            f"--BoothVoila.new_visitors_burst={bounds.new_visitors_burst}",
            f"--BoothVoila.websocket_max_bytes={bounds.websocket_max_bytes}",
            f"--BoothVoila.websocket_messages_burst={bounds.websocket_messages_burst}",
            f"--BoothVoila.websocket_messages_per_second={bounds.websocket_messages_per_second:g}",
        ]
        if bounds.trusted_proxies:
            command.append(f"--BoothVoila.trusted_proxies={','.join(str(n) for n in bounds.trusted_proxies)}")
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
        raise UserError(f"--backend {shown(args.backend)}: allowed: {', '.join(BACKENDS)}", field="--backend")
    notebooks = notebooks_dir()
    if args.blueprint:
        from playground.blueprints import get_blueprint

        get_blueprint(args.blueprint)  # unknown ids: one line listing the known ones
    env = app_environment(args, notebooks.parent)
    limits = booth_limits(args, env) if args.booth else None  # bad flags: one line, before anything is prepared
    from voila_app import SHARE_DIR

    env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(SHARE_DIR), env.get("JUPYTER_PATH", "")) if p)
    if args.booth:
        env.update(booth_environment(args, env))
    from playground.commands.doctor import check_in_background

    check_in_background()  # the stack's fast check; its problems print when known, the app starts meanwhile
    if prepare_model(env["PLAYGROUND_BLUEPRINT"]) is not None and env.get("PLAYGROUND_BACKEND", "local") == "local":
        warm_base_model(env["PLAYGROUND_BLUEPRINT"])  # in the background: the page does not wait for it
        start_base_server(env["PLAYGROUND_BLUEPRINT"], env)  # likewise: visitors' Serve only loads adapters
    port = first_free_port(args.ip, args.port)
    if port != args.port:
        print(f"port {args.port} is in use; using {port}", flush=True)
    command = voila_command(
        notebooks / APP_NOTEBOOK,
        port=port,
        ip=args.ip,
        open_browser=not args.no_browser,
        cull_idle_seconds=args.booth_cull_seconds if args.booth else 600,
        booth_max_kernels=args.booth_max_kernels if args.booth else None,
        booth_limits=limits,
        booth_preheat=args.booth_preheat,
    )
    print(f"Blueprint Playground on http://{args.ip}:{port}/  (Ctrl-C stops it)", flush=True)
    os.chdir(notebooks)
    os.execvpe(command[0], command, env)  # Voila takes over this process (signals, exit code)
    return 0  # pragma: no cover


def warm_base_model(blueprint_id: str) -> Path:
    """Ask the preselected blueprint's base model its held-out questions now, in a detached background process
    (``python -m playground.train.warm``), so that no visitor's first Launch waits for them (SmolLM2: 50 questions,
    ~20-56 s on 2 cores, once per model and question set; known already: ~6 s of imports). Returns its log file."""
    command = [sys.executable, "-m", "playground.train.warm", "--blueprint", blueprint_id]
    log_path = _detached(command, "warm-base-model.log", {"HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"})
    print(f"asking {blueprint_id}'s base model its held-out questions in the background (log: {log_path})",
          file=sys.stderr, flush=True)  # fmt: skip
    return log_path


def start_base_server(blueprint_id: str, environ: dict[str, str]) -> Path:
    """Start the preselected blueprint's base model server (vLLM, LoRA on) in a detached background process
    (``python -m playground.serving.warm``) with the app's environment (home, booth policy), before the first visitor
    asks: a visitor's Serve then only loads an adapter. Returns its log file."""
    command = [sys.executable, "-m", "playground.serving.warm", blueprint_id]
    log_path = _detached(command, "base-server.log", {"HF_HUB_OFFLINE": "1"}, environ=environ)
    print(f"starting {blueprint_id}'s base model server in the background (log: {log_path})", file=sys.stderr,
          flush=True)  # fmt: skip
    return log_path


def _detached(command: list[str], log_name: str, extra: dict[str, str], environ: dict[str, str] | None = None) -> Path:
    """Run ``command`` as a grandchild in its own session (Voila, which replaces this process, never has to reap
    it), its output in ``$PLAYGROUND_HOME/<log_name>``; never with the booth secret."""
    from playground.paths import playground_home
    from playground.processes import child_env

    home = playground_home()
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / log_name
    env = child_env(extra, environ=environ)
    with open(log_path, "w") as log:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child only forks again and exits
            try:
                os.setsid()
                if os.fork() == 0:
                    os.dup2(log.fileno(), 1)
                    os.dup2(log.fileno(), 2)
                    os.execvpe(command[0], command, env)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    return log_path


def booth_environment(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """What booth mode adds to the environment of Voila and its kernels (the engine's booth policy reads it)."""
    for flag, value, low, high in (
        ("--booth-max-kernels", args.booth_max_kernels, 1, 1000),
        ("--booth-cull-seconds", args.booth_cull_seconds, 30, 86400),
        ("--booth-preheat", args.booth_preheat, 0, 8),
    ):
        if not low <= value <= high:
            raise UserError(f"{flag} {value}: allowed: an integer from {low} to {high}", field=flag)
    from playground.paths import playground_home
    from voila_app.identity import SECRET_ENV, IdentityError, booth_secret

    try:
        secret = booth_secret(playground_home(), environ)
    except IdentityError as exc:
        raise UserError(str(exc), field=SECRET_ENV) from None
    from importlib.metadata import version

    from voila_app import PLOTLY_BUNDLE_ENV, PLOTLY_BUNDLE_PATH

    # the chart's front end from BoothVoila's cacheable route, not ~5 MB of widget state over every page's websocket
    bundle = f"{PLOTLY_BUNDLE_PATH}?v={version('plotly')}"
    return {"PLAYGROUND_BOOTH": "1", SECRET_ENV: secret, PLOTLY_BUNDLE_ENV: bundle}


def booth_limits(args: argparse.Namespace, environ: dict[str, str]) -> Limits:
    """The Voila server's booth limits: the flags, else their ``PLAYGROUND_BOOTH_*`` variables, else defaults."""
    from voila_app.limits import SettingError, limits_from

    try:
        return limits_from(
            environ,
            per_minute=args.booth_new_visitors_per_minute,
            burst=args.booth_new_visitors_burst,
            trusted_proxies=args.booth_trusted_proxy,
            websocket_max_bytes=args.booth_websocket_max_bytes,
            messages_burst=args.booth_websocket_messages_burst,
            messages_per_second=args.booth_websocket_messages_per_second,
        )
    except SettingError as exc:
        raise UserError(str(exc), field=exc.field) from None


def first_free_port(ip: str, start: int, tries: int = 20) -> int:
    """``start`` when nothing listens there, else the next free port above it (deterministic, unlike
    Voila's own retries, which jump to random ports and leave the printed URL wrong)."""
    from playground.serving.local import port_in_use

    for port in range(start, min(start + tries, 65536)):
        if not port_in_use(port, ip):
            return port
    last = min(start + tries, 65536) - 1
    message = f"--port {start}: ports {start} to {last} are all in use on {ip}; choose another --port"
    raise UserError(message, field="--port")


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``playground app`` to the CLI."""
    from voila_app.limits import (
        NEW_VISITORS_BURST,
        NEW_VISITORS_BURST_ENV,
        NEW_VISITORS_PER_MINUTE,
        NEW_VISITORS_PER_MINUTE_ENV,
        TRUSTED_PROXIES_ENV,
        WEBSOCKET_MAX_BYTES,
        WEBSOCKET_MAX_BYTES_ENV,
        WEBSOCKET_MESSAGES_BURST,
        WEBSOCKET_MESSAGES_BURST_ENV,
        WEBSOCKET_MESSAGES_PER_SECOND,
        WEBSOCKET_MESSAGES_PER_SECOND_ENV,
    )

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
    booth = parser.add_argument_group("booth mode (strangers in a browser; see README 'Run a booth')")
    booth.add_argument(
        "--booth",
        action="store_true",
        help="visitors own their jobs (signed cookie), per-visitor quotas, a kernel cap, fast culling",
    )
    booth.add_argument(
        "--booth-max-kernels",
        type=int,
        default=BOOTH_MAX_KERNELS,
        help=f"live visitor kernels at most; beyond: a 'booth is full' page (default {BOOTH_MAX_KERNELS})",
    )
    booth.add_argument(
        "--booth-cull-seconds",
        type=int,
        default=BOOTH_CULL_SECONDS,
        help=f"free a kernel this long after its browser left (default {BOOTH_CULL_SECONDS})",
    )
    booth.add_argument(
        "--booth-preheat",
        type=int,
        default=BOOTH_PREHEAT,
        metavar="N",
        help=f"warm kernels kept ready (the app loaded before anyone comes: page → cards without a kernel start; "
        f"~150 MB each; they count toward --booth-max-kernels; 0: none) (default {BOOTH_PREHEAT})",
    )
    booth.add_argument(
        "--booth-new-visitors-per-minute",
        metavar="N",
        default=None,
        help=f"new visitor cookies a minute per client address, beyond the burst; more: a 'one moment' page "
        f"(HTTP 429) (default {NEW_VISITORS_PER_MINUTE:g}; env {NEW_VISITORS_PER_MINUTE_ENV})",
    )
    booth.add_argument(
        "--booth-new-visitors-burst",
        metavar="N",
        default=None,
        help=f"new visitor cookies per client address at once (default {NEW_VISITORS_BURST}; env "
        f"{NEW_VISITORS_BURST_ENV})",
    )
    booth.add_argument(
        "--booth-trusted-proxy",
        metavar="IP[,IP]",
        default=None,
        help="reverse proxies (addresses or CIDR networks) whose X-Forwarded-For names the client (default: "
        f"none, the socket's peer is the client; env {TRUSTED_PROXIES_ENV})",
    )
    booth.add_argument(
        "--booth-websocket-max-bytes",
        metavar="N",
        default=None,
        help=f"largest websocket frame from a browser; a bigger one closes that connection (default "
        f"{WEBSOCKET_MAX_BYTES}; env {WEBSOCKET_MAX_BYTES_ENV})",
    )
    booth.add_argument(
        "--booth-websocket-messages-burst",
        metavar="N",
        default=None,
        help=f"websocket messages from browsers per kernel at once; one over the rate closes that connection "
        f"(default {WEBSOCKET_MESSAGES_BURST}; env {WEBSOCKET_MESSAGES_BURST_ENV})",
    )
    booth.add_argument(
        "--booth-websocket-messages-per-second",
        metavar="N",
        default=None,
        help=f"websocket messages a second per kernel after the burst; a new connection takes a second's worth "
        f"(default {WEBSOCKET_MESSAGES_PER_SECOND:g}; env {WEBSOCKET_MESSAGES_PER_SECOND_ENV})",
    )
    parser.set_defaults(func=cmd_app)
