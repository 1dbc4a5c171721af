"""Which Ray cluster the ``ray`` backend talks to: ``RAY_ADDRESS`` (a cluster's dashboard, e.g.
``http://head:8265``, Ray's own convention for its Job API), or else a local Ray the playground starts for
itself — the embedded default — and stops cleanly.

The local Ray is ``ray start --head --block`` in a session of its own, started by the first submit and shared
by every later process through ``<home>/ray/cluster.json`` (its dashboard URL, the pid of ``ray start`` and the
resources it was given), so a new process (a reloaded notebook, another CLI call) reattaches to the same jobs.
Stopping it (``playground ray stop``) ends that session's processes only, never another Ray on the machine
(``ray stop`` would). Its logs and sockets live in a short temp dir of its own (Unix socket paths are limited
to 107 bytes). It gets the allow-listed environment (:func:`playground.processes.child_env`), like every job.
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
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from playground.backends.common import is_uri
from playground.errors import BackendError, UserError, shown
from playground.paths import ensure_writable_dir
from playground.processes import child_env, process_alive

ADDRESS_ENV = "RAY_ADDRESS"
CPUS_ENV = "PLAYGROUND_RAY_CPUS"  # the local Ray's CPUs (default: this machine's cores)
START_TIMEOUT = 240.0  # seconds for a local Ray to answer (imports on a loaded 2-core machine are slow)
OBJECT_STORE_BYTES = 256 * 1024 * 1024  # the trainer passes nothing through Ray's object store
STATE_FILE = "cluster.json"


@dataclass(frozen=True)
class LocalRay:
    """A local Ray head this playground started (what ``cluster.json`` holds)."""

    dashboard_url: str
    pid: int  # ``ray start --block``: its session holds every Ray process it started
    cpus: float
    gpus: float
    temp_dir: str
    started_at: float

    def resources(self) -> dict[str, float]:
        return {"CPU": self.cpus, "GPU": self.gpus}


def dashboard_answers(url: str, timeout: float = 2.0) -> bool:
    """Whether a Ray dashboard (its Job API) answers at ``url``."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/version", timeout=timeout) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def remote_address() -> str | None:
    """``RAY_ADDRESS`` as a Job API URL (``host:port`` → ``http://host:port``); None when unset."""
    address = os.environ.get(ADDRESS_ENV, "").strip()
    if not address or address == "auto":
        return None
    if address.startswith("ray://"):
        raise UserError(
            f"{ADDRESS_ENV} {shown(address)}: the ray backend submits through Ray's Job API; "
            "allowed: the cluster's dashboard address, e.g. http://head:8265",
            field=ADDRESS_ENV,
        )
    return address if is_uri(address) else f"http://{address}"


