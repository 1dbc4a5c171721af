"""Local model servers: detached ``transformers serve`` processes recorded under ``$PLAYGROUND_HOME/servers``.

Each server is one process (``python -m playground.serving.server``) pinned to one model directory,
listening on ``127.0.0.1`` on a free port, or on the port asked for (``playground serve JOB --port N``).
Its record ``servers/<name>.json`` (pid, port, url, model dir, job id, kind, owner, log path) lets any
later process list and stop it; records whose process is gone are dropped when listed. The server
touches ``servers/<name>.used`` at every chat request: its modification time is the server's last use.

Booth mode (a :class:`~playground.booth.BoothPolicy`, for jobs with an owner): the base model is served by
one *shared* server per base model (owned by nobody; its record lists the visitors using it, each sees it
as theirs, and only the operator stops it); a visitor has at most one fine-tuned server (serving another
job stops the previous one); at most ``max_servers`` servers run (beyond it the least recently used
visitor's fine-tuned server idle for ``server_evict_idle_seconds`` is stopped, else a one-line UserError
and nothing starts); :meth:`LocalServers.stop_idle` stops servers idle for ``server_idle_seconds`` and
the fine-tuned servers of visitors gone for ``visitor_gone_seconds``.
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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from playground.booth import SETTINGS, BoothPolicy, owns, visitor_gone
from playground.errors import UserError, shown, shown_path
from playground.paths import ensure_writable_dir
from playground.processes import child_env, process_alive
from playground.serving.base import ModelServers, ServerInfo, model_to_serve
from playground.types import Endpoint, Job

SERVER_MODULE = "playground.serving.server"
HOST = "127.0.0.1"
LOG_TAIL_LINES = 15
_PORT_RETRIES = 3
START_TIMEOUT = 180.0  # seconds a starting server may take to answer; PLAYGROUND_SERVER_START_TIMEOUT overrides it


def start_timeout() -> float:
    """Seconds a starting model server may take to answer: ``PLAYGROUND_SERVER_START_TIMEOUT`` (a big model read
    from a slow disk, or a loaded machine, takes longer than the default 180)."""
    value = os.environ.get("PLAYGROUND_SERVER_START_TIMEOUT", "").strip()
    if not value:
        return START_TIMEOUT
    from playground.blueprints.schema import parse_number

    try:
        seconds = float(parse_number(value, integer=False))  # the one parser: ASCII digits, no inf/nan
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < 86_400:
        raise UserError(
            f"PLAYGROUND_SERVER_START_TIMEOUT={shown(value)} is not valid "
            "(allowed: seconds, more than 0 and under 86400)",
            field="PLAYGROUND_SERVER_START_TIMEOUT",
        )
    return seconds


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


LOG_CAUSE_CHARS = 256_000  # of a dead server's log read for its traceback


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The log's last meaningful lines (blank lines and traceback ``^^^`` markers skipped)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip(" ^~\t")][-lines:]


def _exited_early(model_dir: str, code: int, log_path: Path, lines: list[str]) -> str:
    """Why a server died before it was ready: the innermost cause of its traceback (with the fix where one is
    known), else its last log lines; the log file keeps the frames."""
    from playground.diagnostics import explain_log

    try:
        cause = explain_log(log_path.read_text(errors="replace")[-LOG_CAUSE_CHARS:])
    except OSError:
        cause = None
    head = f"model server for {model_dir} exited with code {code} before it was ready"
    if cause:
        return f"{head}: {cause} (log: {log_path})"
    return f"{head}; last log lines ({log_path}): " + " | ".join(lines[-5:])


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

    def __init__(self, home: Path | str, policy: BoothPolicy | None = None) -> None:
        self.home = Path(home)
        self.dir = self.home / "servers"
        self.policy = policy  # booth mode: shared base servers, one fine-tuned server per visitor, the cap, idle TTL

    # -- the ModelServers interface --------------------------------------------------------------
    def serve(self, job: Job, *, base: bool = False, port: int | None = None) -> Endpoint:
        model = model_to_serve(job, base=base)
        visitor = self.policy is not None and job.owner is not None
        if visitor and base:
            return self._serve_shared_base(job, model)
        if visitor:  # one fine-tuned server per visitor: their previous one makes room for this one
            for record in self._records():
                mine = record.get("owner") == job.owner and record.get("kind") == "fine-tuned"
                if mine and record.get("job_id") != job.id:
                    self._stop_record(record)
        kind = "base" if base else "fine-tuned"
        return self.start(model, job_id=job.id, kind=kind, owner=job.owner, port=port, capped=visitor)

    def unserve(self, target: str, *, owner: str | None = None) -> None:
        stopped = self.stop(target, owner=owner)
        left = self._leave_shared(target, owner)
        if not stopped and not left:
            raise UserError(f"no local model server matches {target!r} (an endpoint URL, server name or job id)")

    def endpoints(self, *, owner: str | None = None) -> list[Endpoint]:
        """The ready servers (``owner``'s: their own, and the shared base servers they use, shown as theirs)."""
        result = []
        for record in self._records():
            if not record.get("ready", True):
                continue
            endpoint = self._endpoint(record)
            if record.get("shared") and owner is not None:
                job_id = (record.get("users") or {}).get(owner)
                if job_id is not None:
                    result.append(replace(endpoint, job_id=job_id, owner=owner))
            elif owns(endpoint.owner, owner):
                result.append(endpoint)
        return result

    def stop_job(self, job_id: str) -> None:
        self.stop(job_id)
        self._leave_shared(job_id, None)

    # -- booth mode: the shared base servers ---------------------------------------------------------
    def _serve_shared_base(self, job: Job, model: str) -> Endpoint:
        """The one server of ``model`` every visitor shares (started if none runs), with ``job.owner`` as a user."""
        digest = hashlib.sha1(model.encode()).hexdigest()[:8]
        name = f"shared-base-{_slug(Path(model.split('://')[-1]).name)}-{digest}"
        for _attempt in range(2):  # stopped between start and join (idle cleanup, the operator): start again
            batch = self.policy.shared_server_batch_tokens if self.policy is not None else 0
            endpoint = self.start(model, kind="base", name=name, capped=True, shared=True, batch_tokens=batch)
            with self._servers_lock():
                record = next((r for r in self._records() if r["name"] == endpoint.name), None)
                if record is None:
                    continue
                record.setdefault("users", {})[job.owner] = job.id  # one entry per visitor: their latest job
                self._write(record)
            self._mark_used(record)
            return replace(endpoint, job_id=job.id, owner=job.owner)
        raise UserError("the shared base model server stopped while starting; try again", field="job")

    def _leave_shared(self, target: str, owner: str | None) -> bool:
        """Take users off the shared servers: ``owner`` (None: any) whose job is ``target``, or every one of
        ``owner``'s uses of a shared server named by ``target`` (its URL or name). The servers keep running."""
        wanted = target.strip().rstrip("/")

        def leaves(record: dict[str, Any], user: str, job_id: str) -> bool:
            names_it = wanted in (record["url"].rstrip("/"), record["url"].removesuffix("/v1"), record["name"])
            return (owner is None or user == owner) and (names_it or job_id == wanted)

        return self._drop_shared_users(leaves)

    def _drop_shared_users(self, drop: Callable[[dict[str, Any], str, str], bool]) -> bool:
        """Take the users for whom ``drop(record, user, job_id)`` holds off the shared servers' user lists, under
        the servers lock (the servers keep running); whether any left."""
        if not any(record.get("shared") and record.get("users") for record in self._records()):
            return False  # nothing shared (outside booth mode, always): no lock taken, no file written
        left = False
        with self._servers_lock():
            for record in self._records():
                users = record.get("users") or {}
                if not record.get("shared") or not users:
                    continue
                keep = {user: job_id for user, job_id in users.items() if not drop(record, user, job_id)}
                if keep != users:
                    record["users"] = keep
                    self._write(record)
                    left = True
        return left

    # -- booth mode: the cap, idle servers, memory ------------------------------------------------------
    @contextlib.contextmanager
    def _servers_lock(self):
        """Serialises admission (count, make room, start) and the shared servers' user lists across processes."""
        ensure_writable_dir(self.dir, what="server state directory")
        with _locked(self.dir / ".servers.lock"):
            yield

    def _make_room(self) -> None:
        """At the cap, stop the least recently used visitor's fine-tuned servers idle long enough to make room
        for one more, else raise the one-line 'busy' error (nothing stopped, nothing starts)."""
        assert self.policy is not None
        records = self._records()
        cap = self.policy.max_servers
        need = len(records) - cap + 1
        if need <= 0:
            return
        now = time.time()
        idle_enough = [
            r
            for r in records
            if r.get("kind") == "fine-tuned"
            and r.get("owner") is not None
            and r.get("ready", True)
            and now - self._last_used(r) >= self.policy.server_evict_idle_seconds
        ]
        if len(idle_enough) < need:
            setting = SETTINGS["max_servers"]
            raise UserError(f"all {cap} model servers are busy; try again in a few minutes ({setting})", field=setting)
        for record in sorted(idle_enough, key=self._last_used)[:need]:
            self._stop_record(record)

    def _usage_path(self, name: str) -> Path:
        return self.dir / f"{name}.used"

    def _mark_used(self, record: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            self._usage_path(record["name"]).touch()

    def _last_used(self, record: dict[str, Any]) -> float:
        """When the server last had a chat request (the server touches its usage file), else when it started."""
        try:
            return self._usage_path(record["name"]).stat().st_mtime
        except OSError:
            return float(record.get("started_at") or 0.0)

    def stop_idle(self, *, now: float | None = None) -> list[Endpoint]:
        """Booth mode: stop the servers with no chat request for ``server_idle_seconds``, and the fine-tuned servers
        of visitors gone for ``visitor_gone_seconds`` (their kernel stopped showing presence). Starting servers
        are left alone. Outside booth mode nothing stops."""
        if self.policy is None:
            return []
        now = time.time() if now is None else now
        self._prune_shared_users(now)
        stopped = []
        for record in self._records():
            if not record.get("ready", True):
                continue
            idle = now - self._last_used(record) >= self.policy.server_idle_seconds
            owner = None if record.get("shared") else record.get("owner")
            if idle or visitor_gone(self.home, owner, self.policy.visitor_gone_seconds, now):
                self._stop_record(record)
                stopped.append(self._endpoint(record))
        return stopped

    def _prune_shared_users(self, now: float) -> None:
        """Take visitors gone for ``visitor_gone_seconds`` off the shared servers' user lists (the operator's
        ``shared(N)``); the servers keep running until idle."""
        assert self.policy is not None
        gone_after = self.policy.visitor_gone_seconds
        self._drop_shared_users(lambda _record, user, _job: visitor_gone(self.home, user, gone_after, now))

    def details(self) -> list[ServerInfo]:
        """Every server (starting ones too) with its idle time and resident memory (all its processes)."""
        now = time.time()
        return [
            ServerInfo(
                self._endpoint(record),
                idle_seconds=max(0.0, now - self._last_used(record)),
                memory_bytes=_memory_bytes(int(record["pid"])),
                users=len(record.get("users") or {}) if record.get("shared") else None,
            )
            for record in self._records()
        ]

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
            shared=bool(record.get("shared")),
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
        timeout: float | None = None,
        port: int | None = None,
        name: str | None = None,
        owner: str | None = None,
        capped: bool = False,
        shared: bool = False,
        batch_tokens: int = 0,
    ) -> Endpoint:
        """Serve ``model_dir`` and wait until it answers; return its endpoint.

        Serving what is already served (same name and model) returns the running endpoint. ``port``: listen
        there (a port that is taken, or a running server of the same name on another port, is a one-line
        UserError naming ``--port``, and nothing starts); None: a free port. ``owner`` (the visitor owning
        the job) is recorded. ``capped`` (booth mode, a visitor's server): a new server is admitted under the
        policy's ``max_servers``. ``shared``: recorded as the booth's shared base server. ``batch_tokens``: > 0
        answers concurrent requests in one batch out of a KV cache of that many tokens (greedy answers only).
        ``timeout``: seconds it may take to answer (None: :func:`start_timeout`).
        """
        from playground.serving.validate import check_model_dir

        timeout = start_timeout() if timeout is None else timeout

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
                model,
                local,
                name,
                job_id=job_id,
                kind=kind,
                timeout=timeout,
                port=port,
                owner=owner,
                capped=capped and self.policy is not None,
                shared=shared,
                batch_tokens=batch_tokens,
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
        capped: bool = False,
        shared: bool = False,
        batch_tokens: int = 0,
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
                self._mark_used(record)  # served again: its visitor is about to chat
                return self._endpoint(record)
        if port is not None and port_in_use(port):
            raise _port_taken(port)

        log_path = self.dir / f"{name}.log"
        self._usage_path(name).unlink(missing_ok=True)  # a new server: unused until it is ready
        for _attempt in range(_PORT_RETRIES):
            # Counting, making room and recording the new server are one step for every process (booth mode).
            with self._servers_lock() if capped else contextlib.nullcontext():
                if capped:
                    self._make_room()
                chosen = port if port is not None else free_port()
                usage = self._usage_path(name)
                proc = self._spawn(model, chosen, log_path, offline=local, usage=usage, batch_tokens=batch_tokens)
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
                    "shared": shared,
                    "batch_tokens": batch_tokens,
                    "users": {},
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
            self._mark_used(record)  # idle counts from when it could first be used
            return self._endpoint(record)
        raise UserError(f"could not find a free port for the model server after {_PORT_RETRIES} tries")

    def _spawn(
        self, model: str, port: int, log_path: Path, *, offline: bool, usage: Path, batch_tokens: int = 0
    ) -> subprocess.Popen:
        env = child_env(server=True)
        if offline:
            env["HF_HUB_OFFLINE"] = "1"  # a local directory needs nothing from the hub
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the trainer: spinning threads starve a shared CPU
        env["PYTHONUNBUFFERED"] = "1"
        command = [sys.executable, "-m", SERVER_MODULE, model, "--host", HOST, "--port", str(port)]
        command += ["--usage-file", str(usage)]
        if batch_tokens > 0:
            command += ["--batch-tokens", str(batch_tokens)]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                command,
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
                    raise UserError(_exited_early(record["model_dir"], code, log_path, lines))
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

        With ``owner``, only that owner's servers match (a visitor cannot stop another's, nor a shared one).
        """
        wanted = target.strip().rstrip("/")
        matched = []
        for record in self._records():
            if owner is not None and (record.get("owner") != owner or record.get("shared")):
                continue
            url = record["url"].rstrip("/")
            if wanted in (url, url.removesuffix("/v1"), record["name"], record.get("job_id")):
                matched.append(record)
        for record in matched:
            self._stop_record(record)
        return [self._endpoint(r) for r in matched]

    def stop_all(self) -> list[Endpoint]:
        """Stop every server, shared ones too (the operator's ``playground unserve --all``)."""
        records = self._records()
        for record in records:
            self._stop_record(record)
        return [self._endpoint(r) for r in records]

    def _stop_record(self, record: dict[str, Any]) -> None:
        self._kill(int(record["pid"]))
        self._forget(record)

    def _forget(self, record: dict[str, Any]) -> None:
        (self.dir / f"{record['name']}.json").unlink(missing_ok=True)
        self._usage_path(record["name"]).unlink(missing_ok=True)

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


def _memory_bytes(pid: int) -> int | None:
    """Resident memory of a server process and its children (None if it is gone or unreadable)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for each in procs:
        with contextlib.suppress(psutil.Error):
            total += each.memory_info().rss
    return total


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
