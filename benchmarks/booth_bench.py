"""Booth benchmark: N visitors arriving over a minute at `playground app --booth` on this machine, some of them
scripted abusers.

    python benchmarks/booth_bench.py [--visitors 50] [--abusers 10] [--arrival-seconds 60] [--max-kernels 16]
                                     [--addresses forwarded|loopback] [--json PATH|-]

Real Voila in booth mode on a free localhost port with a fresh PLAYGROUND_HOME and the booth's default limits
(new visitor cookies: a burst of 30 then 20 a minute per client address; websocket frames up to 128 KiB; websocket
messages from browsers per kernel: a burst of 200 then 50 a second, a new connection taking 50).
Each real visitor is an HTTP + websocket client as real as a page load needs: its own cookie jar, GET / (the
redirect that sets the signed visitor cookie, then the page, which starts the visitor's kernel and runs the app
notebook in it), then the kernel websocket a browser opens (``kernel_info_request`` answered), kept open for
the visit (``--stay`` seconds), then closed. A visitor refused with the "booth is full" page waits
``--retry-after`` seconds (the page refreshes itself every 30 s) and tries again, up to ``--retries`` times.

``--abusers N`` of the ``--visitors`` are scripted clients instead (issue 20 item 4), each looping on one
behaviour (by index: 0 cookie flood, 1 oversized frames, 2 foreign kernels, 3 comm flood, 4 cookie flood, ...)
until the last real visitor has left:

- ``cookie_flood``: GET / as fast as it can, keeping no cookie (each request a new visitor), with a forged
  ``X-Forwarded-For`` entry of its own (random) in front: must get the 429 page once the address's burst is used;
- ``oversized_frames``: takes a seat, opens its kernel websocket, sends one frame over the cap (a
  ``kernel_info_request`` padded past 128 KiB: an answer would prove it passed); the server must close the
  connection (1009); reconnects, repeats;
- ``foreign_kernels``: with its own valid cookie, tries the kernel websocket, ``GET``/``DELETE
  /api/kernels/<id>`` and Voila's shutdown route of the real visitors' kernels (their ids, which this harness
  knows from its own visitors' pages), and the listing routes: must get 403 every time;
- ``comm_flood``: takes a seat and sends small ``comm_open``/``comm_msg`` messages on its kernel websocket as
  fast as the server takes them, never reading what comes back, and reconnects when the server closes the
  connection (1008: over the booth's message rate per kernel; a reconnect under a second's worth of messages left
  is refused with 429); its kernel's RSS is sampled (the kernel's guard drops what is over 50 a second or 20
  comms, logged once a second with a count). The 1008 closes are counted from the server's log (a line per
  kernel every 10 s at most, with a count): a flooder that reads nothing seldom sees the close frame itself.

Client addresses: the booth limits new visitor cookies per client address, so real visitors must not share the
abusers' address. ``--addresses forwarded`` (default): the app trusts 127.0.0.1 as a reverse proxy
(``--booth-trusted-proxy 127.0.0.1``); each real visitor sends ``X-Forwarded-For: 10.0.x.y`` (its own), and
all abusers act from one machine, ``198.51.100.1``, as that proxy would append it (``--abuser-addresses own``:
one address each). ``--addresses loopback``: no proxy; real visitors connect from 127.0.x.y, the abusers from
127.0.0.1, and the flood's forged header must be ignored.

Reported: real visitors admitted / refused (told to wait) / errors (anything but a page or the friendly 503,
a failed websocket or an unanswered kernel), page-load latency, peak live kernels; per abuse, refused (429,
403, connection closed) vs succeeded (a bound bypassed: reported as FAILED); memory: the Voila server, all its
kernels and any model servers under the fresh home (none start here: no visitor launches a job), RSS summed
and sampled every 0.5 s.
Goal (issue 13, issue 20 item 4): 0 errors for real visitors, every one seated or told their wait, no bound
bypassed, and <= 4 GB for 50 visitors in a minute on a 2-core / 24 GB box.
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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

REPO = Path(__file__).resolve().parents[1]
FULL_PAGE_MARK = "The booth is full"
COOKIE_NAME = "playground_visitor"  # voila_app.identity.COOKIE_NAME
KERNEL_ID = re.compile(r'"kernelId":\s*"([0-9a-f-]{36})"')
KERNEL_FILE = re.compile(r"kernel-([0-9a-f-]{36})\.json")
ABUSES = ("cookie_flood", "oversized_frames", "foreign_kernels", "comm_flood")
PROXY = "127.0.0.1"  # --addresses forwarded: the app trusts this peer's X-Forwarded-For
# A kernel is ~170 MB and 16 fit the 4 GB budget with ~1.2 GB to spare: 75 MB of growth per kernel is the share
# one kernel may take of that. A comm-flooded kernel growing more is reported as a bound that did not hold.
KERNEL_GROWTH_LIMIT_MB = 75
# The Voila server holds ~85 MB idle and ~100 MB with 16 visitors' pages (issue 13's run). Growing more than this
# while a comm flood runs (messages queued for a kernel slower than the flood) is reported as a bound not held.
SERVER_GROWTH_LIMIT_MB = 256


@dataclass
class Visitor:
    index: int
    address: str  # the client address the booth sees
    attempts: int = 0
    outcome: str = "pending"  # admitted | refused | error
    error: str = ""
    load_seconds: list[float] = field(default_factory=list)  # every page load
    admitted_load: float | None = None  # the load that got a seat (kernel started, notebook run)


@dataclass
class Abuser:
    index: int
    behaviour: str
    address: str  # the client address the booth sees (shared by all abusers unless --abuser-addresses own)
    cookie: str | None = None  # its own visitor cookie (all but the flood)
    kernel_id: str | None = None  # its own seat's kernel (oversized_frames, comm_flood)
    refused: Counter = field(default_factory=Counter)  # the bound held: 429, 403, connection closed
    succeeded: Counter = field(default_factory=Counter)  # a bound bypassed
    other: Counter = field(default_factory=Counter)  # neither (the booth full while it wanted a seat, a timeout)
    evidence: list[str] = field(default_factory=list)  # the first few bypasses, as seen
    sent: int = 0  # requests, frames or messages sent
    granted: int = 0  # new visitor cookies the flood got (within the bucket: allowed)
    started: float = 0.0
    flood_started: float | None = None  # comm_flood: when its first message went out
    kernel_rss_at_start: int | None = None  # comm_flood: its kernel's RSS then (the app notebook run)


@dataclass
class Shared:
    base: str
    args: argparse.Namespace
    stop: asyncio.Event
    app_pid: int
    known_kernels: list[str] = field(default_factory=list)  # real visitors' kernels, as their pages named them
    grants: dict[str, list[float]] = field(default_factory=dict)  # client address -> when cookies were granted


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rss(proc: psutil.Process) -> int:
    try:
        return proc.memory_info().rss
    except psutil.Error:
        return 0


def tree_rss(pid: int) -> tuple[int, int]:
    """(RSS bytes of the process and all its descendants, number of kernel processes)."""
    total, kernels = 0, 0
    for proc in _tree(pid):
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
            kernels += is_kernel(proc)
    return total, kernels


def is_kernel(proc: psutil.Process) -> bool:
    """An ipykernel process, not one's child caught between fork and exec (it has the kernel's command line:
    ipykernel runs ``uname -p`` as it starts)."""
    try:
        parent = proc.parent()
        return "ipykernel" in " ".join(proc.cmdline()) and not (parent and "ipykernel" in " ".join(parent.cmdline()))
    except psutil.Error:
        return False


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def server_pids(home: Path) -> list[int]:
    """Model servers the booth started under ``home`` (``playground servers``' records)."""
    pids = []
    for path in (home / "servers").glob("*.json"):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            pids.append(int(json.loads(path.read_text())["pid"]))
    return pids


def _message(msg_type: str, session: str, content: dict | None = None, msg_id: str | None = None) -> str:
    header = {
        "msg_id": msg_id or uuid.uuid4().hex,
        "msg_type": msg_type,
        "username": "",
        "session": session,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "version": "5.3",
    }
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content or {}, "channel": "shell"}
    return json.dumps(message)


