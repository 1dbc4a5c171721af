"""App benchmark: first render time, RSS of one visitor's kernel, UI updates/s at 1000 lines/s.

    python benchmarks/app_bench.py [--seconds 5] [--no-browser]

1. ``playground app`` on a free localhost port; headless Chromium (Debian's /usr/bin/chromium)
   opens it: time from navigation to the gallery being visible (first render), and again after
   the kernel is warm (second visitor).
2. The RSS (and USS) of that visitor's kernel process (goal ≤ 200 MB; it never imports torch).
3. A child process prints trainer event lines at 1000 lines/s (a progress line and a log line
   alternately, the trainer's own line protocol); a JobMonitor follows the parsed stream: widget
   updates per second (goal ≤ 10) and progress points kept on the chart (goal: all).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from playground.backends.base import Backend  # noqa: E402
from playground.events import Event, JobPhase, parse_line  # noqa: E402
from playground.types import Endpoint, Job, TrainRequest  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]

EMITTER = r"""
import sys, time
from playground.events import Log, Phase, JobPhase, Progress, format_event_line
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
total = int(rate * seconds) // 2
print(format_event_line(Phase(JobPhase.TRAINING)), flush=True)
start = time.monotonic()
for i in range(total):
    print(format_event_line(Progress(step=i + 1, total_steps=total, loss=5.0 / (i + 1), tokens_per_second=2e4)))
    print(f"step {i + 1}: a plain log line from the trainer", flush=(i % 10 == 0))
    delay = start + 2 * (i + 1) / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)
print(format_event_line(Phase(JobPhase.SUCCEEDED)), flush=True)
"""


class LinesBackend(Backend):
    """Follows a child process's stdout through the trainer's line protocol (bench only)."""

    name = "lines"

    def __init__(self, rate: float, seconds: float) -> None:
        self.rate, self.seconds = rate, seconds
        self.job = Job(id="bench", blueprint_id="tiny-llama-cpu", backend="lines", phase=JobPhase.PENDING,
                       params={}, created_at=time.time())  # fmt: skip
        self.lines = 0
        self.first_line: float | None = None
        self.last_line: float | None = None

    def events(self, job_id: str, follow: bool = False, *, owner: str | None = None) -> Iterator[Event]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-c", EMITTER, str(self.rate), str(self.seconds)]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.lines += 1
                self.last_line = time.monotonic()
                if self.first_line is None:
                    self.first_line = self.last_line
                yield parse_line(line)
        self.job.phase = JobPhase.SUCCEEDED

    def get(self, job_id: str, *, owner: str | None = None) -> Job:
        return self.job

    def submit(self, request: TrainRequest) -> Job:
        raise NotImplementedError

    def list(self, *, owner: str | None = None) -> list[Job]:
        return [self.job]

    def cancel(self, job_id: str, *, owner: str | None = None) -> Job:
        return self.job

    def delete(self, job_id: str, *, owner: str | None = None) -> None: ...

    def serve(self, job_id: str, *, base: bool = False, owner: str | None = None) -> Endpoint:
        raise NotImplementedError

    def unserve(self, target: str, *, owner: str | None = None) -> None: ...

    def endpoints(self, *, owner: str | None = None) -> list[Endpoint]:
        return []


def bench_updates(rate: float, seconds: float) -> dict[str, float]:
    from widgets.monitor import JobMonitor

    backend = LinesBackend(rate, seconds)
    monitor = JobMonitor(backend, "bench")
    monitor.wait(seconds * 5 + 60)
    assert monitor.coalescer is not None and backend.first_line is not None and backend.last_line is not None
    elapsed = backend.last_line - backend.first_line  # the stream itself, not the emitter's start-up
    emitted = backend.lines
    points = len(monitor.chart.data[0].x)
    return {
        "lines": emitted,
        "lines_per_second": emitted / elapsed,
        "ui_updates": monitor.coalescer.renders,
        "ui_updates_per_second": (monitor.coalescer.renders - 1) / elapsed,  # less the final flush at the end
        "points_kept": points,
        "points_emitted": (emitted - 2) // 2,
        "seconds": elapsed,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kernels(root_pid: int) -> list:
    import psutil

    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    from booth_bench import is_kernel  # benchmarks/ is on sys.path when a benchmark runs

    return [p for p in children if is_kernel(p)]


def bench_render() -> dict[str, float]:
    import psutil
    from playwright.sync_api import sync_playwright

    port = _free_port()
    home = tempfile.mkdtemp(prefix="app-bench-home-")
    env = {**os.environ, "PLAYGROUND_HOME": home, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "playground.cli", "app", "--port", str(port), "--no-browser"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    out: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.2)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            for label in ("first_render_seconds", "second_render_seconds"):
                page = browser.new_page(viewport={"width": 1280, "height": 1200})
                start = time.monotonic()
                page.goto(f"http://127.0.0.1:{port}/", timeout=180_000)
                page.wait_for_selector(".pg-gallery", timeout=180_000)
                out[label] = time.monotonic() - start
                if label == "first_render_seconds":
                    page.click(".pg-select-tiny-llama-cpu")
                    page.wait_for_selector(".pg-launch", timeout=60_000)
                    time.sleep(1.0)
                    kernels = _kernels(proc.pid)
                    if kernels:
                        info = kernels[0].memory_full_info()
                        out["kernel_rss_mb"] = info.rss / 2**20
                        out["kernel_uss_mb"] = info.uss / 2**20
                        maps = Path(f"/proc/{kernels[0].pid}/maps").read_text()
                        out["kernel_maps_torch"] = float("libtorch" in maps)
                page.close()
            browser.close()
        out["voila_server_rss_mb"] = psutil.Process(proc.pid).memory_info().rss / 2**20
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        if proc.poll() is None:
            proc.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the 1000 lines/s stream")
    parser.add_argument("--rate", type=float, default=1000.0, help="lines per second")
    parser.add_argument("--no-browser", action="store_true", help="skip the Voila/Chromium part")
    args = parser.parse_args()
    print("# app benchmark (noisy on a shared 2-core machine)")
    updates = bench_updates(args.rate, args.seconds)
    print(
        f"updates: {updates['lines']} lines in {updates['seconds']:.2f}s = {updates['lines_per_second']:.0f} lines/s; "
        f"UI updates {updates['ui_updates']} (one is the final flush) = {updates['ui_updates_per_second']:.1f}/s "
        "(goal ≤ 10); "
        f"points kept {updates['points_kept']}/{updates['points_emitted']}"
    )
    if not args.no_browser and Path(CHROMIUM).exists():
        render = bench_render()
        print(
            f"render: first {render.get('first_render_seconds', float('nan')):.2f}s, "
            f"second visitor {render.get('second_render_seconds', float('nan')):.2f}s; "
            f"visitor kernel RSS {render.get('kernel_rss_mb', float('nan')):.0f} MB "
            f"(USS {render.get('kernel_uss_mb', float('nan')):.0f} MB, goal ≤ 200 MB, "
            f"libtorch mapped: {bool(render.get('kernel_maps_torch'))}); "
            f"Voila server RSS {render.get('voila_server_rss_mb', float('nan')):.0f} MB"
        )
    elif not args.no_browser:
        print("render: skipped (no /usr/bin/chromium)")


if __name__ == "__main__":
    main()
