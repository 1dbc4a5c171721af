"""Page-load benchmark of a booth: bytes a browser receives per page load, and time from navigation to Launch.

    python benchmarks/page_load.py [--loads 3] [--blueprint smollm2-135m-lora-kubectl]

`playground app --booth` on a free localhost port with a fresh PLAYGROUND_HOME; Debian's headless Chromium
(playwright) loads the page ``--loads`` times in one browser profile (its HTTP cache kept between loads, as a
visitor's browser keeps it; each load a new tab). Per load, from Chrome's own network events (CDP):

- **HTTP bytes**: bytes received over the network for every request (``encodedDataLength``; a file served from the
  browser's cache counts 0);
- **websocket bytes**: payload of every frame the page's kernel websocket received (widget state and updates);
- **seconds to Launch**: navigation → the Launch button visible; **seconds to cards**: → the blueprint cards visible.

Goals (issue 20 item 4, 2 idle cores): ≤ 1 MB per page load after the first visit; page → cards ≤ 3 s.
`--preheat N` sets the booth's warm kernels (default 1; 0: a kernel started per page load); `--pause S` waits between
loads (default 10 s: a visitor who comes after the warm kernel taken by the one before has been replaced).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
SECRET = "page-load-bench-" + "0123456789abcdef" * 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_app(home: Path, blueprint: str, preheat: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PLAYGROUND_HOME": str(home), "PLAYGROUND_BOOTH_SECRET": SECRET,
           "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}  # fmt: skip
    command = [sys.executable, "-m", "playground.cli", "app", "--booth", "--port", str(port), "--no-browser",
               "--blueprint", blueprint, "--booth-preheat", str(preheat)]  # fmt: skip
    proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"playground app exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return proc, f"http://127.0.0.1:{port}/"
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("playground app did not listen within 300 s")


def load_once(context, url: str) -> dict[str, float]:
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Network.enable")
    received = {"http": 0, "ws": 0}
    cdp.on("Network.loadingFinished", lambda e: received.__setitem__("http", received["http"] + e["encodedDataLength"]))
    cdp.on(
        "Network.webSocketFrameReceived",
        lambda e: received.__setitem__("ws", received["ws"] + len(e["response"]["payloadData"])),
    )
    started = time.monotonic()
    page.goto(url, timeout=300_000)
    page.locator(".pg-launch").first.wait_for(state="visible", timeout=300_000)
    to_launch = time.monotonic() - started
    page.locator(".pg-card").first.wait_for(state="visible", timeout=300_000)
    to_cards = time.monotonic() - started
    page.locator(".pg-chart .main-svg").first.wait_for(state="attached", timeout=300_000)  # plotly drew the chart
    to_chart = time.monotonic() - started
    page.wait_for_timeout(2000)  # late widget messages
    page.close()
    return {"seconds_to_launch": to_launch, "seconds_to_cards": to_cards, "seconds_to_chart": to_chart,
            "http_bytes": received["http"], "websocket_bytes": received["ws"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--blueprint", default="smollm2-135m-lora-kubectl")
    parser.add_argument("--preheat", type=int, default=1, help="the booth's warm kernels (--booth-preheat)")
    parser.add_argument("--pause", type=float, default=10, help="seconds between loads (and before the first)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_app(Path(tmp) / "home", args.blueprint, args.preheat)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch_persistent_context(
                    str(Path(tmp) / "profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                    viewport={"width": 1366, "height": 768},
                )  # fmt: skip
                loads = []
                for _ in range(args.loads):
                    time.sleep(args.pause)  # visitors come apart: the warm kernel taken is replaced meanwhile
                    loads.append(load_once(browser, url))
                browser.close()
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            if proc.poll() is None:
                proc.kill()
    for i, load in enumerate(loads, 1):
        received = f"{load['http_bytes'] / 1e6:.2f} MB over HTTP + {load['websocket_bytes'] / 1e6:.2f} MB websocket"
        times = f"Launch {load['seconds_to_launch']:.1f} s, cards {load['seconds_to_cards']:.1f} s"
        print(f"load {i}: {received}; {times}, chart {load['seconds_to_chart']:.1f} s")
    print(json.dumps(loads))


if __name__ == "__main__":
    main()