def _http_client(address: str, args: argparse.Namespace, **kwargs) -> httpx.AsyncClient:
    """An HTTP client the booth sees as coming from ``address`` (forwarded by the trusted proxy, or its socket)."""
    if args.addresses == "forwarded":
        kwargs["headers"] = {"X-Forwarded-For": address, **kwargs.get("headers", {})}
    else:
        kwargs["transport"] = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(timeout=args.page_timeout, **kwargs)


def _cookie_header(cookies: dict[str, str]) -> dict[str, str]:
    return {"Cookie": "; ".join(f"{name}={value}" for name, value in cookies.items())}


async def _ws_connect(base: str, kernel_id: str, cookie: str | None) -> tuple[WebSocketClientConnection, str]:
    session = uuid.uuid4().hex
    url = base.replace("http://", "ws://") + f"api/kernels/{kernel_id}/channels?session_id={session}"
    headers = _cookie_header({COOKIE_NAME: cookie}) if cookie else {}
    request = HTTPRequest(url, headers=headers, connect_timeout=30, request_timeout=60)
    return await websocket_connect(request), session


# -- real visitors ----------------------------------------------------------------------------------------------


async def visit(v: Visitor, sh: Shared) -> None:
    args = sh.args
    async with _http_client(v.address, args, follow_redirects=True) as client:
        while v.attempts <= args.retries:
            v.attempts += 1
            start = time.monotonic()
            try:
                response = await client.get(sh.base)
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
            match = KERNEL_ID.search(response.text)
            if not match:
                v.outcome, v.error = "error", "page without a kernel id"
                return
            sh.known_kernels.append(match.group(1))
            await stay(v, sh.base, match.group(1), dict(client.cookies.items()), args)
            return


async def stay(v: Visitor, base: str, kernel_id: str, cookies: dict[str, str], args: argparse.Namespace) -> None:
    """Open the kernel websocket as the page does, check the kernel answers, keep it open, leave."""
    session = uuid.uuid4().hex
    url = base.replace("http://", "ws://") + f"api/kernels/{kernel_id}/channels?session_id={session}"
    try:
        ws = await websocket_connect(HTTPRequest(url, headers=_cookie_header(cookies), connect_timeout=30))
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


# -- abusers ----------------------------------------------------------------------------------------------------


def _bypass(a: Abuser, what: str, detail: str) -> None:
    a.succeeded[what] += 1
    if len(a.evidence) < 5:
        a.evidence.append(f"{what}: {detail}"[:300])


