"""Local model servers: vLLM processes (:mod:`playground.serving.vllm_server`) recorded under
``$PLAYGROUND_HOME/servers``.

- **One server per base model** (``base-<model>-<digest>``), started once (in a booth: when the app starts) with
  LoRA enabled. It answers the base side of every chat (model name: the base model directory's name) and every
  LoRA job of that base: serving a LoRA job loads its adapter (the job's ``model/``, a few MB) onto it under the
  job's id (``POST /v1/load_lora_adapter``, well under a second), unserving unloads it. A base server stops with
  its last job's unserve, unless *pinned* (:meth:`LocalServers.base_server` ``pin=True``: ``playground app`` pins the
  preselected blueprint's, before the first visitor); then it runs until stopped by name or ``unserve --all``.
- **A full fine-tune** gets a server of its own (``<job>-fine-tuned``).
- Each record ``servers/<name>.json`` (pid, port, url, served model, job id, kind, owner, log, the adapters and base
  users) lets any later process list and stop it; records whose process is gone are dropped when listed, and with
  them every adapter the server held. vLLM's process touches ``servers/<name>.usage/<model>.used`` at every chat
  request (:mod:`playground.serving.vllm_guard`): the modification times are the last uses.

Booth mode (a :class:`~playground.booth.BoothPolicy`, for jobs with an owner): a visitor has at most one fine-tuned
model served (serving another unloads the previous adapter, or stops the previous server); a base server holds at
most ``max_adapters`` adapters (one more unloads the least recently used, re-served on its visitor's next chat); at
most ``max_servers`` processes run (beyond it the least recently used visitor's full fine-tune server idle for
``server_evict_idle_seconds`` is stopped, else a one-line UserError and nothing starts);
:meth:`LocalServers.stop_idle` unloads adapters and stops fine-tuned servers idle for ``server_idle_seconds`` and
those of visitors gone for ``visitor_gone_seconds``.

Where vLLM has no wheel (:mod:`playground.serving.vllm_env`), ``PLAYGROUND_SERVING_ENGINE=transformers`` serves with
transformers' public ``transformers serve`` instead: never a silent switch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from playground.booth import SETTINGS, BoothPolicy, visitor_gone
from playground.errors import UserError, shown, shown_path
from playground.owner import OPERATOR, Owner
from playground.paths import ensure_writable_dir
from playground.processes import child_env, process_alive
from playground.serving.base import ModelServers, ServerInfo, model_to_serve
from playground.types import Endpoint, Job

# in a server's command line: vLLM's (which may retitle itself), the fallback's
SERVER_MARKERS = ("playground_vllm_guard", "VLLM::", "transformers.cli.transformers serve")
HOST = "127.0.0.1"
LOG_TAIL_LINES = 15
_PORT_RETRIES = 3
START_TIMEOUT = 600.0  # seconds a starting server may take to answer; PLAYGROUND_SERVER_START_TIMEOUT overrides it
# (vLLM on 2 busy cores: 55-115 s measured; a first start also compiles its CPU kernels)
DEFAULT_MAX_ADAPTERS = 8  # adapters on one base server outside booth mode (BoothPolicy.max_adapters in a booth)
MAX_BODY_BYTES = 1 << 20  # a request body over this answers 413


def start_timeout() -> float:
    """Seconds a starting model server may take to answer: ``PLAYGROUND_SERVER_START_TIMEOUT`` (a big model read
    from a slow disk, or a loaded machine, takes longer than the default 600)."""
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
    """Guard against pid reuse: on Linux the command line must be a server we start (vLLM may retitle it)."""
    return any(process_alive(pid, marker) for marker in SERVER_MARKERS)


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
        self.policy = policy  # booth mode: one fine-tuned model per visitor, the caps, idle TTL

    @property
    def max_adapters(self) -> int:
        return self.policy.max_adapters if self.policy is not None else DEFAULT_MAX_ADAPTERS

    # -- the ModelServers interface --------------------------------------------------------------
    def serve(self, job: Job, *, base: bool = False, port: int | None = None) -> Endpoint:
        model = model_to_serve(job, base=base)
        if base:
            return self._serve_base_side(job, model, port)
        from playground.models.adapters import is_adapter_dir
        from playground.serving.vllm_env import engine

        if is_adapter_dir(model):
            if engine() == "vllm":
                return self._serve_adapter(job, model, port)
            model = _merged_for_fallback(job, model)  # transformers serve loads no adapter: a server of its own
        visitor = self.policy is not None and job.owner is not None
        if visitor:  # one fine-tuned model per visitor: their previous one makes room for this one
            self._leave_fine_tuned(job.owner, keep=job.id)
        owner = Owner(job.owner)
        return self.start(model, job_id=job.id, kind="fine-tuned", owner=owner, port=port, capped=visitor)

    def unserve(self, target: str, *, owner: Owner = OPERATOR) -> None:
        stopped = self.stop(target, owner=owner)
        left = self._leave(target, owner)
        if not stopped and not left:
            raise UserError(f"no local model server matches {target!r} (an endpoint URL, server name or job id)")

    def endpoints(self, *, owner: Owner = OPERATOR) -> list[Endpoint]:
        """The ready servers and the adapters on them (``owner``'s: their own, and the base servers they use,
        shown as theirs)."""
        result = []
        for record in self._records():
            if not record.get("ready", True):
                continue
            endpoint = self._endpoint(record)
            if not record.get("shared"):
                if owner.sees(endpoint.owner):
                    result.append(endpoint)
                continue
            users = record.get("base_jobs") or {}
            # shared with others: in a booth, or pinned by the app (else it goes with its last job's unserve)
            endpoint = replace(endpoint, shared=self.policy is not None or bool(record.get("pinned")))
            result += [
                replace(endpoint, job_id=job_id, owner=user) for job_id, user in users.items() if owner.sees(user)
            ]
            if owner.is_operator and not users:
                result.append(endpoint)
            result += [
                self._adapter_endpoint(record, job_id, entry)
                for job_id, entry in (record.get("adapters") or {}).items()
                if owner.sees(entry.get("owner"))
            ]
        return result

    def stop_job(self, job_id: str) -> None:
        self.stop(job_id)
        self._leave(job_id, OPERATOR)

    # -- base servers, and the adapters on them -----------------------------------------------------------
    def base_server(self, model_ref: str, *, port: int | None = None, pin: bool = False) -> Endpoint:
        """The one server of base model ``model_ref`` (a directory, ``pkg://`` or ``hf://``), started if none runs:
        its endpoint answers the base model; LoRA adapters load onto it. ``pin``: it keeps running when its last
        job leaves (``playground app`` pins the preselected blueprint's; unpinned ones stop with their last use)."""
        model, _local = _resolve_model(model_ref)
        digest = hashlib.sha1(model.encode()).hexdigest()[:8]
        name = f"base-{_slug(Path(model.split('://')[-1]).name)}-{digest}"
        endpoint = self.start(model_ref, kind="base", name=name, capped=self.policy is not None, shared=True, port=port)
        if pin:
            with self._servers_lock():
                record = self._record(endpoint.name)
                if record is not None and not record.get("pinned"):
                    record["pinned"] = True
                    self._write(record)
        return endpoint

    def _serve_base_side(self, job: Job, model: str, port: int | None) -> Endpoint:
        """The base server of ``job``'s base model, with ``job`` recorded as using it (a visitor: their latest job)."""
        for _attempt in range(2):  # stopped between start and join (idle cleanup, the operator): start again
            endpoint = self.base_server(model, port=port)
            with self._servers_lock():
                record = self._record(endpoint.name)
                if record is None:
                    continue
                users = record.setdefault("base_jobs", {})
                if self.policy is not None and job.owner is not None:
                    for other in [j for j, user in users.items() if user == job.owner]:
                        users.pop(other)
                users[job.id] = job.owner
                self._write(record)
            self._mark_used(record)
            shared = self.policy is not None or bool(record.get("pinned"))
            return replace(endpoint, job_id=job.id, owner=job.owner, shared=shared)
        raise UserError("the base model server stopped while starting; try again", field="job")

    def _serve_adapter(self, job: Job, adapter_dir: str, port: int | None) -> Endpoint:
        """Load ``job``'s LoRA adapter onto its base model's server under the job's id (the base server is started
        first if none runs; at the cap the least recently used adapter is unloaded)."""
        from playground.serving.vllm_server import load_adapter

        if not job.base_model:
            raise UserError(f"job {job.id} records no base model for its LoRA adapter", field="job")
        from playground.serving.validate import check_adapter_dir

        path = str(check_adapter_dir(adapter_dir).resolve())
        if self.policy is not None and job.owner is not None:
            self._leave_fine_tuned(job.owner, keep=job.id)
        for _attempt in range(2):
            base = self.base_server(job.base_model, port=port)
            with self._servers_lock():
                record = self._record(base.name)
                if record is None:
                    continue
                adapters = record.setdefault("adapters", {})
                if job.id not in adapters:
                    self._evict_adapters(record, room_for=1)
                self._keep_template(record["name"], job.id, path)  # its chats are rendered as it was trained
                load_adapter(record["url"], job.id, path)
                adapters[job.id] = {"path": path, "owner": job.owner, "loaded_at": time.time()}
                self._write(record)
            self._mark_used(record, job.id)
            return self._adapter_endpoint(record, job.id, adapters[job.id])
        raise UserError("the base model server stopped while loading the adapter; try again", field="job")

    def _evict_adapters(self, record: dict[str, Any], *, room_for: int) -> list[str]:
        """Unload the least recently used adapters of ``record`` until ``room_for`` more fit under the cap."""

        adapters = record.get("adapters") or {}
        excess = len(adapters) + room_for - self.max_adapters
        evicted = sorted(adapters, key=lambda job_id: self._adapter_last_used(record, job_id))[: max(0, excess)]
        for job_id in evicted:
            self._unload(record, job_id)
        return evicted

    def _unload(self, record: dict[str, Any], job_id: str) -> None:
        """Take ``job_id``'s adapter off ``record``'s server, its entry and its chat template (the caller writes the
        record)."""
        from playground.serving.vllm_server import unload_adapter

        with contextlib.suppress(UserError):  # a server that cannot answer loses it anyway
            unload_adapter(record["url"], job_id)
        (record.get("adapters") or {}).pop(job_id, None)
        self._keep_template(record["name"], job_id, None)

    def _keep_template(self, server: str, job_id: str, adapter_dir: str | None) -> None:
        """Keep the chat template of the adapter at ``adapter_dir`` where the guard of base server ``server`` puts it
        into ``job_id``'s chat requests (None: forget it)."""
        from playground.serving.vllm_guard import template_file

        target = template_file(_templates_dir(self._usage_dir(server)), job_id)
        template = _chat_template(Path(adapter_dir)) if adapter_dir else None
        if template is None:
            target.unlink(missing_ok=True)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(template)
        os.replace(tmp, target)

    def _adapter_endpoint(self, record: dict[str, Any], job_id: str, entry: dict[str, Any]) -> Endpoint:
        return Endpoint(
            url=record["url"],
            model=job_id,
            job_id=job_id,
            kind="fine-tuned",
            backend="local",
            name=f"{job_id}-fine-tuned",
            owner=entry.get("owner"),
            shared=False,
        )

    def _adapter_last_used(self, record: dict[str, Any], job_id: str) -> float:
        from playground.serving.vllm_guard import usage_file

        try:
            return usage_file(self._usage_dir(record["name"]), job_id).stat().st_mtime
        except OSError:
            return float((record.get("adapters") or {}).get(job_id, {}).get("loaded_at") or 0.0)

    def _leave(self, target: str, owner: Owner) -> bool:
        """Take ``owner``'s (the operator: anyone's) uses named by ``target`` off the base servers: the job ``target``
        (base side and adapter), its adapter's endpoint name, or every use of a base server named by ``target``
        (URL or name). Adapters taken off are unloaded; the base servers keep running."""
        wanted = target.strip().rstrip("/")

        def names_server(record: dict[str, Any]) -> bool:
            return wanted in (record["url"].rstrip("/"), record["url"].removesuffix("/v1"), record["name"])

        def drops(record: dict[str, Any], job_id: str, user: str | None) -> bool:
            names_it = names_server(record) or wanted in (job_id, f"{job_id}-fine-tuned")
            return names_it and owner.sees(user)

        return self._drop_uses(drops)

    def _leave_fine_tuned(self, owner: str, *, keep: str) -> None:
        """A visitor's other fine-tuned models go: their adapters are unloaded, their own servers stopped."""
        for record in self._records():
            mine = record.get("owner") == owner and record.get("kind") == "fine-tuned" and not record.get("shared")
            if mine and record.get("job_id") != keep:
                self._stop_record(record)
        self._drop_uses(lambda _record, job_id, user: user == owner and job_id != keep, base_side=False)

    def _drop_uses(self, drop: Callable[[dict[str, Any], str, str | None], bool], *, base_side: bool = True) -> bool:
        """Take the uses for which ``drop(record, job_id, owner)`` holds off the base servers (adapters unloaded;
        with ``base_side``, base-side users too), under the servers lock; whether any went."""

        if not any(record.get("shared") for record in self._records()):
            return False  # no base server: no lock taken, no file written
        left = False
        unused = []
        with self._servers_lock():
            for record in self._records():
                if not record.get("shared"):
                    continue
                users = record.get("base_jobs") or {}
                adapters = record.get("adapters") or {}
                gone = [job_id for job_id, entry in adapters.items() if drop(record, job_id, entry.get("owner"))]
                for job_id in gone:
                    self._unload(record, job_id)
                keep = {j: user for j, user in users.items() if not (base_side and drop(record, j, user))}
                if gone or keep != users:
                    record["base_jobs"], record["adapters"] = keep, adapters
                    self._write(record)
                    left = True
                    if not keep and not adapters and not record.get("pinned"):
                        unused.append(record)
            for record in unused:  # its last job left and nothing pinned it: the memory goes back
                self._stop_record(record)
        return left

    # -- booth mode: the cap, idle servers, memory ------------------------------------------------------
    @contextlib.contextmanager
    def _servers_lock(self):
        """Serialises admission (count, make room, start) and the base servers' users and adapters across
        processes."""
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

    def _usage_dir(self, name: str) -> Path:
        return self.dir / f"{name}.usage"

    def _mark_used(self, record: dict[str, Any], model: str | None = None) -> None:
        """Record a use of ``record``'s server (``model``: an adapter's job id; None: the server itself)."""
        from playground.serving.vllm_guard import usage_file

        usage_dir = self._usage_dir(record["name"])
        with contextlib.suppress(OSError):
            usage_dir.mkdir(parents=True, exist_ok=True)
            usage_file(usage_dir, model or record["model"]).touch()

    def _last_used(self, record: dict[str, Any]) -> float:
        """When the server last had a chat request (for any of its models), else when it started."""
        try:
            times = [path.stat().st_mtime for path in self._usage_dir(record["name"]).glob("*.used")]
        except OSError:
            times = []
        return max(times, default=float(record.get("started_at") or 0.0))

    def stop_idle(self, *, now: float | None = None) -> list[Endpoint]:
        """Booth mode: unload the adapters and stop the fine-tuned servers with no chat request for
        ``server_idle_seconds`` or whose visitor is gone for ``visitor_gone_seconds``; stop base servers no visitor
        has used for ``server_idle_seconds``. Starting servers are left alone. Outside booth mode nothing stops."""
        if self.policy is None:
            return []
        now = time.time() if now is None else now
        policy = self.policy
        gone_after = policy.visitor_gone_seconds

        def gone(user: str | None) -> bool:
            return visitor_gone(self.home, Owner(user), gone_after, now)

        self._drop_uses(lambda _record, _job, user: user is not None and gone(user))
        stopped = []
        idle_adapters = []
        for record in self._records():
            if not record.get("ready", True):
                continue
            idle = now - self._last_used(record) >= policy.server_idle_seconds
            if record.get("shared"):
                for job_id in record.get("adapters") or {}:
                    if now - self._adapter_last_used(record, job_id) >= policy.server_idle_seconds:
                        idle_adapters.append((record["name"], job_id))
            if (idle and not record.get("pinned")) or (not record.get("shared") and gone(record.get("owner"))):
                self._stop_record(record)
                stopped.append(self._endpoint(record))
        for name, job_id in idle_adapters:
            self._drop_uses(lambda record, j, _user, n=name, i=job_id: record["name"] == n and j == i, base_side=False)
        return stopped

    def details(self) -> list[ServerInfo]:
        """Every server (starting ones too) with its idle time and resident memory (all its processes)."""
        now = time.time()
        return [
            ServerInfo(
                self._endpoint(record),
                idle_seconds=max(0.0, now - self._last_used(record)),
                memory_bytes=_memory_bytes(int(record["pid"])),
                users=len(record.get("base_jobs") or {}) + len(record.get("adapters") or {})
                if record.get("shared")
                else None,
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

    def _record(self, name: str | None) -> dict[str, Any] | None:
        return next((r for r in self._records() if r["name"] == name), None)

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
        """The servers that are up and answering, and the adapters on them (records of dead processes dropped)."""
        return self.endpoints()

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
        owner: Owner = OPERATOR,
        capped: bool = False,
        shared: bool = False,
    ) -> Endpoint:
        """Serve ``model_dir`` (a full model directory, ``pkg://`` or ``hf://``) and wait until it answers; return
        its endpoint.

        Serving what is already served (same name and model) returns the running endpoint. ``port``: listen
        there (a port that is taken, or a running server of the same name on another port, is a one-line
        UserError naming ``--port``, and nothing starts); None: a free port. ``owner`` (the visitor owning
        the job; its id) is recorded. ``capped`` (booth mode, a visitor's server): a new server is admitted under the
        policy's ``max_servers``. ``shared``: a base server (LoRA adapters load onto it; every job of that base
        uses it). ``timeout``: seconds it may take to answer (None: :func:`start_timeout`).
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
        served_name = _slug(job_id or Path(model.split("://")[-1]).name)
        ensure_writable_dir(self.dir, what="server state directory")
        with _locked(self.dir / f".{name}.lock"):  # two callers serving the same thing get one server
            return self._start_locked(
                model,
                local,
                name,
                served_name=served_name,
                job_id=job_id,
                kind=kind,
                timeout=timeout,
                port=port,
                owner=owner,
                capped=capped and self.policy is not None,
                shared=shared,
            )

    def _start_locked(
        self,
        model: str,
        local: bool,
        name: str,
        *,
        served_name: str,
        job_id: str | None,
        kind: str,
        timeout: float,
        port: int | None,
        owner: Owner = OPERATOR,
        capped: bool = False,
        shared: bool = False,
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
                if not record.get("ready", True):  # started by another process that died before it was ready
                    self._stop_record(record)
                    break
                self._mark_used(record)  # served again: its visitor is about to chat
                return self._endpoint(record)
        if port is not None and port_in_use(port):
            raise _port_taken(port)
        launcher = _launcher(self.dir, lora=shared, max_adapters=self.max_adapters)  # before any record: may build
        log_path = self.dir / f"{name}.log"
        shutil.rmtree(self._usage_dir(name), ignore_errors=True)  # a new server: unused until it is ready
        for _attempt in range(_PORT_RETRIES):
            # Counting, making room and recording the new server are one step for every process (booth mode).
            with self._servers_lock() if capped else contextlib.nullcontext():
                if capped:
                    self._make_room()
                chosen = port if port is not None else free_port()
                usage_dir = self._usage_dir(name)
                proc = launcher.spawn(model, served_name, chosen, log_path, usage_dir=usage_dir, offline=local)
                record = {
                    "name": name,
                    "engine": launcher.engine,
                    "pid": proc.pid,
                    "port": chosen,
                    "url": f"http://{HOST}:{chosen}/v1",
                    "model": launcher.model_name(model, served_name),
                    "model_dir": model,
                    "job_id": job_id,
                    "kind": kind,
                    "owner": owner.id,
                    "shared": shared,
                    "base_jobs": {},
                    "adapters": {},
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
            with self._servers_lock():  # users and adapters may have been recorded meanwhile: keep them
                record = {**(self._record(name) or record), "ready": True}
                self._write(record)
            self._mark_used(record)  # idle counts from when it could first be used
            return self._endpoint(record)
        raise UserError(f"could not find a free port for the model server after {_PORT_RETRIES} tries")

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
                time.sleep(0.5)

    # -- stop --------------------------------------------------------------------------------
    def stop(self, target: str, *, owner: Owner = OPERATOR) -> list[Endpoint]:
        """Stop the servers matching ``target``: an endpoint URL, a server name or a job id (its own servers).

        For a visitor ``owner``, only their servers match (they cannot stop another's, nor a base server)."""
        wanted = target.strip().rstrip("/")
        matched = []
        for record in self._records():
            if not owner.is_operator and (not owner.sees(record.get("owner")) or record.get("shared")):
                continue
            url = record["url"].rstrip("/")
            if wanted in (url, url.removesuffix("/v1"), record["name"]) or (
                wanted == record.get("job_id") and not record.get("shared")
            ):
                matched.append(record)
        for record in matched:
            self._stop_record(record)
        return [self._endpoint(r) for r in matched]

    def stop_all(self) -> list[Endpoint]:
        """Stop every server, base servers too (the operator's ``playground unserve --all``)."""
        records = self._records()
        for record in records:
            self._stop_record(record)
        return [self._endpoint(r) for r in records]

    def _stop_record(self, record: dict[str, Any]) -> None:
        self._kill(int(record["pid"]))
        self._forget(record)

    def _forget(self, record: dict[str, Any]) -> None:
        (self.dir / f"{record['name']}.json").unlink(missing_ok=True)
        shutil.rmtree(self._usage_dir(record["name"]), ignore_errors=True)
        shutil.rmtree(_templates_dir(self._usage_dir(record["name"])), ignore_errors=True)

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


class _Launcher:
    """Starts one server process with the chosen engine (vLLM, or transformers' ``transformers serve`` where
    asked for with ``PLAYGROUND_SERVING_ENGINE=transformers``)."""

    def __init__(self, engine: str, state_dir: Path, *, lora: bool, max_adapters: int) -> None:
        self.engine, self.state_dir, self.lora, self.max_adapters = engine, state_dir, lora, max_adapters

    def model_name(self, model: str, served_name: str) -> str:
        """The name chat requests ask for: vLLM's served name; ``transformers serve`` loads by path."""
        return served_name if self.engine == "vllm" else model

    def spawn(
        self, model: str, served_name: str, port: int, log_path: Path, *, usage_dir: Path, offline: bool
    ) -> subprocess.Popen:
        from playground.serving import vllm_server

        env = child_env(server=True)
        env.update({k: v for k, v in os.environ.items() if k.startswith("VLLM_")})  # the operator's vLLM settings
        if offline:
            env["HF_HUB_OFFLINE"] = "1"  # a local directory needs nothing from the hub
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["PYTHONUNBUFFERED"] = "1"
        usage_dir.mkdir(parents=True, exist_ok=True)
        if self.engine == "vllm":
            from playground.serving.vllm_env import ensure_environment, wants_gpu

            gpu = wants_gpu()
            python = ensure_environment(gpu=gpu)
            guard = vllm_server.guard_dir(self.state_dir)
            templates = _templates_dir(usage_dir) if self.lora else None
            env = vllm_server.environment(
                env, guard=guard, usage_dir=usage_dir, max_body_bytes=MAX_BODY_BYTES, templates_dir=templates
            )
            argv = vllm_server.command(
                python, model, port, HOST, served_name=served_name, lora=self.lora,
                max_adapters=self.max_adapters,
            )  # fmt: skip
        else:  # transformers' public CLI (an adapter directory loads onto its base through PEFT)
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            argv = [sys.executable, "-m", "transformers.cli.transformers", "serve", model, "--host", HOST]
            argv += ["--port", str(port)]  # the model preloaded and answering every request, whatever it names
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # outlives the caller; a signal to its group reaches it alone
                close_fds=True,
            )
        _children[proc.pid] = proc
        return proc


def _merged_for_fallback(job: Job, adapter_dir: str) -> str:
    """The fallback engine serves a LoRA job merged: ``<output>/merged-model`` beside the adapter, made once (in a
    child process: the caller, a visitor's kernel, never imports torch)."""
    target = Path(adapter_dir).parent / "merged-model"
    if (target / "config.json").is_file():
        return str(target)
    if not job.base_model:
        raise UserError(f"job {job.id} records no base model for its LoRA adapter", field="job")
    code = "import sys; from playground.models.adapters import merge_adapter; merge_adapter(*sys.argv[1:4])"
    proc = subprocess.run(
        [sys.executable, "-c", code, adapter_dir, job.base_model, str(target)],
        capture_output=True, text=True, env=child_env(), timeout=1800, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"could not merge job {job.id}'s adapter for transformers serve: {last}", field="job")
    return str(target)


def _launcher(state_dir: Path, *, lora: bool, max_adapters: int) -> _Launcher:
    """The engine's launcher, its settings checked (a bad one is a one-line error before anything starts)."""
    from playground.serving import vllm_server
    from playground.serving.vllm_env import engine

    chosen = engine()
    if chosen == "vllm":
        vllm_server.serving_dtype()
    return _Launcher(chosen, state_dir, lora=lora, max_adapters=max_adapters)


def _templates_dir(usage_dir: Path) -> Path:
    """Where a base server's adapters' chat templates are kept (beside its usage files)."""
    return usage_dir.with_name(usage_dir.name.removesuffix(".usage") + ".templates")


def _chat_template(model_dir: Path) -> str | None:
    """The chat template saved with a model or adapter directory (``chat_template.jinja`` or the tokenizer config's)."""
    with contextlib.suppress(OSError):
        return (model_dir / "chat_template.jinja").read_text()
    try:
        template = json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    return template if isinstance(template, str) and template else None


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
