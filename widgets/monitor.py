"""JobMonitor: phase, progress bar with ETA, live loss/throughput chart, log tail, cluster events, Cancel."""

from __future__ import annotations

import html
import threading
from collections.abc import Callable

import ipywidgets as ipw
import plotly.graph_objects as go

from playground.backends.base import Backend
from playground.blueprints import Blueprint
from playground.events import JobPhase
from playground.types import Job
from widgets.state import Coalescer, Snapshot, error_text, follow_job, format_eta, format_rate

PHASE_COLOURS = {
    JobPhase.PENDING: "#8a8a8a",
    JobPhase.INITIALIZING: "#1f77b4",
    JobPhase.TRAINING: "#1f77b4",
    JobPhase.SAVING: "#9467bd",
    JobPhase.SUCCEEDED: "#2ca02c",
    JobPhase.FAILED: "#d62728",
    JobPhase.CANCELLED: "#ff7f0e",
}


def phase_badge(phase: JobPhase, reason: str = "") -> str:
    colour = PHASE_COLOURS.get(phase, "#555")
    why = f" <span class='pg-reason'>{html.escape(reason)}</span>" if reason else ""
    return f"<span class='pg-badge' style='background:{colour}'>{phase}</span>{why}"


def loss_chart() -> go.FigureWidget:
    """Loss (left axis) and tokens/s (right axis) against the optimizer step."""
    return go.FigureWidget(
        data=[
            go.Scatter(x=[], y=[], name="loss", mode="lines+markers", marker={"size": 4}),
            go.Scatter(x=[], y=[], name="tokens/s", mode="lines", yaxis="y2", line={"dash": "dot"}),
        ],
        layout=go.Layout(
            height=280,
            margin={"l": 50, "r": 60, "t": 20, "b": 40},
            xaxis={"title": {"text": "step"}},
            yaxis={"title": {"text": "loss"}},
            yaxis2={"title": {"text": "tokens/s"}, "overlaying": "y", "side": "right", "showgrid": False},
            legend={"orientation": "h", "y": 1.12},
            template="plotly_white",
        ),
    )


