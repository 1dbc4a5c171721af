"""LaunchForm: controls generated from the blueprint's parameter schema, errors inline, Launch."""

from __future__ import annotations

import contextlib
import html
import threading
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as ipw

from playground.api import BACKENDS, Blueprint, booth_enabled, format_duration, plan_run
from playground.errors import UserError
from widgets.state import FieldSpec, FormModel, FormResult, error_text, format_param
from widgets.userdata import DataPanel, is_data_error

LaunchHandler = Callable[[str, dict[str, Any]], Any]


def make_control(spec: FieldSpec, value: Any) -> ipw.ValueWidget:
    """One control per parameter. Numbers are typed into a text box: a bad value is shown as an
    error next to the field rather than silently clamped, as a slider would do."""
    style = {"description_width": "170px"}
    if spec.control == "Checkbox":
        return ipw.Checkbox(value=bool(value), description=spec.label, style=style, indent=True)
    if spec.control == "Dropdown":
        return ipw.Dropdown(options=list(spec.choices), value=value, description=spec.label, style=style)
    return ipw.Text(
        value=format_param(value),
        description=spec.label,
        placeholder=spec.allowed,
        continuous_update=False,
        style=style,
        layout=ipw.Layout(width="320px"),
    )


def _plan_html(plan: Any, message: str) -> str:
    """The plan panel: one line (memory, verdict, time) and the breakdown behind a toggle."""
    if plan is None:
        return f"<div class='pg-plan-note'>{html.escape(message)}</div>"
    gb = plan.memory.total / 1e9
    verdict = "fits" if plan.fits else "does not fit"
    icon = "✓" if plan.fits else "✗"
    duration = format_duration(plan.seconds, unknown="–", sub_minute=True)
    head = (
        f"<b>Plan</b>: {plan.parameters / 1e6:.1f}M parameters ({plan.trainable_parameters / 1e6:.2f}M trainable) · "
        f"<span class='pg-plan-verdict'>{icon} {gb:.2f} GB per device, {verdict}</span> · about {duration}"
    )
    if plan.advice:
        head += f" · {html.escape(plan.advice)}"
    details = html.escape(plan.describe())
    return f"<div class='pg-plan-head'>{head}</div><details><summary>how</summary><pre>{details}</pre></details>"


def _error_html(message: str) -> str:
    return f"<span class='pg-error-text'>{html.escape(message)}</span>" if message else ""


