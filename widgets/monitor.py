"""JobMonitor: phase, queue position, progress bar with ETA, live loss/throughput chart, log tail,
evaluation table, cluster events, Cancel; an operator "details" expander outside booth mode."""

from __future__ import annotations

import html
import json
import os
import threading
import time
from collections.abc import Callable
from copy import deepcopy

import ipywidgets as ipw
import plotly.graph_objects as go

from playground.api import (
    Backend,
    Blueprint,
    format_duration,
    format_rate,
    job_run,
    register_model,
    time_left_in,
    without_tracebacks,
)
from playground.api import loss_curves as previous_loss_curves
from playground.events import HEADLINE_METRICS, METRIC_LABELS, JobPhase, Progress
from playground.facade import Playground
from playground.types import Job
from voila_app import PLOTLY_BUNDLE_ENV
from widgets.run_view import RunView
from widgets.state import (
    Coalescer,
    Snapshot,
    error_text,
    follow_job,
    headline,
    metric_rows,
    queue_text,
    scrub_paths,
    visitor_text,
)

PHASE_COLOURS = {
    JobPhase.PENDING: "#8a8a8a",
    JobPhase.INITIALIZING: "#1f77b4",
    JobPhase.TRAINING: "#1f77b4",
    JobPhase.EVALUATING: "#17becf",
    JobPhase.SAVING: "#9467bd",
    JobPhase.SUCCEEDED: "#2ca02c",
    JobPhase.FAILED: "#d62728",
    JobPhase.CANCELLED: "#ff7f0e",
}
LOG_LINES = 15  # the log tail shows this many of the newest lines
QUEUE_TICK_SECONDS = 1.0  # the queue's wait counts down this often


def phase_badge(phase: JobPhase, reason: str = "") -> str:
    colour = PHASE_COLOURS.get(phase, "#555")
    why = f" <span class='pg-reason'>{html.escape(reason)}</span>" if reason else ""
    return f"<span class='pg-badge' style='background:{colour}'>{phase}</span>{why}"


def metrics_table(
    metrics: dict[str, float], *, operator: bool = False, quality_metric: str | None = None, final: bool = False
) -> str:
    """The evaluation results: once the job succeeded (``final``) the headline (base → fine-tuned), then every figure
    as a small two-column table (names humanised, values formatted), folded away for a booth visitor."""
    rows = "".join(
        f"<tr><th>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
        for label, value in metric_rows(metrics, operator=operator)
    )
    if not rows:
        return ""
    table = f"<table class='pg-metrics-table'>{rows}</table>"
    top = headline_html(metrics, quality_metric) if final else ""
    if operator:
        return f"{top}<b>Results</b>{table}"
    return f"{top}<details class='pg-all-results'><summary><b>Results</b>: every figure</summary>{table}</details>"


def points_text(count: int) -> str:
    """``1 point``, ``12 points``: the chart's progress points."""
    return f"{count} point" if count == 1 else f"{count} points"


def headline_html(metrics: dict[str, float], quality_metric: str | None = None) -> str:
    """The headline (:func:`widgets.state.headline`) as the page shows it; "" without one."""
    text = headline(metrics, quality_metric)
    return f"<div class='pg-headline'>{html.escape(text)}</div>" if text else ""


def nice_step(span: float, ticks: int = 8) -> int:
    """An integer tick step of 1, 2 or 5 × 10^k giving at most about ``ticks`` ticks over ``span``."""
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if span / (mantissa * scale) <= ticks:
                return mantissa * scale
        scale *= 10


def right_axis_value(point: Progress) -> tuple[str, float] | None:
    """What the chart's right axis shows for a point: the method's headline figure (GRPO's mean reward,
    DPO's reward margin) when it has one, else tokens/s; None when the point has neither."""
    headline = next((name for name in HEADLINE_METRICS if name in point.metrics), None)
    if headline is not None:
        return METRIC_LABELS[headline], point.metrics[headline]
    return None if point.tokens_per_second is None else ("tokens/s", point.tokens_per_second)


