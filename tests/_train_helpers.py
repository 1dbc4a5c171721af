"""Helpers for the training-entrypoint tests: run ``python -m playground.train`` for real, parse its lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from playground.events import Event, Log, Metric, Phase, Progress, parse_line

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class TrainRun:
    returncode: int
    stdout: str
    stderr: str
    events: list[Event]
    seconds: float = 0.0  # wall time of the whole process

    @property
    def phases(self) -> list[str]:
        """The phases in order, each once (a phase's progress updates, e.g. Evaluating's, repeat it)."""
        phases: list[str] = []
        for event in self.events:
            if isinstance(event, Phase) and (not phases or phases[-1] != event.phase):
                phases.append(str(event.phase))
        return phases

    @property
    def progress(self) -> list[Progress]:
        return [e for e in self.events if isinstance(e, Progress)]

    @property
    def metrics(self) -> dict[str, float]:
        return {e.name: e.value for e in self.events if isinstance(e, Metric)}

    @property
    def logs(self) -> list[str]:
        return [e.line for e in self.events if isinstance(e, Log)]


def trainer_command(*args: str, nproc: int = 1) -> list[str]:
    """``python -m playground.train ARGS``, under torchrun (``--standalone``: a free port) when ``nproc > 1``."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    return [sys.executable, *launcher, "-m", "playground.train", *args]


def trainer_env(env: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def run_trainer(*args: str, timeout: float = 300, env: dict[str, str] | None = None, nproc: int = 1) -> TrainRun:
    """Run the entrypoint in a child process (as every backend does) and parse stdout into events."""
    started = time.monotonic()
    proc = subprocess.run(
        trainer_command(*args, nproc=nproc),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=trainer_env(env),
        cwd=REPO_ROOT,
    )
    events = [parse_line(line) for line in proc.stdout.splitlines() if line.strip()]
    return TrainRun(proc.returncode, proc.stdout, proc.stderr, events, time.monotonic() - started)


def describe(run: TrainRun) -> str:
    """Context for assertion messages."""
    return f"exit {run.returncode}\n--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-3000:]}"


@contextmanager
def trainer_status_server(token_file: Path) -> Iterator[tuple[dict[str, str], list[dict]]]:
    """A local HTTP endpoint standing in for the Kubeflow Trainer controller's status URL.

    Yields the env a TrainJob pod gets (``KUBEFLOW_TRAINER_SERVER_URL``/``..._TOKEN``) and the list
    of received requests (``auth`` header and JSON ``body``), filled as the SDK posts.
    """
    received: list[dict] = []
    token_file.write_text("test-token\n")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append({"auth": self.headers.get("Authorization"), "body": json.loads(body)})
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {
        "KUBEFLOW_TRAINER_SERVER_URL": f"http://127.0.0.1:{server.server_address[1]}/status",
        "KUBEFLOW_TRAINER_SERVER_TOKEN": str(token_file),
    }
    try:
        yield env, received
    finally:
        server.shutdown()
        server.server_close()


def processes_mentioning(text: str) -> list[int]:
    """The pids of the processes whose command line mentions ``text`` (a local Ray's temp dir: its processes)."""
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if text in " ".join(p.info["cmdline"] or [])]


@contextmanager
def busy_processes(count: int) -> Iterator[list[subprocess.Popen]]:
    """``count`` processes that keep a core busy each (``while True: pass``), killed on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)  # running, not starting
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)


@contextmanager
def threads_asked_back(run: Any) -> Iterator[int]:
    """The thread guard of a spinning run (an SFT Recipe or a TrlRecipe) on this machine's real CPU pressure: more
    busy processes than cores until the guard asks for half the threads; yields the full count (restored after)."""
    import pytest
    import torch

    from playground.train import cpu_share

    full = torch.get_num_threads()
    if full < 2:
        pytest.skip("one CPU thread: nothing to give back")
    guard = cpu_share.ThreadGuard(full, period=0.2, settle=0.0)
    run.runtime = replace(run.runtime, thread_guard=guard)
    try:
        with busy_processes(cpu_share.available_cores() + 1):
            guard.watch()
            deadline = time.monotonic() + 30
            while guard.wanted == full and time.monotonic() < deadline:
                time.sleep(0.1)
            assert guard.wanted == full // 2, "the busy processes made no CPU pressure the guard saw"
            yield full
    finally:
        guard.stop()
        torch.set_num_threads(full)
