"""The App: gallery → form → monitor → serve → chat, plus the jobs list (reattach)."""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as ipw

from playground import api
from playground.api import BACKENDS, Backend, Blueprint, booth_enabled, get_blueprint
from playground.errors import UserError
from playground.events import JobPhase
from playground.facade import Playground, connect
from playground.owner import Owner
from playground.types import Job, RunParameters
from widgets.chat import ChatPanel, ServePanel
from widgets.form import LaunchForm
from widgets.gallery import BlueprintGallery
from widgets.guard import guard_kernel
from widgets.jobs import JobsList
from widgets.monitor import JobMonitor, headline_html
from widgets.state import error_text, scrub_paths

STYLE = """<style>
.pg-app h1 { margin: 4px 0 2px 0; }
.pg-intro { font-size: 1.15em; margin: 0 0 4px 0; }
.pg-card { border: 1px solid #ddd; border-radius: 8px; background: #fafafa; }
.pg-card-summary { color: #333; margin: 2px 0; }
.pg-card-resources { color: #555; font-size: 0.9em; }
.pg-card-details summary { cursor: pointer; color: #555; font-size: 0.9em; }
.pg-form h3 { margin: 2px 0; } .pg-form p { margin: 2px 0 6px 0; }
.pg-headline { font-size: 1.4em; font-weight: 600; color: #1a5e1a; margin: 6px 0; }
.pg-all-results summary { cursor: pointer; }
.pg-card.pg-selected { border: 2px solid #1f77b4; background: #eef5fc; }
.pg-card-title { font-weight: 600; font-size: 1.05em; }
.pg-card-table th { text-align: left; padding-right: 8px; color: #666; font-weight: normal; }
.pg-note { color: #a15c00; margin-top: 4px; }
.pg-badge { color: white; border-radius: 4px; padding: 1px 8px; font-weight: 600; }
.pg-reason { color: #666; margin-left: 6px; }
.pg-queue { color: #a15c00; margin: 0 8px; font-weight: 600; }
.pg-help { color: #777; font-size: 0.9em; margin: 0 8px; }
.pg-error-text { color: #c00; }
.pg-log { font-size: 0.85em; line-height: 1.35; background: #f6f6f6; padding: 4px; margin: 0; white-space: pre-wrap; }
.pg-metrics-table { border-collapse: collapse; margin: 4px 0; }
.pg-metrics-table th { text-align: left; font-weight: normal; color: #555; padding: 2px 16px 2px 0; }
.pg-metrics-table td { font-weight: 600; font-variant-numeric: tabular-nums; text-align: right; }
.pg-answers { border: 1px solid #ddd; border-radius: 6px; min-height: 80px; padding: 6px; }
.pg-turn { border-top: 1px solid #eee; padding-top: 4px; }
.pg-q { color: #555; font-style: italic; }
.pg-reading { color: #777; font-size: 0.85em; }
.pg-a { font-family: monospace; font-size: 1.1em; margin-bottom: 6px; white-space: pre-wrap; }
.pg-empty, .pg-whitespace, .pg-cut { color: #888; }
.pg-ok { color: #2ca02c; font-weight: bold; } .pg-bad { color: #d62728; font-weight: bold; }
.pg-section h2 { margin: 10px 0 4px 0; }
.pg-data-preview { font-size: 0.85em; background: #f6f6f6; padding: 4px; margin: 2px 0 6px 0; white-space: pre-wrap; }
.pg-data-preview mark { background: #ffe58a; }
.pg-data-ok { color: #2ca02c; }
</style>"""

RUNNING = "your job is still running: wait for it to finish, or cancel it"
INTRO = (
    "Pick a model, press Launch: watch it learn live, then ask it and the untouched base model the same question "
    "side by side."
)
UNKNOWN_VISITOR = (
    "This page could not recognise your visit (its cookie is missing or not valid). Reload the page; "
    "if this message stays, allow cookies for this site."
)