class JobMonitor(ipw.VBox):
    """Follows one job through ``backend.events(job_id, follow=True)`` on a background thread.

    The stream starts from the job's beginning, so attaching after a reload shows the whole
    history. Updates reach the widgets through a :class:`~widgets.state.Coalescer`
    (≤ ``max_rate`` per second); every progress point lands on the chart.
    """

    def __init__(
        self,
        backend: Backend,
        job: Job | str,
        *,
        blueprint: Blueprint | None = None,
        on_done: Callable[[Job], None] | None = None,
        max_rate: float = 10.0,
        autostart: bool = True,
        chart: go.FigureWidget | None = None,
    ) -> None:
        self.backend = backend
        self.job_id = job if isinstance(job, str) else job.id
        self.blueprint = blueprint
        self.on_done = on_done
        self.max_rate = max_rate
        self.final_job: Job | None = None
        self.error: str = ""
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._steps: list[int] = []
        self._losses: list[float | None] = []
        self._rate_steps: list[int] = []
        self._rates: list[float] = []

        title = blueprint.title if blueprint else (job.blueprint_id if isinstance(job, Job) else "")
        self.header = ipw.HTML(f"<b>Job</b> <code>{html.escape(self.job_id)}</code> · {html.escape(title)}")
        self.phase = ipw.HTML(phase_badge(JobPhase.PENDING)).add_class("pg-phase")
        self.progress = ipw.FloatProgress(value=0.0, min=0.0, max=1.0, layout=ipw.Layout(width="60%"))
        self.progress.add_class("pg-progress")
        self.progress_text = ipw.HTML("waiting for the first progress point…").add_class("pg-progress-text")
        self.points = ipw.HTML("0 points").add_class("pg-points")
        # A chart created while the page renders (the App's) is safest: a FigureWidget created later
        # sends its traces right after opening its comm, and a busy browser may drop that first update.
        self.chart = chart if chart is not None else loss_chart()
        self._detached = False
        with self.chart.batch_update():
            for trace in self.chart.data:
                trace.x, trace.y = [], []
        self.chart_box = ipw.Box([self.chart]).add_class("pg-chart")
        self.metrics = ipw.HTML("").add_class("pg-metrics")
        self.cluster = ipw.HTML("", layout=ipw.Layout(display="none")).add_class("pg-cluster-events")
        self.logs = ipw.HTML("<pre class='pg-log'></pre>").add_class("pg-logs")
        self.status = ipw.HTML("").add_class("pg-monitor-status")
        self.cancel_button = ipw.Button(description="Cancel", icon="stop", button_style="warning")
        self.cancel_button.add_class("pg-cancel")
        self.cancel_button.on_click(lambda _: self.cancel())
        self.coalescer: Coalescer | None = None
        super().__init__(
            [
                self.header,
                ipw.HBox([self.phase, self.cancel_button]),
                ipw.HBox([self.progress, self.progress_text]),
                self.chart_box,
                self.points,
                self.metrics,
                self.cluster,
                ipw.HTML("<b>Log</b>"),
                self.logs,
                self.status,
            ]
        )
        self.add_class("pg-monitor")
        if autostart:
            self.start()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start following the job (idempotent)."""
        if self._thread is not None:
            return
        self.coalescer = Coalescer(self._render, max_rate=self.max_rate)
        self._thread = threading.Thread(target=self._follow, name=f"follow-{self.job_id}", daemon=True)
        self._thread.start()

    def detach(self) -> None:
        """Stop drawing on the (shared) chart; the stream keeps being read until it ends."""
        self._detached = True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the stream ended and the last update was applied."""
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        self.cancel_button.disabled = True
        threading.Thread(target=self._cancel, daemon=True).start()

    def _cancel(self) -> None:
        try:
            self.backend.cancel(self.job_id)
            self.status.value = "cancel requested"
        except Exception as exc:
            self.status.value = f"<span class='pg-error'>cancel failed: {html.escape(error_text(exc))}</span>"
            self.cancel_button.disabled = False

    def _follow(self) -> None:
        assert self.coalescer is not None
        try:
            stream = self.backend.events(self.job_id, follow=True)
            follow_job(stream, self.coalescer, on_error=self._stream_error)
        except Exception as exc:
            self._stream_error(exc)
            self.coalescer.close()
        try:
            self.final_job = self.backend.get(self.job_id)
            self._render_final(self.final_job)
        except Exception as exc:
            self._stream_error(exc)
        if self.coalescer.error is not None:
            self._stream_error(self.coalescer.error)
        self.cancel_button.disabled = True
        if self.on_done and self.final_job is not None:
            try:
                self.on_done(self.final_job)
            except Exception as exc:
                self._stream_error(exc)
        self._done.set()  # after on_done: whoever waits sees its effects (e.g. the serve panel)

    def _stream_error(self, exc: BaseException) -> None:
        self.error = error_text(exc)
        self.status.value = f"<span class='pg-error'>{html.escape(self.error)}</span>"

    # -- rendering (called ≤ max_rate times per second from the coalescer thread) ----------------

    def _render(self, snap: Snapshot) -> None:
        self.phase.value = phase_badge(snap.phase, snap.reason)
        for point in snap.new_points:
            self._steps.append(point.step)
            self._losses.append(point.loss)
            if point.tokens_per_second is not None:
                self._rate_steps.append(point.step)
                self._rates.append(point.tokens_per_second)
        if snap.new_points and not self._detached:
            with self.chart.batch_update():
                self.chart.data[0].x = list(self._steps)
                self.chart.data[0].y = list(self._losses)
                self.chart.data[1].x = list(self._rate_steps)
                self.chart.data[1].y = list(self._rates)
        self.points.value = f"{len(self._steps)} points"
        self.progress.value = snap.fraction
        latest = snap.latest
        if latest is not None:
            loss = f"{latest.loss:.4f}" if latest.loss is not None else "–"
            self.progress_text.value = (
                f"step {latest.step}/{latest.total_steps} · {snap.fraction:.0%} · ETA "
                f"{format_eta(latest.eta_seconds if not snap.phase.terminal else 0)} · loss {loss} · "
                f"{format_rate(latest.tokens_per_second)} tokens/s"
            )
        if snap.metrics:
            self.metrics.value = "<b>Evaluation</b> " + " · ".join(
                f"{html.escape(k)} = {v:.4g}" for k, v in sorted(snap.metrics.items())
            )
        if snap.cluster_events:
            rows = "".join(
                f"<li><b>{html.escape(e.kind)}</b> {html.escape(e.reason)}: {html.escape(e.message)}</li>"
                for e in snap.cluster_events
            )
            self.cluster.value = f"<b>Cluster events</b><ul>{rows}</ul>"
            self.cluster.layout.display = None
        tail = "\n".join(snap.log_tail[-30:])
        self.logs.value = f"<pre class='pg-log'>{html.escape(tail)}</pre>"
        if snap.phase.terminal:
            self.cancel_button.disabled = True

    def _render_final(self, job: Job) -> None:
        self.phase.value = phase_badge(job.phase, job.message)
        if job.phase == JobPhase.SUCCEEDED:
            self.progress.value = 1.0
            self.progress.bar_style = "success"
        elif job.phase in (JobPhase.FAILED, JobPhase.CANCELLED):
            self.progress.bar_style = "danger" if job.phase == JobPhase.FAILED else "warning"
        if job.metrics:
            self.metrics.value = "<b>Evaluation</b> " + " · ".join(
                f"{html.escape(k)} = {v:.4g}" for k, v in sorted(job.metrics.items())
            )
        if job.phase == JobPhase.FAILED and job.log_tail:
            tail = "\n".join(job.log_tail[-30:])
            self.logs.value = f"<pre class='pg-log'>{html.escape(tail)}</pre>"
