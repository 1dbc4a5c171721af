"""After the last step: the final evaluation and the save as phases a watcher sees, with progress, and their time in
the training ETA.

Every recipe (SFT, DPO, GRPO) goes Training → ``Evaluating`` (the held-out answers, ``answered 24/50 held-out
requests · ~0:40 left``) → ``Saving`` → Succeeded, and writes how long that finish took (``finish_seconds``) into
``metrics.json``. A later run of the same blueprint with the same held-out size on the same machine adds that time to
each progress point's ETA, so "ETA 0:00" means done, not "evaluation next". Torch-free.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from playground.events import JobPhase
from playground.formatting import format_duration

UPDATE_SECONDS = 2.0  # at most one progress update this often (the CLI prints each one)


def earlier_finish_seconds(output: Path, blueprint_id: str, num_eval_examples: int) -> float:
    """How long the final evaluation and save took in the newest earlier finished run of ``blueprint_id`` with the same
    held-out size among this machine's local jobs (``output`` is this job's ``jobs/<id>/output``); 0 when none."""
    from playground.blueprints.plan import measured_runs

    parents = Path(output).resolve().parents
    if len(parents) < 3:
        return 0.0
    for run in measured_runs(parents[2]):
        if run.blueprint_id == blueprint_id and run.num_eval_examples == num_eval_examples and run.finish_seconds:
            return run.finish_seconds
    return 0.0


class FinishReporter:
    """The Evaluating phase with progress over the held-out requests, then Saving; times the whole finish."""

    def __init__(self, reporter: Any, *, every: float = UPDATE_SECONDS) -> None:
        self.reporter, self.every = reporter, every
        self.started: float | None = None
        self._last_update = float("-inf")

    def evaluating(self, total: int) -> None:
        self.started = self._last_update = time.perf_counter()
        self.reporter.phase(JobPhase.EVALUATING, f"answering {total} held-out requests")

    def answered(self, done: int, total: int) -> None:
        """A callback for :func:`playground.train.evaluate.generate_answers`: ``done`` of ``total`` answered."""
        now = time.perf_counter()
        if self.started is None or done >= total or now - self._last_update < self.every:
            return
        self._last_update = now
        left = format_duration((now - self.started) * (total - done) / done) if done else "?"
        self.reporter.phase(JobPhase.EVALUATING, f"answered {done}/{total} held-out requests · ~{left} left")

    def saving(self) -> None:
        if self.started is None:  # saved without a final evaluation (GRPO's warm start)
            self.started = time.perf_counter()
        self.reporter.phase(JobPhase.SAVING, "writing the model directory")

    @property
    def seconds(self) -> float:
        """Since the evaluation started (read once the save is done: the run's ``finish_seconds``)."""
        return round(time.perf_counter() - (self.started or time.perf_counter()), 3)
