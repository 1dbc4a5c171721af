"""RunView: a finished job's MLflow run, inline: every logged curve, the final metrics, the parameters, and where
to browse it in MLflow's UI (a link reachable from the user's browser, or what to install). It renders
:class:`playground.runs.store.RunRecord` as the engine read it; nothing here reads MLflow."""

from __future__ import annotations

import html
import os

import ipywidgets as ipw
import plotly.graph_objects as go

from playground.api import RunRecord
from voila_app import PLOTLY_BUNDLE_ENV
from widgets.state import METRIC_LABELS, humanise, metric_rows

CHART_HEIGHT = 300
SHOWN_FIRST = "loss"  # the curve drawn at first; the others are a legend click away (their scales differ)
PARAM_CHARS = 120  # a longer parameter value is cut on the page (whole in its tooltip)


def curve_label(key: str) -> str:
    return METRIC_LABELS.get(key, (humanise(key), ""))[0]


def link_html(record: RunRecord) -> str:
    """``MLflow run <id>: <a>open in MLflow's UI</a> (how it starts)``, or the id and what to install."""
    head = f"MLflow run <code>{html.escape(record.run_id)}</code> · {html.escape(record.status)}"
    if record.verdict != "unknown":
        head += f" · quality {html.escape(record.verdict)}"
    link = record.link
    if link.url is None:
        return f"{head}<br><span class='pg-run-ui-missing'>{html.escape(link.note)}</span>"
    anchor = f"<a href='{html.escape(link.url, quote=True)}' target='_blank' rel='noopener'>open in MLflow's UI</a>"
    note = f" <span class='pg-run-ui-note'>({html.escape(link.note)})</span>" if link.note else ""
    return f"{head}: {anchor}{note}"


def tables_html(record: RunRecord) -> str:
    """The final metrics, then the parameters, each a table folded in a ``<details>`` (the monitor's results table
    above already shows the evaluation)."""
    metrics = "".join(
        f"<tr><th>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
        for label, value in metric_rows(record.metrics, operator=True)
    )
    params = "".join(
        f"<tr><th>{html.escape(key)}</th>"
        f"<td title='{html.escape(value, quote=True)}'>{html.escape(_cut(value))}</td></tr>"
        for key, value in record.params.items()
    )
    parts = []
    if metrics:
        parts.append(
            f"<details class='pg-run-metrics'><summary><b>Run metrics</b> ({len(record.metrics)})</summary>"
            f"<table class='pg-metrics-table'>{metrics}</table></details>"
        )
    if params:
        parts.append(
            f"<details class='pg-run-params'><summary><b>Parameters</b> ({len(record.params)})</summary>"
            f"<table class='pg-metrics-table'>{params}</table></details>"
        )
    return "".join(parts)


def _cut(value: str) -> str:
    return value if len(value) <= PARAM_CHARS else value[: PARAM_CHARS - 1] + "…"


def curves_chart(traces: list[go.Scatter]) -> go.FigureWidget:
    """A run's curves against the step, sized like the monitor's, plotly's bundle loaded as the monitor's is. The
    traces are in the figure from the start: traces added to a figure before its view exists never reach the page."""
    chart = go.FigureWidget(
        data=traces,
        layout=go.Layout(
            height=CHART_HEIGHT,
            autosize=True,
            margin={"l": 55, "r": 20, "t": 30, "b": 45},
            xaxis={"title": {"text": "step"}, "tickformat": "d"},
            legend={"orientation": "h", "y": 1.15},
            template="plotly_white",
        ),
    )
    chart._config = {**chart._config, "responsive": True}
    if os.environ.get(PLOTLY_BUNDLE_ENV):
        from widgets.monitor import bundle_loader  # here: widgets.monitor imports this module

        chart._esm = bundle_loader(os.environ[PLOTLY_BUNDLE_ENV])
    return chart


class RunView(ipw.VBox):
    """One job's MLflow run; :meth:`show` a record, :meth:`clear` for none. Each record gets its own chart (a figure
    is never shown twice: a FigureWidget's old views keep listening, see :class:`widgets.monitor.JobMonitor`)."""

    def __init__(self) -> None:
        self.record: RunRecord | None = None
        self.link = ipw.HTML("").add_class("pg-run-link")
        self.tables = ipw.HTML("").add_class("pg-run-tables")
        self.chart: go.FigureWidget | None = None
        self.chart_box = ipw.VBox([], layout=ipw.Layout(width="100%")).add_class("pg-run-chart")
        super().__init__([self.link, self.chart_box, self.tables])
        self.add_class("pg-run-view")

    def clear(self) -> None:
        self.record = None
        self.link.value = ""
        self.tables.value = ""
        self.chart = None
        self.chart_box.children = []

    def show(self, record: RunRecord) -> None:
        self.record = record
        self.link.value = link_html(record)
        self.tables.value = tables_html(record)
        if not record.curves:
            self.chart = None
            self.chart_box.children = []
            return
        first = SHOWN_FIRST if any(curve.key == SHOWN_FIRST for curve in record.curves) else record.curves[0].key
        traces = [
            go.Scatter(
                x=curve.steps,
                y=curve.values,
                name=curve_label(curve.key),
                mode="lines+markers",
                marker={"size": 4},
                visible=True if curve.key == first else "legendonly",
                meta=curve.key,
            )
            for curve in record.curves
        ]
        self.chart = curves_chart(traces)
        self.chart_box.children = [self.chart]