def preload() -> None:
    """Load now what the first :class:`App` would load lazily (plotly's chart widget, the blueprint catalog: ~0.4 s on
    2 cores). A warm booth kernel runs it before any visitor comes; it creates no widget."""
    import plotly.graph_objects as go

    go.FigureWidget  # noqa: B018 - plotly imports its widget module on first access
    api.blueprints()


def section(title: str, body: ipw.Widget, css: str) -> ipw.VBox:
    box = ipw.VBox([ipw.HTML(f"<h2>{html.escape(title)}</h2>"), body])
    return box.add_class("pg-section").add_class(css)


class App(ipw.VBox):
    """The whole path in one widget. It talks to the engine only through its API: the facade (a backend and its
    servers) and :mod:`playground.api`.

    Booth mode (``booth=True``, or ``PLAYGROUND_BOOTH=1`` in the environment as
    ``playground app --booth`` sets it): the page belongs to one ``visitor`` (in Voila, the id
    verified from the signed cookie; without a valid one the page shows nothing else). Every
    backend call carries that owner, the backend choice is fixed, and visitors see no paths,
    pids or command lines. Outside booth mode, the operator sees every job and a details expander.

    On load the visitor's running job (else the newest) is reattached, history included.
    """

    def __init__(
        self,
        *,
        backend: Backend | Playground | None = None,
        backend_name: str | None = None,
        blueprint_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        model_source: str | None = None,
        dataset_source: str | None = None,
        backend_options: Mapping[str, Any] | None = None,
        booth: bool | None = None,
        visitor: str | None = None,
        reattach: bool = True,
    ) -> None:
        self.booth = booth_enabled() if booth is None else booth
        self.guard = guard_kernel(booth=self.booth)  # hostile widget messages: size, rate, no tracebacks out
        if self.booth and visitor is None:  # the visitor of the kernel's verified cookie (None: nobody, fail closed)
            found = Owner.from_environment()
            visitor = found.id if found is not None else None
        self.owner = visitor if self.booth else None
        self.operator = not self.booth
        self.backend_name = backend_name or (backend.name if backend else os.environ.get("PLAYGROUND_BACKEND", "local"))
        given = backend if isinstance(backend, Playground) or backend is None else Playground(backend)
        self._backends: dict[str, Playground] = {self.backend_name: given} if given else {}
        self._backend_options = dict(backend_options or {})
        self.model_source, self.dataset_source = model_source, dataset_source
        self.preset = dict(params or {})
        self._preset_for = blueprint_id
        self.blueprint: Blueprint | None = None
        self.form: LaunchForm | None = None
        self.serve_panel: ServePanel | None = None
        self.chat: ChatPanel | None = None
        self.job: Job | None = None
        self.jobs: JobsList | None = None
        self._built = False
        self.status = ipw.HTML("").add_class("pg-app-status")
        header = ipw.HTML(STYLE + f"<h1>Blueprint Playground</h1><p class='pg-intro'>{html.escape(INTRO)}</p>")
        if self.booth and not self.owner:  # fail closed: no identity, no jobs
            self.monitor = JobMonitor(owner="", operator=False)
            self.gallery = None
            self.status.value = f"<p class='pg-error-text'>{html.escape(UNKNOWN_VISITOR)}</p>"
            super().__init__([header, self.status])
            self.add_class("pg-app")
            return

        # The monitor (and its chart) is on the page from the start and stays there: every job is
        # shown in it, so its plotly view never has to be created again (see JobMonitor).
        self.monitor = JobMonitor(owner=self.owner, operator=self.operator, on_done=self._finished)
        self.chart = self.monitor.chart
        self.gallery = BlueprintGallery(
            api.blueprints(), on_select=self.select, backend=self.backend_name, operator=self.operator
        )
        where = "below" if self.booth else "above"
        self.form_box = ipw.VBox([ipw.HTML(f"<i>pick a blueprint {where}</i>")])
        self.serve_box = ipw.VBox([ipw.HTML("<i>available when the job has succeeded</i>")])
        self.presence = None  # booth mode: shows the engine this visitor is still here while the kernel lives
        try:
            self.jobs = JobsList(self.get_backend(self.backend_name), on_open=self.open_job, owner=self.owner)
            self.presence = self.get_backend(self.backend_name).keep_present(self.owner)
        except Exception as exc:  # e.g. no cluster configured: shown, the gallery still works
            self.status.value = f"<span class='pg-error-text'>{html.escape(self._text(error_text(exc)))}</span>"
        jobs = section("Your jobs", self.jobs or ipw.HTML(""), "pg-step-jobs")
        if self.booth:  # a visitor: the preselected blueprint's Launch first (above the fold), other blueprints below
            steps = [
                section("1 · Launch", self.form_box, "pg-step-form"),
                section("2 · Watch it learn", self.monitor, "pg-step-monitor"),
                section("3 · Ask both models: base vs fine-tuned", self.serve_box, "pg-step-chat"),
                section("Other blueprints", self.gallery, "pg-step-gallery"),
                jobs,
            ]
        else:
            steps = [
                section("1 · Pick a blueprint", self.gallery, "pg-step-gallery"),
                section("2 · Set parameters and launch", self.form_box, "pg-step-form"),
                section("3 · Watch training", self.monitor, "pg-step-monitor"),
                section("4 · Serve and chat: base vs fine-tuned", self.serve_box, "pg-step-chat"),
                jobs,
            ]
        super().__init__([header, self.status, *steps])
        self.add_class("pg-app")
        if blueprint_id:
            self.gallery.select(blueprint_id)
        if reattach and self.jobs is not None and self.jobs.jobs:
            self.reattach(self.jobs.jobs[0])
        self._built = True  # from now on a selection or a launch brings its widgets into view

    # -- backends ------------------------------------------------------------------------------

    def get_backend(self, name: str) -> Playground:
        if name not in self._backends:
            options = self._backend_options if name == self.backend_name else {}
            self._backends[name] = connect(name, **options)
        return self._backends[name]

    def _text(self, text: str) -> str:
        return text if self.operator else scrub_paths(text)

    # -- the path ------------------------------------------------------------------------------

    def select(self, blueprint: Blueprint) -> None:
        self.blueprint = blueprint
        values = self.preset if self.preset and blueprint.id == self._preset_for else None
        backends = BACKENDS if self.backend_name in BACKENDS else (self.backend_name, *BACKENDS)
        self.form = LaunchForm(
            blueprint,
            on_launch=self.launch,
            backend=self.backend_name,
            backends=backends,
            values=values,
            show_backend=not self.booth,
            data_panel=not self.booth,
            model_source=self.model_source,
            dataset_source=self.dataset_source,
            on_saved=self._saved,
            compact=self.booth,
        )
        if self.gallery is not None and not self.booth:
            self.form.backend.observe(lambda change: self.gallery.set_backend(change["new"]), names="value")
        self.form_box.children = [self.form]
        self._update_launch()
        if self._built:  # picked on a card: its Launch comes into view (the browser scrolls to a focused element)
            self.form.launch_button.focus()

    def launch(self, backend_name: str, params: RunParameters | dict[str, Any]) -> Job:
        """Called by the form with validated params; engine errors propagate to the form.

        Refused here (the kernel) while the shown job runs, whatever state the button is in:
        a double-click makes one job. The engine's booth policy adds the visitor's quotas.
        """
        if self.blueprint is None:
            raise UserError("pick a blueprint first", field="blueprint")
        if self.monitor.running:
            raise UserError(RUNNING, field="quota")
        backend = self.get_backend(self.backend_name if self.booth else backend_name)
        sources = {"model_source": self.model_source, "dataset_source": self.dataset_source}
        if not self.booth and self.form is not None:
            sources.update(self.form.sources())  # the "Your data & model" panel (its values start as these)
        request = api.make_request(
            self.blueprint.id,
            params,
            **sources,
            labels={"app": "playground"},
            owner=self.owner,
        )
        job = backend.submit(request)
        self.attach(backend, job)
        self.monitor.cancel_button.focus()  # the browser scrolls the monitor into view
        if self.jobs is not None:
            if self.jobs.backend is not backend:
                self.jobs.set_backend(backend)
            else:
                self.jobs.refresh()
        return job

    def _saved(self, blueprint: Blueprint) -> None:
        """A blueprint of your own was saved from the form: the gallery shows it (the form stays as it is)."""
        if self.gallery is not None:
            self.gallery.refresh(api.blueprints())

    def open_job(self, job: Job) -> None:
        """Reattach (JobsList → Open): the monitor replays the job's whole history."""
        backend = self.jobs.backend if self.jobs is not None else self.get_backend(self.backend_name)
        self.attach(backend, job)

    def reattach(self, job: Job) -> None:
        """After a reload: show ``job``, and its blueprint's form filled with its parameters
        (unless the page was opened with other parameters)."""
        known_blueprint = self.gallery is not None and job.blueprint_id in self.gallery.blueprints
        same_blueprint = self.blueprint is None or self.blueprint.id == job.blueprint_id
        if known_blueprint and same_blueprint and not self.preset:
            known = get_blueprint(job.blueprint_id).parameters
            self.preset = {k: v for k, v in job.params.items() if k in known}
            self._preset_for = job.blueprint_id
            self.gallery.select(job.blueprint_id)
        self.open_job(job)

    def attach(self, backend: Playground, job: Job) -> JobMonitor:
        self.job = job
        try:
            blueprint = get_blueprint(job.blueprint_id)
        except Exception:
            blueprint = None
        self.serve_box.children = [ipw.HTML("<i>available when the job has succeeded</i>")]
        self.monitor.follow(job, backend=backend, blueprint=blueprint)
        self._update_launch()
        return self.monitor

    def _update_launch(self) -> None:
        if self.form is None:
            return
        if self.monitor.running:
            self.form.block(RUNNING)
        else:
            self.form.unblock()

    def _finished(self, job: Job) -> None:
        """Called by the monitor (its thread) when the shown job ended."""
        if self.jobs is not None:
            self.jobs.refresh()
        if self.job is None or job.id != self.job.id:
            return
        self.job = job
        backend = self.monitor.backend
        if job.phase != JobPhase.SUCCEEDED or backend is None:
            reason = f": {html.escape(self._text(job.message))}" if job.message else ""
            self.serve_box.children = [ipw.HTML(f"job ended {job.phase}{reason}")]
        else:
            blueprint = get_blueprint(job.blueprint_id)
            self.chat = ChatPanel(
                blueprint,
                operator=self.operator,
                history=self._chat_history(backend, job),
                on_change=self._keep_chat(backend, job),
            )
            self.serve_panel = ServePanel(backend, job, chat=self.chat, owner=self.owner, operator=self.operator)
            top = headline_html(job.metrics, blueprint.quality.metric)  # the measured win, the chat right under it
            shown = [ipw.HTML(top)] if top else []
            self.serve_box.children = [*shown, self.serve_panel, self.chat]
        if self.form is not None:
            self.form.unblock()  # the monitor's stream has ended (it is marked done just after this)

    def _chat_history(self, backend: Playground, job: Job) -> list[dict[str, Any]]:
        """This visitor's chat with the job's models as the engine kept it ([] when none or unreadable)."""
        try:
            return backend.chat_history(job.id, owner=self.owner)
        except Exception:  # a backend without kept chats, an unreadable file: the chat starts empty
            return []

    def _keep_chat(self, backend: Playground, job: Job) -> Callable[[list[dict[str, Any]]], None]:
        """What the chat calls once a question has both answers: the engine keeps it for this visitor and job."""
        return lambda exchanges: backend.save_chat(job.id, exchanges, owner=self.owner)
