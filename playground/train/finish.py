"""After the last step: the final evaluation and the save as phases a watcher sees, with progress, and their time in
the training ETA.

Every recipe (SFT, DPO, GRPO) goes Training → ``Evaluating`` (the held-out answers, ``answered 24/50 held-out
requests · ~0:40 left``) → ``Saving`` → Succeeded, and writes how long that finish took (``finish_seconds``) into
``metrics.json``. A later run of the same blueprint with the same held-out size on the same machine adds that time to
each progress point's ETA, so "ETA 0:00" means done, not "evaluation next": the plan's evaluation and saving
(:func:`planned_finish`), which come from that run where there is one, else the earlier run's finish. Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.events import JobPhase
from playground.formatting import time_left_text
from playground.train.eta import EtaSmoother, finishing_eta, saving_eta

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


@dataclass(frozen=True)
class PlannedFinish:
    """The plan's evaluation and saving seconds for this run, and its step time (all under the load at setup)."""

    evaluation: float
    saving: float
    step_seconds: float


def planned_finish(spec: Any) -> PlannedFinish | None:  # spec: playground.train.settings.TrainSpec
    """What :func:`playground.blueprints.plan.make_plan` says the run's finish takes (its output: ``jobs/<id>/output``,
    whose home holds the measured runs); None where the plan cannot be made (a model it cannot size offline)."""
    from playground.blueprints.plan import machine_load, make_plan

    blueprint, params = spec.blueprint, spec.params.as_dict()
    parents = Path(spec.output).resolve().parents
    home = parents[2] if len(parents) >= 3 and parents[1].name == "jobs" else None
    try:  # the load without this trainer (its own job is running; its setup is about one thread of the average)
        plan = make_plan(blueprint, params, home=home, load=machine_load(own_threads=1.0, count_jobs=False))
    except Exception:  # the ETA falls back to the earlier run's finish; training goes on
        return None
    if plan.time is None:
        return None
    return PlannedFinish(plan.time.evaluation, plan.time.saving, plan.seconds_per_step)


def make_eta(
    total_steps: int, earlier_finish: float, planned: PlannedFinish | None, finish: FinishReporter
) -> EtaSmoother:
    """The run's ETA, with the plan's evaluation and saving (from the earlier run where there is one, and the job's
    wrap-up after the trainer: the MLflow run, the status) scaled by the run's pace, else the earlier run's finish;
    ``finish`` gets the planned evaluation and save for its Evaluating/Saving countdowns."""
    if planned is None:
        return EtaSmoother(total_steps, finish_seconds=earlier_finish)
    finish.planned_evaluation, finish.planned_saving = planned.evaluation, planned.saving
    return EtaSmoother(
        total_steps, finish_seconds=planned.evaluation + planned.saving, planned_step_seconds=planned.step_seconds
    )


class FinishReporter:
    """The Evaluating phase with progress over the held-out requests, then Saving, each with the time left; times
    the evaluation and the whole finish."""

    def __init__(self, reporter: Any, *, every: float = UPDATE_SECONDS) -> None:
        self.reporter, self.every = reporter, every
        self.started: float | None = None
        self.saving_started: float | None = None
        self.planned_evaluation = 0.0  # the plan's seconds (make_eta sets them)
        self.planned_saving = 0.0
        self._last_update = float("-inf")

    def evaluating(self, total: int) -> None:
        self.started = self._last_update = time.perf_counter()
        left = time_left_text(finishing_eta(0, total, 0.0, self.planned_saving, self.planned_evaluation))
        self.reporter.phase(JobPhase.EVALUATING, f"answering {total} held-out requests · {left}")

    def answered(self, done: int, total: int) -> None:
        """A callback for :func:`playground.train.evaluate.generate_answers`: ``done`` of ``total`` answered."""
        now = time.perf_counter()
        if self.started is None or done >= total or now - self._last_update < self.every:
            return
        self._last_update = now
        left = time_left_text(self.eta_seconds(done, total, now))
        self.reporter.phase(JobPhase.EVALUATING, f"answered {done}/{total} held-out requests · {left}")

    def eta_seconds(self, done: int, total: int, now: float | None = None) -> float:
        """Seconds left in the finish with ``done`` of ``total`` held-out requests answered (at least 1)."""
        now = time.perf_counter() if now is None else now
        elapsed = now - self.started if self.started is not None else 0.0
        return finishing_eta(done, total, elapsed, self.planned_saving, self.planned_evaluation)

    def saving(self) -> None:
        self.saving_started = time.perf_counter()
        if self.started is None:  # saved without a final evaluation (GRPO's warm start)
            self.started = self.saving_started
        left = time_left_text(saving_eta(0.0, self.planned_saving))
        self.reporter.phase(JobPhase.SAVING, f"writing the model directory · {left}")

    @property
    def evaluate_seconds(self) -> float | None:
        """The final evaluation's seconds (metrics.json's ``evaluate_seconds``), once the save began."""
        if self.started is None or self.saving_started is None:
            return None
        return round(self.saving_started - self.started, 3)

    @property
    def seconds(self) -> float:
        """Since the evaluation started (read once the save is done: the run's ``finish_seconds``)."""
        return round(time.perf_counter() - (self.started or time.perf_counter()), 3)
