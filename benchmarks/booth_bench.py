"""Booth benchmark: N visitors arriving over a minute at `playground app --booth` on this machine.

    python benchmarks/booth_bench.py [--visitors 50] [--arrival-seconds 60] [--max-kernels 16]

Real Voila in booth mode on a free localhost port with a fresh PLAYGROUND_HOME. Each visitor is an
HTTP + websocket client as real as a page load needs: its own cookie jar, GET / (the redirect that
sets the signed visitor cookie, then the page, which starts the visitor's kernel and runs the app
notebook in it), then the kernel websocket a browser opens (``kernel_info_request`` answered), kept
open for the visit (``--stay`` seconds), then closed. A visitor refused with the "booth is full" page
waits ``--retry-after`` seconds (the page refreshes itself every 30 s) and tries again, up to
``--retries`` times.

Reported: visitors admitted / refused / errors (anything but a page or the friendly 503, a failed
websocket or an unanswered kernel), page-load latency, peak live kernels, and the app's memory:
the Voila server plus all its kernels (RSS summed over the process tree, sampled every 0.5 s).
Goal (issue 13): 0 errors and ≤ 4 GB for 50 visitors in a minute on a 2-core / 24 GB box.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

REPO = Path(__file__).resolve().parents[1]
FULL_PAGE_MARK = "The booth is full"


@dataclass
class Visitor:
    index: int
    attempts: int = 0
    outcome: str = "pending"  # admitted | refused | error
    error: str = ""
    load_seconds: list[float] = field(default_factory=list)  # every page load
    admitted_load: float | None = None  # the load that got a seat (kernel started, notebook run)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tree_rss(pid: int) -> tuple[int, int]:
    """(RSS bytes of the process and all its descendants, number of kernel processes)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    total, kernels = 0, 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
            if "ipykernel" in " ".join(proc.cmdline()):
                kernels += 1
    return total, kernels


def _message(msg_type: str, session: str) -> str:
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": msg_type,
        "username": "",
        "session": session,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "version": "5.3",
    }
    return json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": {}, "channel": "shell"})


async def visit(v: Visitor, base: str, args: argparse.Namespace) -> None:
    async with httpx.AsyncClient(follow_redirects=True, timeout=args.page_timeout) as client:
        while v.attempts <= args.retries:
            v.attempts += 1
            start = time.monotonic()
            try:
                response = await client.get(base)
            except httpx.HTTPError as exc:
                v.outcome, v.error = "error", f"GET: {type(exc).__name__}: {exc}"
                return
            v.load_seconds.append(time.monotonic() - start)
            if response.status_code == 503 and FULL_PAGE_MARK in response.text:
                v.outcome = "refused"
                await asyncio.sleep(args.retry_after)
                continue
            if response.status_code != 200:
                v.outcome, v.error = "error", f"GET: HTTP {response.status_code}"
                return
            v.admitted_load = v.load_seconds[-1]
            match = re.search(r'"kernelId":\s*"([0-9a-f-]{36})"', response.text)
            if not match:
                v.outcome, v.error = "error", "page without a kernel id"
                return
            await stay(v, base, match.group(1), client.cookies, args)
            return


async def stay(v: Visitor, base: str, kernel_id: str, cookies: httpx.Cookies, args: argparse.Namespace) -> None:
    """Open the kernel websocket as the page does, check the kernel answers, keep it open, leave."""
    session = uuid.uuid4().hex
    url = base.replace("http://", "ws://") + f"api/kernels/{kernel_id}/channels?session_id={session}"
    cookie = "; ".join(f"{name}={value}" for name, value in cookies.items())
    try:
        ws = await websocket_connect(HTTPRequest(url, headers={"Cookie": cookie}, connect_timeout=30))
    except Exception as exc:
        v.outcome, v.error = "error", f"websocket: {type(exc).__name__}: {exc}"
        return
    try:
        ws.write_message(_message("kernel_info_request", session))
        deadline = time.monotonic() + 60
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                v.outcome, v.error = "error", "no kernel_info_reply within 60 s"
                return
            raw = await asyncio.wait_for(ws.read_message(), timeout=remaining)
            if raw is None:
                v.outcome, v.error = "error", "websocket closed by the server"
                return
            if isinstance(raw, str) and '"kernel_info_reply"' in raw:
                break
        v.outcome = "admitted"
        end = time.monotonic() + random.uniform(*args.stay)
        while time.monotonic() < end:  # read (and drop) what the kernel sends while the visitor looks
            with contextlib.suppress(asyncio.TimeoutError):
                if await asyncio.wait_for(ws.read_message(), timeout=max(0.1, end - time.monotonic())) is None:
                    break
    except Exception as exc:
        v.outcome, v.error = "error", f"websocket: {type(exc).__name__}: {exc}"
    finally:
        ws.close()


async def sample(pid: int, stop: asyncio.Event, peaks: dict[str, float]) -> None:
    while not stop.is_set():
        rss, kernels = tree_rss(pid)
        peaks["rss"] = max(peaks.get("rss", 0), rss)
        peaks["kernels"] = max(peaks.get("kernels", 0), kernels)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


