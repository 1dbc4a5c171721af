"""Widget logic: form validation inline, coalescing under a fast stream, reattach, no torch in the UI."""

from __future__ import annotations

import html
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import ipywidgets as ipw
import pytest
from _waiting import wait_for

from playground.backends.base import Backend
from playground.blueprints import get_blueprint
from playground.errors import JobNotFound, ParameterError
from playground.events import Event, JobPhase, Log, Metric, Phase, Progress, Queued
from playground.owner import Owner
from playground.types import Endpoint, Job, RunRequest
from widgets.form import LaunchForm
from widgets.monitor import JobMonitor, metrics_table
from widgets.state import (
    Coalescer,
    FormModel,
    JobState,
    attachable_jobs,
    blueprint_notes,
    latest_running,
    metric_rows,
    queue_text,
    replay,
)

REPO = Path(__file__).resolve().parents[1]


# -- form -----------------------------------------------------------------------------------------


def test_form_controls_come_from_the_schema() -> None:
    bp = get_blueprint("tiny-llama-cpu")
    form = LaunchForm(bp)
    assert set(form.controls) == set(bp.parameters)
    steps = form.controls["max_steps"]
    # numbers are typed (a slider would silently clamp a bad value into its bounds)
    assert isinstance(steps, ipw.Text) and steps.value == str(bp.defaults()["max_steps"])
    assert steps.placeholder == "an integer from 1 to 5000"
    assert form.controls["learning_rate"].value == "0.003"
    # untouched controls give exactly the blueprint's defaults
    assert form.validate().params == bp.defaults()


BAD_VALUES = [
    ("learning_rate", "-1", "out of range"),
    ("learning_rate", "1000", "out of range"),
    ("learning_rate", "nan", "not valid"),
    ("learning_rate", "inf", "not valid"),
    ("max_steps", "99999999", "out of range"),
    ("max_steps", "2.5", "not valid"),
    ("batch_size", "abc", "not valid"),
    ("batch_size", "", "empty"),
    ("seed", "1" * 5000, "too long"),
]


@pytest.mark.parametrize(("name", "value", "why"), BAD_VALUES)
def test_a_bad_value_is_an_inline_error_and_launches_nothing(name: str, value: str, why: str) -> None:
    """Values arrive as a client sends them (a comm update, as ipywidgets applies it), then Launch."""
    bp = get_blueprint("tiny-llama-cpu")
    launched: list[dict] = []
    form = LaunchForm(bp, on_launch=lambda backend, params: launched.append(params.as_dict()))  # typed: RunParameters
    form.controls[name].set_state({"value": value})  # what an incoming comm message does
    assert why in form.errors[name].value and name in form.errors[name].value  # shown as soon as it changes
    assert form.launch() is None and launched == []
    assert "nothing launched: fix" in form.status.value
    others = [n for n in form.errors if n != name]
    assert all(form.errors[n].value == "" for n in others)  # only the bad field lights up
    if why in ("out of range", "not valid"):  # the engine's own one-line message, allowed values included
        with pytest.raises(ParameterError) as exc:
            bp.resolve_params({name: value})
        assert html.escape(str(exc.value)) in form.errors[name].value and "allowed:" in str(exc.value)


def test_a_fixed_value_launches_once_with_exactly_that_value() -> None:
    bp = get_blueprint("tiny-llama-cpu")
    launched: list[dict] = []
    form = LaunchForm(bp, on_launch=lambda backend, params: launched.append(params.as_dict()))  # typed: RunParameters
    form.controls["max_steps"].set_state({"value": "99999999"})
    assert form.launch() is None
    form.controls["max_steps"].set_state({"value": " 7 "})
    form.controls["learning_rate"].set_state({"value": "1e-3"})
    assert form.errors["max_steps"].value == ""
    form.launch()
    assert launched == [{**bp.defaults(), "max_steps": 7, "learning_rate": 0.001}]
    # a blocked form refuses in the kernel, whatever the button's state (a client can click it anyway)
    form.block("your job is still running")
    form.launch_button.set_state({"disabled": False})
    form.launch_button._handle_button_msg(None, {"event": "click"}, None)
    assert len(launched) == 1 and "still running" in form.status.value


def test_form_preset_out_of_bounds_is_flagged_not_started() -> None:
    bp = get_blueprint("tiny-llama-cpu")
    form = LaunchForm(bp, values={"batch_size": 0})
    assert "batch_size" in form.errors["batch_size"].value and "1 to 512" in form.errors["batch_size"].value
    assert FormModel(bp).validate({"nonsense": 1}).errors["nonsense"].startswith("unknown parameter 'nonsense'")


def test_the_backend_choice_is_fixed_in_booth_mode() -> None:
    bp = get_blueprint("tiny-llama-cpu")
    calls: list[str] = []
    form = LaunchForm(bp, on_launch=lambda backend, params: calls.append(backend), show_backend=False)
    assert form.backend.layout.display == "none"
    form.backend.set_state({"index": 1})  # a client picks the other backend anyway
    form.launch()
    assert calls == ["local"]