CHART_HEIGHT = 380


def bundle_loader(url: str) -> str:
    """A few bytes of ES module that import plotly's widget bundle from ``url`` (relative to the page's Jupyter base
    URL) and re-export it: the browser fetches and caches the ~5 MB bundle once, instead of receiving it as widget
    state over every page's websocket."""
    return (
        'const config = JSON.parse(document.getElementById("jupyter-config-data")?.textContent || "{}");\n'
        'const base = new URL(config.baseUrl || "/", document.baseURI);\n'
        f"const bundle = await import(new URL({json.dumps(url)}, base).href);\n"
        "export const FigureModel = bundle.FigureModel;\n"
        "export const FigureView = bundle.FigureView;\n"
        "export default bundle.default;\n"
    )


def loss_chart() -> go.FigureWidget:
    """Loss (left axis) and tokens/s (right axis) against the optimizer step: the page's width, integer steps,
    the right axis with its own round ticks (an overlaying axis' ticks follow the left one's by default: 4.83k…).
    Under ``playground app --booth`` plotly's front end comes from a cacheable URL (:func:`bundle_loader`)."""
    chart = go.FigureWidget(
        data=[
            go.Scatter(x=[], y=[], name="loss", mode="lines+markers", marker={"size": 4}),
            go.Scatter(x=[], y=[], name="tokens/s", mode="lines", yaxis="y2", line={"dash": "dot"}),
            go.Scatter(
                x=[], y=[], name="previous runs", mode="lines", line={"color": "#bbbbbb", "width": 1}, connectgaps=False
            ),
        ],
        layout=go.Layout(
            height=CHART_HEIGHT,
            autosize=True,
            margin={"l": 55, "r": 65, "t": 30, "b": 45},
            xaxis={"title": {"text": "step"}, "tickformat": "d", "rangemode": "tozero"},
            yaxis={"title": {"text": "loss"}, "rangemode": "tozero"},
            yaxis2={
                "title": {"text": "tokens/s"},
                "overlaying": "y",
                "side": "right",
                "showgrid": False,
                "tickmode": "auto",
                "nticks": 6,
                "rangemode": "tozero",
                "tickformat": "~s",
            },
            legend={"orientation": "h", "y": 1.12},
            template="plotly_white",
        ),
    )
    chart._config = {**chart._config, "responsive": True}  # follows the window's width (plotly.js resizes it)
    if os.environ.get(PLOTLY_BUNDLE_ENV):
        chart._esm = bundle_loader(os.environ[PLOTLY_BUNDLE_ENV])
    return chart


def _facade(backend: Backend | Playground | None) -> Playground | None:
    """The facade over ``backend``: a monitor talks to jobs the way the app does (owners as the edge takes them)."""
    return backend if backend is None or isinstance(backend, Playground) else Playground(backend)


