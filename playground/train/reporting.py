"""What the trainer tells the world: event lines on stdout (one JSON object per line behind the
``@@playground`` prefix, flushed at once) and, inside a Kubeflow TrainJob, the TrainJob's
``status.trainerStatus`` through kubeflow's ``update_trainjob_status``.

Only rank 0 reports. The TrainJob update runs on a background thread with the latest figures,
so a slow or unreachable controller never stalls a training step.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from typing import Any, TextIO

from playground.events import JobPhase, Metric, Phase, Progress, format_event_line

TRAINJOB_ENV = "KUBEFLOW_TRAINER_SERVER_URL"  # set by the Trainer controller inside a TrainJob
THROTTLE_SECONDS = 5.0  # the SDK sends at most one update per 5 s
_IMPORT_TRIES = 5  # the SDK's import, retried: it can race another thread's imports (seen once beside a CPU hog)
_RUN_STATUS = {JobPhase.SUCCEEDED: "FINISHED", JobPhase.FAILED: "FAILED", JobPhase.CANCELLED: "KILLED"}


class Reporter:
    """Prints events (rank 0 only) and mirrors progress into the TrainJob status."""

    def __init__(self, *, enabled: bool = True, stream: TextIO | None = None, tracker: Any = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.tracker = tracker  # the job's MLflow run (playground.runs.tracking.RunTracker), rank 0 only
        self.metrics: dict[str, float] = {}
        self._position: dict[str, int] = {}  # the last step/total_steps, carried into the final status
        self._window: dict[str, float] = {}  # the last progress point's method figures (DPO/GRPO), ditto
        self._status = _TrainJobStatus() if enabled and os.environ.get(TRAINJOB_ENV) else None

    def _emit(self, event: Any) -> None:
        if self.enabled:
            self.stream.write(format_event_line(event) + "\n")
            self.stream.flush()

    def phase(self, phase: JobPhase, reason: str = "") -> None:
        self._emit(Phase(phase=phase, reason=reason))
        if self.tracker and phase.terminal:
            self.tracker.finish(_RUN_STATUS[phase])
        if self._status and phase == JobPhase.SUCCEEDED:
            self._status.push(100, 0, {**self._window, **self.metrics, **self._position}, final=True)

    def log(self, line: str) -> None:
        """A plain, human-readable line (becomes a Log event on the reading side)."""
        if self.enabled:
            self.stream.write(line + "\n")
            self.stream.flush()

    def metric(self, name: str, value: float) -> None:
        if not math.isfinite(value):
            self.log(f"metric {name} is not finite ({value}); not reported")
            return
        self.metrics[name] = float(value)
        self._emit(Metric(name=name, value=float(value)))
        if self.tracker:
            self.tracker.metric(name, float(value))

    def progress(self, progress: Progress) -> None:
        self._emit(_finite(progress))
        if self.tracker:
            self.tracker.progress(progress)
            self.flush_tracker_warning()
        if self._status:
            # step/total_steps let a reader merge this summary with the log lines step for step
            self._position = {"step": progress.step, "total_steps": progress.total_steps}
            metrics = {**self.metrics, **self._position}
            if progress.loss is not None and math.isfinite(progress.loss):
                metrics["loss"] = round(progress.loss, 5)
            self._window = {name: round(value, 5) for name, value in progress.metrics.items() if math.isfinite(value)}
            metrics.update(self._window)
            if progress.tokens_per_second is not None:
                metrics["tokens_per_second"] = round(progress.tokens_per_second, 1)
            eta = None if progress.eta_seconds is None else int(progress.eta_seconds)
            self._status.push(int(100 * progress.fraction), eta, metrics)

    def summary(self, metrics: dict[str, Any]) -> None:
        """The run's final figures (metrics.json) for its MLflow run."""
        if self.tracker:
            self.tracker.summary(metrics)

    def flush_tracker_warning(self) -> None:
        """Print the tracker's warning line, if it has one (from the main thread)."""
        if self.tracker and (warning := self.tracker.take_warning()):
            self.log(warning)

    def close(self) -> None:
        if self._status:
            self._status.close()
        if self.tracker:
            self.flush_tracker_warning()
            self.tracker.close()
            self.flush_tracker_warning()


def _finite(progress: Progress) -> Progress:
    """The line protocol forbids NaN/inf (``allow_nan=False``): unknown figures become None."""
    from dataclasses import replace

    changes: dict[str, Any] = {
        name: None
        for name in ("loss", "learning_rate", "tokens_per_second", "eta_seconds", "mfu")
        if isinstance(getattr(progress, name), float) and not math.isfinite(getattr(progress, name))
    }
    if not all(math.isfinite(value) for value in progress.metrics.values()):
        changes["metrics"] = {name: value for name, value in progress.metrics.items() if math.isfinite(value)}
    return replace(progress, **changes) if changes else progress


class _TrainJobStatus:
    """Latest-value mailbox drained by a daemon thread calling ``update_trainjob_status``.

    The SDK already throttles to one request per 5 s and never raises; we keep only the newest
    figures (older ones are stale) and always deliver the final 100%.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: tuple[int, int | None, dict[str, Any], bool] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="trainjob-status", daemon=True)
        self._thread.start()

    def push(self, percent: int, eta: int | None, metrics: dict[str, Any], final: bool = False) -> None:
        with self._cond:
            self._pending = (percent, eta, dict(metrics), final)
            self._cond.notify()

    def close(self, timeout: float = 20.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        import time

        update_trainjob_status = None
        for attempt in range(_IMPORT_TRIES):
            try:
                from kubeflow.trainer import update_trainjob_status

                break
            except ImportError:  # also "partially initialized module": another thread (the MLflow worker, the
                # trainer) importing a shared dependency at this moment; that clears once its import ends
                time.sleep(0.5 * (attempt + 1))
            except Exception:  # SDK broken: reporting is best effort
                return
        if update_trainjob_status is None:  # SDK missing
            return

        last_sent = -THROTTLE_SECONDS
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                percent, eta, metrics, final = self._pending
                self._pending = None
            for attempt in range(4 if final else 1):  # the last update must land despite the throttle
                if attempt:
                    time.sleep(max(0.1, THROTTLE_SECONDS + 0.1 - (time.monotonic() - last_sent)))
                if update_trainjob_status(progress_percent=percent, estimated_remaining_seconds=eta, metrics=metrics):
                    last_sent = time.monotonic()
                    break
