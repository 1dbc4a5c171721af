"""Local model servers: detached ``transformers serve`` processes recorded under ``$PLAYGROUND_HOME/servers``.

Each server is one process (``python -m playground.serving.server``) pinned to one model directory,
listening on ``127.0.0.1`` on a free port, or on the port asked for (``playground serve JOB --port N``).
Its record ``servers/<name>.json`` (pid, port, url, model dir, job id, kind, owner, log path) lets any
later process list and stop it; records whose process is gone are dropped when listed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from playground.booth import owns
from playground.errors import UserError, shown, shown_path
from playground.paths import ensure_writable_dir
from playground.processes import child_env, process_alive
from playground.serving.base import ModelServers, model_to_serve
from playground.types import Endpoint, Job

SERVER_MODULE = "playground.serving.server"
HOST = "127.0.0.1"
LOG_TAIL_LINES = 15
_PORT_RETRIES = 3
_children: dict[int, subprocess.Popen] = {}  # servers started by this process (reaped on stop)


def parse_port(value: object) -> int:
    """A port a server may listen on (1-65535), from an int or its text; a one-line UserError naming
    ``--port`` otherwise."""
    text = str(value).strip()
    port = int(text) if text.isascii() and text.isdecimal() else None
    if port is None or not 1 <= port <= 65535:
        raise UserError(f"--port must be a whole number from 1 to 65535, got {shown(value)}", field="--port")
    return port


def free_port(host: str = HOST) -> int:
    """A port nobody listens on right now (bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(port: int, host: str = HOST) -> bool:
    """Whether a server could not listen on ``port`` now (SO_REUSEADDR, as uvicorn binds: closed
    connections lingering in TIME_WAIT do not count, a listener does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie child of ours counts as gone, and is reaped)."""
    return process_alive(pid)


def _is_our_server(pid: int) -> bool:
    """Guard against pid reuse: on Linux the command line must be our server module."""
    return process_alive(pid, SERVER_MODULE)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The log's last meaningful lines (blank lines and traceback ``^^^`` markers skipped)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip(" ^~\t")][-lines:]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "model"


def _resolve_model(model_dir: str) -> tuple[str, bool]:
    """(what the server loads, whether it is a local directory). ``hf://org/name`` serves a hub id."""
    if model_dir.startswith("hf://"):
        return model_dir[len("hf://") :], False
    if model_dir.startswith("pkg://"):  # a packaged model: its converted directory (converted if needed)
        from playground.models.packaged import prepare_in_subprocess

        model_dir = str(prepare_in_subprocess(model_dir))
    if "://" in model_dir:
        raise UserError(
            f"cannot serve {shown_path(model_dir)} locally: give a model directory, hf://org/name or pkg://DIST/FILE",
            field="model",
        )
    path = Path(model_dir).expanduser().resolve()
    if "@" in str(path):
        raise UserError(f"model directory {str(path)!r} contains '@', which transformers reads as a revision")
    return str(path), True


class LocalServers(ModelServers):
    """Start, list and stop the local model servers recorded under ``home/servers`` (the local backend's home)."""

    name = "local"

    def __init__(self, home: Path | str) -> None:
        self.home = Path(home)
        self.dir = self.home / "servers"

    # -- the ModelServers interface --------------------------------------------------------------
    def serve(self, job: Job, *, base: bool = False, port: int | None = None) -> Endpoint:
        model = model_to_serve(job, base=base)
        kind = "base" if base else "fine-tuned"
        return self.start(model, job_id=job.id, kind=kind, owner=job.owner, port=port)

    def unserve(self, target: str, *, owner: str | None = None) -> None:
        if not self.stop(target, owner=owner):
            raise UserError(f"no local model server matches {target!r} (an endpoint URL, server name or job id)")

    def endpoints(self, *, owner: str | None = None) -> list[Endpoint]:
        return [e for e in self.list() if owns(e.owner, owner)]

    def stop_job(self, job_id: str) -> None:
        self.stop(job_id)

    # -- records -----------------------------------------------------------------------------
    def _records(self) -> list[dict[str, Any]]:
        if not self.dir.is_dir():
            return []
        records = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being written, or garbage
            if not _is_our_server(int(record.get("pid", 0))):
                path.unlink(missing_ok=True)
                continue
            records.append(record)
        return records

    def _write(self, record: dict[str, Any]) -> None:
        path = self.dir / f"{record['name']}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=2))
        os.replace(tmp, path)

    @staticmethod
    def _endpoint(record: dict[str, Any]) -> Endpoint:
        return Endpoint(
            url=record["url"],
            model=record["model"],
            job_id=record.get("job_id"),
            kind=record.get("kind", "fine-tuned"),
            backend="local",
            name=record["name"],
            owner=record.get("owner"),
        )

    def list(self) -> list[Endpoint]:
        """The servers that are up and answering (records of dead processes are dropped)."""
        return [self._endpoint(r) for r in self._records() if r.get("ready", True)]

    def records(self) -> list[dict[str, Any]]:
        """Every server's full record (pid, port, log path, model dir, ready...), starting ones included."""
        return self._records()

    # -- start -------------------------------------------------------------------------------
    def start(
        self,
        model_dir: str,
        *,
        job_id: str | None = None,
        kind: str = "fine-tuned",
        timeout: float = 180,
        port: int | None = None,
        name: str | None = None,
        owner: str | None = None,
    ) -> Endpoint:
        """Serve ``model_dir`` and wait until it answers; return its endpoint.

        Serving what is already served (same name and model) returns the running endpoint. ``port``: listen
        there (a port that is taken, or a running server of the same name on another port, is a one-line
        UserError naming ``--port``, and nothing starts); None: a free port. ``owner`` (the visitor owning
        the job) is recorded.
        """
        from playground.serving.validate import check_model_dir

        if port is not None:
            port = parse_port(port)
            if port_in_use(port) and not any(r.get("port") == port for r in self._records()):
                raise _port_taken(port)  # before anything is prepared or started
        model, local = _resolve_model(model_dir)
        if local:
            check_model_dir(model)
        if name is None:
            digest = hashlib.sha1(model.encode()).hexdigest()[:8]
            name = f"{job_id}-{kind}" if job_id else f"{Path(model).name}-{digest}"
        name = _slug(name)
        ensure_writable_dir(self.dir, what="server state directory")
        with _locked(self.dir / f".{name}.lock"):  # two callers serving the same thing get one server
            return self._start_locked(
                model, local, name, job_id=job_id, kind=kind, timeout=timeout, port=port, owner=owner
            )

    def _start_locked(
        self,
        model: str,
        local: bool,
        name: str,
        *,
        job_id: str | None,
        kind: str,
        timeout: float,
        port: int | None,
        owner: str | None = None,
    ) -> Endpoint:
        for record in self._records():
            if record["name"] == name:
                if record["model_dir"] != model:
                    raise UserError(f"a server named {name!r} already serves {record['model_dir']}; stop it first")
                if port is not None and record.get("port") != port:
                    raise UserError(
                        f"--port {port}: server {name} already serves {model} on port {record.get('port')}; "
                        f"stop it first (playground unserve {name}) or leave --port out",
                        field="--port",
                    )
                return self._endpoint(record)
        if port is not None and port_in_use(port):
            raise _port_taken(port)

        log_path = self.dir / f"{name}.log"
        for _attempt in range(_PORT_RETRIES):
            chosen = port if port is not None else free_port()
            proc = self._spawn(model, chosen, log_path, offline=local)
            record = {
                "name": name,
                "pid": proc.pid,
                "port": chosen,
                "url": f"http://{HOST}:{chosen}/v1",
                "model": model,
                "model_dir": model,
                "job_id": job_id,
                "kind": kind,
                "owner": owner,
                "log": str(log_path),
                "started_at": time.time(),
                "ready": False,
            }
            self._write(record)
            try:
                self._wait_ready(proc, record, timeout)
            except _PortTaken:
                self._forget(record)
                if port is not None:  # the port asked for was taken meanwhile: never another one
                    raise _port_taken(port) from None
                continue  # a free port taken meanwhile: another free one
            except BaseException:
                self._kill(proc.pid)
                self._forget(record)
                raise
            record["ready"] = True
            self._write(record)
            return self._endpoint(record)
        raise UserError(f"could not find a free port for the model server after {_PORT_RETRIES} tries")

    def _spawn(self, model: str, port: int, log_path: Path, *, offline: bool) -> subprocess.Popen:
        env = child_env(server=True)
        if offline:
            env["HF_HUB_OFFLINE"] = "1"  # a local directory needs nothing from the hub
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["PYTHONUNBUFFERED"] = "1"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", SERVER_MODULE, model, "--host", HOST, "--port", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # outlives the caller; a signal to its group reaches it alone
                close_fds=True,
            )
        _children[proc.pid] = proc
        return proc

    def _wait_ready(self, proc: subprocess.Popen, record: dict[str, Any], timeout: float) -> None:
        import httpx

        url, log_path = record["url"], Path(record["log"])
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = proc.poll()
                if code is not None:
                    lines = tail(log_path)
                    if any("address already in use" in line.lower() for line in lines):
                        raise _PortTaken
                    raise UserError(
                        f"model server for {record['model_dir']} exited with code {code} before it was ready; "
                        f"last log lines ({log_path}): " + " | ".join(lines[-5:])
                    )
                try:
                    health = client.get(url.removesuffix("/v1") + "/health")
                    models = client.get(url + "/models") if health.status_code == 200 else None
                    if models is not None and models.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise UserError(
                        f"model server for {record['model_dir']} was not ready after {timeout:g}s; "
                        f"last log lines ({log_path}): " + " | ".join(tail(log_path)[-5:])
                    )
                time.sleep(0.25)

    # -- stop --------------------------------------------------------------------------------
    def stop(self, target: str, *, owner: str | None = None) -> list[Endpoint]:
        """Stop the servers matching ``target``: an endpoint URL, a server name or a job id (all its servers).

        With ``owner``, only that owner's servers match (a visitor cannot stop another's).
        """
        wanted = target.strip().rstrip("/")
        matched = []
        for record in self._records():
            if owner is not None and record.get("owner") != owner:
                continue
            url = record["url"].rstrip("/")
            if wanted in (url, url.removesuffix("/v1"), record["name"], record.get("job_id")):
                matched.append(record)
        for record in matched:
            self._kill(int(record["pid"]))
            self._forget(record)
        return [self._endpoint(r) for r in matched]

    def stop_all(self) -> list[Endpoint]:
        records = self._records()
        for record in records:
            self._kill(int(record["pid"]))
            self._forget(record)
        return [self._endpoint(r) for r in records]

    def _forget(self, record: dict[str, Any]) -> None:
        (self.dir / f"{record['name']}.json").unlink(missing_ok=True)

    @staticmethod
    def _kill(pid: int, grace: float = 10.0) -> None:
        """SIGTERM the server's process group, SIGKILL after ``grace`` seconds; wait until it is gone."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            proc = _children.get(pid)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(wait)
            else:
                deadline = time.monotonic() + wait
                while pid_alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
            if not pid_alive(pid):
                _children.pop(pid, None)
                return


def _port_taken(port: int) -> UserError:
    return UserError(
        f"--port {port} is taken on {HOST} (another process listens there); choose another port, "
        "or leave --port out for a free one",
        field="--port",
    )


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive advisory lock on ``path`` (no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class _PortTaken(Exception):
    """The server lost the race for its port; start again on another."""