def _count(a: Abuser, label: str, status: int) -> None:
    """A response to something the booth must refuse with 403."""
    if status == 403:
        a.refused[f"{label}: 403"] += 1
    elif 200 <= status < 300 or status == 101:
        _bypass(a, f"{label}: {status}", "another visitor's kernel reached")
    else:
        a.other[f"{label}: {status}"] += 1


async def _pause(sh: Shared, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(sh.stop.wait(), timeout=seconds)


def _grant(sh: Shared, address: str) -> None:
    sh.grants.setdefault(address, []).append(time.monotonic())


async def own_cookie(a: Abuser, sh: Shared) -> bool:
    """A new visitor cookie for the abuser itself (the redirect's; no page, no kernel)."""
    while a.cookie is None and not sh.stop.is_set():
        try:
            async with _http_client(a.address, sh.args) as client:
                response = await client.get(sh.base)
        except httpx.HTTPError as exc:
            a.other[f"own cookie: {type(exc).__name__}"] += 1
            await _pause(sh, 1)
            continue
        if response.status_code == 302 and response.cookies.get(COOKIE_NAME):
            a.cookie = response.cookies[COOKIE_NAME]
            _grant(sh, a.address)
        else:  # its own address's bucket is empty (the flood): wait as the 429 says
            a.other[f"own cookie: HTTP {response.status_code}"] += 1
            await _pause(sh, float(response.headers.get("retry-after", 5)))
    return a.cookie is not None


async def take_seat(a: Abuser, sh: Shared) -> bool:
    """Load the page with its own cookie until it has a kernel (a seat, as a real visitor's)."""
    a.kernel_id = None
    while a.kernel_id is None and await own_cookie(a, sh):
        try:
            async with _http_client(a.address, sh.args, follow_redirects=True) as client:
                response = await client.get(sh.base, headers=_cookie_header({COOKIE_NAME: a.cookie}))
        except httpx.HTTPError as exc:
            a.other[f"seat: {type(exc).__name__}"] += 1
            await _pause(sh, 5)
            continue
        match = KERNEL_ID.search(response.text) if response.status_code == 200 else None
        if match:
            a.kernel_id = match.group(1)
        elif response.status_code == 503 and FULL_PAGE_MARK in response.text:
            a.other["seat: booth full"] += 1
            await _pause(sh, 10)
        else:
            a.other[f"seat: HTTP {response.status_code}"] += 1
            await _pause(sh, 5)
    return a.kernel_id is not None


def _forged() -> str:
    return f"203.0.113.{random.randint(1, 254)}"


async def cookie_flood(a: Abuser, sh: Shared) -> None:
    """New visitors as fast as the server answers, keeping no cookie; a forged address in front of its own."""
    async with _http_client(a.address, sh.args) as client:
        while not sh.stop.is_set():
            client.cookies.clear()
            forwarded = f"{_forged()}, {a.address}" if sh.args.addresses == "forwarded" else _forged()
            a.sent += 1
            try:
                response = await client.get(sh.base, headers={"X-Forwarded-For": forwarded})
            except httpx.HTTPError as exc:
                a.other[type(exc).__name__] += 1
                await _pause(sh, 0.1)
                continue
            if response.status_code == 429:
                a.refused["429"] += 1
            elif response.status_code == 302 and response.cookies.get(COOKIE_NAME):
                a.granted += 1  # within the address's bucket: allowed; checked against the bucket after the run
                _grant(sh, a.address)
            else:
                a.other[f"HTTP {response.status_code}"] += 1
            if sh.args.abuser_pause:
                await _pause(sh, sh.args.abuser_pause)


async def _own_kernel_socket(a: Abuser, sh: Shared) -> tuple[WebSocketClientConnection, str] | None:
    """The websocket of the abuser's own kernel and its session; None after a refused or failed connect (counted,
    then a pause). A 403 means its kernel is gone: the next turn takes a new seat."""
    try:
        return await _ws_connect(sh.base, a.kernel_id, a.cookie)
    except HTTPClientError as exc:
        if exc.code == 429:  # its kernel's message rate (or its connections): the bound held
            a.refused["connect: 429"] += 1
        else:
            a.other[f"connect: HTTP {exc.code}"] += 1
        a.kernel_id = None if exc.code == 403 else a.kernel_id
    except Exception as exc:
        a.other[f"connect: {type(exc).__name__}"] += 1
    await _pause(sh, 1)
    return None


async def oversized_frames(a: Abuser, sh: Shared) -> None:
    """Over and over: connect to its own kernel, send one frame over the cap, see the server close."""
    pad = "x" * (sh.args.websocket_max_bytes + 4096)
    while not sh.stop.is_set() and (a.kernel_id or await take_seat(a, sh)):
        connected = await _own_kernel_socket(a, sh)
        if connected is None:
            continue
        ws, session = connected
        msg_id = uuid.uuid4().hex
        try:
            a.sent += 1
            ws.write_message(_message("kernel_info_request", session, {"pad": pad}, msg_id))
            deadline = time.monotonic() + 30
            while True:
                raw = await asyncio.wait_for(ws.read_message(), timeout=max(0.1, deadline - time.monotonic()))
                if raw is None:
                    a.refused[f"closed {ws.close_code}"] += 1
                    break
                if isinstance(raw, str) and msg_id in raw and '"kernel_info_reply"' in raw:
                    _bypass(a, "kernel answered a frame over the cap", f"{len(pad)} bytes of padding")
                    break
        except TimeoutError:
            _bypass(a, "connection still open 30 s after a frame over the cap", f"{len(pad)} bytes")
        except Exception as exc:  # the write itself refused (closed under it): the bound held
            a.refused[f"closed ({type(exc).__name__})"] += 1
        finally:
            ws.close()
        if sh.args.abuser_pause:
            await _pause(sh, sh.args.abuser_pause)


async def foreign_kernels(a: Abuser, sh: Shared) -> None:
    """With its own valid cookie: the listing routes and every route of the real visitors' kernels."""
    if not await own_cookie(a, sh):
        return
    mine = _cookie_header({COOKIE_NAME: a.cookie, "_xsrf": "t"})
    turn = 0
    async with _http_client(a.address, sh.args, headers=mine) as client:
        while not sh.stop.is_set():
            try:
                for path in ("api/kernels", "api/sessions"):  # learn ids: no route lists kernels
                    a.sent += 1
                    _count(a, f"GET /{path}", (await client.get(sh.base + path)).status_code)
                if not sh.known_kernels:
                    await _pause(sh, 0.5)
                    continue
                kernel = sh.known_kernels[turn % len(sh.known_kernels)]
                turn += 1
                a.sent += 4
                _count(a, "GET /api/kernels/<id>", (await client.get(f"{sh.base}api/kernels/{kernel}")).status_code)
                status = (await client.delete(f"{sh.base}api/kernels/{kernel}")).status_code
                _count(a, "DELETE /api/kernels/<id>", status)
                shutdown = await client.post(f"{sh.base}voila/api/shutdown/{kernel}", data={"_xsrf": "t"})
                _count(a, "POST /voila/api/shutdown/<id>", shutdown.status_code)
            except httpx.HTTPError as exc:
                a.other[type(exc).__name__] += 1
                await _pause(sh, 0.5)
                continue
            try:
                ws, _ = await _ws_connect(sh.base, kernel, a.cookie)
            except HTTPClientError as exc:
                _count(a, "kernel websocket", exc.code)
            except Exception as exc:
                a.other[f"kernel websocket: {type(exc).__name__}"] += 1
            else:
                _count(a, "kernel websocket", 101)
                ws.close()
            if sh.args.abuser_pause:
                await _pause(sh, sh.args.abuser_pause)


async def comm_flood(a: Abuser, sh: Shared) -> None:
    """Small comm_open / comm_msg messages on its own kernel websocket as fast as they go out, nothing read."""
    while not sh.stop.is_set() and (a.kernel_id or await take_seat(a, sh)):
        connected = await _own_kernel_socket(a, sh)
        if connected is None:
            continue
        ws, session = connected
        if a.flood_started is None:
            a.flood_started, a.kernel_rss_at_start = time.monotonic(), kernel_rss(sh.app_pid, a.kernel_id)
        comms: list[str] = []
        drain = asyncio.create_task(_drain(ws)) if sh.args.comm_flood_reads else None
        try:
            while not sh.stop.is_set():
                if not comms or a.sent % 2 == 0:
                    comms = [*comms[-50:], uuid.uuid4().hex]
                    content = {"comm_id": comms[-1], "target_name": "jupyter.widget", "data": {"state": {}}}
                    message = _message("comm_open", session, content)
                else:
                    state = {"value": "x" * 200}
                    content = {"comm_id": random.choice(comms), "data": {"method": "update", "state": state}}
                    message = _message("comm_msg", session, content)
                await ws.write_message(message)  # waits while the server does not read
                a.sent += 1
                if a.sent % 50 == 0:
                    await asyncio.sleep(sh.args.abuser_pause)  # let the other clients of this process run
        except Exception as exc:
            # the server's rate limit on messages per kernel closes it with 1008 (policy violation); the close frame
            # waits behind the replies nobody read, and is lost when the server gives up waiting (5 s) first
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_drain(ws), 1)
            a.refused[f"connection closed ({ws.close_code or type(exc).__name__})"] += 1
        finally:
            ws.close()
            if drain:
                drain.cancel()