class LaunchForm(ipw.VBox):
    """The launch form for one blueprint.

    ``on_launch(backend_name, params)`` is called with validated params; a
    :class:`~playground.errors.UserError` it raises is shown inline (next to its field when it
    names one). Nothing is validated here that the engine does not validate itself.

    Every value is read from the kernel-side widgets and validated at Launch: a client can send any
    comm message (change a control's value, click a disabled button), so neither the controls'
    bounds nor the button's ``disabled`` state is trusted. :meth:`block` refuses launches in the kernel.

    ``data_panel=True`` adds the "Your data & model" section (:class:`~widgets.userdata.DataPanel`, never in
    booth mode); ``on_launch`` then reads the chosen sources with :meth:`sources`.
    """

    def __init__(
        self,
        blueprint: Blueprint,
        *,
        on_launch: LaunchHandler | None = None,
        backend: str = "local",
        backends: tuple[str, ...] = BACKENDS,
        values: Mapping[str, Any] | None = None,
        show_backend: bool = True,
        data_panel: bool = False,
        model_source: str | None = None,
        dataset_source: str | None = None,
        on_saved: Callable[[Blueprint], None] | None = None,
        compact: bool = False,
    ) -> None:
        self.blueprint = blueprint
        self.model = FormModel(blueprint)
        self.on_launch = on_launch
        self.backend_name = backend
        self.controls: dict[str, ipw.ValueWidget] = {}
        self.errors: dict[str, ipw.HTML] = {}
        self.blocked_reason = ""
        self._refused = False  # the status says "nothing launched: fix …" (kept up to date as fields change)
        self.show_backend = show_backend
        self._launching = threading.Lock()
        rows = []
        initial = {**self.model.defaults(), **dict(values or {})}
        for spec in self.model.fields:
            value = initial[spec.name]
            try:
                control = make_control(spec, value)
            except Exception:  # a preset a checkbox/dropdown cannot hold: start from the default
                control = make_control(spec, spec.default)
            control.add_class(f"pg-field-{spec.name}")
            hint = " · ".join(part for part in (spec.help, spec.allowed if spec.control == "Text" else "") if part)
            help_text = ipw.HTML(f"<span class='pg-help'>{html.escape(hint)}</span>")
            error = ipw.HTML("").add_class("pg-error").add_class(f"pg-error-{spec.name}")
            control.observe(lambda _change, name=spec.name: self.check_field(name), names="value")
            self.controls[spec.name] = control
            self.errors[spec.name] = error
            rows.append(ipw.HBox([control, help_text, error], layout=ipw.Layout(align_items="center")))
        self.backend = ipw.Dropdown(options=list(backends), value=backend, description="backend")
        self.backend.add_class("pg-backend")
        if not show_backend:
            self.backend.layout.display = "none"
        self.launch_button = ipw.Button(description="Launch", icon="rocket", button_style="primary")
        self.launch_button.add_class("pg-launch")
        self.launch_button.on_click(lambda _: self.launch())
        self.status = ipw.HTML("").add_class("pg-form-status")
        # Will it fit, how long: the engine's plan (playground.blueprints.plan), redrawn as the values change.
        self.plan_view = ipw.HTML("").add_class("pg-plan")
        self._plan_generation = 0
        self._plan_lock = threading.Lock()
        title = ipw.HTML(f"<h3>{html.escape(blueprint.title)}</h3><p>{html.escape(blueprint.description)}</p>")
        launch_row = ipw.HBox([self.backend, self.launch_button])
        self.data: DataPanel | None = None
        if data_panel and not booth_enabled():  # booth: no such widgets exist, whatever a client sends
            self.data = DataPanel(
                blueprint,
                params=self._valid_params,
                model_source=model_source,
                dataset_source=dataset_source,
                on_saved=on_saved,
            )
        extra = [self.data] if self.data is not None else []
        # compact (booth): the description and Launch on top, the parameters behind a "Settings" toggle
        self.settings_toggle = ipw.ToggleButton(value=not compact, description="Settings", icon="cog")
        self.settings_toggle.add_class("pg-settings-toggle")
        self.settings = ipw.VBox([*rows, *extra, self.plan_view]).add_class("pg-settings")
        self.settings_toggle.observe(lambda change: self.show_settings(bool(change["new"])), names="value")
        if compact:
            launch_row.children = (*launch_row.children, self.settings_toggle)
            children = [title, launch_row, self.status, self.settings]
        else:
            self.settings_toggle.layout.display = "none"
            children = [title, self.settings, launch_row, self.status]
        super().__init__(children)
        self.show_settings(not compact)
        self.add_class("pg-form")
        self.backend.observe(lambda _change: self.refresh_plan(), names="value")
        if values:
            self.validate(initial)
        self.refresh_plan()

    def show_settings(self, shown: bool = True) -> None:
        """Show (or fold away) the parameters; an error in one of them shows them whatever the toggle said."""
        self.settings.layout.display = None if shown else "none"
        if self.settings_toggle.value != shown:
            self.settings_toggle.value = shown

    def values(self) -> dict[str, Any]:
        return {name: control.value for name, control in self.controls.items()}

    def _valid_params(self) -> dict[str, Any] | None:
        result = self.validate()
        return dict(result.params) if result.ok else None

    def sources(self) -> dict[str, str | None]:
        """The dataset and model sources chosen in the data panel (``{}`` without one); a UserError for values
        Launch cannot use."""
        return self.data.launch_sources() if self.data is not None else {}

    def chosen_backend(self) -> str:
        """The backend picked in the form; when the dropdown is hidden (booth), the App's, whatever a client sent."""
        return str(self.backend.value) if self.show_backend else self.backend_name

    def check_field(self, name: str) -> str:
        """Validate one field as it changes; its error (or nothing) appears next to it."""
        message = self.model.validate({name: self.controls[name].value}).errors.get(name, "")
        self.errors[name].value = _error_html(message)
        if message:
            self.show_settings()
        if self._refused:
            self._show_refusal(self.model.validate(self.values()))
        self.refresh_plan()
        return message

    def _show_refusal(self, result: FormResult) -> None:
        """Say "nothing launched: fix …" naming the fields still wrong; gone once none is (no stale red line)."""
        self._refused = not result.ok
        if result.ok:
            self.status.value = ""
            return
        bad = ", ".join(name.replace("_", " ") for name in result.errors)
        self.status.value = _error_html(f"nothing launched: fix {bad}")

    def refresh_plan(self, *, wait: bool = False) -> threading.Thread | None:
        """Recompute the plan for the current values in a thread (the kernel keeps answering); a newer
        request wins over an older one. Invalid values leave the last plan, marked as such."""
        result = self.model.validate(self.values())
        with self._plan_lock:
            self._plan_generation += 1
            generation = self._plan_generation
            if not result.ok:  # an older plan still computing must not come back over this
                self.plan_view.value = _plan_html(None, "plan: fix the highlighted values first")
                return None
        backend = self.chosen_backend()
        thread = threading.Thread(
            target=self._compute_plan, args=(generation, dict(result.params), backend), daemon=True, name="pg-plan"
        )
        thread.start()
        if wait:
            thread.join()
        return thread

    def _compute_plan(self, generation: int, params: dict[str, Any], backend: str) -> None:
        try:
            plan = plan_run(self.blueprint.id, params, backend=backend)
            view = _plan_html(plan, "")
        except UserError as exc:
            view = _plan_html(None, f"plan unavailable: {exc}")
        except Exception:  # never a traceback or a path to the page
            view = _plan_html(None, "plan unavailable for these values")
        with self._plan_lock, contextlib.suppress(Exception):  # the kernel shutting down: no page left to show it
            if generation == self._plan_generation:
                self.plan_view.value = view

    def validate(self, values: Mapping[str, Any] | None = None) -> FormResult:
        """Validate through the engine and show each error next to its field."""
        result = self.model.validate(self.values() if values is None else values)
        for name, widget in self.errors.items():
            widget.value = _error_html(result.errors.get(name, ""))
        if any(name in self.errors for name in result.errors):
            self.show_settings()  # the visitor sees the field to fix
        other = [msg for name, msg in result.errors.items() if name not in self.errors]
        self.status.value = "<br>".join(_error_html(m) for m in other)
        return result

    def show_error(self, exc: BaseException) -> None:
        """Show an engine error inline: next to its field when it names one, else under the form."""
        message = error_text(exc)
        field = getattr(exc, "field", None)
        if self.data is not None and is_data_error(exc):
            self.data.show_error(message)
        if field in self.errors:
            self.errors[field].value = _error_html(message)
            self.show_settings()
        else:
            self.status.value = _error_html(message)

    def block(self, reason: str) -> None:
        """Refuse launches (kernel-side) and disable the button, e.g. while the visitor's job runs."""
        self.blocked_reason = reason
        self.launch_button.disabled = True
        self.launch_button.tooltip = reason

    def unblock(self) -> None:
        self.blocked_reason = ""
        self.launch_button.disabled = False
        self.launch_button.tooltip = ""

    def launch(self) -> Any:
        """Validate, then hand the params to ``on_launch``; returns what it returned (None on error)."""
        if not self._launching.acquire(blocking=False):
            return None  # another launch is in progress (a second thread)
        try:
            if self.blocked_reason:  # e.g. the second click of a double-click: the first one launched
                self.status.value = f"<span class='pg-help'>{html.escape(self.blocked_reason)}</span>"
                return None
            result = self.validate()
            if not result.ok:
                if not self.status.value:
                    self._show_refusal(result)
                return None
            self._refused = False
            if self.on_launch is None:
                return None
            self.launch_button.disabled = True
            self.status.value = "launching…"
            try:
                launched = self.on_launch(self.chosen_backend(), result.typed)
            except UserError as exc:
                self.show_error(exc)
                return None
            except Exception as exc:
                self.status.value = _error_html(error_text(exc))
                return None
            finally:
                self.launch_button.disabled = bool(self.blocked_reason)
            self.status.value = "launched"
            return launched
        finally:
            self._launching.release()
