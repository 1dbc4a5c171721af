"""BlueprintGallery: one compact card per blueprint (title, what it does, CPU/GPU and how long a run takes, why it
cannot run here; model, data and method behind a details toggle).

A card's time is never written by hand: it is the engine's plan of the default run (``Plan.seconds``: start-up,
training, evaluation and saving under this machine's load now), computed off the kernel's main thread."""

from __future__ import annotations

import contextlib
import html
import threading
from collections.abc import Callable, Iterable
from typing import Any

import ipywidgets as ipw

from playground.api import Blueprint, format_duration, plan_run
from widgets.state import blueprint_notes


def method_text(blueprint: Blueprint) -> str:
    method = blueprint.method
    if method.kind == "lora":
        return f"LoRA r={method.rank} α={method.alpha} on {', '.join(method.target_modules)}"
    return "full fine-tune"


def gpu_text(blueprint: Blueprint) -> str:
    res = blueprint.resources
    if not res.needs_gpu:
        return "CPU only"
    total = res.nodes * res.gpus_per_node
    return f"{total} GPU{'s' if total > 1 else ''}" + (f" ({res.nodes} nodes)" if res.nodes > 1 else "")


def summary_text(blueprint: Blueprint, limit: int = 110) -> str:
    """One line of what the blueprint does: its description's first sentence, shortened to ``limit`` characters."""
    text = " ".join(blueprint.description.split())
    first = text.split(". ", 1)[0].rstrip(".")
    if not first:
        return blueprint.task
    return first if len(first) <= limit else first[: limit - 1].rsplit(" ", 1)[0] + "…"


def time_text(plan: Any) -> str:
    """How long the default run takes, from its plan (``about 4:10 here now``); "" without a plan."""
    if plan is None or not plan.seconds or plan.seconds <= 0:
        return ""
    where = "here now" if plan.device == "cpu" else f"on {plan.processes} GPU{'s' if plan.processes > 1 else ''}"
    return f"about {format_duration(plan.seconds, sub_minute=True)} {where}"


def card_html(blueprint: Blueprint, notes: list[str], time: str = "") -> str:
    """Title, one line of what it does, CPU/GPU and ``time`` (:func:`time_text`), why it cannot run here; the rest
    (model, data, method, id) behind a ``details`` toggle, which works without JavaScript."""
    model = blueprint.model.source + (" (gated)" if blueprint.model.gated else "")
    rows = [
        ("id", blueprint.id),
        ("task", blueprint.task),
        ("model", model),
        ("data", blueprint.dataset.source),
        ("method", method_text(blueprint)),
    ]
    table = "".join(f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    note = "".join(f"<div class='pg-note'>⚠ {html.escape(n)}</div>" for n in notes)
    resources = gpu_text(blueprint) + (f" · {time}" if time and not notes else "")  # a time only where it runs
    return (
        f"<div class='pg-card-title'>{html.escape(blueprint.title)}</div>"
        f"<div class='pg-card-summary'>{html.escape(summary_text(blueprint))}</div>"
        f"<div class='pg-card-resources'>{html.escape(resources)}</div>{note}"
        f"<details class='pg-card-details'><summary>details</summary>"
        f"<table class='pg-card-table'>{table}</table></details>"
    )


class BlueprintGallery(ipw.VBox):
    """Cards for the catalog; ``on_select(blueprint)`` fires when a person picks one."""

    def __init__(
        self,
        blueprints: Iterable[Blueprint],
        *,
        on_select: Callable[[Blueprint], None] | None = None,
        backend: str = "local",
        operator: bool = True,
    ) -> None:
        self.on_select = on_select
        self.operator = operator  # False: a booth visitor, who reads no operator advice on the cards
        self.selected: str | None = None
        self.backend = backend
        self.times: dict[str, str] = {}  # each card's time text, from the plan (refresh_times)
        self._times_lock = threading.Lock()
        self._times_generation = 0
        super().__init__([])
        self.add_class("pg-gallery")
        self.refresh(blueprints)

    def refresh(self, blueprints: Iterable[Blueprint]) -> None:
        """Redraw the cards for ``blueprints`` (e.g. after a blueprint was saved); the selection stays."""
        for old in self.children:  # the previous cards' widgets leave the kernel
            for card in getattr(old, "children", ()):
                for widget in card.children:
                    widget.close()
                card.close()
            old.close()
        self.blueprints = {b.id: b for b in blueprints}
        self.cards: dict[str, ipw.VBox] = {}
        self.notes: dict[str, list[str]] = {}
        self.bodies: dict[str, ipw.HTML] = {}
        for bp in self.blueprints.values():
            body = ipw.HTML()
            button = ipw.Button(description="Select", icon="check")
            button.add_class("pg-select").add_class(f"pg-select-{bp.id}")
            button.on_click(lambda _, bid=bp.id: self.select(bid))
            card = ipw.VBox([body, button], layout=ipw.Layout(width="300px", margin="4px", padding="6px 8px"))
            card.add_class("pg-card").add_class(f"pg-card-{bp.id}")
            self.cards[bp.id], self.bodies[bp.id] = card, body
        if self.selected in self.cards:
            self.cards[self.selected].add_class("pg-selected")
        self.set_backend(self.backend)
        self.children = [ipw.HBox(list(self.cards.values()), layout=ipw.Layout(flex_flow="row wrap"))]

    def set_backend(self, backend: str) -> None:
        """Recompute the 'cannot run here' notes for ``backend``."""
        self.backend = backend
        for bid, bp in self.blueprints.items():
            self.notes[bid] = blueprint_notes(bp, backend, operator=self.operator)
            self.bodies[bid].value = card_html(bp, self.notes[bid], self.times.get(bid, ""))
        self.refresh_times()

    def refresh_times(self, *, wait: bool = False) -> threading.Thread:
        """Plan each card's default run in a thread (the kernel keeps answering), show its time; a newer call wins."""
        with self._times_lock:
            self._times_generation += 1
            generation = self._times_generation
        thread = threading.Thread(
            target=self._compute_times, args=(generation, dict(self.blueprints), self.backend), daemon=True,
            name="pg-card-times",
        )  # fmt: skip
        thread.start()
        if wait:
            thread.join()
        return thread

    def _compute_times(self, generation: int, blueprints: dict[str, Blueprint], backend: str) -> None:
        for bid, bp in blueprints.items():
            try:
                text = time_text(plan_run(bp, backend=backend))
            except Exception:  # a blueprint the plan cannot size here: the card says no time, never a traceback
                text = ""
            with self._times_lock, contextlib.suppress(Exception):  # the kernel shutting down: no page left
                if generation != self._times_generation or bid not in self.bodies:
                    return
                self.times[bid] = text
                self.bodies[bid].value = card_html(bp, self.notes.get(bid, []), text)

    def select(self, blueprint_id: str) -> Blueprint:
        blueprint = self.blueprints[blueprint_id]
        if self.selected in self.cards:
            self.cards[self.selected].remove_class("pg-selected")
        self.selected = blueprint_id
        self.cards[blueprint_id].add_class("pg-selected")
        if self.on_select:
            self.on_select(blueprint)
        return blueprint