async def _drain(ws: WebSocketClientConnection) -> None:
    while await ws.read_message() is not None:
        pass


def kernel_rss(app_pid: int, kernel_id: str) -> int | None:
    for proc in _tree(app_pid):
        with contextlib.suppress(psutil.Error):
            if f"kernel-{kernel_id}.json" in " ".join(proc.cmdline()):
                return proc.memory_info().rss
    return None


ABUSE = {"cookie_flood": cookie_flood, "oversized_frames": oversized_frames}
ABUSE.update(foreign_kernels=foreign_kernels, comm_flood=comm_flood)


async def abuse(a: Abuser, sh: Shared) -> None:
    a.started = time.monotonic()
    if a.behaviour == "cookie_flood":  # the others from its machine get their own cookies first
        await _pause(sh, sh.args.flood_delay)
    try:
        await ABUSE[a.behaviour](a, sh)
    except Exception as exc:  # a bug in the harness, not a bypass: shown as such
        a.other[f"abuser stopped: {type(exc).__name__}: {exc}"[:200]] += 1


# -- the run ----------------------------------------------------------------------------------------------------


async def sample(pid: int, home: Path, stop: asyncio.Event, peaks: dict, sh: Shared) -> None:
    """Peak RSS: the app's process tree plus model servers; per kernel (by kernel id); the Voila server alone, also
    every 5 s. Over ``--memory-abort-gb`` the abusers stop (the machine is shared), and the report says when."""
    kernel_peak: dict[str, int] = peaks.setdefault("kernel_peak", {})
    series: list[tuple[float, float, float]] = peaks.setdefault("series", [])  # (s, all GB, Voila server MB)
    start = time.monotonic()
    while not stop.is_set():
        procs = {p.pid: p for p in _tree(pid)}
        servers = server_pids(home)
        for server in servers:
            procs.update({p.pid: p for p in _tree(server)})
        total, kernels = 0, 0
        for proc in procs.values():
            rss = _rss(proc)
            total += rss
            with contextlib.suppress(psutil.Error):
                match = KERNEL_FILE.search(" ".join(proc.cmdline()))
                if match and is_kernel(proc):
                    kernels += 1
                    kernel_peak[match.group(1)] = max(kernel_peak.get(match.group(1), 0), rss)
        peaks["rss"] = max(peaks.get("rss", 0), total)
        peaks["kernels"] = max(peaks.get("kernels", 0), kernels)
        voila = _rss(psutil.Process(pid)) if psutil.pid_exists(pid) else 0
        peaks["voila"] = max(peaks.get("voila", 0), voila)
        peaks["servers"] = max(peaks.get("servers", 0), len(servers))
        at = time.monotonic() - start
        if not series or at - series[-1][0] >= 5:
            series.append((round(at, 1), round(total / 2**30, 3), round(voila / 2**20, 1)))
        if total > sh.args.memory_abort_gb * 2**30 and not sh.stop.is_set():
            peaks["abusers_stopped_at_s"] = round(at, 1)
            sh.stop.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