async def run(args: argparse.Namespace, base: str, pid: int) -> tuple[list[Visitor], dict[str, float], float]:
    visitors = [Visitor(i) for i in range(args.visitors)]
    gap = args.arrival_seconds / max(1, args.visitors - 1)
    stop, peaks = asyncio.Event(), {}
    sampler = asyncio.create_task(sample(pid, stop, peaks))
    start = time.monotonic()
    tasks = []
    for v in visitors:
        tasks.append(asyncio.create_task(visit(v, base, args)))
        await asyncio.sleep(gap)
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    stop.set()
    await sampler
    return visitors, peaks, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--visitors", type=int, default=50)
    parser.add_argument("--arrival-seconds", type=float, default=60.0, help="arrivals spread evenly over this")
    parser.add_argument("--max-kernels", type=int, default=16, help="--booth-max-kernels for the app")
    parser.add_argument("--cull-seconds", type=int, default=60, help="--booth-cull-seconds for the app")
    parser.add_argument("--stay", type=float, nargs=2, default=(20.0, 60.0), help="visit length range, seconds")
    parser.add_argument("--retry-after", type=float, default=30.0, help="a refused visitor retries after this")
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--page-timeout", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    random.seed(args.seed)

    port = _free_port()
    home = tempfile.mkdtemp(prefix="booth-bench-home-")
    log_path = Path(home) / "voila.log"
    env = {**os.environ, "PLAYGROUND_HOME": home, "PYTHONPATH": str(REPO)}
    # every simulated visitor comes from 127.0.0.1: lift the per-address limit on new visitors
    env.update(PLAYGROUND_BOOTH_NEW_VISITORS_PER_MINUTE="100000", PLAYGROUND_BOOTH_NEW_VISITORS_BURST="100000")
    env.pop("PLAYGROUND_BOOTH_SECRET", None)
    command = [sys.executable, "-m", "playground.cli", "app", "--booth", "--port", str(port), "--no-browser",
               "--booth-max-kernels", str(args.max_kernels), "--booth-cull-seconds", str(args.cull_seconds),
               "--blueprint", "tiny-llama-cpu"]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.2)
        idle_rss, _ = tree_rss(proc.pid)
        load_before = os.getloadavg()[0]
        visitors, peaks, elapsed = asyncio.run(run(args, f"http://127.0.0.1:{port}/", proc.pid))
        load_after = os.getloadavg()[0]
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        if proc.poll() is None:
            proc.kill()

    outcomes = {k: sum(v.outcome == k for v in visitors) for k in ("admitted", "refused", "error")}
    first_try = sum(v.outcome == "admitted" and v.attempts == 1 for v in visitors)
    seated = sorted(v.admitted_load for v in visitors if v.admitted_load is not None)
    refused_loads = sorted(
        t for v in visitors for t in (v.load_seconds[:-1] if v.admitted_load is not None else v.load_seconds)
    )
    refusals = len(refused_loads)
    waits = sorted(sum(args.retry_after for _ in range(v.attempts - 1)) for v in visitors if v.outcome == "admitted")
    print(f"# booth benchmark: {args.visitors} visitors over {args.arrival_seconds:.0f} s, "
          f"--booth-max-kernels {args.max_kernels} --booth-cull-seconds {args.cull_seconds}, "
          f"visits {args.stay[0]:.0f}-{args.stay[1]:.0f} s, refused visitors retry every {args.retry_after:.0f} s "
          f"(up to {args.retries} times); {os.cpu_count()} CPUs, "
          f"load {load_before:.1f} -> {load_after:.1f}")  # fmt: skip
    print(f"visitors: admitted {outcomes['admitted']} ({first_try} at the first try), "
          f"still refused after {args.retries} retries {outcomes['refused']}, errors {outcomes['error']}; "
          f"'booth is full' pages served: {refusals}")  # fmt: skip
    if seated:
        p95 = seated[min(len(seated) - 1, int(0.95 * len(seated)))]
        print(f"page load with a seat (kernel start + the app notebook): median {statistics.median(seated):.1f} s, "
              f"p95 {p95:.1f} s, max {seated[-1]:.1f} s; wait for a seat: median {statistics.median(waits):.0f} s, "
              f"max {waits[-1]:.0f} s")  # fmt: skip
    if refused_loads:
        print(f"'booth is full' page: median {statistics.median(refused_loads) * 1000:.0f} ms")
    peak_gb = peaks.get("rss", 0) / 2**30
    print(f"memory (Voila server + kernels, RSS): idle {idle_rss / 2**20:.0f} MB, peak {peak_gb:.2f} GB "
          f"(goal <= 4 GB); peak live kernels {peaks.get('kernels', 0):.0f}; run {elapsed:.0f} s")  # fmt: skip
    for v in visitors:
        if v.outcome == "error":
            print(f"  visitor {v.index}: {v.error}")
    log_text = log_path.read_text(errors="replace")
    culled = log_text.count("no browser connected") + log_text.count("with 0 connections due to")
    print(f"kernels culled after their visitor left (during the run): {culled}; Voila log: {log_path}")


if __name__ == "__main__":
    main()
