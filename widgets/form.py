"""LaunchForm: controls generated from the blueprint's parameter schema, errors inline, Launch."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as ipw

from playground.backends import BACKENDS
from playground.blueprints import Blueprint
from playground.errors import UserError
from widgets.state import FieldSpec, FormModel, FormResult, clean_number, error_text

LaunchHandler = Callable[[str, dict[str, Any]], Any]


def make_control(spec: FieldSpec, value: Any) -> ipw.ValueWidget:
    """A bounded control for one parameter (bounds and choices come from the schema)."""
    style = {"description_width": "170px"}
    layout = ipw.Layout(width="460px")
    common = {"description": spec.label, "style": style, "layout": layout, "continuous_update": False}
    kind = spec.control
    if kind == "Checkbox":
        return ipw.Checkbox(value=bool(value), description=spec.label, style=style, indent=True)
    if kind == "Dropdown":
        return ipw.Dropdown(options=list(spec.choices), value=value, description=spec.label, style=style)
    assert spec.min is not None and spec.max is not None
    if kind == "IntSlider":
        return ipw.IntSlider(value=int(value), min=int(spec.min), max=int(spec.max), **common)
    if kind == "BoundedIntText":
        common.pop("continuous_update")
        return ipw.BoundedIntText(value=int(value), min=int(spec.min), max=int(spec.max), **common)
    if kind == "FloatLogSlider":
        lo, hi = math.log10(spec.min), math.log10(spec.max)
        return ipw.FloatLogSlider(
            value=float(value), base=10, min=lo, max=hi, step=(hi - lo) / 200, readout_format=".2e", **common
        )
    return ipw.FloatSlider(
        value=float(value), min=spec.min, max=spec.max, step=(spec.max - spec.min) / 200, readout_format=".3g", **common
    )


class LaunchForm(ipw.VBox):
    """The launch form for one blueprint.

    ``on_launch(backend_name, params)`` is called with validated params; a
    :class:`~playground.errors.UserError` it raises is shown inline (next to its field when it
    names one). Nothing is validated here that the engine does not validate itself.
    """

    def __init__(
        self,
        blueprint: Blueprint,
        *,
        on_launch: LaunchHandler | None = None,
        backend: str = "local",
        backends: tuple[str, ...] = BACKENDS,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        self.blueprint = blueprint
        self.model = FormModel(blueprint)
        self.on_launch = on_launch
        self.controls: dict[str, ipw.ValueWidget] = {}
        self.errors: dict[str, ipw.HTML] = {}
        rows = []
        initial = {**self.model.defaults(), **dict(values or {})}
        for spec in self.model.fields:
            value = initial[spec.name]
            try:
                control = make_control(spec, value)
            except Exception:  # a preset outside the bounds: start from the default, show the error below
                control = make_control(spec, spec.default)
            control.add_class(f"pg-field-{spec.name}")
            help_text = ipw.HTML(f"<span class='pg-help'>{html.escape(spec.help)}</span>")
            error = ipw.HTML("").add_class("pg-error").add_class(f"pg-error-{spec.name}")
            self.controls[spec.name] = control
            self.errors[spec.name] = error
            rows.append(ipw.HBox([control, help_text, error]))
        self.backend = ipw.Dropdown(options=list(backends), value=backend, description="backend")
        self.backend.add_class("pg-backend")
        self.launch_button = ipw.Button(description="Launch", icon="rocket", button_style="primary")
        self.launch_button.add_class("pg-launch")
        self.launch_button.on_click(lambda _: self.launch())
        self.status = ipw.HTML("").add_class("pg-form-status")
        title = ipw.HTML(f"<h3>{html.escape(blueprint.title)}</h3><p>{html.escape(blueprint.description)}</p>")
        super().__init__([title, *rows, ipw.HBox([self.backend, self.launch_button]), self.status])
        self.add_class("pg-form")
        if values:
            self.validate(initial)

    def values(self) -> dict[str, Any]:
        return {name: clean_number(control.value) for name, control in self.controls.items()}

    def validate(self, values: Mapping[str, Any] | None = None) -> FormResult:
        """Validate through the engine and show each error next to its field."""
        result = self.model.validate(self.values() if values is None else values)
        for name, widget in self.errors.items():
            message = result.errors.get(name, "")
            widget.value = f"<span class='pg-error-text'>{html.escape(message)}</span>" if message else ""
        other = [msg for name, msg in result.errors.items() if name not in self.errors]
        self.status.value = "<br>".join(f"<span class='pg-error-text'>{html.escape(m)}</span>" for m in other)
        return result

    def show_error(self, exc: BaseException) -> None:
        """Show an engine error inline: next to its field when it names one, else under the form."""
        message = error_text(exc)
        field = getattr(exc, "field", None)
        if field in self.errors:
            self.errors[field].value = f"<span class='pg-error-text'>{html.escape(message)}</span>"
        else:
            self.status.value = f"<span class='pg-error-text'>{html.escape(message)}</span>"

    def launch(self) -> Any:
        """Validate, then hand the params to ``on_launch``; returns what it returned (None on error)."""
        result = self.validate()
        if not result.ok or self.on_launch is None:
            return None
        self.launch_button.disabled = True
        self.status.value = "launching…"
        try:
            launched = self.on_launch(self.backend.value, result.params)
        except UserError as exc:
            self.show_error(exc)
            return None
        except Exception as exc:
            self.status.value = f"<span class='pg-error-text'>{html.escape(error_text(exc))}</span>"
            return None
        finally:
            self.launch_button.disabled = False
        self.status.value = "launched"
        return launched