def _address(index: int, args: argparse.Namespace, *, abuser: bool) -> str:
    if abuser:
        own = args.abuser_addresses == "own"
        if args.addresses == "forwarded":
            return f"198.51.100.{index + 1}" if own else "198.51.100.1"
        return f"127.66.0.{index + 1}" if own else "127.0.0.1"
    prefix = "10.0" if args.addresses == "forwarded" else "127.0"
    return f"{prefix}.{1 + index // 250}.{index % 250 + 1}"


async def run(args: argparse.Namespace, base: str, pid: int, home: Path) -> tuple[list, list, dict, float]:
    real = args.visitors - args.abusers
    visitors = [Visitor(i, _address(i, args, abuser=False)) for i in range(real)]
    kinds = args.behaviours
    abusers = [Abuser(i, kinds[i % len(kinds)], _address(i, args, abuser=True)) for i in range(args.abusers)]
    sh = Shared(base, args, asyncio.Event(), pid)
    gap = args.arrival_seconds / max(1, real - 1)
    stop_sampler, peaks = asyncio.Event(), {}
    sampler = asyncio.create_task(sample(pid, home, stop_sampler, peaks, sh))
    start = time.monotonic()
    abuse_tasks = [asyncio.create_task(abuse(a, sh)) for a in abusers]
    if args.abuse_seconds:
        asyncio.get_running_loop().call_later(args.abuse_seconds, sh.stop.set)
    tasks = []
    for v in visitors:
        tasks.append(asyncio.create_task(visit(v, sh)))
        await asyncio.sleep(gap)
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    sh.stop.set()
    _, pending = await asyncio.wait(abuse_tasks, timeout=40) if abuse_tasks else (None, [])
    for task in pending:
        task.cancel()
    stop_sampler.set()
    await sampler
    peaks["grants"] = sh.grants
    peaks["real_kernels"] = list(sh.known_kernels)
    return visitors, abusers, peaks, elapsed


def bucket_check(grants: dict[str, list[float]], args: argparse.Namespace) -> dict[str, dict]:
    """New visitor cookies granted per abuser address against what its bucket allows (burst + refill)."""
    checked = {}
    for address, times in grants.items():
        span = max(times) - min(times)
        allowed = args.new_visitors_burst + args.new_visitors_per_minute * span / 60 + 1  # +1: a refill in flight
        checked[address] = {"granted": len(times), "allowed_at_most": int(allowed), "held": len(times) <= allowed}
    return checked


def guard_drops(text: str, why: str) -> int:
    """Messages the kernels' guard dropped for a reason (``why``: a regex of the line's end), counted from its
    lines: one per message ("dropped a widget message: ...") or, throttled, one a second with a count."""
    pattern = rf"dropped (?:a widget message|(\d+) widget messages in [\d.]+ s): {why}"
    return sum(int(count or 1) for count in re.findall(pattern, text))


def websocket_closes(text: str) -> int:
    """Websockets the server closed over the message rate (1008), from its lines: "a websocket over the message
    rate" or, throttled to one a kernel every 10 s, "N websockets in S s over ..." (the last 10 s not counted)."""
    pattern = r"(?:a websocket|(\d+) websockets in \d+ s) over the message rate [^\n]*; closed \(1008\)"
    return sum(int(count or 1) for count in re.findall(pattern, text))


def rate_limit_refusals(text: str) -> int:
    """Pages refused over the new-visitor rate, from the gate's lines (one per address every 10 s, with a count)."""
    return sum(int(n) for n in re.findall(r"over the rate limit: HTTP 429 to (\d+) request", text))


