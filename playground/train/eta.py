"""The time left in a run, as its progress events say it: smoothed, with the evaluation and the save in it.

A training step's time on a shared CPU swings (another process, the thread guard halving threads, a checkpoint):
the old ETA (remaining steps × the last window's step time) swung 15:04 ↔ 24:50 from one event to the next and said
0:00 while the held-out answers still took minutes. :class:`EtaSmoother` keeps an exponentially weighted step time
(a half-life of a tenth of the run, at least 10 steps), lets each event's ETA move at most ``MAX_CHANGE``× from the
previous one counted down, and adds the finish: the plan's evaluation and saving seconds, scaled by how the run's
steps compare with the plan's (a loaded machine slows both alike). During Evaluating, :func:`finishing_eta` says
what is left from the requests answered so far. Torch-free.
"""

from __future__ import annotations

import math
import time

MAX_CHANGE = 1.25  # an event's ETA is within this factor of the previous one, counted down
FINISH_SCALE = (0.5, 4.0)  # bounds on scaling the plan's finish by measured / planned step time


class EtaSmoother:
    """Remaining seconds of a run from its progress windows (:meth:`update`)."""

    def __init__(
        self,
        total_steps: int,
        *,
        finish_seconds: float = 0.0,
        planned_step_seconds: float | None = None,
        half_life_steps: float | None = None,
    ) -> None:
        self.total_steps = total_steps
        self.finish_seconds = max(0.0, finish_seconds)  # the plan's evaluation + saving
        self.planned_step_seconds = planned_step_seconds
        self.half_life_steps = half_life_steps or max(10.0, total_steps / 10)
        self.step_seconds: float | None = None  # the smoothed step time
        self.eta: float | None = None
        self._at: float | None = None

    def finish(self) -> float:
        """The evaluation and the save, as this run's pace makes them."""
        if not self.finish_seconds or not self.planned_step_seconds or self.step_seconds is None:
            return self.finish_seconds
        low, high = FINISH_SCALE
        return self.finish_seconds * min(high, max(low, self.step_seconds / self.planned_step_seconds))

    def update(self, step: int, window_steps: int, window_seconds: float, now: float | None = None) -> float:
        """The ETA after ``step``, the window of ``window_steps`` steps having taken ``window_seconds``."""
        now = time.monotonic() if now is None else now
        if window_steps > 0 and window_seconds > 0:
            sample = window_seconds / window_steps
            if self.step_seconds is None:
                self.step_seconds = sample
            else:
                weight = 1 - 0.5 ** (window_steps / self.half_life_steps)
                self.step_seconds += weight * (sample - self.step_seconds)
        raw = max(0, self.total_steps - step) * (self.step_seconds or 0.0) + self.finish()
        if self.eta is not None and self._at is not None:
            previous = max(0.0, self.eta - (now - self._at))
            if previous > 0:
                raw = min(previous * MAX_CHANGE, max(previous / MAX_CHANGE, raw))
        self.eta, self._at = raw, now
        return raw


def finishing_eta(done: int, total: int, elapsed: float, saving_seconds: float, planned_seconds: float) -> float:
    """Seconds left while Evaluating: the held-out requests left at the pace of those answered (the plan's evaluation
    before the first batch), then the save; never below one second, so the page never says 0:00 mid-finish."""
    left = elapsed * (total - done) / done if done > 0 and elapsed > 0 else max(0.0, planned_seconds - elapsed)
    return max(1.0, left + max(0.0, saving_seconds))


def saving_eta(elapsed: float, saving_seconds: float) -> float:
    """Seconds left while Saving: the planned save less what passed, never below one second."""
    return max(1.0, saving_seconds - elapsed) if math.isfinite(saving_seconds) else 1.0


def measured_load_factor(threads: int, wall_seconds: float, cpu_seconds: float) -> float:
    """How much slower than on an idle machine a CPU run trained, from the CPU it got: ``threads`` cores wanted for
    ``wall_seconds``, ``cpu_seconds`` received (metrics.json's ``load_factor``; the plan scales the run's times back
    to an idle machine by it). An idle machine gives a spinning run all its cores (1.0); a tiny-llama-cpu run at load
    ~8 on 2 cores got 0.64 of them (3.1, where its step took 2.8× the idle one)."""
    if wall_seconds <= 0 or cpu_seconds <= 0:
        return 1.0
    return round(max(1.0, threads * wall_seconds / cpu_seconds), 3)


class LoadRecorder:
    """The load factor the load average predicted while a run trained (:meth:`MachineLoad.slowdown
    <playground.blueprints.plan.MachineLoad.slowdown>`), averaged over its progress windows by time: metrics.json's
    ``load_average_factor``, beside the measured ``load_factor``, to check the plan's load model against."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._weighted = 0.0
        self._seconds = 0.0

    def sample(self, seconds: float, own_threads: float) -> None:
        """The load now (the 1-minute average less this run's ``own_threads``), weighted by the window's ``seconds``."""
        from playground.blueprints.plan import machine_load

        if seconds <= 0:
            return
        factor = machine_load(own_threads=own_threads, count_jobs=False).slowdown(self.threads)
        self._weighted += factor * seconds
        self._seconds += seconds

    @property
    def factor(self) -> float:
        return round(self._weighted / self._seconds, 3) if self._seconds else 1.0

    def measured(self, wall_seconds: float, cpu_seconds: float, *, gpu: bool = False) -> float:
        """:func:`measured_load_factor` for this run's threads (1.0 on a GPU: its step is not the CPU's)."""
        return 1.0 if gpu else measured_load_factor(self.threads, wall_seconds, cpu_seconds)