class JobMonitor(ipw.VBox):
    """Follows a job through ``backend.events(job_id, follow=True)`` on a background thread.

    The stream starts from the job's beginning, so attaching after a reload shows the whole
    history. Updates reach the widgets through a :class:`~widgets.state.Coalescer`
    (≤ ``max_rate`` per second); every progress point lands on the chart.

    :meth:`follow` points the same monitor at another job. Its widgets, the chart above all, stay
    on the page: plotly's FigureWidget view keeps listening to its model after it is taken off the
    page, so a second view of the same figure made the dead one throw on every update ("Cannot
    read properties of undefined (reading 'length')") and the new one stayed empty.

    ``owner`` is passed to every backend call (booth mode: only that visitor's job is reachable);
    ``operator=False`` hides command lines, pids and paths, and the details expander.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        job: Job | str | None = None,
        *,
        blueprint: Blueprint | None = None,
        on_done: Callable[[Job], None] | None = None,
        max_rate: float = 10.0,
        autostart: bool = True,
        chart: go.FigureWidget | None = None,
        owner: str | None = None,
        operator: bool = True,
    ) -> None:
        if operator:
            # Imported whole before any monitor thread runs: plotly's chart validators use pandas as soon as it is in
            # sys.modules, and the operator's MLflow reads (previous runs, the run view, Register) import it from their
            # own threads, so a chart render during that import met a half-initialised module (AttributeError: ...
            # 'pandas' has no 'Series'). A visitor's page reads no MLflow: its kernel never imports pandas (~70 MB).
            import pandas  # noqa: F401  (0.3 s, once per kernel)
        self.backend = _facade(backend)
        self.job_id = ""
        self.blueprint = blueprint
        self.on_done = on_done
        self.max_rate = max_rate
        self.owner = owner
        self.operator = operator
        self.final_job: Job | None = None
        self.error: str = ""
        self.coalescer: Coalescer | None = None
        self._lock = threading.RLock()  # one job's updates at a time: rendering vs switching jobs
        self._generation = 0
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._job_info: Job | None = None
        self._details_lines = 0
        self._queued: tuple[int, float | None, float | None] | None = None  # position, estimate, when: counts down
        self._reset_series()

        self.header = ipw.HTML("<i>No job yet: launch one above, or open one from “Your jobs”.</i>")
        self.header.add_class("pg-monitor-header")
        self.phase = ipw.HTML("").add_class("pg-phase")
        self.queue = ipw.HTML("").add_class("pg-queue")
        self.progress = ipw.FloatProgress(value=0.0, min=0.0, max=1.0, layout=ipw.Layout(width="60%"))
        self.progress.add_class("pg-progress")
        self.progress_text = ipw.HTML("").add_class("pg-progress-text")
        self.points = ipw.HTML(points_text(0)).add_class("pg-points")
        self.run_view = RunView()  # the finished job's MLflow run: curves, metrics, parameters, its UI (operator view)
        self.run_link = self.run_view.link
        self.chart = chart if chart is not None else loss_chart()
        self.chart_box = ipw.VBox([self.chart], layout=ipw.Layout(width="100%")).add_class("pg-chart")
        self.metrics = ipw.HTML("").add_class("pg-metrics")
        self.cluster = ipw.HTML("", layout=ipw.Layout(display="none")).add_class("pg-cluster-events")
        self.logs = ipw.HTML("<pre class='pg-log'></pre>").add_class("pg-logs")
        self.status = ipw.HTML("").add_class("pg-monitor-status")
        self.cancel_button = ipw.Button(description="Cancel", icon="stop", button_style="warning")
        self.cancel_button.add_class("pg-cancel")
        self.cancel_button.on_click(lambda _: self.cancel())
        self._set_cancellable(False)  # shown only while a job that can be cancelled is
        self.register_button = ipw.Button(description="Register model", icon="archive", disabled=True)
        self.register_button.add_class("pg-register")  # MLflow's model registry; not in booth mode
        self.register_button.on_click(lambda _: self.register())
        if not operator:
            self.register_button.layout.display = "none"
        self.details = ipw.HTML("").add_class("pg-details-body")
        self.details_box = ipw.Accordion(children=[self.details], selected_index=None)
        self.details_box.set_title(0, "Details (operator)")
        self.details_box.add_class("pg-details")
        if not operator:
            self.details_box.layout.display = "none"
        super().__init__(
            [
                self.header,
                ipw.HBox(
                    [self.phase, self.queue, self.cancel_button, self.register_button],
                    layout=ipw.Layout(align_items="center"),
                ),
                ipw.HBox([self.progress, self.progress_text]),
                self.chart_box,
                self.points,
                self.run_view,
                self.metrics,
                self.cluster,
                ipw.HTML("<b>Log</b>"),
                self.logs,
                self.status,
                self.details_box,
            ]
        )
        self.add_class("pg-monitor")
        threading.Thread(target=self._count_down, name="queue-countdown", daemon=True).start()
        if job is not None:
            self.follow(job, backend=backend, blueprint=blueprint, start=autostart)

    def _count_down(self) -> None:
        """Once a second, the queue's estimated wait counts down on the page (the engine re-estimates only when the
        position moves or the estimate departs from this countdown)."""
        while True:
            time.sleep(QUEUE_TICK_SECONDS)
            with self._lock:
                if self._queued is not None:
                    text = html.escape(queue_text(*self._queued))
                    if self.queue.value != text:
                        self.queue.value = text

    # -- lifecycle -----------------------------------------------------------------------------

    def follow(
        self,
        job: Job | str,
        *,
        backend: Backend | None = None,
        blueprint: Blueprint | None = None,
        start: bool = True,
    ) -> None:
        """Show ``job`` from its beginning, replacing whatever this monitor showed."""
        with self._lock:
            self._stop.set()  # the previous job's reader stops at its next event; its updates are ignored
            self._generation += 1
            self._stop = threading.Event()
            self._done = threading.Event()
            self._thread = None
            self.coalescer = None
            self.backend = _facade(backend) or self.backend
            self.blueprint = blueprint
            self.job_id = job if isinstance(job, str) else job.id
            self.final_job = None
            self.error = ""
            self._reset_series()
            with self.chart.batch_update():
                for trace in self.chart.data:
                    trace.x, trace.y = [], []
            title = blueprint.title if blueprint else (job.blueprint_id if isinstance(job, Job) else "")
            self.header.value = f"<b>Job</b> <code>{html.escape(self.job_id)}</code> · {html.escape(title)}"
            phase = job.phase if isinstance(job, Job) else JobPhase.PENDING
            self.phase.value = phase_badge(phase)
            self.queue.value = ""
            self._queued = None
            if isinstance(job, Job) and job.queue_position:
                self.queue.value = html.escape(queue_text(job.queue_position, job.estimated_wait_seconds))
            self.progress.value = 0.0
            self.progress.bar_style = ""
            self.progress_text.value = "waiting for the first progress point…"
            self.points.value = points_text(0)
            self.run_view.clear()
            self.metrics.value = ""
            self.cluster.value = ""
            self.cluster.layout.display = "none"
            self.logs.value = "<pre class='pg-log'></pre>"
            self.status.value = ""
            self._set_cancellable(not (isinstance(job, Job) and job.done))
            self.register_button.disabled = True
            self._job_info = job if isinstance(job, Job) else None
            self._details_lines = 0
            self._show_details(self._job_info, [])
        if start:
            self.start()

    def start(self) -> None:
        """Start following the current job (idempotent)."""
        with self._lock:
            if self._thread is not None or not self.job_id or self.backend is None:
                return
            generation = self._generation
            self.coalescer = Coalescer(lambda snap: self._render(snap, generation), max_rate=self.max_rate)
            self._thread = threading.Thread(
                target=self._follow,
                args=(generation, self.backend, self.job_id, self.coalescer, self._stop, self._done),
                name=f"follow-{self.job_id}",
                daemon=True,
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop following (the reader ends at its next event; nothing more is drawn)."""
        with self._lock:
            self._stop.set()
            self._generation += 1

    def detach(self) -> None:
        """Alias of :meth:`stop` (kept for notebooks written against the first version)."""
        self.stop()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the current job's stream ended and the last update was applied."""
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def running(self) -> bool:
        """A job is shown and has not finished."""
        return bool(self.job_id) and not self._done.is_set()

    def _set_cancellable(self, cancellable: bool) -> None:
        """Cancel is on the page only while the shown job can be cancelled (no greyed orange button otherwise)."""
        self.cancel_button.disabled = not cancellable
        self.cancel_button.layout.display = None if cancellable else "none"

    def cancel(self) -> None:
        if not self.job_id or self.backend is None:
            return
        self.cancel_button.disabled = True  # stays shown (greyed) until the job ends: the request is on its way
        threading.Thread(target=self._cancel, args=(self.backend, self.job_id), daemon=True).start()

    def _cancel(self, backend: Backend, job_id: str) -> None:
        try:
            backend.cancel(job_id, owner=self.owner)
            if job_id == self.job_id:
                self.status.value = "cancel requested"
        except Exception as exc:
            if job_id == self.job_id:
                message = html.escape(self._text(error_text(exc)))
                self.status.value = f"<span class='pg-error'>cancel failed: {message}</span>"
                self.cancel_button.disabled = False

    def register(self) -> None:
        """Record the finished job's model in MLflow's model registry (operator view only)."""
        job = self.final_job
        if not self.operator or job is None or job.phase != JobPhase.SUCCEEDED:
            return
        self.register_button.disabled = True
        threading.Thread(target=self._register, args=(job, self._generation), daemon=True).start()

    def _register(self, job: Job, generation: int) -> None:
        try:
            version = register_model(job)
            text = f"registered <code>{html.escape(version.name)}</code> version {html.escape(version.version)}"
            text += f" · serve it: <code>playground serve models:/{html.escape(version.name)}/{version.version}</code>"
        except Exception as exc:
            text = f"<span class='pg-error'>register failed: {html.escape(error_text(exc))}</span>"
        with self._lock:
            if self._current(generation):
                self.status.value = text
                self.register_button.disabled = False

    def _current(self, generation: int) -> bool:
        return generation == self._generation

    def _follow(
        self,
        generation: int,
        backend: Backend,
        job_id: str,
        coalescer: Coalescer,
        stop: threading.Event,
        done: threading.Event,
    ) -> None:
        if self.operator:  # its own thread: reading MLflow (~2 s to import) never delays the live stream
            threading.Thread(
                target=self._load_previous_runs, args=(generation, backend, job_id), name="previous-runs", daemon=True
            ).start()
        try:
            stream = backend.events(job_id, follow=True, owner=self.owner)
            follow_job(stream, coalescer, stop=stop, on_error=lambda exc: self._stream_error(exc, generation))
        except Exception as exc:
            self._stream_error(exc, generation)
            coalescer.close()
        final: Job | None = None
        if not stop.is_set():
            try:
                final = backend.get(job_id, owner=self.owner)
                self._render_final(final, generation, coalescer)
            except Exception as exc:
                self._stream_error(exc, generation)
        if coalescer.error is not None:
            self._stream_error(coalescer.error, generation)
        if self.operator and final is not None:
            self._show_run_link(generation, job_id)
        with self._lock:
            if self._current(generation):
                self.final_job = final
                self._set_cancellable(False)
                self.register_button.disabled = not (
                    self.operator and final is not None and final.phase == JobPhase.SUCCEEDED
                )
        if self.on_done and final is not None and self._current(generation):
            try:
                self.on_done(final)
            except Exception as exc:
                self._stream_error(exc, generation)
        done.set()  # after on_done: whoever waits sees its effects (e.g. the serve panel)

    def _load_previous_runs(self, generation: int, backend: Backend, job_id: str) -> None:
        """The loss curves of the blueprint's previous runs (MLflow), grey behind this one's. Best effort."""
        try:
            blueprint_id = self.blueprint.id if self.blueprint else backend.get(job_id, owner=self.owner).blueprint_id
            curves = previous_loss_curves(blueprint_id, exclude_job=job_id)
        except Exception:
            return
        with self._lock:
            if self._current(generation) and curves:
                for curve in curves:  # one trace, the runs separated by gaps
                    self._previous_steps += [*curve.steps, None]
                    self._previous_losses += [*curve.values, None]
                self._draw_chart()

    def _show_run_link(self, generation: int, job_id: str) -> None:
        try:
            run = job_run(job_id)
        except Exception:
            return
        with self._lock:
            if self._current(generation) and run is not None:
                self.run_view.show(run)

    def _stream_error(self, exc: BaseException, generation: int) -> None:
        with self._lock:
            if not self._current(generation):
                return
            self.error = error_text(exc)
            self.status.value = f"<span class='pg-error'>{html.escape(self._text(self.error))}</span>"

    def _quality(self) -> str | None:
        return self.blueprint.quality.metric if self.blueprint is not None else None

    # -- what a visitor may read -------------------------------------------------------------------

    def _text(self, text: str) -> str:
        return text if self.operator else scrub_paths(text)

    def _log_lines(self, lines: list[str]) -> list[str]:
        if self.operator:
            return lines
        # A visitor sees no traceback frames: each traceback becomes its one-line cause (the operator's log keeps it).
        return [shown for line in without_tracebacks(lines) if (shown := visitor_text(line)) is not None]

    def _show_details(self, job: Job | None, lines: list[str]) -> None:
        if not self.operator:
            return
        rows = []
        if job is not None:
            fields = {
                "job": job.id,
                "backend": job.backend,
                "owner": job.owner or "(operator)",
                "model": job.model_dir or "–",
                "base model": job.base_model or "–",
                "parameters": ", ".join(f"{k}={v}" for k, v in sorted(job.params.items())),
                "labels": ", ".join(f"{k}={v}" for k, v in sorted(job.labels.items())) or "–",
            }
            rows = [f"<tr><th>{k}</th><td><code>{html.escape(str(v))}</code></td></tr>" for k, v in fields.items()]
        supervisor = [line for line in lines if visitor_text(line) is None]
        log = f"<pre class='pg-log'>{html.escape(chr(10).join(supervisor[-10:]))}</pre>" if supervisor else ""
        self.details.value = f"<table class='pg-card-table'>{''.join(rows)}</table>{log}"

    # -- rendering (called ≤ max_rate times per second from the coalescer thread) ----------------

    def _reset_series(self) -> None:
        self._right_label = "tokens/s"
        if hasattr(self, "chart"):
            self._label_right_axis()
            self._set_step_axis(None)
        self._total_steps: int | None = None
        self._steps: list[int] = []
        self._losses: list[float | None] = []
        self._rate_steps: list[int] = []
        self._rates: list[float] = []
        self._previous_steps: list[int | None] = []
        self._previous_losses: list[float | None] = []

    def _label_right_axis(self) -> None:
        with self.chart.batch_update():
            self.chart.data[1].name = self._right_label
            self.chart.layout.yaxis2.title.text = self._right_label
            self.chart.layout.yaxis2.tickformat = "~s" if self._right_label == "tokens/s" else ""

    def _set_step_axis(self, total_steps: int | None) -> None:
        """The step axis spans the whole run (0 → total) with integer ticks; unknown total: plotly's own range."""
        if total_steps == self._total_steps:
            return
        self._total_steps = total_steps
        axis = self.chart.layout.xaxis
        with self.chart.batch_update():
            if total_steps:
                axis.range, axis.tickmode, axis.tick0 = [0, total_steps], "linear", 0
                axis.dtick = nice_step(total_steps)
            else:
                axis.range, axis.tickmode, axis.tick0, axis.dtick, axis.autorange = None, "auto", None, None, True

    def _draw_chart(self, *, resend: bool = False) -> None:
        """Send the whole series to the chart. Views that exist get it as one restyle; the model's
        ``_widget_data`` is kept equal to it too, so a view whose page connects later (a reload, a slow
        browser) starts from every point. ``resend`` first clears the traces, so that the restyle goes
        out even when the data did not change (plotly skips unchanged values): for a view that
        connected between a restyle and the model copy."""
        if resend:
            with self.chart.batch_update():
                for trace in self.chart.data:
                    trace.x, trace.y = [], []
        with self.chart.batch_update():
            self.chart.data[0].x = list(self._steps)
            self.chart.data[0].y = list(self._losses)
            self.chart.data[1].x = list(self._rate_steps)
            self.chart.data[1].y = list(self._rates)
            self.chart.data[2].x = list(self._previous_steps)
            self.chart.data[2].y = list(self._previous_losses)
        self.chart._widget_data = deepcopy(self.chart._data)

    def _render(self, snap: Snapshot, generation: int) -> None:
        with self._lock:
            if not self._current(generation):
                return
            self._render_snapshot(snap)

    def _render_snapshot(self, snap: Snapshot) -> None:
        self.phase.value = phase_badge(snap.phase, self._text(snap.reason))
        queued = (snap.queue_position, snap.estimated_wait_seconds, snap.queued_at)
        self._queued = queued if snap.queue_position else None
        self.queue.value = html.escape(queue_text(*self._queued)) if self._queued else ""
        for point in snap.new_points:
            self._steps.append(point.step)
            self._losses.append(point.loss)
            right = right_axis_value(point)
            if right is not None:
                if right[0] != self._right_label:  # DPO/GRPO: the method's headline replaces tokens/s
                    self._right_label, self._rate_steps, self._rates = right[0], [], []
                    self._label_right_axis()
                self._rate_steps.append(point.step)
                self._rates.append(right[1])
        if snap.new_points:
            self._set_step_axis(snap.new_points[-1].total_steps or None)
            self._draw_chart()
        self.points.value = points_text(len(self._steps))
        self.progress.value = snap.fraction
        latest = snap.latest
        if latest is not None:
            loss = f"{latest.loss:.4f}" if latest.loss is not None else "–"
            right = right_axis_value(latest)
            figure = f"{right[0]} {right[1]:.3g}" if right else f"{format_rate(latest.tokens_per_second)} tokens/s"
            eta = 0 if snap.phase.terminal else latest.eta_seconds
            if snap.phase in (JobPhase.EVALUATING, JobPhase.SAVING):  # the finish's own countdown, never 0:00
                eta = time_left_in(snap.reason) or eta
            self.progress_text.value = (
                f"step {latest.step}/{latest.total_steps} · {snap.fraction:.0%} · ETA "
                f"{format_duration(eta, unknown='–')} · loss {loss} · {figure}"
            )
        elif snap.queue_position:
            self.progress_text.value = "queued: training starts when a slot is free"
        if snap.metrics:
            self.metrics.value = metrics_table(
                snap.metrics,
                operator=self.operator,
                quality_metric=self._quality(),
                final=snap.phase == JobPhase.SUCCEEDED,
            )
        if snap.cluster_events:
            rows = "".join(
                f"<li><b>{html.escape(e.kind)}</b> {html.escape(e.reason)}: {html.escape(self._text(e.message))}</li>"
                for e in snap.cluster_events
            )
            self.cluster.value = f"<b>Cluster events</b><ul>{rows}</ul>"
            self.cluster.layout.display = None
        tail = self._log_lines(snap.log_tail)[-LOG_LINES:]
        self.logs.value = f"<pre class='pg-log'>{html.escape(chr(10).join(tail))}</pre>"
        if snap.phase.terminal:
            self._set_cancellable(False)
        if self.operator:
            supervisor = [line for line in snap.log_tail if visitor_text(line) is None]
            if len(supervisor) != self._details_lines:
                self._details_lines = len(supervisor)
                self._show_details(self._job_info, supervisor)

    def _render_final(self, job: Job, generation: int, coalescer: Coalescer) -> None:
        with self._lock:
            if not self._current(generation):
                return
            self.phase.value = phase_badge(job.phase, self._text(job.message))
            self.queue.value = ""
            if job.phase == JobPhase.SUCCEEDED:
                self.progress.value = 1.0
                self.progress.bar_style = "success"
            elif job.phase in (JobPhase.FAILED, JobPhase.CANCELLED):
                self.progress.bar_style = "danger" if job.phase == JobPhase.FAILED else "warning"
                if not self._steps:  # ended before any progress: say why instead of "waiting for the first…"
                    self.progress_text.value = html.escape(self._text(job.message) or f"{job.phase} before training")
            if job.metrics:
                self.metrics.value = metrics_table(
                    job.metrics,
                    operator=self.operator,
                    quality_metric=self._quality(),
                    final=job.phase == JobPhase.SUCCEEDED,
                )
            if job.phase == JobPhase.FAILED and job.log_tail:
                tail = self._log_lines(job.log_tail)[-LOG_LINES:]
                self.logs.value = f"<pre class='pg-log'>{html.escape(chr(10).join(tail))}</pre>"
            self._draw_chart(resend=True)
            self._show_details(job, list(coalescer.state.logs))