def log_counts(text: str) -> dict[str, int]:
    return {
        "429 warnings": rate_limit_refusals(text),
        "429 warning lines": text.count("over the rate limit: HTTP 429"),
        "comm guard: over the rate": guard_drops(text, "more than"),
        "comm guard: too many comms": guard_drops(text, r"the browser opened \d+ comms already"),
        "comm guard: too big": guard_drops(text, r"\d+ bytes"),
        "comm guard: log lines": text.count("[playground.guard] dropped"),
        "websocket closed over the message rate": websocket_closes(text),
        "websocket close lines": text.count("; closed (1008)"),
        "booth full warnings": text.count("Booth full:"),
        "tracebacks": text.count("Traceback"),
    }


def report(args, visitors, abusers, peaks, elapsed, idle_rss, loads, log_path) -> dict:
    outcomes = {k: sum(v.outcome == k for v in visitors) for k in ("admitted", "refused", "error")}
    seated = sorted(v.admitted_load for v in visitors if v.admitted_load is not None)
    full_loads = sorted(
        t for v in visitors for t in (v.load_seconds[:-1] if v.admitted_load is not None else v.load_seconds)
    )
    waits = sorted(args.retry_after * (v.attempts - 1) for v in visitors if v.outcome == "admitted")
    log_text = log_path.read_text(errors="replace")
    logged = log_counts(log_text)
    buckets = bucket_check(peaks.get("grants", {}), args)
    kernel_peak = peaks.get("kernel_peak", {})
    real_kernels = [kernel_peak[k] for k in peaks.get("real_kernels", []) if k in kernel_peak]

    def p95(values: list[float]) -> float:
        return values[min(len(values) - 1, int(0.95 * len(values)))]

    by_behaviour: dict[str, dict] = {}
    for behaviour in ABUSES:
        group = [a for a in abusers if a.behaviour == behaviour]
        if not group:
            continue
        entry = {
            "abusers": len(group),
            "sent": sum(a.sent for a in group),
            "refused": dict(sum((a.refused for a in group), Counter())),
            "succeeded": dict(sum((a.succeeded for a in group), Counter())),
            "other": dict(sum((a.other for a in group), Counter())),
            "evidence": [e for a in group for e in a.evidence],
        }
        if behaviour == "cookie_flood":
            entry["cookies_granted"] = sum(a.granted for a in group)
            entry["buckets"] = buckets
            if not all(b["held"] for b in buckets.values()):
                entry["succeeded"]["cookies beyond the address's bucket"] = sum(
                    b["granted"] - b["allowed_at_most"] for b in buckets.values() if not b["held"]
                )
        if behaviour == "comm_flood":
            kernels = {}
            for a in group:
                if a.kernel_id in kernel_peak and a.kernel_rss_at_start:
                    first, peak = a.kernel_rss_at_start, kernel_peak[a.kernel_id]
                    kernels[a.kernel_id[:8]] = {"at_flood_start_mb": first / 2**20, "peak_mb": peak / 2**20}
                    if (peak - first) / 2**20 > KERNEL_GROWTH_LIMIT_MB:
                        entry["succeeded"][f"kernel grew over {KERNEL_GROWTH_LIMIT_MB} MB"] = 1
            grew = (peaks.get("voila", 0) - idle_rss) / 2**20
            if grew > SERVER_GROWTH_LIMIT_MB:
                _bypass(
                    group[0],
                    "Voila server grew while flooded",
                    f"{grew:.0f} MB over its idle {idle_rss / 2**20:.0f} MB",
                )
                entry["succeeded"][f"Voila server grew over {SERVER_GROWTH_LIMIT_MB} MB"] = 1
                entry["evidence"] = [e for a in group for e in a.evidence]
            flood_seconds = [time.monotonic() - a.flood_started for a in group if a.flood_started]
            entry.update(kernels=kernels, guard_drops_logged=logged["comm guard: over the rate"])
            entry["closed_1008_server_log"] = logged["websocket closed over the message rate"]
            entry["closed_1008_seen_by_flooders"] = entry["refused"].get("connection closed (1008)", 0)
            entry["connects_refused_429"] = entry["refused"].get("connect: 429", 0)
            entry["guard_allows_at_most"] = sum(500 + 50 * s for s in flood_seconds)  # burst + 50/s, per kernel
        by_behaviour[behaviour] = entry
    bypasses = sum(sum(e["succeeded"].values()) for e in by_behaviour.values())
    peak_gb = peaks.get("rss", 0) / 2**30
    result = {
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items() if k not in ("json",)},
        "cpus": os.cpu_count(),
        "load": {"before": loads[0], "after": loads[1]},
        "run_seconds": elapsed,
        "real_visitors": {
            "count": len(visitors),
            **outcomes,
            "admitted_first_try": sum(v.outcome == "admitted" and v.attempts == 1 for v in visitors),
            "full_pages_served": len(full_loads),
            "page_load_seated_s": {"median": statistics.median(seated), "p95": p95(seated), "max": seated[-1]}
            if seated
            else None,
            "full_page_ms_median": statistics.median(full_loads) * 1000 if full_loads else None,
            "wait_for_seat_s": {"median": statistics.median(waits), "max": waits[-1]} if waits else None,
            "errors_detail": [f"visitor {v.index} ({v.address}): {v.error}" for v in visitors if v.outcome == "error"],
        },
        "abusers": by_behaviour,
        "memory": {
            "idle_mb": idle_rss / 2**20,
            "peak_gb": peak_gb,
            "voila_server_peak_mb": peaks.get("voila", 0) / 2**20,
            "peak_live_kernels": peaks.get("kernels", 0),
            "real_kernel_peak_mb_median": statistics.median(real_kernels) / 2**20 if real_kernels else None,
            "real_kernel_peak_mb_max": max(real_kernels) / 2**20 if real_kernels else None,
            "model_servers_seen": peaks.get("servers", 0),
            "abusers_stopped_over_memory_at_s": peaks.get("abusers_stopped_at_s"),
            "every_5s_seconds_gb_voila_mb": peaks.get("series", []),
        },
        "voila_log": {"path": str(log_path), "bytes": len(log_text.encode()), **logged},
        "bars": {
            "real_visitors_0_errors": outcomes["error"] == 0,
            "every_real_visitor_seated_or_told_to_wait": outcomes["admitted"] + outcomes["refused"] == len(visitors),
            "no_bound_bypassed": bypasses == 0 and peaks.get("abusers_stopped_at_s") is None,
            "peak_memory_le_4gb": peak_gb <= 4.0,
        },
    }
    return result