RAY_WORKER_PORTS = range(10002, 20000)  # Ray's default --min-worker-port .. --max-worker-port: its workers bind there
PORT_CANDIDATES = 100  # free-looking ports per port wanted, for a range to be worth choosing from
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports() -> range:
    """The kernel's ephemeral port range: every outgoing connection and every bind to port 0 takes a local port
    from it (Linux's default 32768-60999 where the kernel does not say)."""
    try:
        low, high = (int(word) for word in _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def listen_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nobody uses now, between Ray's worker ports and the ephemeral range (held
    open together while chosen, so none repeats).

    A port handed out by binding port 0 is an ephemeral one: between the choice and Ray's bind, many seconds on a
    loaded machine, any outgoing connection on the machine (Ray's own among them) may take it as its local port.
    When that happened to the client server's port, the client server exited and ``ray start --block`` stopped
    every process it had started: the whole local Ray, seconds after it first answered."""
    import random

    ephemeral = ephemeral_ports()
    # below the ephemeral range first: the ports Ray picks itself are random ones above an ephemeral one
    candidates = list(range(RAY_WORKER_PORTS.stop, ephemeral.start))
    if len(candidates) < PORT_CANDIDATES * count:
        candidates = [p for p in range(RAY_WORKER_PORTS.stop, 65536) if p not in ephemeral]
    if len(candidates) < PORT_CANDIDATES * count:  # an operator gave (nearly) every port to the kernel: take its ports
        candidates = []
    random.shuffle(candidates)
    chosen: list[int] = []
    with contextlib.ExitStack() as stack:
        for port in candidates:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (a listener, or a connection's local port)
            chosen.append(port)
            if len(chosen) == count:
                return chosen
        while len(chosen) < count:
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            chosen.append(int(sock.getsockname()[1]))
    return chosen


def _temp_dir(home: Path) -> Path:
    """A short per-home temp dir for Ray's sessions (sockets live under it)."""
    digest = hashlib.sha1(str(home).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"pg-ray-{digest}"


def local_cpus() -> float:
    value = os.environ.get(CPUS_ENV)
    if value:
        try:
            cpus = float(value)
        except ValueError:
            cpus = 0.0
        if not 0 < cpus <= 4096:
            raise UserError(f"{CPUS_ENV} {shown(value)}: allowed: a number of CPUs above 0", field=CPUS_ENV)
        return cpus
    return float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def local_gpus() -> float:
    from playground.backends.gpus import detect_gpus

    return float(detect_gpus())


# a Ray log line ("<time>\tERROR services.py:1405 -- Failed to start the dashboard"): its level and message
_RAY_LOG_LINE = re.compile(r"^\S+ \S+\s+(?P<level>[A-Z]+) \S+ -- (?P<message>.*)$")
_EXCEPTION = re.compile(r"^[A-Za-z_.]*(Error|Exception): .+$")


def start_env(dashboard_wait: float = START_TIMEOUT) -> dict[str, str]:
    """The environment of ``ray start``: the allow-listed one, plus Ray's own settings for a one-machine Ray
    (``dashboard_wait``: the seconds Ray waits for its dashboard and each of its modules)."""
    return child_env(
        {
            "RAY_DEDUP_LOGS": "0",
            # a one-machine Ray: every process advertises and dials 127.0.0.1, never this machine's LAN address
            # (Ray's single-node mode; `--node-ip-address=127.0.0.1` alone is turned into the LAN address)
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            # On a loaded 2-core machine the dashboard's nine module processes (its Job API among them) take longer
            # to import than Ray waits for them (30 s each) and for the dashboard (60 s: then `ray start` stops
            # every process it started and exits 1). A slow start, not a failed one: Ray waits as long as we do.
            "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": f"{dashboard_wait:g}",
            "RAY_DASHBOARD_STARTUP_TIMEOUT_S": f"{dashboard_wait:.0f}",  # Ray reads an integer
        }
    )


def start_failure(log_text: str) -> str:
    """Why ``ray start`` exited, from what it printed: Ray's first error line (it follows it with a traceback and
    the dashboard's log, whose last lines say nothing), else the exception, else its last lines."""
    lines = [line.strip() for line in log_text.strip().splitlines() if line.strip()]
    for line in lines:
        if (found := _RAY_LOG_LINE.match(line)) and found["level"] == "ERROR" and found["message"]:
            return found["message"].strip()[:300]
    exceptions = [line for line in lines if _EXCEPTION.match(line)]
    if exceptions:
        return exceptions[-1][:300]
    return " / ".join(line[:200] for line in lines[-3:]) or "it printed nothing"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SUBPROCESSES_EXITED = "Some Ray subprocesses exited unexpectedly"
_RAY_START_FIRST_LINE = "Local node IP"  # the first line each `ray start --head` prints about its node


def exit_reason(log_text: str) -> str | None:
    """Why a running local Ray stopped by itself, from what ``ray start --block`` printed last ("Some Ray
    subprocesses exited unexpectedly: ray_client_server [exit code=1]": it then stops every other process it
    started); None where it printed no such thing (it was stopped)."""
    messages = [
        (found["level"], found["message"].strip())
        for line in log_text.splitlines()
        if (found := _RAY_LOG_LINE.match(_ANSI.sub("", line).strip()))
    ]
    starts = [index for index, (_, message) in enumerate(messages) if message.startswith(_RAY_START_FIRST_LINE)]
    messages = messages[starts[-1] :] if starts else messages  # the last start's lines only: the log is appended to
    for index in range(len(messages) - 1, -1, -1):
        if messages[index][1].startswith(_SUBPROCESSES_EXITED):
            exited = []
            for level, message in messages[index + 1 :]:
                if not level.startswith("ERR") or message.startswith("Remaining processes"):
                    break
                exited.append(message)
            return f"{_SUBPROCESSES_EXITED}: {', '.join(exited) or 'Ray did not say which'}"
    return None


class LocalRayHome:
    """The local Ray of one playground home: find it, start it, stop it."""

    def __init__(self, home: Path, *, dashboard_wait: float = START_TIMEOUT) -> None:
        self.dir = home / "ray"
        self.dashboard_wait = dashboard_wait  # how long `ray start` waits for its dashboard (start_env says why)
        self.state_file = self.dir / STATE_FILE

    def read(self) -> LocalRay | None:
        """The recorded local Ray if it still runs, else None (a stale record is removed)."""
        try:
            data = json.loads(self.state_file.read_text())
            cluster = LocalRay(**data)
        except (OSError, ValueError, TypeError):
            return None
        if process_alive(cluster.pid, "ray") and dashboard_answers(cluster.dashboard_url):
            return cluster
        return None

    def exit_reason(self) -> str | None:
        """Why the last local Ray of this home stopped by itself (:func:`exit_reason` of its log's end)."""
        try:
            with open(self.dir / "ray-start.log", "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 64 * 1024))
                return exit_reason(log.read().decode(errors="replace"))
        except OSError:
            return None

    def ensure(self) -> LocalRay:
        """The running local Ray, started now if there is none (one process starts it; others wait for it)."""
        import fcntl

        ensure_writable_dir(self.dir, what="Ray state dir")
        with open(self.dir / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self.read() or self._start()

    def _start(self) -> LocalRay:
        temp_dir = _temp_dir(self.dir.parent)
        temp_dir.mkdir(parents=True, exist_ok=True)
        gcs_port, port, agent_port, agent_grpc_port, client_port, env_agent_port, metrics_port = listen_ports(7)
        cpus, gpus = local_cpus(), local_gpus()
        # Every port of its own: Ray's fixed defaults (the job agent's 52365, the client server's 10001) are taken
        # when another Ray runs on this machine (another home's, a second test run, an operator's), and then its
        # job agent never registers (every submission: "No available agent") and its client server exits. Ports Ray
        # would pick itself come from the ephemeral range, where a connection may take them first (listen_ports).
        command = [
            sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--disable-usage-stats",
            f"--port={gcs_port}", f"--dashboard-port={port}", "--dashboard-host=127.0.0.1", "--include-dashboard=true",
            f"--dashboard-agent-listen-port={agent_port}", f"--dashboard-agent-grpc-port={agent_grpc_port}",
            f"--ray-client-server-port={client_port}", f"--runtime-env-agent-port={env_agent_port}",
            f"--metrics-export-port={metrics_port}",
            f"--num-cpus={cpus:g}", f"--num-gpus={gpus:g}", f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--temp-dir={temp_dir}",
        ]  # fmt: skip
        log_path = self.dir / "ray-start.log"
        log_start = log_path.stat().st_size if log_path.is_file() else 0
        env = start_env(self.dashboard_wait)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                with open(log_path, "rb") as log:
                    log.seek(log_start)
                    why = start_failure(log.read().decode(errors="replace"))
                raise BackendError(f"the local Ray did not start (exit {proc.returncode}): {why}; see {log_path}")
            if dashboard_answers(url, timeout=1.0):
                cluster = LocalRay(url, proc.pid, cpus, gpus, str(temp_dir), time.time())
                tmp = self.state_file.with_suffix(".tmp")
                tmp.write_text(json.dumps(asdict(cluster)))
                tmp.replace(self.state_file)
                return cluster
            time.sleep(0.5)
        _stop_session(proc.pid, grace=5.0)
        raise BackendError(f"the local Ray did not answer within {START_TIMEOUT:g}s; see {log_path}")

    def stop(self, grace: float = 15.0) -> bool:
        """Stop the local Ray (its jobs end with it); whether one was running."""
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return False
        pid = int(data.get("pid") or 0)
        running = process_alive(pid, "ray")
        if running:
            _stop_session(pid, grace=grace)
        with contextlib.suppress(OSError):
            self.state_file.unlink()
        return running


def _session_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (zombies left to an init that does not reap them do not count)."""
    import psutil

    members = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
    return members


def _stop_session(pid: int, *, grace: float) -> None:
    """SIGTERM to the whole session of ``ray start --block`` (raylet, GCS, dashboard, workers: start_new_session
    made its pid the group id), then SIGKILL to whatever is left after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # our own child (this process started it): reaped, not a zombie
        if not _session_members(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)
