"""Widget logic: form validation inline, coalescing under a fast stream, reattach, no torch in the UI."""

from __future__ import annotations

import html
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import ipywidgets as ipw
import pytest

from playground.backends.base import Backend
from playground.blueprints import get_blueprint
from playground.errors import JobNotFound, ParameterError
from playground.events import Event, JobPhase, Log, Metric, Phase, Progress
from playground.types import Endpoint, Job, TrainRequest
from widgets.form import LaunchForm
from widgets.monitor import JobMonitor
from widgets.state import Coalescer, FormModel, attachable_jobs, blueprint_notes, latest_running, replay

REPO = Path(__file__).resolve().parents[1]


# -- form -----------------------------------------------------------------------------------------


def test_form_controls_come_from_the_schema() -> None:
    bp = get_blueprint("tiny-llama-cpu")
    form = LaunchForm(bp)
    assert set(form.controls) == set(bp.parameters)
    steps = form.controls["max_steps"]
    assert isinstance(steps, ipw.IntSlider)
    assert (steps.min, steps.max, steps.value) == (1, 5000, bp.defaults()["max_steps"])
    lr = form.controls["learning_rate"]
    assert isinstance(lr, ipw.FloatLogSlider)
    assert lr.min == pytest.approx(-5) and lr.max == pytest.approx(-1)
    assert isinstance(form.controls["seed"], ipw.BoundedIntText)  # 0..1e6: a bounded text box, not a slider
    assert form.controls["seed"].max == 1_000_000
    # untouched controls give exactly the blueprint's defaults (log-slider floats are rounded back)
    assert form.validate().params == bp.defaults()


def test_form_shows_engine_errors_next_to_the_field() -> None:
    bp = get_blueprint("tiny-llama-cpu")
    launched: list[dict] = []
    form = LaunchForm(bp, on_launch=lambda backend, params: launched.append(params))
    result = form.validate({**form.values(), "max_steps": 999_999, "learning_rate": "fast"})
    assert not result.ok
    steps_error = form.errors["max_steps"].value
    assert "max_steps" in steps_error and "out of range" in steps_error and "1 to 5000" in steps_error
    assert "learning_rate" in form.errors["learning_rate"].value
    assert form.errors["batch_size"].value == ""  # only the bad fields light up
    # the message is the engine's own (one line, the allowed values)
    with pytest.raises(ParameterError) as exc:
        bp.resolve_params({"max_steps": 999_999})
    assert html.escape(str(exc.value)) in steps_error
    # a bounded control cannot hold a bad value: launching with the controls calls on_launch once
    form.controls["max_steps"].value = 7
    form.launch()
    assert launched == [{**bp.defaults(), "max_steps": 7}]
    assert all(w.value == "" for w in form.errors.values())


def test_form_preset_out_of_bounds_is_flagged_not_started() -> None:
    bp = get_blueprint("tiny-llama-cpu")
    form = LaunchForm(bp, values={"batch_size": 0})
    assert "batch_size" in form.errors["batch_size"].value and "1 to 512" in form.errors["batch_size"].value
    assert FormModel(bp).validate({"nonsense": 1}).errors["nonsense"].startswith("unknown parameter 'nonsense'")


def test_launch_error_from_the_backend_is_inline_and_starts_nothing(isolated_home: Path) -> None:
    from playground.backends.local import LocalBackend, detect_gpus
    from widgets.app import App

    if detect_gpus() > 0:
        pytest.skip("this machine has a GPU: the GPU blueprint would really start")
    backend = LocalBackend(home=isolated_home)
    app = App(backend=backend, blueprint_id="llama-3.2-1b-lora-alpaca")
    assert any("needs 1 GPU" in n for n in app.gallery.notes["llama-3.2-1b-lora-alpaca"])
    assert app.form is not None
    assert app.form.launch() is None
    assert "needs 1 GPU" in app.form.status.value and "tiny-llama-cpu" in app.form.status.value
    assert backend.list() == []  # nothing started
    assert app.monitor is None


def test_gallery_notes() -> None:
    llama = get_blueprint("llama-3.2-1b-lora-alpaca")
    tiny = get_blueprint("tiny-llama-cpu")
    assert blueprint_notes(tiny, "local", gpus=0) == []
    notes = blueprint_notes(llama, "local", gpus=0)
    assert notes and "GPU" in notes[0]
    assert not any("GPU" in n for n in blueprint_notes(llama, "local", gpus=1))
    assert not any("GPU" in n for n in blueprint_notes(llama, "kubernetes", gpus=0))


# -- coalescing -----------------------------------------------------------------------------------


def _progress(step: int, total: int) -> Progress:
    return Progress(step=step, total_steps=total, loss=10.0 / (step + 1), tokens_per_second=1000.0 + step)