def print_report(r: dict) -> None:
    s, rv, mem = r["settings"], r["real_visitors"], r["memory"]
    print(f"# booth benchmark: {s['visitors']} visitors ({rv['count']} real, {s['abusers']} abusers) over "
          f"{s['arrival_seconds']:.0f} s, --booth-max-kernels {s['max_kernels']} --booth-cull-seconds "
          f"{s['cull_seconds']}, visits {s['stay'][0]:.0f}-{s['stay'][1]:.0f} s, refused visitors retry every "
          f"{s['retry_after']:.0f} s (up to {s['retries']} times), addresses {s['addresses']}; {r['cpus']} CPUs, "
          f"load {r['load']['before']:.1f} -> {r['load']['after']:.1f}")  # fmt: skip
    print(f"real visitors: admitted {rv['admitted']} ({rv['admitted_first_try']} at the first try), "
          f"still refused after {s['retries']} retries {rv['refused']}, errors {rv['error']}; "
          f"'booth is full' pages served: {rv['full_pages_served']}")  # fmt: skip
    if rv["page_load_seated_s"]:
        load, wait = rv["page_load_seated_s"], rv["wait_for_seat_s"]
        print(f"page load with a seat (kernel start + the app notebook): median {load['median']:.1f} s, "
              f"p95 {load['p95']:.1f} s, max {load['max']:.1f} s; wait for a seat: median {wait['median']:.0f} s, "
              f"max {wait['max']:.0f} s")  # fmt: skip
    if rv["full_page_ms_median"] is not None:
        print(f"'booth is full' page: median {rv['full_page_ms_median']:.0f} ms")
    for line in rv["errors_detail"]:
        print(f"  {line}")
    if mem["abusers_stopped_over_memory_at_s"] is not None:
        print(f"MEMORY OVER --memory-abort-gb: the abusers were stopped at {mem['abusers_stopped_over_memory_at_s']} s")
    for behaviour, e in r["abusers"].items():
        refused, succeeded = sum(e["refused"].values()), sum(e["succeeded"].values())
        verdict = "held" if not succeeded else "FAILED: A BOUND WAS BYPASSED"
        print(f"abuse {behaviour} ({e['abusers']} abusers, {e['sent']} sent): refused {refused} "
              f"{dict(e['refused'])}, succeeded {succeeded} {dict(e['succeeded'])} -> {verdict}")  # fmt: skip
        if e["other"]:
            print(f"  neither: {dict(e['other'])}")
        if behaviour == "cookie_flood":
            print(f"  cookies granted within the bucket: {e['cookies_granted']}; per address: {e['buckets']}")
        if behaviour == "comm_flood":
            kernels = ", ".join(
                f"{k} {v['at_flood_start_mb']:.0f} -> {v['peak_mb']:.0f} MB" for k, v in e["kernels"].items()
            )
            print(f"  its kernels' RSS: {kernels or 'none seen'}; guard drops logged {e['guard_drops_logged']} "
                  f"(the guard lets at most ~{e['guard_allows_at_most']:.0f} through)")  # fmt: skip
            print(f"  websockets closed over the message rate (1008): {e['closed_1008_server_log']} (server log; "
                  f"{e['closed_1008_seen_by_flooders']} seen by the flooders), reconnects refused (429): "
                  f"{e['connects_refused_429']}")  # fmt: skip
        for line in e["evidence"]:
            print(f"  BYPASS: {line}")
    print(f"memory (Voila server + kernels + model servers, RSS): idle {mem['idle_mb']:.0f} MB, "
          f"peak {mem['peak_gb']:.2f} GB (goal <= 4 GB); Voila server peak {mem['voila_server_peak_mb']:.0f} MB; "
          f"peak live kernels {mem['peak_live_kernels']:.0f}; real visitors' kernels peak median "
          f"{mem['real_kernel_peak_mb_median'] or 0:.0f} MB, max {mem['real_kernel_peak_mb_max'] or 0:.0f} MB; "
          f"model servers seen: {mem['model_servers_seen']} (no visitor launches a job here); "
          f"run {r['run_seconds']:.0f} s")  # fmt: skip
    series = mem["every_5s_seconds_gb_voila_mb"]
    print(
        "memory every 5 s (s: all GB / Voila server MB): "
        + ", ".join(f"{t:.0f}: {g:.2f}/{m:.0f}" for t, g, m in series)
    )
    log = r["voila_log"]
    print(f"Voila log: {log['bytes'] / 2**20:.1f} MB, {log['429 warning lines']} rate-limit lines "
          f"({log['429 warnings']} refusals), "
          f"{log['websocket closed over the message rate']} websockets closed over the message rate (1008), "
          f"{log['comm guard: log lines']} guard lines, {log['tracebacks']} tracebacks; {log['path']}")  # fmt: skip
    print("bars: " + ", ".join(f"{k} {'met' if v else 'NOT MET'}" for k, v in r["bars"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--visitors", type=int, default=50, help="all clients, the abusers included")
    parser.add_argument("--abusers", type=int, default=10, help="how many of --visitors are scripted abusers")
    parser.add_argument("--arrival-seconds", type=float, default=60.0, help="real arrivals spread evenly over this")
    parser.add_argument("--max-kernels", type=int, default=16, help="--booth-max-kernels for the app")
    parser.add_argument("--cull-seconds", type=int, default=60, help="--booth-cull-seconds for the app")
    parser.add_argument("--stay", type=float, nargs=2, default=(20.0, 60.0), help="visit length range, seconds")
    parser.add_argument("--retry-after", type=float, default=30.0, help="a refused visitor retries after this")
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--page-timeout", type=float, default=180.0)
    parser.add_argument("--new-visitors-per-minute", type=float, default=20.0, help="the app's rate limit")
    parser.add_argument("--new-visitors-burst", type=int, default=30, help="the app's burst of new visitors")
    parser.add_argument("--websocket-max-bytes", type=int, default=128 * 1024, help="the app's frame cap")
    parser.add_argument("--websocket-messages-burst", type=int, default=200, help="the app's messages per kernel")
    parser.add_argument("--websocket-messages-per-second", type=float, default=50.0, help="... and their rate")
    parser.add_argument("--addresses", choices=("forwarded", "loopback"), default="forwarded",
                        help="how real visitors get their own client address (see above)")  # fmt: skip
    parser.add_argument("--abuser-addresses", choices=("shared", "own"), default="shared")
    parser.add_argument("--flood-delay", type=float, default=5.0,
                        help="the cookie flood starts this late (the other abusers get cookies first)")  # fmt: skip
    parser.add_argument("--abuse-seconds", type=float, default=0, help="stop the abusers earlier (0: at the end)")
    parser.add_argument("--abuser-pause", type=float, default=0.0, help="seconds between an abuser's actions")
    parser.add_argument("--behaviours", type=lambda text: text.split(","), default=list(ABUSES),
                        help=f"abusers' behaviours, given in turn by index (default {','.join(ABUSES)})")  # fmt: skip
    parser.add_argument("--comm-flood-reads", action="store_true", help="the comm flood reads what comes back")
    parser.add_argument("--memory-abort-gb", type=float, default=6.0,
                        help="the abusers stop when the app's memory passes this (a shared machine)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON ('-': stdout)")
    args = parser.parse_args()
    if not 0 <= args.abusers < args.visitors:
        parser.error("--abusers must be from 0 to --visitors - 1")
    if not args.behaviours or set(args.behaviours) - set(ABUSES):
        parser.error(f"--behaviours: a comma-separated list of {', '.join(ABUSES)}")
    random.seed(args.seed)

    port = _free_port()
    home = Path(tempfile.mkdtemp(prefix="booth-bench-home-"))
    log_path = home / "voila.log"
    env = {**os.environ, "PLAYGROUND_HOME": str(home), "PYTHONPATH": str(REPO)}
    for name in [n for n in env if n.startswith("PLAYGROUND_BOOTH_") or n.startswith("PLAYGROUND_WIDGET_")]:
        env.pop(name)  # the booth's defaults, and the flags below
    command = [sys.executable, "-m", "playground.cli", "app", "--booth", "--port", str(port), "--no-browser",
               "--booth-max-kernels", str(args.max_kernels), "--booth-cull-seconds", str(args.cull_seconds),
               "--booth-new-visitors-per-minute", f"{args.new_visitors_per_minute:g}",
               "--booth-new-visitors-burst", str(args.new_visitors_burst),
               "--booth-websocket-max-bytes", str(args.websocket_max_bytes),
               "--booth-websocket-messages-burst", str(args.websocket_messages_burst),
               "--booth-websocket-messages-per-second", f"{args.websocket_messages_per_second:g}",
               "--blueprint", "tiny-llama-cpu"]  # fmt: skip
    if args.addresses == "forwarded":
        command += ["--booth-trusted-proxy", PROXY]
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
        visitors, abusers, peaks, elapsed = asyncio.run(run(args, f"http://127.0.0.1:{port}/", proc.pid, home))
        load_after = os.getloadavg()[0]
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        if proc.poll() is None:
            proc.kill()
        for pid in server_pids(home):  # none expected: nothing here launches a job
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).terminate()

    result = report(args, visitors, abusers, peaks, elapsed, idle_rss, (load_before, load_after), log_path)
    print_report(result)
    if args.json:
        text = json.dumps(result, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
