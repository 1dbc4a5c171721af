"""The real app: `playground app` (Voila) on localhost, driven by Debian's headless Chromium.

Pick tiny-llama-cpu, launch, watch the progress bar move and the loss chart gain points, reload
the page and reattach, serve, ask a held-out prompt and see the fine-tuned model's correct answer
next to the base model's. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _waiting import wait_for

# generous: ~3 min on 2 free cores, far more on a loaded machine (training dominates)
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 90) -> None:
    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"playground app exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False

    wait_for(listening, timeout, f"playground app listening on port {port}", interval=0.3)


@pytest.fixture
def app_url(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """`playground app` on a free localhost port with its own PLAYGROUND_HOME; everything stopped after."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is absent (/usr/bin/chromium); scripts/test.sh installs it")
    pytest.importorskip("playwright.sync_api")
    home = tmp_path / "home"
    port = free_port()
    env = {
        **os.environ,
        "PLAYGROUND_HOME": str(home),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    }
    log = open(tmp_path / "voila.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "playground.cli", "app", "--port", str(port), "--no-browser"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/", home, tmp_path / "voila.log"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        from playground.backends.local import LocalBackend

        backend = LocalBackend(home=home)
        for job in backend.list():
            with contextlib.suppress(Exception):
                backend.delete(job.id)  # cancels, stops its servers, removes its state


def held_out_prompts(n: int = 3) -> list[tuple[str, str]]:
    """Prompts from tiny-llama-cpu's held-out split (never trained on) with their answers."""
    from playground.blueprints import get_blueprint
    from playground.train.data import synthetic_splits

    blueprint = get_blueprint("tiny-llama-cpu")
    task = blueprint.dataset.source.split("://", 1)[1]
    _, held = synthetic_splits(task, dict(blueprint.dataset.options), num_train=1, num_eval=n, seed=0)
    return [(s.prompt, s.answer) for s in held]


def progress_width(page) -> float:
    style = page.get_attribute(".pg-progress .progress-bar", "style") or ""
    match = re.search(r"width:\s*([\d.]+)%", style)
    return float(match.group(1)) if match else 0.0


def chart_points(page) -> int:
    """Loss markers drawn by plotly in the chart (first trace)."""
    return page.locator(".pg-chart .scatterlayer .trace").first.locator("path.point").count()


def points_label(page) -> int:
    text = page.inner_text(".pg-points")
    return int(text.split()[0])


def test_app_in_headless_chromium(app_url: tuple[str, Path, Path], artifacts_dir: Path) -> None:
    from playwright.sync_api import sync_playwright

    from playground.blueprints import get_blueprint

    url, _home, voila_log = app_url
    shots = artifacts_dir / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 2600})
        try:
            # 1. the app renders; pick tiny-llama-cpu
            page.goto(url, timeout=180_000)
            page.wait_for_selector(".pg-gallery", timeout=180_000)
            assert "needs 1 GPU" in page.inner_text(".pg-card-llama-3\\.2-1b-lora-alpaca") or os.path.exists(
                "/proc/driver/nvidia/gpus"
            )
            assert "Traceback" not in page.content()
            page.click(".pg-select-tiny-llama-cpu")
            page.wait_for_selector(".pg-launch", timeout=60_000)
            page.screenshot(path=str(shots / "01-gallery-form.png"), full_page=True)

            # 2. launch; the progress bar moves and the chart gains points
            page.click(".pg-launch")
            page.wait_for_selector(".pg-monitor", timeout=60_000)
            first = wait_for(lambda: progress_width(page) > 0 and chart_points(page) > 0, 300, "first progress")
            w1, p1 = progress_width(page), chart_points(page)
            assert first
            wait_for(lambda: progress_width(page) > w1 and chart_points(page) > p1, 300, "more progress")
            page.screenshot(path=str(shots / "02-training.png"), full_page=True)

            # 3. reload the page mid-training: reattach from "Your jobs" and see the history
            before = points_label(page)
            page.reload(timeout=180_000)
            page.wait_for_selector(".pg-jobs .pg-open", timeout=180_000)
            page.click(".pg-jobs .pg-open >> nth=0")
            page.wait_for_selector(".pg-monitor", timeout=60_000)
            wait_for(lambda: points_label(page) >= before, 60, "history after reattach")
            page.screenshot(path=str(shots / "03-reattached.png"), full_page=True)

            # 4. training ends; the chart kept every point
            wait_for(lambda: "Succeeded" in page.inner_text(".pg-phase"), 1500, "Succeeded")
            total = points_label(page)
            defaults = get_blueprint("tiny-llama-cpu").defaults()
            assert total == defaults["max_steps"] // defaults["log_every"]  # every progress point arrived
            wait_for(lambda: chart_points(page) == total, 30, "every point drawn")
            assert progress_width(page) == pytest.approx(100, abs=0.5)
            assert "eval_exact_match" in page.inner_text(".pg-metrics")
            page.screenshot(path=str(shots / "04-trained.png"), full_page=True)

            # 5. serve both models, ask held-out prompts, see them side by side
            page.click(".pg-serve")
            page.wait_for_selector(".pg-send:not([disabled])", timeout=400_000)
            correct = None
            for i, (prompt, answer) in enumerate(held_out_prompts(3), start=1):
                page.fill(".pg-prompt input", prompt)
                page.click(".pg-send")
                done = f".pg-answer-{{side}} .pg-turn:nth-child({i}) .pg-a[data-done='true']"
                # attached, not visible: an untrained model may answer with nothing at all
                page.wait_for_selector(done.format(side="fine-tuned"), timeout=120_000, state="attached")
                page.wait_for_selector(done.format(side="base"), timeout=120_000, state="attached")
                fine = page.text_content(done.format(side="fine-tuned")).strip()
                base = page.text_content(done.format(side="base")).strip()
                assert base != answer, "the untrained base model should not know the task"
                if fine == answer:
                    correct = (prompt, fine, base)
                    break
            page.screenshot(path=str(shots / "05-chat.png"), full_page=True)
            assert correct is not None, "the fine-tuned model answered none of 3 held-out prompts correctly"
            assert "Culling kernels with idle durations" in voila_log.read_text()  # idle visitors' kernels go
        finally:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(shots / "99-last.png"), full_page=True)
            browser.close()