def test_coalescer_caps_updates_and_keeps_every_point() -> None:
    renders: list[tuple[float, int]] = []
    received: list[int] = []

    def render(snapshot) -> None:
        renders.append((time.monotonic(), len(snapshot.new_points)))
        received.extend(p.step for p in snapshot.new_points)

    coalescer = Coalescer(render, max_rate=10)
    total, rate = 2000, 1000.0  # 1000 events per second for 2 seconds
    start = time.monotonic()
    for i in range(total):
        coalescer.push(_progress(i + 1, total))
        if i % 2:
            coalescer.push(Log(source="trainer", line=f"line {i}"))
        delay = start + (i + 1) / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    elapsed = time.monotonic() - start
    coalescer.close()
    assert received == list(range(1, total + 1)), "every progress point reaches the chart, in order"
    per_second = len(renders) / elapsed
    assert len(renders) <= 10 * elapsed + 2, f"{len(renders)} renders in {elapsed:.2f}s"
    assert len(renders) >= 5, "updates keep flowing while events arrive"
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(renders)]
    assert min(gaps) >= 0.095, f"updates closer than 1/10 s: {min(gaps):.3f}s"
    assert coalescer.error is None and not coalescer.alive
    print(f"renders/s={per_second:.1f} points={len(received)}")


class ScriptedBackend(Backend):
    """A backend double that replays a scripted event stream at a given rate (interface only)."""

    name = "scripted"

    def __init__(self, events: list[Event], rate: float) -> None:
        self.script, self.rate = events, rate
        self.job = Job(
            id="job-1",
            blueprint_id="tiny-llama-cpu",
            backend="scripted",
            phase=JobPhase.PENDING,
            params={},
            created_at=0.0,
        )

    def events(self, job_id: str, follow: bool = False) -> Iterator[Event]:
        start = time.monotonic()
        for i, event in enumerate(self.script):
            delay = start + i / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            yield event
        self.job.phase = JobPhase.SUCCEEDED

    def get(self, job_id: str) -> Job:
        if job_id != self.job.id:
            raise JobNotFound(job_id)
        return self.job

    def submit(self, request: TrainRequest) -> Job:
        raise NotImplementedError

    def list(self) -> list[Job]:
        return [self.job]

    def cancel(self, job_id: str) -> Job:
        return self.job

    def delete(self, job_id: str) -> None: ...

    def serve(self, job_id: str, *, base: bool = False) -> Endpoint:
        raise NotImplementedError

    def unserve(self, target: str) -> None: ...

    def endpoints(self) -> list[Endpoint]:
        return []


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
    assert "eval_exact_match" in monitor.metrics.value
    assert f"step {total}" in monitor.logs.value
    assert done and done[0].phase == JobPhase.SUCCEEDED
    assert monitor.error == ""


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


def test_reattach_to_a_running_job_gets_history_then_live(isolated_home: Path) -> None:
    """Attach while it trains: the first update already holds the points logged before attaching."""
    from playground.api import make_request
    from playground.backends.local import LocalBackend

    first = LocalBackend(home=isolated_home)
    quick = {"max_steps": 20, "log_every": 2, "checkpoint_every": 0, "num_eval_examples": 10}
    job = first.submit(make_request("tiny-llama-cpu", quick))
    try:
        for event in first.events(job.id, follow=True):  # wait for a few points, then "reload the page"
            if isinstance(event, Progress) and event.step >= 6:
                break
        monitor = JobMonitor(LocalBackend(home=isolated_home), job.id)
        assert monitor.wait(240), "followed to the end"
        steps = list(monitor.chart.data[0].x)
        assert steps == list(range(2, 21, 2)), steps
        assert monitor.final_job is not None and monitor.final_job.phase == JobPhase.SUCCEEDED
    finally:
        first.delete(job.id)


# -- no heavy imports in the UI -------------------------------------------------------------------


def test_ui_never_imports_torch_or_transformers() -> None:
    script = """
import json, sys
import widgets, widgets.app, widgets.chat, widgets.form, widgets.gallery, widgets.jobs, widgets.monitor, widgets.state
import playground.headless, playground.commands.app, playground.cli
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
        def events(self, job_id: str, follow: bool = False) -> Iterator[Event]:
            yield Phase(JobPhase.TRAINING)
            raise ConnectionError("stream dropped")

    monitor = JobMonitor(Broken([], 1.0), "job-1")
    assert monitor.wait(10)
    assert "stream dropped" in monitor.status.value
    out, err = capfd.readouterr()
    assert "stream dropped" not in out + err
    assert threading.active_count() < 50


# -- `playground app` and binder -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["app", "--backend", "nope"], "--backend 'nope': allowed: local, kubernetes"),
        (["app", "--blueprint", "nope"], "unknown blueprint 'nope'; known:"),
        (["app", "--port", "0"], "--port 0: allowed: 1 to 65535"),
    ],
)
def test_app_command_bad_input_is_one_line_exit_2(argv: list[str], needle: str) -> None:
    out = subprocess.run([sys.executable, "-m", "playground.cli", *argv], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("playground: error: ") and needle in lines[0], out.stderr


def test_app_command_uses_safe_voila_settings() -> None:
    from playground.cli import build_parser
    from playground.commands.app import APP_NOTEBOOK, notebooks_dir, voila_command

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