def test_launch_error_from_the_backend_is_inline_and_starts_nothing(
    isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playground.backends.local import LocalBackend
    from widgets.app import App

    monkeypatch.setenv("PLAYGROUND_GPU_COUNT", "0")  # a GPU machine refuses the GPU blueprint too
    backend = LocalBackend(home=isolated_home)
    app = App(backend=backend, blueprint_id="llama-3.2-1b-lora-alpaca", booth=False)
    assert any("needs 1 GPU" in n for n in app.gallery.notes["llama-3.2-1b-lora-alpaca"])
    assert app.form is not None
    assert app.form.launch() is None
    assert "needs 1 GPU" in app.form.status.value and "tiny-llama-cpu" in app.form.status.value
    assert backend.list() == []  # nothing started
    assert app.monitor.job_id == "" and not app.monitor.running


def test_gallery_notes() -> None:
    llama = get_blueprint("llama-3.2-1b-lora-alpaca")
    tiny = get_blueprint("tiny-llama-cpu")
    assert blueprint_notes(tiny, "local", gpus=0) == []
    notes = blueprint_notes(llama, "local", gpus=0)
    assert notes and "GPU" in notes[0]
    assert not any("GPU" in n for n in blueprint_notes(llama, "local", gpus=1))
    assert not any("GPU" in n for n in blueprint_notes(llama, "kubernetes", gpus=0))


def test_a_booth_visitor_reads_no_operator_advice_on_the_cards(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger sees 'not available at this booth' where the operator reads what to install or set (issue 20)."""
    from widgets.gallery import BlueprintGallery
    from widgets.state import VISITOR_NOTE

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("PLAYGROUND_GPU_COUNT", "0")
    catalog = [get_blueprint("tiny-llama-cpu"), get_blueprint("llama-3.2-1b-lora-alpaca")]
    operator, visitor = BlueprintGallery(catalog), BlueprintGallery(catalog, operator=False)
    assert any("HF_TOKEN" in n for n in operator.notes["llama-3.2-1b-lora-alpaca"])
    assert visitor.notes == {"tiny-llama-cpu": [], "llama-3.2-1b-lora-alpaca": [VISITOR_NOTE]}
    card = visitor.bodies["llama-3.2-1b-lora-alpaca"].value
    shown_notes = "".join(part.split("</div>")[0] for part in card.split("class='pg-note'>")[1:])  # not folded
    assert VISITOR_NOTE in shown_notes and "HF_TOKEN" not in shown_notes and "GPU" not in shown_notes


def test_cards_are_compact_with_the_jargon_behind_a_details_toggle() -> None:
    """A card shows its title, one line of what it does and CPU/GPU; model, data, method and id are folded away in an
    HTML details element (no JavaScript needed)."""
    from widgets.gallery import card_html, summary_text

    smol = get_blueprint("smollm2-135m-lora-kubectl")
    card = card_html(smol, [])
    shown, folded = card.split("<details", 1)
    assert smol.title in html.unescape(shown) and "CPU only" in shown
    assert html.escape(summary_text(smol)) in shown and len(summary_text(smol)) <= 110
    for jargon in ("pkg://", "q_proj", "synthetic://", smol.id):
        assert jargon not in shown and jargon in folded
    assert folded.startswith(" class='pg-card-details'><summary>details</summary>")


# -- coalescing -----------------------------------------------------------------------------------


def _progress(step: int, total: int) -> Progress:
    return Progress(step=step, total_steps=total, loss=10.0 / (step + 1), tokens_per_second=1000.0 + step)


class FakeClock:
    """Time that passes only when told: the producer's events and the flusher's sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def test_coalescer_caps_updates_and_keeps_every_point() -> None:
    """1000 events per (fake) second: every point reaches the chart in order, renders keep coming
    while events arrive, and never two renders within 1/max_rate of the coalescer's own clock."""
    clock = FakeClock()
    received: list[int] = []
    rendered = threading.Event()

    def render(snapshot) -> None:
        received.extend(p.step for p in snapshot.new_points)
        rendered.set()

    coalescer = Coalescer(render, max_rate=10, clock=clock, sleep=clock.sleep)
    total, batch = 2000, 10
    for start in range(0, total, batch):
        rendered.clear()
        for i in range(start, start + batch):
            coalescer.push(_progress(i + 1, total))
            if i % 2:
                coalescer.push(Log(source="trainer", line=f"line {i}"))
            clock.sleep(0.001)
        assert rendered.wait(10), f"no update while events {start + 1}..{start + batch} arrived"
    coalescer.close()
    assert received == list(range(1, total + 1)), "every progress point reaches the chart, in order"
    assert coalescer.renders >= total // batch
    # each render waited until 1/max_rate after the previous one on the injected clock
    assert clock() >= (coalescer.renders - 1) * coalescer.interval, (coalescer.renders, clock())
    assert coalescer.error is None and not coalescer.alive


class ScriptedBackend(Backend):
    """A backend double that replays scripted event streams at a given rate (interface only)."""

    name = "scripted"

    def __init__(self, events: list[Event], rate: float, scripts: dict[str, list[Event]] | None = None) -> None:
        self.scripts = {"job-1": events, **(scripts or {})}
        self.rate = rate
        self.jobs = {
            job_id: Job(
                id=job_id,
                blueprint_id="tiny-llama-cpu",
                backend="scripted",
                phase=JobPhase.PENDING,
                params={},
                created_at=0.0,
            )
            for job_id in self.scripts
        }
        self.job = self.jobs["job-1"]
        self.owners: list[Owner] = []

    def events(self, job_id: str, follow: bool = False, *, owner: str | None = None) -> Iterator[Event]:
        self.owners.append(owner)
        start = time.monotonic()
        for i, event in enumerate(self.scripts[job_id]):
            delay = start + i / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            yield event
        self.jobs[job_id].phase = JobPhase.SUCCEEDED

    def get(self, job_id: str, *, owner: str | None = None) -> Job:
        if job_id not in self.jobs:
            raise JobNotFound(job_id)
        return self.jobs[job_id]

    def prepare(self, request: RunRequest) -> None:
        raise NotImplementedError

    def create(self, request: RunRequest, prepared: None) -> Job:
        raise NotImplementedError

    def list(self, *, owner: str | None = None) -> list[Job]:
        return list(self.jobs.values())

    def cancel(self, job_id: str, *, owner: str | None = None) -> Job:
        return self.jobs[job_id]

    def delete(self, job_id: str, *, owner: str | None = None) -> None: ...


def test_under_the_booth_the_chart_imports_plotly_from_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """`playground app --booth` names where the page gets plotly's front end: the chart's widget state then holds a
    small module importing it, not the ~5 MB bundle itself."""
    from voila_app import PLOTLY_BUNDLE_ENV
    from widgets.monitor import loss_chart

    assert len(str(loss_chart()._esm)) > 1_000_000  # plotly's own: the whole bundle in the widget's state
    monkeypatch.setenv(PLOTLY_BUNDLE_ENV, "playground/static/plotly-widgetbundle.js?v=1")
    module = loss_chart()._esm
    assert len(module) < 1000 and '"playground/static/plotly-widgetbundle.js?v=1"' in module
    assert "export const FigureModel" in module and "export default" in module


def test_your_jobs_stay_live_while_a_job_runs() -> None:
    """'Your jobs' follows a running job by itself (it went stale at step 5/80 while the job trained on), updating
    its rows in place; once every job has finished it stops refreshing."""
    from dataclasses import replace

    from playground.facade import Playground
    from widgets.jobs import JobsList

    backend = ScriptedBackend([], rate=1.0)

    def job_now(**changes: object) -> None:  # what the backend lists from now on (a new Job each time, as a real one)
        backend.jobs["job-1"] = replace(backend.jobs["job-1"], **changes)

    job_now(phase=JobPhase.TRAINING, progress=_progress(5, 80))
    listing = JobsList(Playground(backend), live_seconds=0.2)
    row = listing.rows.children[0]
    assert "step 5/80" in row.children[1].value
    job_now(progress=_progress(40, 80))
    wait_for(lambda: "step 40/80" in row.children[1].value, 10, "the list following the job")
    job_now(phase=JobPhase.SUCCEEDED)
    wait_for(lambda: "Succeeded" in row.children[1].value, 10, "the list showing the job's end")
    assert listing.rows.children[0] is row  # updated in place, not rebuilt
    job_now(progress=_progress(80, 80))
    time.sleep(1.0)
    assert "step 40/80" in row.children[1].value  # every job finished: no more refreshes
    listing.close()


def test_monitor_at_1000_lines_per_second() -> None:
    total = 1500
    script: list[Event] = [Phase(JobPhase.TRAINING)]
    for i in range(total):
        script.append(_progress(i + 1, total))
        script.append(Log(source="trainer", line=f"step {i + 1}"))
    script += [Metric("eval_exact_match", 0.97), Phase(JobPhase.SUCCEEDED)]
    backend = ScriptedBackend(script, rate=1000.0)
    done: list[Job] = []
    start = time.monotonic()
    monitor = JobMonitor(backend, "job-1", on_done=done.append)
    assert monitor.wait(30)
    elapsed = time.monotonic() - start
    assert monitor.coalescer is not None
    renders = monitor.coalescer.renders
    assert renders <= 10 * elapsed + 2, f"{renders} widget updates in {elapsed:.2f}s"
    assert list(monitor.chart.data[0].x) == list(range(1, total + 1))  # no point dropped
    assert len(monitor.chart.data[1].y) == total
    assert monitor.points.value == f"{total} points"
    assert monitor.progress.value == 1.0
    assert "Succeeded" in monitor.phase.value
    assert "Exact match on held-out examples" in monitor.metrics.value and "97.0 %" in monitor.metrics.value
    assert f"step {total}/{total} · loss" in monitor.logs.value and "step 1499" in monitor.logs.value
    assert done and done[0].phase == JobPhase.SUCCEEDED
    assert monitor.error == ""


def test_the_chart_shows_a_methods_headline_beside_the_loss() -> None:
    """GRPO's mean reward (DPO's reward margin) takes the right axis where an SFT run shows tokens/s; the
    next SFT job on the same chart gets tokens/s back."""
    rewards = [0.2, 0.35, 0.5]
    grpo: list[Event] = [Phase(JobPhase.TRAINING)]
    grpo += [Progress(step=i + 1, total_steps=3, loss=0.1, metrics={"mean_reward": r, "kl": 0.01})
             for i, r in enumerate(rewards)]  # fmt: skip
    grpo.append(Phase(JobPhase.SUCCEEDED))
    sft: list[Event] = [Phase(JobPhase.TRAINING), _progress(1, 1), Phase(JobPhase.SUCCEEDED)]
    backend = ScriptedBackend(grpo, rate=200.0, scripts={"job-2": sft})
    monitor = JobMonitor(backend, "job-1")
    assert monitor.wait(30)
    assert list(monitor.chart.data[1].y) == rewards and monitor.chart.data[1].name == "reward"
    assert monitor.chart.layout.yaxis2.title.text == "reward"
    assert monitor.progress_text.value.endswith("· loss 0.1000 · reward 0.5")
    monitor.follow(backend.get("job-2"), backend=backend)
    assert monitor.wait(30)
    assert monitor.chart.data[1].name == "tokens/s" and monitor.chart.layout.yaxis2.title.text == "tokens/s"
    assert len(monitor.chart.data[1].y) == 1


def test_monitor_shows_a_second_job_on_the_same_chart() -> None:
    """Switching jobs keeps the widgets (and the one chart view) and draws only the new job's points;
    late events of the first job are ignored."""
    first: list[Event] = [Phase(JobPhase.TRAINING)] + [_progress(i, 1000) for i in range(1, 1001)]
    second: list[Event] = [Phase(JobPhase.TRAINING)] + [_progress(i, 5) for i in range(1, 6)]
    second += [Metric("eval_loss", 1.23456), Phase(JobPhase.SUCCEEDED)]
    backend = ScriptedBackend(first, rate=200.0, scripts={"job-2": second})
    monitor = JobMonitor(backend, "job-1", owner="v-0123456789abcdef")
    chart, children = monitor.chart, monitor.children
    wait_for(lambda: len(monitor.chart.data[0].x) >= 5, 30, "first job's points")
    first_updates = monitor.coalescer
    assert first_updates is not None
    monitor.follow(backend.get("job-2"), backend=backend)
    assert monitor.wait(30)
    wait_for(lambda: not first_updates.alive, 30, "the first job's reader to stop")  # its last render is done
    assert monitor.chart is chart and monitor.children == children  # nothing re-created
    assert list(monitor.chart.data[0].x) == [1, 2, 3, 4, 5]
    # a chart view whose page connects only now (a reload, a slow browser) starts from the model's data
    assert list(monitor.chart._widget_data[0]["x"]) == [1, 2, 3, 4, 5]
    assert monitor.points.value == "5 points" and "job-2" in monitor.header.value
    assert "Loss on held-out examples" in monitor.metrics.value and "1.235" in monitor.metrics.value
    assert "Succeeded" in monitor.phase.value and monitor.final_job is backend.jobs["job-2"]
    assert set(backend.owners) == {Owner.visitor("v-0123456789abcdef")}  # every call carried the visitor


def test_visitors_see_no_paths_pids_or_command_lines() -> None:
    secret_lines = [
        "[supervisor] starting: /usr/bin/python -m playground.train --output /srv/home/jobs/j/output (pid 4242)",
        "model: /srv/home/jobs/j/output/base-model (0.76M parameters)",
    ]
    script: list[Event] = [Log(source="trainer", line=line) for line in secret_lines]
    script += [Phase(JobPhase.TRAINING), _progress(1, 2), Phase(JobPhase.SUCCEEDED)]
    for operator in (False, True):
        monitor = JobMonitor(ScriptedBackend(script, rate=1000.0), "job-1", operator=operator)
        assert monitor.wait(10)
        shown = monitor.logs.value
        if operator:
            assert "/srv/home/jobs" in shown and "[supervisor]" in shown
            assert "pid 4242" in monitor.details.value and monitor.details_box.layout.display != "none"
        else:
            assert "/srv/" not in shown and "[supervisor]" not in shown and "4242" not in shown
            assert "model: …/base-model (0.76M parameters)" in shown
            assert monitor.details_box.layout.display == "none" and "4242" not in monitor.details.value


def test_the_queue_wait_counts_down_between_estimates() -> None:
    """The engine re-estimates a queued job's wait only when its position moves; the page counts down meanwhile."""
    import re

    assert queue_text(2, 95.0, since=100.0, now=110.0) == "position 2 in the queue · about 1:25 to wait"
    assert queue_text(1, 30.0, since=100.0, now=140.0) == "next in line · any moment now"
    estimated_at = time.time() - 10
    script = [Queued(2, 95.0, time=estimated_at), Phase(JobPhase.INITIALIZING)]
    monitor = JobMonitor(ScriptedBackend(script, rate=0.2), "job-1", operator=False)  # 5 s between the events

    def seconds_left() -> int:
        found = re.search(r"about (\d+):(\d\d) to wait", monitor.queue.value)
        return int(found[1]) * 60 + int(found[2]) if found else 0

    first = wait_for(seconds_left, 30, "the queue's estimated wait")
    expected = 95 - (time.time() - estimated_at)  # the estimate, less the time since it was made
    assert monitor.queue.value.startswith("position 2 in the queue") and expected - 2 <= first <= expected + 1
    later = wait_for(lambda: (left := seconds_left()) and left < first and left, 3, "the wait counting down")
    assert first - 3 <= later < first
    assert monitor.wait(30) and monitor.queue.value == ""  # out of the queue: nothing to count


def test_queue_position_and_a_live_log_tail() -> None:
    state = JobState()
    for event in [Queued(2, 95.0), Queued(1, 30.0), Phase(JobPhase.INITIALIZING), Phase(JobPhase.TRAINING)]:
        state.apply(event)
        if isinstance(event, Queued):
            snap = state.snapshot()
            assert snap.queue_position == event.position
    assert state.snapshot().queue_position is None  # training: no longer queued
    state.apply(_progress(5, 20))
    tail = state.snapshot().log_tail
    assert tail[0] == "waiting for a training slot: position 2 in the queue · about 1:35 to wait"
    assert tail[1].startswith("waiting for a training slot: next in line")
    assert tail[-1] == "step 5/20 · loss 1.6667 · 1.0k tokens/s"  # a line per progress point: the tail moves
    assert queue_text(3, None) == "position 3 in the queue · waiting for admission"


def test_results_are_a_readable_table() -> None:
    metrics = {
        "eval_exact_match": 0.9234,
        "eval_loss": 0.123456,
        "num_train_examples": 19200.0,
        "world_size": 1.0,
        "train_seconds": 95.3,
    }
    assert metric_rows(metrics) == [
        ("Exact match on held-out examples", "92.3 %"),
        ("Loss on held-out examples", "0.123"),
        ("Training time", "1:35"),
        ("Training examples", "19,200"),
    ]
    assert ("World size", "1") in metric_rows(metrics, operator=True)
    assert metric_rows({"train_loss": 0.00049}) == [("Training loss (last steps)", "4.9e-04")]  # not "0.000"
    table = metrics_table(metrics)
    assert "<table" in table and "1.92e+04" not in table and "world_size" not in table


def test_the_headline_puts_the_fine_tuned_figure_beside_the_base_models() -> None:
    from widgets.state import headline

    assert headline({"base_eval_exact_match": 0.0, "eval_exact_match": 0.8649}) == (
        "held-out exact match: base 0 % → fine-tuned 86 %"
    )
    grpo = {
        "base_eval_mean_reward": 0.12,
        "eval_mean_reward": 0.7,
        "base_eval_exact_match": 0.0,
        "eval_exact_match": 0.5,
    }
    assert headline(grpo, "eval_mean_reward") == "held-out mean reward: base 0.12 → fine-tuned 0.70"
    assert headline(grpo).startswith("held-out exact match: base 0 %")  # no quality metric given: exact match first
    assert headline({"eval_exact_match": 0.9}) == ""  # no base figure (an older run): no headline
    assert headline({"base_eval_exact_match": float("nan"), "eval_exact_match": 0.9}) == ""
    table = metrics_table({"base_eval_exact_match": 0.0, "eval_exact_match": 0.9}, final=True)
    assert "pg-headline" in table and "base 0 % → fine-tuned 90 %" in table
    assert "pg-headline" not in metrics_table({"base_eval_exact_match": 0.0, "eval_exact_match": 0.4})  # not yet


def test_the_chart_spans_the_run_with_integer_steps_and_round_right_ticks() -> None:
    """The x axis runs 0 → total steps with an integer tick step; the right axis picks its own round ticks (plotly
    syncs an overlaying axis' ticks to the left one's otherwise); the points stay when the job ends; after Succeeded
    the results open with the headline."""
    from widgets.monitor import CHART_HEIGHT, nice_step

    assert [nice_step(n) for n in (1, 8, 12, 80, 300, 5000)] == [1, 1, 2, 10, 50, 1000]
    script: list[Event] = [Phase(JobPhase.INITIALIZING), Metric("base_eval_exact_match", 0.0), Phase(JobPhase.TRAINING)]
    script += [_progress(i, 12) for i in range(2, 13, 2)]
    script += [Metric("eval_exact_match", 0.86), Phase(JobPhase.SUCCEEDED)]
    monitor = JobMonitor(ScriptedBackend(script, rate=200.0), "job-1", blueprint=get_blueprint("tiny-llama-cpu"))
    assert monitor.wait(30)
    layout = monitor.chart.layout
    assert layout.height == CHART_HEIGHT >= 360 and monitor.chart_box.layout.width == "100%"
    assert layout.autosize and monitor.chart._config["responsive"]  # the page's width, also after a window resize
    assert tuple(layout.xaxis.range) == (0, 12) and layout.xaxis.dtick == 2 and layout.xaxis.tickformat == "d"
    assert layout.yaxis2.tickmode == "auto" and layout.yaxis2.showgrid is False
    assert list(monitor.chart.data[0].x) == [2, 4, 6, 8, 10, 12]  # kept at the end (not blanked)
    assert "held-out exact match: base 0 % → fine-tuned 86 %" in monitor.metrics.value
    monitor.follow("job-1")  # the next job starts from an empty chart with plotly's own range
    assert layout.xaxis.range is None and list(monitor.chart.data[0].x) == []


def test_a_booth_page_puts_the_intro_and_launch_first(monkeypatch: pytest.MonkeyPatch, isolated_home: Path) -> None:
    """Booth: the one-sentence intro, then the preselected blueprint's description and Launch, its parameters folded
    behind Settings (an invalid value unfolds them, and is still refused in the kernel), the other blueprints
    after the monitor and the chat. The operator's page keeps the gallery first, its parameters shown."""
    from widgets.app import INTRO, App

    visitor = App(backend=RecordingBackend(), blueprint_id="tiny-llama-cpu", booth=True, visitor="v-0123456789abcdef",
                  reattach=False)  # fmt: skip
    assert INTRO in visitor.children[0].value
    steps = [next(c for c in w._dom_classes if c.startswith("pg-step-")) for w in visitor.children[2:]]
    assert steps == ["pg-step-form", "pg-step-monitor", "pg-step-chat", "pg-step-gallery", "pg-step-jobs"]
    form = visitor.form
    assert form is not None and form.children[1].children[-2:] == (form.launch_button, form.settings_toggle)
    assert form.settings.layout.display == "none" and form.settings_toggle.value is False
    form.settings_toggle.set_state({"value": True})  # as the browser's click sets it
    assert form.settings.layout.display is None
    form.settings_toggle.set_state({"value": False})
    form.controls["max_steps"].set_state({"value": "99999999"})
    assert form.settings.layout.display is None and "out of range" in form.errors["max_steps"].value
    assert form.launch() is None and visitor.monitor.job_id == ""

    monkeypatch.delenv("PLAYGROUND_BOOTH", raising=False)
    operator = App(backend=RecordingBackend(), blueprint_id="tiny-llama-cpu", booth=False, reattach=False)
    assert "pg-step-gallery" in operator.children[2]._dom_classes
    assert operator.form is not None and operator.form.settings.layout.display is None
    assert operator.form.settings_toggle.layout.display == "none"


def test_chat_shows_the_answer_as_given() -> None:
    from widgets.chat import Turn, answer_html

    assert answer_html(Turn("q", answer="ebuk", done=True)) == "ebuk"
    assert "(empty answer)" in answer_html(Turn("q", answer="", done=True))
    explained = answer_html(Turn("q", answer="", done=True, tokens=12))
    assert "empty answer: 12 tokens generated, all of them special tokens" in explained
    assert "␠␠" in answer_html(Turn("q", answer="  ", done=True))  # whitespace is an answer too
    assert "no answer" not in explained


def test_chat_asks_one_bounded_question_at_a_time() -> None:
    from widgets.chat import MAX_PROMPT_CHARS, ChatPanel

    release = threading.Event()
    panel = ChatPanel(get_blueprint("tiny-llama-cpu"), operator=False)
    assert panel.ask("reverse: kube") == []  # nothing served yet
    panel.endpoints = {"fine-tuned": Endpoint(url="http://127.0.0.1:9/v1", model="m")}
    assert panel.ask("x" * (MAX_PROMPT_CHARS + 1)) == [] and "allowed: up to 500" in panel.status.value
    blocker = threading.Thread(target=release.wait, daemon=True)
    blocker.start()
    panel._threads = [blocker]  # an answer is still streaming
    assert panel.ask("reverse: kube") == [] and "wait for both answers" in panel.status.value
    release.set()
    blocker.join()


def test_chat_prompt_sends_on_enter_once() -> None:
    """Enter in the prompt box (its value synced from the browser) asks and empties the box; the same question sent
    again while it is answered is not asked twice and says nothing; another question then says to wait. Typing and
    clicking Send syncs the box, then clicks: one question, even when its answers came before the click (a tiny
    model's did, in the booth's browser test, and the question was asked twice)."""
    from widgets.chat import ChatPanel

    panel = ChatPanel(get_blueprint("tiny-llama-cpu"), operator=False)
    release = threading.Event()
    asked: list[str] = []

    def stream(side: str, endpoint: Endpoint, turn) -> None:
        asked.append(turn.prompt)
        release.wait(10)

    panel._stream = stream  # no server: record what would be asked
    panel.endpoints = {"fine-tuned": Endpoint(url="http://127.0.0.1:9/v1", model="m")}
    panel.prompt.set_state({"value": "  reverse: kube "})  # what the browser sends on Enter
    assert wait_for(lambda: asked == ["reverse: kube"], 5, "asked")
    assert panel.prompt.value == ""  # the question is in the dialogue, not in the box
    panel.send.click()  # Send after Enter
    assert panel.ask("reverse: kube") == [] and "wait for" not in panel.status.value
    assert panel.ask("reverse: flow") == [] and "wait for both answers" in panel.status.value
    release.set()
    assert panel.wait(5) and asked == ["reverse: kube"]
    panel.prompt.set_state({"value": "reverse: nebx"})  # typed, then Send clicked: the box syncs as it loses focus
    assert panel.wait(5) and asked == ["reverse: kube", "reverse: nebx"]  # answered before the click arrives
    panel.send.click()
    assert panel.wait(5) and asked == ["reverse: kube", "reverse: nebx"], asked
    release.clear()
    panel.prompt.set_state({"value": "reverse: flow"})  # a question refused while one is answered stays in the box
    assert wait_for(lambda: len(asked) == 3, 5, "asked") and panel.prompt.value == ""
    panel.prompt.set_state({"value": "reverse: tree"})
    assert "wait for both answers" in panel.status.value and panel.prompt.value == "reverse: tree"
    release.set()
    assert panel.wait(5)
    panel.send.click()  # Send once the answers are in: asked now
    assert wait_for(lambda: asked[-1] == "reverse: tree", 5, "asked") and len(asked) == 4
    assert panel.wait(5)


# -- page nits (issue 62) -------------------------------------------------------------------------


def test_a_fixed_value_clears_the_nothing_launched_line() -> None:
    """The red "nothing launched: fix …" names only the fields still wrong, and goes once none is."""
    form = LaunchForm(get_blueprint("tiny-llama-cpu"), on_launch=lambda backend, params: params)
    form.controls["max_steps"].set_state({"value": "99999999"})
    form.controls["seed"].set_state({"value": "x"})
    assert form.launch() is None and "nothing launched: fix max steps, seed" in form.status.value
    form.controls["max_steps"].set_state({"value": "12"})
    assert "nothing launched: fix seed" in form.status.value
    form.controls["seed"].set_state({"value": "0"})
    assert form.status.value == "" and form.errors["seed"].value == ""
    assert form.launch() is not None and form.status.value == "launched"


def test_cancel_is_shown_only_while_the_job_can_be_cancelled_and_one_point_is_one_point() -> None:
    release = threading.Event()

    def held() -> Iterator[Event]:  # a job that trains until released
        yield Phase(JobPhase.TRAINING)
        yield _progress(1, 2)
        release.wait(30)
        yield Phase(JobPhase.SUCCEEDED)

    class Held(ScriptedBackend):
        def events(self, job_id: str, follow: bool = False, *, owner: str | None = None) -> Iterator[Event]:
            yield from held()
            self.jobs[job_id].phase = JobPhase.SUCCEEDED

    monitor = JobMonitor(operator=False)
    assert monitor.cancel_button.layout.display == "none"  # no job: no Cancel (not even a greyed one)
    backend = Held([], rate=1.0)
    monitor.follow(backend.get("job-1"), backend=backend)
    wait_for(lambda: monitor.points.value == "1 point", 10, "the first point")
    assert monitor.cancel_button.layout.display is None and not monitor.cancel_button.disabled
    release.set()
    assert monitor.wait(10)
    assert monitor.cancel_button.layout.display == "none" and monitor.cancel_button.disabled
    finished = backend.get("job-1")
    monitor.follow(finished, backend=backend, start=False)  # a finished job shown again (Your jobs → Open)
    assert monitor.cancel_button.layout.display == "none" and monitor.points.value == "0 points"


def test_chat_rows_pair_both_answers_with_their_question_and_come_back_from_the_engine(isolated_home: Path) -> None:
    """Each question is one row holding the base and the fine-tuned answer (the columns never drift apart, even
    when one side is not served); the exchanges kept by the engine draw the same rows in a new page."""
    from playground.chats import MAX_EXCHANGES, MAX_TEXT_CHARS, ChatStore
    from playground.facade import Playground
    from widgets.chat import ChatPanel, Turn, stopped_text

    blueprint = get_blueprint("tiny-llama-cpu")
    kept: list[list[dict]] = []
    panel = ChatPanel(blueprint, operator=False, on_change=kept.append)
    answers = {"base": ["a rambling base answer " * 20, "b"], "fine-tuned": ["ebuk", "wolf", "tset"]}

    def stream(side: str, endpoint: Endpoint, turn: Turn) -> None:  # no server: the answer this side gives
        turn.answer, turn.seconds = answers[side][len(panel.transcripts[side].turns) - 1], 0.5
        turn.done = True
        panel._refresh(side)
        panel._answered()

    panel._stream = stream
    panel.set_endpoints({side: Endpoint(url="http://127.0.0.1:9/v1", model="m") for side in answers})
    for prompt in ("reverse: kube", "reverse: flow"):
        assert panel.ask(prompt) and panel.wait(5)
    panel.set_endpoints({"fine-tuned": Endpoint(url="http://127.0.0.1:9/v1", model="m")})  # the base not served
    assert panel.ask("reverse: test") and panel.wait(5)
    rows = panel.dialogue.value.split("<div class='pg-turn' ")[1:]
    bases = [*answers["base"], "not served"]
    for number, (row, prompt, base, fine) in enumerate(
        zip(rows, ("reverse: kube", "reverse: flow", "reverse: test"), bases, answers["fine-tuned"], strict=True), 1
    ):
        assert row.startswith(f"data-turn='{number}'><div class='pg-q'>{prompt}</div>")
        assert row.index("pg-answer-base") < row.index(base) < row.index("pg-answer-fine-tuned") < row.index(fine)
    assert len(kept) == 3 and [e["prompt"] for e in kept[-1]] == ["reverse: kube", "reverse: flow", "reverse: test"]

    again = ChatPanel(blueprint, operator=False, history=kept[-1])  # a reloaded page, from what was kept
    assert again.dialogue.value == panel.dialogue.value

    # the engine keeps it per visitor and per job, bounded; someone else's job is unknown
    backend = Playground(ScriptedBackend([], rate=1.0))
    backend.save_chat("job-1", kept[-1], owner="v-a11ce00000000000")
    assert backend.chat_history("job-1", owner="v-a11ce00000000000") == kept[-1]
    assert backend.chat_history("job-1", owner="v-b0b0000000000000") == []  # another visitor's page: nothing
    with pytest.raises(JobNotFound):
        backend.save_chat("job-9", kept[-1], owner="v-a11ce00000000000")
    store = ChatStore(isolated_home)
    store.save(
        "job-1", Owner.visitor("v-a11ce00000000000"), [{"prompt": "x" * 10**5, "answers": {}}] * (MAX_EXCHANGES + 5)
    )
    long = store.load("job-1", Owner.visitor("v-a11ce00000000000"))
    assert len(long) == MAX_EXCHANGES and len(long[0]["prompt"]) == MAX_TEXT_CHARS
    store.forget("job-1")  # what deleting the job does (Playground.delete)
    assert store.load("job-1", Owner.visitor("v-a11ce00000000000")) == []

    # Stop servers: a shared base server is not the visitor's to stop, and the page says so
    own, shared = Endpoint(url="u", model="m"), Endpoint(url="u", model="m", kind="base", shared=True)
    said = stopped_text({"fine-tuned": own, "base": shared})
    assert said == "Fine-tuned server stopped; the shared base model server keeps running for other visitors"
    assert stopped_text({"fine-tuned": own}) == "servers stopped"


def test_the_app_notebook_shows_no_stray_value(isolated_home: Path) -> None:
    """The app notebook run in a real kernel: only its last cell (the App) shows anything; a bare call before it
    printed its True/False at the top of the page."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(REPO / "notebooks" / "playground.ipynb", as_version=4)
    NotebookClient(notebook, timeout=240, resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.outputs for cell in cells[:-1]] == [[] for _ in cells[:-1]]
    (shown,) = cells[-1].outputs
    assert "application/vnd.jupyter.widget-view+json" in shown["data"]


# -- reattach -------------------------------------------------------------------------------------


def test_attachable_order() -> None:
    def job(i: str, phase: JobPhase, created: float) -> Job:
        return Job(id=i, blueprint_id="b", backend="local", phase=phase, params={}, created_at=created)

    jobs = [
        job("old-done", JobPhase.SUCCEEDED, 1),
        job("running", JobPhase.TRAINING, 2),
        job("new-done", JobPhase.FAILED, 3),
    ]
    assert [j.id for j in attachable_jobs(jobs)] == ["running", "new-done", "old-done"]
    assert latest_running(jobs).id == "running"
    assert latest_running(jobs, blueprint_id="other") is None


def test_reattach_after_restart_shows_the_full_history(trained_tiny_job: Job, session_home: Path) -> None:
    """A fresh process (a restarted kernel) lists the job, reattaches and sees every point again."""
    from playground.backends.local import LocalBackend

    history = list(LocalBackend(home=session_home).events(trained_tiny_job.id))
    expected = replay(history)
    assert expected.phase == JobPhase.SUCCEEDED
    params = trained_tiny_job.params
    assert len(expected.points) == params["max_steps"] // params["log_every"]

    script = f"""
import json, sys
from playground.backends.local import LocalBackend
from widgets.app import App
backend = LocalBackend(home={str(session_home)!r})
app = App(backend=backend)
rows = [j.id for j in app.jobs.jobs]
app.jobs.attach_job({trained_tiny_job.id!r})
assert app.monitor.wait(120)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
print(json.dumps({{
    "rows": rows, "points": list(app.monitor.chart.data[0].x), "phase": app.monitor.phase.value,
    "progress": app.monitor.progress.value, "serve": app.serve_panel is not None, "heavy": heavy,
    "error": app.monitor.error,
}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert trained_tiny_job.id in seen["rows"]
    assert seen["points"] == [p.step for p in expected.points]
    assert "Succeeded" in seen["phase"] and seen["progress"] == 1.0
    assert seen["serve"], "a succeeded job offers serving after reattach"
    assert seen["heavy"] == [] and seen["error"] == ""


def test_the_run_view_shows_the_runs_curves_metrics_and_parameters(trained_tiny_job: Job, session_home: Path) -> None:
    """A finished job's MLflow run inline (operator view), rendered from the engine's record (real MLflow store)."""
    import dataclasses

    from playground.backends.local import LocalBackend
    from playground.facade import Playground
    from playground.runs.settings import store_uri
    from playground.runs.store import job_run
    from playground.runs.ui import INSTALL_MLFLOW, ui_link
    from widgets.run_view import RunView

    record = job_run(trained_tiny_job.id)
    assert record is not None and len(record.curves) >= 3
    view = RunView()
    view.show(record)
    traces = {trace.meta: trace for trace in view.chart.data}
    assert list(traces) == [curve.key for curve in record.curves]
    for curve in record.curves:  # every point of every curve, the loss drawn and the others a legend click away
        assert list(traces[curve.key].x) == curve.steps and list(traces[curve.key].y) == curve.values
        assert traces[curve.key].visible == (True if curve.key == "loss" else "legendonly")
    assert view.chart_box.children == (view.chart,)
    for label, value in metric_rows(record.metrics, operator=True):
        assert f"<th>{html.escape(label)}</th><td>{html.escape(value)}</td>" in view.tables.value
    for key in record.params:
        assert f"<th>{html.escape(key)}</th>" in view.tables.value
    assert f"Parameters</b> ({len(record.params)})" in view.tables.value
    assert f"Run metrics</b> ({len(record.metrics)})" in view.tables.value
    # mlflow-skinny only here: the run id and the package to install, no dead link
    assert record.run_id in view.link.value and "FINISHED" in view.link.value
    assert html.escape(INSTALL_MLFLOW) in view.link.value and "<a " not in view.link.value
    # where MLflow's UI is reachable (Kubeflow Notebooks, jupyter-server-proxy): a link under the notebook's base URL
    link = ui_link(
        store_uri(),
        record.experiment_id,
        record.run_id,
        env={"NB_PREFIX": "/notebook/ns/nb"},
        mlflow_ui=True,
        server_proxy=True,
    )
    view.show(dataclasses.replace(record, link=link))
    assert f"href='/notebook/ns/nb/mlflow/#/experiments/{record.experiment_id}/runs/{record.run_id}'" in view.link.value
    chart = view.chart
    view.clear()
    assert view.link.value == view.tables.value == "" and view.chart_box.children == () and view.chart is None
    view.show(record)  # a new figure, its traces in it from the start (added later they never reach a new view)
    assert view.chart is not chart and len(view.chart.data) == len(record.curves)

    # the monitor shows it once the job is done (operator view)
    operator = Playground(LocalBackend(home=session_home))
    monitor = JobMonitor(operator, trained_tiny_job, blueprint=get_blueprint("tiny-llama-cpu"))
    assert monitor.wait(120)
    wait_for(lambda: monitor.run_view.record is not None, 30, "the run view")
    assert monitor.run_view.record == record and monitor.run_view in monitor.children


def test_reattach_to_a_running_job_gets_history_then_live(isolated_home: Path) -> None:
    """Attach while it trains: the first update already holds the points logged before attaching."""
    from playground.api import make_request
    from playground.backends.local import LocalBackend
    from playground.facade import Playground

    first = LocalBackend(home=isolated_home)
    quick = {"max_steps": 20, "log_every": 2, "checkpoint_every": 0, "num_eval_examples": 10}
    job = first.submit(make_request("tiny-llama-cpu", quick))
    try:
        for event in first.events(job.id, follow=True):  # wait for a few points, then "reload the page"
            if isinstance(event, Progress) and event.step >= 6:
                break
        monitor = JobMonitor(Playground(LocalBackend(home=isolated_home)), job.id)
        assert monitor.wait(240), "followed to the end"
        steps = list(monitor.chart.data[0].x)
        assert steps == list(range(2, 21, 2)), steps
        assert monitor.final_job is not None and monitor.final_job.phase == JobPhase.SUCCEEDED
    finally:
        first.delete(job.id)


QUICK = {"max_steps": "12", "log_every": "2", "num_eval_examples": "10", "checkpoint_every": "0"}


def _fill(app, values: dict[str, str]) -> None:
    for name, value in values.items():
        app.form.controls[name].set_state({"value": value})  # as a client's comm message sets it


def test_booth_visitors_own_their_jobs_and_a_double_click_makes_one_job(home: Path) -> None:
    """Two visitors' pages on a real local backend with the booth policy (one training at a time)."""
    from playground.backends.local import LocalBackend
    from playground.booth import BoothPolicy
    from widgets.app import App

    backend = LocalBackend(home=home, policy=BoothPolicy(max_concurrent_trainings=1))
    alice, bob = "v-a11ce00000000000", "v-b0b0000000000000"
    page_a = App(backend=backend, booth=True, visitor=alice, blueprint_id="tiny-llama-cpu")
    assert page_a.form is not None and page_a.form.backend.layout.display == "none"
    _fill(page_a, QUICK)
    click = {"event": "click"}
    page_a.form.launch_button._handle_button_msg(None, click, None)
    page_a.form.launch_button._handle_button_msg(None, click, None)  # the second click of a double-click
    jobs = backend.list(owner=Owner.visitor(alice))
    assert len(jobs) == 1 and jobs[0].owner == alice and page_a.monitor.job_id == jobs[0].id
    assert page_a.form.launch_button.disabled and "still running" in page_a.form.status.value

    page_b = App(backend=backend, booth=True, visitor=bob, blueprint_id="tiny-llama-cpu")
    assert page_b.jobs is not None and page_b.jobs.jobs == [] and page_b.monitor.job_id == ""
    with pytest.raises(JobNotFound):
        page_b.jobs.attach_job(jobs[0].id)  # another visitor's job is like an unknown one
    _fill(page_b, QUICK)
    job_b = page_b.form.launch()
    assert job_b is not None and job_b.owner == bob
    wait_for(lambda: "next in line" in page_b.monitor.queue.value or page_b.monitor.done, 120, "B queued")
    assert "next in line" in page_b.monitor.queue.value  # A trains: B waits, and sees it
    assert [j.id for j in page_b.jobs.jobs] == [job_b.id]

    page_a_again = App(backend=backend, booth=True, visitor=alice, blueprint_id="tiny-llama-cpu")  # a reload
    assert page_a_again.monitor.job_id == jobs[0].id and page_a_again.form.launch_button.disabled
    assert page_a_again.form.controls["max_steps"].value == "12"  # the form shows that job's parameters
    assert page_a_again.monitor.wait(300) and page_a_again.monitor.final_job.phase == JobPhase.SUCCEEDED
    assert not page_a_again.form.launch_button.disabled  # free to launch again once it ended
    page_b.monitor.cancel()
    assert page_b.monitor.wait(120)


def test_booth_page_without_a_valid_cookie_shows_nothing(monkeypatch: pytest.MonkeyPatch, isolated_home: Path) -> None:
    from voila_app.identity import COOKIE_NAME, SECRET_ENV, sign
    from widgets.app import UNKNOWN_VISITOR, App

    monkeypatch.setenv(SECRET_ENV, "k" * 40)
    for cookie in ("", f"{COOKIE_NAME}={sign('another-secret-' + 'x' * 30, 'v-0000000000000000')}"):
        monkeypatch.setenv("HTTP_COOKIE", cookie)
        app = App(booth=True)
        assert app.owner is None and app.gallery is None and app.jobs is None
        assert html.escape(UNKNOWN_VISITOR) in app.status.value
    monkeypatch.setenv("HTTP_COOKIE", f"{COOKIE_NAME}={sign('k' * 40, 'v-0123456789abcdef')}")
    app = App(booth=True)  # what a kernel started by the booth's Voila sees
    assert app.owner == "v-0123456789abcdef" and app.gallery is not None


def test_a_booth_page_shows_its_visitor_is_present_while_its_kernel_lives(home: Path) -> None:
    """The app starts the engine's presence heartbeat (a queued job of a visitor gone too long leaves the queue)."""
    from playground.backends.local import LocalBackend
    from playground.booth import BoothPolicy, last_seen
    from playground.facade import Playground
    from widgets.app import App

    backend = Playground(LocalBackend(home=home, policy=BoothPolicy()))
    assert last_seen(home, "v-present") is None
    app = App(backend=backend, booth=True, visitor="v-present", reattach=False)
    try:
        seen = wait_for(lambda: last_seen(home, "v-present"), 10, "the page's first heartbeat")
        assert abs(time.time() - seen) < 10 and last_seen(home, "v-other") is None
    finally:
        app.presence.stop()
    assert App(backend=Playground(LocalBackend(home=home)), booth=False, reattach=False).presence is None


# -- no heavy imports in the UI -------------------------------------------------------------------


def test_ui_never_imports_torch_or_transformers() -> None:
    script = """
import json, sys
import widgets, widgets.app, widgets.chat, widgets.form, widgets.gallery, widgets.jobs, widgets.monitor, widgets.state
import playground.e2e.headless, playground.headless, voila_app.command, playground.cli
from widgets import App
App(backend_name="local")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "peft"))))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_threads_never_print(capfd: pytest.CaptureFixture[str]) -> None:
    """Errors in the reader thread land in the widget, not on stdout (Voila would show them)."""

    class Broken(ScriptedBackend):
        def events(self, job_id: str, follow: bool = False, *, owner: str | None = None) -> Iterator[Event]:
            yield Phase(JobPhase.TRAINING)
            raise ConnectionError("stream dropped")

    monitor = JobMonitor(Broken([], 1.0), "job-1")
    assert monitor.wait(10)
    assert "stream dropped" in monitor.status.value
    out, err = capfd.readouterr()
    assert "stream dropped" not in out + err
    assert threading.active_count() < 50


# -- the kernel's guard against hostile widget messages ------------------------------------------------------


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_guard_logs_dropped_messages_once_a_second_per_reason_with_a_count() -> None:
    """A comm flood (the booth bench's: 24.7 MB of log, a line per message) is a line a second per reason."""
    from widgets.guard import CommGuard, Limits

    now = [0.0]
    guard = CommGuard(Limits(max_message_bytes=1000, messages_per_second=5, max_client_comms=20), lambda: now[0])
    handler, logger = _Lines(), logging.getLogger("ipykernel.comm")
    logger.addHandler(handler)
    try:
        big = {"content": {"data": "x" * 2000}}
        assert [guard.allow("comm_msg", big) for _ in range(3)] == [False] * 3  # too big (3 of the 50 tokens)
        assert sum(guard.allow("comm_msg", {"content": {}}) for _ in range(1000)) == 47  # then over the rate
        now[0] += 0.5
        assert sum(guard.allow("comm_msg", {"content": {}}) for _ in range(100)) == 2
        now[0] += 0.6
        assert sum(guard.allow("comm_msg", {"content": {}}) for _ in range(100)) == 3
        now[0] += 2.0
        assert [guard.allow("comm_msg", big) for _ in range(2)] == [False] * 2
    finally:
        logger.removeHandler(handler)
    assert guard.dropped == 3 + 953 + 98 + 97 + 2
    assert handler.lines == [
        "dropped a widget message: 2012 bytes > 1000",
        "dropped a widget message: more than 5 per second",
        "dropped 1051 widget messages in 1.1 s: more than 5 per second",  # 952 + 98 held back, and this one
        "dropped 3 widget messages in 3.1 s: 2012 bytes > 1000",
    ]


def test_repeated_comm_errors_are_one_line_a_second_with_a_count(capfd: pytest.CaptureFixture[str]) -> None:
    """ipykernel's comm manager logs "No such comm" for every message to an unknown comm: a flood's worth."""
    from comm.base_comm import CommManager

    from widgets.guard import RepeatedLines, quiet_comm_errors

    quiet_comm_errors()  # what the app's kernel does: the comm loggers' lines go to the server log, throttled
    capfd.readouterr()
    manager = CommManager()
    for i in range(500):
        manager.comm_msg(None, None, {"content": {"comm_id": f"nope-{i}", "data": {}}})
    lines = capfd.readouterr().err.splitlines()
    assert len([line for line in lines if "No such comm" in line]) <= 2, lines  # not 500 (2: a second boundary)
    assert lines[0].startswith("[playground.guard] No such comm: nope-0")

    now = [0.0]
    handler, logger = _Lines(), logging.getLogger("test.repeated")
    handler.addFilter(RepeatedLines(lambda: now[0]))
    logger.addHandler(handler)
    logger.propagate = False
    for step in range(24):  # 3 s, a line every 1/8 s
        now[0] = step / 8
        logger.warning("No such comm: %s", f"c{step}")
        if step == 5:
            logger.warning("Exception in comm_msg for %s", "c5")  # another kind of line: its own second
    assert handler.lines == [
        "No such comm: c0",
        "Exception in comm_msg for c5",
        "No such comm: c8 (8 such lines in 1.0 s)",
        "No such comm: c16 (8 such lines in 1.0 s)",
    ]
    logger.removeHandler(handler)


# -- `playground app` and binder -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["app", "--backend", "nope"], "--backend 'nope': allowed: local, kubernetes"),
        (["app", "--blueprint", "nope"], "unknown blueprint 'nope'; known:"),
        (["app", "--port", "0"], "--port 0: allowed: 1 to 65535"),
        (["app", "--booth", "--booth-max-kernels", "0"], "--booth-max-kernels 0: allowed: an integer from 1 to 1000"),
        (["app", "--booth", "--booth-cull-seconds", "5"], "--booth-cull-seconds 5: allowed: an integer from 30 to"),
        (["app", "--booth", "--booth-preheat", "9"], "--booth-preheat 9: allowed: an integer from 0 to 8"),
        (["app", "--booth", "--booth-new-visitors-burst", "0"], "--booth-new-visitors-burst '0': allowed: an integer"),
        (
            ["app", "--booth", "--booth-websocket-messages-per-second", "0"],
            "--booth-websocket-messages-per-second '0': allowed: a number from 1 to 100000",
        ),
    ],
)
def test_app_command_bad_input_is_one_line_exit_2(argv: list[str], needle: str) -> None:
    out = subprocess.run([sys.executable, "-m", "playground.cli", *argv], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("playground: error: ") and needle in lines[0], out.stderr


def test_app_command_uses_safe_voila_settings() -> None:
    from playground.cli import build_parser
    from voila_app.command import APP_NOTEBOOK, notebooks_dir, voila_command

    args = build_parser().parse_args(["app"])
    assert (args.ip, args.port, args.no_browser) == ("127.0.0.1", 8866, False)  # localhost by default
    nb = notebooks_dir() / APP_NOTEBOOK
    assert nb == REPO / "notebooks" / APP_NOTEBOOK
    command = voila_command(nb, port=1234, ip=args.ip, open_browser=False)
    for flag in (
        "--strip_sources=True",
        "--show_tracebacks=False",
        "--Voila.ip=127.0.0.1",
        "--port=1234",
        "--no-browser",
    ):
        assert flag in command
    assert any(a.startswith("--MappingKernelManager.cull_idle_timeout=") for a in command)
    assert "--template=playground" in command  # a page title, no stylesheets from a CDN
    assert not any("BoothKernelManager" in a or "config_file_paths" in a for a in command)


def test_booth_mode_settings(isolated_home: Path) -> None:
    from playground.cli import build_parser
    from voila_app import CONFIG_DIR
    from voila_app.command import BOOTH_CULL_SECONDS, BOOTH_MAX_KERNELS, booth_environment, voila_command
    from voila_app.identity import SECRET_ENV
    from voila_app.limits import TRUSTED_PROXIES_ENV, limits_from

    args = build_parser().parse_args(["app", "--booth"])
    assert (args.booth_max_kernels, args.booth_cull_seconds, args.booth_preheat) == (
        BOOTH_MAX_KERNELS,
        BOOTH_CULL_SECONDS,
        1,
    )
    command = voila_command(Path("app.ipynb"), port=1, ip="0.0.0.0", open_browser=False, cull_idle_seconds=120,
                            booth_max_kernels=16, booth_preheat=args.booth_preheat)  # fmt: skip
    for flag in (
        "--MappingKernelManager.cull_idle_timeout=120",
        "--MappingKernelManager.cull_interval=30",
        "--MappingKernelManager.cull_connected=False",
        f"--Voila.config_file_paths={CONFIG_DIR}",
        "--BoothKernelManager.max_kernels=16",
        "--BoothVoila.preheat_kernels=1",  # one warm kernel: the app imported before a visitor comes
        "--BoothVoila.new_visitors_per_minute=20",  # the Voila server's booth limits (voila_app.limits)
        "--BoothVoila.new_visitors_burst=30",
        f"--BoothVoila.websocket_max_bytes={128 * 1024}",
        "--BoothVoila.websocket_messages_burst=200",  # per kernel, from browsers
        "--BoothVoila.websocket_messages_per_second=50",
    ):
        assert flag in command
    assert command[1:3] == ["-m", "voila_app"] and not any("trusted_proxies" in a for a in command)
    limits = limits_from({}, per_minute="6", trusted_proxies="10.0.0.5,10.244.0.0/16", messages_per_second="12.5")
    command = voila_command(Path("app.ipynb"), port=1, ip="0.0.0.0", open_browser=False, booth_max_kernels=16,
                            booth_limits=limits)  # fmt: skip
    assert "--BoothVoila.new_visitors_per_minute=6" in command
    assert "--BoothVoila.websocket_messages_per_second=12.5" in command
    assert "--BoothVoila.trusted_proxies=10.0.0.5/32,10.244.0.0/16" in command
    assert (CONFIG_DIR / "voila.py").is_file()
    # the kernels get booth mode (the engine's policy) and the secret that verifies visitor cookies
    booth = booth_environment(args, {})
    assert booth["PLAYGROUND_BOOTH"] == "1" and len(booth[SECRET_ENV]) == 64
    assert booth_environment(args, {})[SECRET_ENV] == booth[SECRET_ENV]  # kept in the home: survives a restart
    assert oct((isolated_home / "booth" / "secret").stat().st_mode & 0o777) == "0o600"
    out = subprocess.run(
        [sys.executable, "-m", "playground.cli", "app", "--booth"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, SECRET_ENV: "short"},
    )
    assert out.returncode == 2 and f"{SECRET_ENV} is 5 characters; allowed: at least 32" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "playground.cli", "app", "--booth"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, TRUSTED_PROXIES_ENV: "10.0.0.5,proxy.local"},
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert f"{TRUSTED_PROXIES_ENV} 'proxy.local': allowed: IP addresses or networks" in out.stderr


TINY = "tiny-llama-cpu"


def test_app_on_a_taken_port_serves_and_prints_the_next_free_one(tmp_path: Path) -> None:
    """`playground app --port P` with P taken: Voila listens on the port the command printed."""
    import socket

    from _waiting import wait_for

    from playground.serving.local import port_in_use
    from voila_app.command import first_free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        expected = first_free_port("127.0.0.1", busy)
        assert expected > busy and not port_in_use(expected)
        env = {**os.environ, "PLAYGROUND_HOME": str(tmp_path / "home")}
        proc = subprocess.Popen(
            # tiny-llama-cpu: no packaged model, so no base model is asked its questions in the background
            [sys.executable, "-m", "playground.cli", "app", "--port", str(busy), "--no-browser", "--blueprint", TINY],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=REPO,
        )
        try:
            assert proc.stdout is not None
            lines = [proc.stdout.readline().strip(), proc.stdout.readline().strip()]
            assert lines == [
                f"port {busy} is in use; using {expected}",
                f"Blueprint Playground on http://127.0.0.1:{expected}/  (Ctrl-C stops it)",
            ]
            wait_for(lambda: port_in_use(expected) or proc.poll() is not None, 120, f"Voila on port {expected}")
            assert proc.poll() is None, "Voila exited instead of serving the printed port"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_binder_runs_the_app_on_cpu_torch() -> None:
    binder = REPO / "binder"
    requirements = (binder / "requirements.txt").read_text()
    assert "download.pytorch.org/whl/cpu" in requirements and "torch==2.13.0+cpu" in requirements
    start = (binder / "start").read_text()
    assert "PLAYGROUND_BACKEND=local" in start and "PLAYGROUND_BLUEPRINT=smollm2-135m-lora-kubectl" in start
    assert 'exec "$@"' in start
    post = (binder / "postBuild").read_text()
    assert "pip install" in post and "show_tracebacks = False" in post and "strip_sources = True" in post
    assert os.access(binder / "postBuild", os.X_OK) and os.access(binder / "start", os.X_OK)


def test_launch_form_shows_the_plan_and_follows_the_values() -> None:
    """The plan panel (issue 21 item 4): memory, verdict and time from the engine's plan, redrawn as values change."""
    from playground.api import plan_run

    bp = get_blueprint("tiny-llama-cpu")
    form = LaunchForm(bp)
    form.refresh_plan(wait=True)
    expected = plan_run("tiny-llama-cpu")
    text = html.unescape(form.plan_view.value)
    assert "0.8M parameters" in text and "fits" in text and f"{expected.memory.total / 1e9:.2f} GB" in text
    assert "<details>" in form.plan_view.value and "memory per device" in text
    form.controls["batch_size"].value = "512"
    bigger = f"{plan_run('tiny-llama-cpu', {'batch_size': 512}).memory.total / 1e9:.2f} GB"
    wait_for(lambda: bigger in form.plan_view.value, timeout=30, what="the plan for batch_size=512")
    form.controls["batch_size"].value = "0"  # out of range: the error shows, the plan says why it stopped
    assert "fix the highlighted values" in form.plan_view.value
    assert "Traceback" not in form.plan_view.value


# -- your data & model (the data panel on the launch form) ----------------------------------------

GOOD_ROWS = [
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                  {"role": "user", "content": "more"}, {"role": "assistant", "content": "sure <b>x</b>"}]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
    {"messages": [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]},
]  # fmt: skip


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _click(button: ipw.Button) -> None:
    button._handle_button_msg(None, {"event": "click"}, None)  # what a client's click does


def _upload_msg(name: str, content: bytes) -> dict:
    """The FileUpload value as a client sends it (deserialized by the widget itself)."""
    return {"value": [{"name": name, "type": "", "size": 1, "content": memoryview(content), "last_modified": 0}]}


class RecordingBackend(ScriptedBackend):
    """Records what Launch submits and starts nothing."""

    def __init__(self) -> None:
        super().__init__([], 1.0)
        self.jobs = {}
        self.requests: list[RunRequest] = []

    def submit(self, request: RunRequest) -> Job:
        self.requests.append(request)
        raise ParameterError("not started in this test", field="blueprint")


def _data_app(backend: RecordingBackend, **kwargs):
    from widgets.app import App

    app = App(backend=backend, blueprint_id="tiny-llama-cpu", booth=False, reattach=False, **kwargs)
    assert app.form is not None and app.form.data is not None
    return app


def test_data_panel_reports_a_good_multi_turn_file(isolated_home: Path, tmp_path: Path) -> None:
    good = _jsonl(tmp_path / "good.jsonl", GOOD_ROWS)
    form = LaunchForm(get_blueprint("tiny-llama-cpu"), data_panel=True)
    panel = form.data
    assert panel is not None and panel.selected_index is None and panel.titles == ("Your data & model",)
    panel.dataset.set_state({"value": str(good)})
    _click(panel.check_button)
    out = panel.output.value
    assert panel.report is not None and panel.report.rows == 3 and "pg-error-text" not in out
    assert "3 rows (messages, 1 multi-turn); 2 to train, 1 held out" in out
    assert "p50 5 · p90 30 · p99 30 · max 30" in out and "max_seq_length 64 truncates 0 of 3 rows" in out
    assert out.count("pg-data-row") == 3 and "<mark>hello&lt;|end|&gt;</mark>" in out
    assert "sure &lt;b&gt;x&lt;/b&gt;" in out and "<b>x" not in out  # the file's text is escaped


def test_a_bad_row_is_one_inline_line_and_launch_starts_nothing(isolated_home: Path, tmp_path: Path) -> None:
    empty_answer = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]}
    bad = _jsonl(tmp_path / "bad.jsonl", [GOOD_ROWS[1], empty_answer])
    backend = RecordingBackend()
    app = _data_app(backend)
    panel = app.form.data
    panel.dataset.set_state({"value": str(bad)})
    _click(panel.check_button)
    text = html.unescape(panel.output.value)
    assert "pg-error-text" in panel.output.value and "bad.jsonl row 2 field 'messages[1].content'" in text
    assert "\n" not in text and "<br>" not in text and "Traceback" not in text and panel.selected_index == 0
    assert app.form.launch() is None and backend.requests == []  # the engine refused before anything started
    assert "bad.jsonl row 2" in html.unescape(app.form.status.value)
    assert app.monitor.job_id == "" and not app.monitor.running
    panel.columns.set_state({"value": "prompt"})  # not NAME=COLUMN: one line, still nothing started
    _click(panel.check_button)
    assert "expected NAME=COLUMN" in html.unescape(panel.output.value)
    panel.columns.set_state({"value": ""})
    panel.dataset.set_state({"value": "x\x00.jsonl"})  # what a client can send
    assert app.form.launch() is None and "dataset: not valid" in app.form.status.value and backend.requests == []


def test_an_unexpected_check_failure_is_a_generic_line(monkeypatch: pytest.MonkeyPatch, isolated_home: Path) -> None:
    from playground import api

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("/secret/place exploded")

    monkeypatch.setattr(api, "check_data", broken)
    form = LaunchForm(get_blueprint("tiny-llama-cpu"), data_panel=True)
    assert form.data.check() is None
    assert form.data.output.value == "<span class='pg-error-text'>could not check the data (RuntimeError)</span>"


def test_launch_passes_the_panel_sources(isolated_home: Path, tmp_path: Path) -> None:
    good = _jsonl(tmp_path / "good.jsonl", GOOD_ROWS)
    backend = RecordingBackend()
    app = _data_app(backend, dataset_source=str(good))
    assert app.form.data.dataset.value == str(good)  # the App's sources start the panel
    app.form.data.model.set_state({"value": "scratch://llama"})
    app.form.launch()
    overrides = backend.requests[-1].overrides
    assert (overrides.dataset, overrides.model) == (str(good), "scratch://llama")
    app.form.data.eval_file.set_state({"value": str(good)})  # lives in a blueprint of your own: refused inline
    assert app.form.launch() is None and len(backend.requests) == 1
    assert "Save as blueprint" in app.form.data.output.value


def test_uploads_are_private_files_inside_uploads(isolated_home: Path, tmp_path: Path) -> None:
    from widgets.userdata import MAX_UPLOAD_BYTES, safe_upload_name

    form = LaunchForm(get_blueprint("tiny-llama-cpu"), data_panel=True)
    panel = form.data
    content = "".join(json.dumps(row) + "\n" for row in GOOD_ROWS).encode()
    panel.upload.set_state(_upload_msg("../../x.jsonl", content))
    uploads = isolated_home / "uploads"
    saved = uploads / "x.jsonl"
    assert saved.read_bytes() == content and panel.dataset.value == str(saved)
    assert oct(saved.stat().st_mode & 0o777) == "0o600" and oct(uploads.stat().st_mode & 0o777) == "0o700"
    assert not (tmp_path / "x.jsonl").exists() and sorted(p.name for p in uploads.iterdir()) == ["x.jsonl"]
    assert panel.report is not None and "<mark>" in panel.output.value  # checked at once
    assert panel.upload.value == ()  # the bytes do not stay in the kernel
    names = {"..\\..\\evil.CSV": "evil.csv", ".hidden.json": "hidden.json", "a b<script>.jsonl": "a_b_script_.jsonl"}
    assert {name: safe_upload_name(name) for name in names} == names
    # too large (the cap is a setting), or not a dataset: one line, nothing written
    panel.upload.set_state(_upload_msg("big.jsonl", bytes(MAX_UPLOAD_BYTES + 1)))
    assert "allowed: at most 9 MB" in panel.output.value and not (uploads / "big.jsonl").exists()
    panel.upload.set_state(_upload_msg("run.sh", b"echo"))
    assert "unsupported file type" in panel.output.value and panel.dataset.value == str(saved)
    assert sorted(p.name for p in uploads.iterdir()) == ["x.jsonl"]


def test_save_as_blueprint_joins_the_catalog(isolated_home: Path, tmp_path: Path) -> None:
    from playground import api

    good = _jsonl(tmp_path / "good.jsonl", GOOD_ROWS)
    app = _data_app(RecordingBackend())
    panel = app.form.data
    panel.dataset.set_state({"value": str(good)})
    panel.save_id.set_state({"value": "my-own-data"})
    _click(panel.save_button)
    saved = isolated_home / "blueprints" / "my-own-data.yaml"
    assert saved.is_file() and "saved my-own-data" in panel.save_status.value, panel.save_status.value
    assert "my-own-data" in [b.id for b in api.blueprints()]
    assert "my-own-data" in app.gallery.cards and "pg-selected" in app.gallery.cards["tiny-llama-cpu"]._dom_classes
    _click(panel.save_button)  # the same id again: one line, nothing overwritten
    assert "already exists" in panel.save_status.value and "pg-error-text" in panel.save_status.value


def test_booth_mode_has_no_data_panel(monkeypatch: pytest.MonkeyPatch, isolated_home: Path) -> None:
    from widgets.app import App
    from widgets.userdata import DataPanel

    monkeypatch.setenv("PLAYGROUND_BOOTH", "1")
    form = LaunchForm(get_blueprint("tiny-llama-cpu"), data_panel=True)
    assert form.data is None and form.sources() == {}
    app = App(backend=RecordingBackend(), blueprint_id="tiny-llama-cpu", visitor="v-0123456789abcdef", reattach=False)
    assert app.booth and app.form is not None and app.form.data is None
    assert not any(isinstance(w, DataPanel) for w in app.form.children)


def test_checking_data_from_the_panel_imports_no_torch(tmp_path: Path) -> None:
    good = _jsonl(tmp_path / "good.jsonl", GOOD_ROWS)
    script = f"""
import json, sys
from playground.blueprints import get_blueprint
from widgets.form import LaunchForm
form = LaunchForm(get_blueprint("tiny-llama-cpu"), data_panel=True)
form.data.dataset.value = {str(good)!r}
assert form.data.check() is not None, form.data.output.value
form.refresh_plan(wait=True)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "peft"))))
"""
    env = {**os.environ, "PLAYGROUND_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
