"""The App: gallery → form → monitor → serve → chat, plus the jobs list (reattach)."""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from typing import Any

import ipywidgets as ipw

from playground import api
from playground.backends import BACKENDS, get_backend
from playground.backends.base import Backend
from playground.blueprints import Blueprint, get_blueprint
from playground.events import JobPhase
from playground.types import Job
from widgets.chat import ChatPanel, ServePanel
from widgets.form import LaunchForm
from widgets.gallery import BlueprintGallery
from widgets.jobs import JobsList
from widgets.monitor import JobMonitor, loss_chart
from widgets.state import error_text

STYLE = """<style>
.pg-card { border: 1px solid #ddd; border-radius: 8px; background: #fafafa; }
.pg-card.pg-selected { border: 2px solid #1f77b4; background: #eef5fc; }
.pg-card-title { font-weight: 600; font-size: 1.05em; }
.pg-card-table th { text-align: left; padding-right: 8px; color: #666; font-weight: normal; }
.pg-note { color: #a15c00; margin-top: 4px; }
.pg-badge { color: white; border-radius: 4px; padding: 1px 8px; font-weight: 600; }
.pg-reason { color: #666; margin-left: 6px; }
.pg-help { color: #777; font-size: 0.9em; }
.pg-error-text { color: #c00; }
.pg-log { max-height: 180px; overflow: auto; font-size: 0.85em; background: #f6f6f6; padding: 4px; margin: 0; }
.pg-answers { border: 1px solid #ddd; border-radius: 6px; min-height: 80px; padding: 6px; }
.pg-q { color: #555; font-style: italic; }
.pg-a { font-family: monospace; font-size: 1.1em; margin-bottom: 6px; }
.pg-ok { color: #2ca02c; font-weight: bold; } .pg-bad { color: #d62728; font-weight: bold; }
.pg-section h2 { margin: 12px 0 4px 0; }
</style>"""


def section(title: str, body: ipw.Widget, css: str) -> ipw.VBox:
    box = ipw.VBox([ipw.HTML(f"<h2>{html.escape(title)}</h2>"), body])
    return box.add_class("pg-section").add_class(css)


class App(ipw.VBox):
    """The whole path in one widget. It talks only to a Backend and the chat client."""

    def __init__(
        self,
        *,
        backend: Backend | None = None,
        backend_name: str | None = None,
        blueprint_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        model_source: str | None = None,
        dataset_source: str | None = None,
        backend_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.backend_name = backend_name or (backend.name if backend else os.environ.get("PLAYGROUND_BACKEND", "local"))
        self._backends: dict[str, Backend] = {self.backend_name: backend} if backend else {}
        self._backend_options = dict(backend_options or {})
        self.model_source, self.dataset_source = model_source, dataset_source
        self.preset = dict(params or {})
        self._preset_for = blueprint_id
        self.blueprint: Blueprint | None = None
        self.form: LaunchForm | None = None
        self.monitor: JobMonitor | None = None
        self.serve_panel: ServePanel | None = None
        self.chat: ChatPanel | None = None
        self.job: Job | None = None

        self.chart = loss_chart()  # created now, while the page renders, and reused by every monitor
        self.gallery = BlueprintGallery(api.blueprints(), on_select=self.select, backend=self.backend_name)
        self.form_box = ipw.VBox([ipw.HTML("<i>pick a blueprint above</i>")])
        self.monitor_box = ipw.VBox([ipw.HTML("<i>launch a job, or open one from “Your jobs”</i>")])
        self.serve_box = ipw.VBox([ipw.HTML("<i>available when the job has succeeded</i>")])
        self.status = ipw.HTML("").add_class("pg-app-status")
        try:
            self.jobs = JobsList(self.get_backend(self.backend_name), on_open=self.open_job)
        except Exception as exc:  # e.g. no cluster configured: shown, the gallery still works
            self.jobs = None
            self.status.value = f"<span class='pg-error-text'>{html.escape(error_text(exc))}</span>"
        super().__init__(
            [
                ipw.HTML(STYLE + "<h1>Blueprint Playground</h1>"),
                self.status,
                section("1 · Pick a blueprint", self.gallery, "pg-step-gallery"),
                section("2 · Set parameters and launch", self.form_box, "pg-step-form"),
                section("3 · Watch training", self.monitor_box, "pg-step-monitor"),
                section("4 · Serve and chat: base vs fine-tuned", self.serve_box, "pg-step-chat"),
                section("Your jobs", self.jobs or ipw.HTML(""), "pg-step-jobs"),
            ]
        )
        self.add_class("pg-app")
        if blueprint_id:
            self.gallery.select(blueprint_id)

    # -- backends ------------------------------------------------------------------------------

    def get_backend(self, name: str) -> Backend:
        if name not in self._backends:
            options = self._backend_options if name == self.backend_name else {}
            self._backends[name] = get_backend(name, **options)
        return self._backends[name]

    # -- the path ------------------------------------------------------------------------------

    def select(self, blueprint: Blueprint) -> None:
        self.blueprint = blueprint
        values = self.preset if self.preset and blueprint.id == self._preset_for else None
        backends = BACKENDS if self.backend_name in BACKENDS else (self.backend_name, *BACKENDS)
        self.form = LaunchForm(
            blueprint, on_launch=self.launch, backend=self.backend_name, backends=backends, values=values
        )
        self.form.backend.observe(lambda change: self.gallery.set_backend(change["new"]), names="value")
        self.form_box.children = [self.form]

    def launch(self, backend_name: str, params: dict[str, Any]) -> Job:
        """Called by the form with validated params; engine errors propagate to the form."""
        assert self.blueprint is not None
        backend = self.get_backend(backend_name)
        request = api.make_request(
            self.blueprint.id,
            params,
            model_source=self.model_source,
            dataset_source=self.dataset_source,
            labels={"app": "playground"},
        )
        job = backend.submit(request)
        self.attach(backend, job)
        if self.jobs is not None:
            if self.jobs.backend is not backend:
                self.jobs.set_backend(backend)
            else:
                self.jobs.refresh()
        return job

    def open_job(self, job: Job) -> None:
        """Reattach (JobsList → Open): the monitor replays the job's whole history."""
        backend = self.jobs.backend if self.jobs is not None else self.get_backend(self.backend_name)
        self.attach(backend, job)

    def attach(self, backend: Backend, job: Job) -> JobMonitor:
        self.job = job
        try:
            blueprint = get_blueprint(job.blueprint_id)
        except Exception:
            blueprint = None
        if self.monitor is not None:
            self.monitor.detach()
        self.monitor = JobMonitor(
            backend, job, blueprint=blueprint, chart=self.chart, on_done=lambda j: self._finished(backend, j)
        )
        self.monitor_box.children = [self.monitor]
        self.serve_box.children = [ipw.HTML("<i>available when the job has succeeded</i>")]
        return self.monitor

    def _finished(self, backend: Backend, job: Job) -> None:
        if self.jobs is not None:
            self.jobs.refresh()
        if self.job is None or job.id != self.job.id:
            return
        if job.phase != JobPhase.SUCCEEDED:
            self.serve_box.children = [ipw.HTML(f"job ended {job.phase}: {html.escape(job.message)}")]
            return
        blueprint = get_blueprint(job.blueprint_id)
        self.chat = ChatPanel(blueprint)
        self.serve_panel = ServePanel(backend, job, chat=self.chat)
        self.serve_box.children = [self.serve_panel, self.chat]
