"""Helpers for the training-entrypoint tests: run ``python -m playground.train`` for real, parse its lines."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from playground.events import Event, Log, Metric, Phase, Progress, parse_line

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class TrainRun:
    returncode: int
    stdout: str
    stderr: str
    events: list[Event]

    @property
    def phases(self) -> list[str]:
        return [str(e.phase) for e in self.events if isinstance(e, Phase)]

    @property
    def progress(self) -> list[Progress]:
        return [e for e in self.events if isinstance(e, Progress)]

    @property
    def metrics(self) -> dict[str, float]:
        return {e.name: e.value for e in self.events if isinstance(e, Metric)}

    @property
    def logs(self) -> list[str]:
        return [e.line for e in self.events if isinstance(e, Log)]


def run_trainer(*args: str, timeout: float = 300) -> TrainRun:
    """Run the entrypoint in a child process (as every backend does) and parse stdout into events."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "playground.train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO_ROOT,
    )
    events = [parse_line(line) for line in proc.stdout.splitlines() if line.strip()]
    return TrainRun(proc.returncode, proc.stdout, proc.stderr, events)


def describe(run: TrainRun) -> str:
    """Context for assertion messages."""
    return f"exit {run.returncode}\n--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-3000:]}"
