"""The booth's Voila server bounds what a script can do: a real `playground app --booth` on localhost, driven
over HTTP (httpx, http.client for raw paths) and the kernel websocket (tornado's client).

One server for the module, with a small new-visitor burst and 127.0.0.2 as its trusted proxy. Each test
sends from its own loopback address (127.0.0.0/8 all reaches the server), so one test's rate-limit bucket
is not another's. Every bound is checked together with a real visitor still getting in.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import math
import os
import re
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from _fixtures import WARM_KERNEL_READY, stop_process, unused_port, wait_for_app
from _waiting import wait_for
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, websocket_connect
from websockets.sync.client import connect as sync_websocket

from voila_app.identity import COOKIE_NAME, sign

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
SECRET = "booth-server-test-secret-" + "0123456789abcdef" * 2
BURST = 4
PROXY = "127.0.0.2"  # the trusted proxy
WS_MAX = 64 * 1024


@dataclass
class Server:
    port: int
    log: Path
    pid: int  # the Voila server's (``playground app`` execs it)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def client(self, source: str, **kwargs) -> httpx.Client:
        """An HTTP client whose connections come from loopback address ``source``."""
        transport = httpx.HTTPTransport(local_address=source)
        return httpx.Client(base_url=self.url, transport=transport, timeout=240, **kwargs)


@dataclass
class Visitor:
    cookie: str  # the signed visitor cookie's value
    kernel_id: str
    page: str = ""  # the HTML of the page they loaded


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("booth-server")
    port = unused_port()
    env = {
        **os.environ,
        "PLAYGROUND_HOME": str(tmp / "home"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "PLAYGROUND_BOOTH_SECRET": SECRET,
        "PLAYGROUND_BOOTH_NEW_VISITORS_PER_MINUTE": "0.5",  # one token back every 2 minutes: no refill in a test
        "PLAYGROUND_BOOTH_TRUSTED_PROXIES": PROXY,  # the environment's settings, the flags' below
    }
    log_path = tmp / "voila.log"
    # --booth-cull-seconds 900: no culling here (visitor A's idle kernel outlives page loads on a busy machine)
    command = [sys.executable, "-m", "playground.cli", "app", "--booth", "--port", str(port), "--no-browser",
               "--booth-max-kernels", "4", "--booth-new-visitors-burst", str(BURST),
               "--booth-websocket-max-bytes", str(WS_MAX), "--blueprint", "tiny-llama-cpu",
               "--booth-cull-seconds", "900"]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_for_app(port, proc, warm_log=log_path)
        yield Server(port, log_path, proc.pid)
    finally:
        stop_process(proc)


def page_load(server: Server, source: str) -> Visitor:
    """A new visitor loads the page from ``source``: their cookie and the kernel it started (its id is in the page)."""
    with server.client(source, follow_redirects=True) as client:
        page = client.get("/")
        assert page.status_code == 200, page.text[:500]
        match = re.search(r'"kernelId":\s*"([0-9a-f-]{36})"', page.text)
        assert match, "no kernel id in the page"
        return Visitor(client.cookies[COOKIE_NAME].strip('"'), match.group(1), page.text)


@pytest.fixture(scope="module")
def visitor_a(server: Server) -> Visitor:
    """A visitor who loaded the page."""
    return page_load(server, "127.0.0.11")


@pytest.fixture(scope="module")
def visitor_f(server: Server) -> Visitor:
    """Another visitor who loaded the page, whose script then floods their kernel (its kernel is shut down last)."""
    return page_load(server, "127.0.0.17")


def new_cookie(server: Server, source: str = "127.0.0.11") -> str:
    """A new visitor's cookie (the first response sets it; no page, no kernel)."""
    with server.client(source) as client:
        first = client.get("/")
        assert first.status_code == 302, first.status_code
        return client.cookies[COOKIE_NAME].strip('"')


def cookies(value: str | None, **more: str) -> dict[str, str]:
    """Request headers carrying the visitor cookie ``value`` (none when None) and ``more`` cookies."""
    jar = {COOKIE_NAME: f'"{value}"'} if value else {}
    jar.update(more)
    return {"Cookie": "; ".join(f"{k}={v}" for k, v in jar.items())} if jar else {}


def _message(msg_type: str, session: str, content: dict | None = None) -> str:
    header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "", "session": session,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": "5.3"}  # fmt: skip
    return json.dumps(
        {"header": header, "parent_header": {}, "metadata": {}, "content": content or {}, "channel": "shell"}
    )


def _frame_header(length: int) -> bytes:
    """A client's (masked) text frame header announcing ``length`` payload bytes (RFC 6455 section 5.2)."""
    return bytes([0x81, 0x80 | 127]) + struct.pack("!Q", length)


async def _connect(server: Server, kernel_id: str, cookie: str | None) -> tuple[WebSocketClientConnection, str]:
    session = uuid.uuid4().hex
    url = f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id={session}"
    return await websocket_connect(
        HTTPRequest(url, headers=cookies(cookie), connect_timeout=30, request_timeout=60)
    ), session


async def _kernel_answers(ws: WebSocketClientConnection, session: str) -> bool:
    ws.write_message(_message("kernel_info_request", session))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        raw = await asyncio.wait_for(ws.read_message(), timeout=deadline - time.monotonic())
        if raw is None:
            return False
        if isinstance(raw, str) and '"kernel_info_reply"' in raw:
            return True
    return False


def websocket_status(server: Server, kernel_id: str, cookie: str | None) -> int:
    """101 when the kernel websocket opens and the kernel answers through it, else the HTTP status."""

    async def attempt() -> int:
        try:
            ws, session = await _connect(server, kernel_id, cookie)
        except HTTPClientError as exc:
            return exc.code
        try:
            return 101 if await _kernel_answers(ws, session) else 0
        finally:
            ws.close()

    return asyncio.run(attempt())


def raw_get(server: Server, path: str) -> tuple[int, str]:
    """GET ``path`` exactly as written (no client normalises its dots or escapes)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


# -- tests ----------------------------------------------------------------------------------------------


def test_kernel_routes_answer_only_the_kernels_visitor(server: Server, visitor_a: Visitor) -> None:
    kernel = visitor_a.kernel_id
    b = new_cookie(server)
    forged = sign("another-secret-" + "x" * 30, "v-0000000000000000")
    with server.client("127.0.0.11") as client:
        mine = client.get(f"/api/kernels/{kernel}", headers=cookies(visitor_a.cookie))
        assert mine.status_code == 200 and mine.json()["id"] == kernel
        for other in (b, forged, None):
            assert client.get(f"/api/kernels/{kernel}", headers=cookies(other)).status_code == 403
            assert client.delete(f"/api/kernels/{kernel}", headers=cookies(other)).status_code == 403
            # with a matching XSRF pair: the refusal is the owner check's
            headers = cookies(other, _xsrf="t")
            shutdown = client.post(f"/voila/api/shutdown/{kernel}", data={"_xsrf": "t"}, headers=headers)
            assert shutdown.status_code == 403
        # no route lists kernels (nor starts one): A's id is nowhere
        for path in ("/api/kernels", "/api/kernels/", "/api/sessions", f"/api/kernels/{kernel}/interrupt"):
            method = "POST" if path.endswith("interrupt") else "GET"
            listing = client.request(method, path, headers=cookies(visitor_a.cookie))
            assert listing.status_code == 403 and kernel not in listing.text, path
        assert client.get(f"/api/kernels/{kernel}", headers=cookies(visitor_a.cookie)).status_code == 200  # alive
    # the websocket: B, a forged cookie and no cookie are refused at the handshake; A's own still works
    assert websocket_status(server, kernel, b) == 403
    assert websocket_status(server, kernel, forged) == 403
    assert websocket_status(server, kernel, None) == 403
    assert websocket_status(server, kernel, visitor_a.cookie) == 101
    assert "Traceback" not in server.log.read_text()


def warm_kernel(server: Server) -> str:
    """The id of the booth's warm kernel (started, not yet taken by a page, not shut down), once it is ready."""

    def ready() -> str | None:
        log = server.log.read_text(errors="replace")
        started = re.findall(r"Kernel started: ([0-9a-f-]{36})", log)
        gone = set(re.findall(r"(?:pre-heated kernel|Kernel shutdown): ([0-9a-f-]{36})", log))
        waiting = [k for k in started if k not in gone]
        return waiting[-1] if waiting and log.count(WARM_KERNEL_READY) >= len(started) - len(waiting) + 1 else None

    assert wait_for(lambda: ready() is not None, 120, "the booth's warm kernel")
    return ready() or ""


async def _query(server: Server, kernel_id: str, headers: dict[str, str]) -> tuple[int, str | None]:
    """Open ``/voila/query/<kernel_id>`` with ``headers``: (101 and the first message within 3 s, or None), or the
    HTTP status it was refused with."""
    url = f"ws://127.0.0.1:{server.port}/voila/query/{kernel_id}"
    try:
        ws = await websocket_connect(HTTPRequest(url, headers=headers, request_timeout=60))
    except HTTPClientError as exc:
        return exc.code, None
    try:
        message = await asyncio.wait_for(ws.read_message(), 3)
    except TimeoutError:
        message = None
    finally:
        ws.close()
    return 101, message


def test_a_page_takes_the_warm_kernel_which_answers_no_one_before(server: Server) -> None:
    """A page load is served by the warm kernel (started and through the app's imports before the visitor came):
    until then no visitor owns it, so none of its routes answers anyone; after, its visitor only."""
    warm = warm_kernel(server)
    early = new_cookie(server, "127.0.0.21")
    with server.client("127.0.0.21") as client:
        assert client.get(f"/api/kernels/{warm}", headers=cookies(early)).status_code == 403
    assert websocket_status(server, warm, early) == 403
    with server.client("127.0.0.21", follow_redirects=True) as client:
        client.cookies.set(COOKIE_NAME, f'"{early}"')
        page = client.get("/")
        assert page.status_code == 200 and f'"kernelId": "{warm}"' in page.text.replace('":"', '": "')
        assert client.get(f"/api/kernels/{warm}").status_code == 200
    assert f"Using pre-heated kernel: {warm}" in server.log.read_text()
    assert websocket_status(server, warm, early) == 101  # the app in it knows its visitor: it answers
    assert websocket_status(server, warm, new_cookie(server, "127.0.0.21")) == 403


def test_only_a_kernel_of_the_booth_reads_its_page_request(server: Server, visitor_a: Visitor) -> None:
    """``/voila/query/<kernel>`` hands a warm kernel its page request, the visitor's cookie in it: a script cannot
    read it (no proof, another kernel's proof, a visitor cookie: 403 before the upgrade), and once delivered it is
    not kept for anyone who later shows the right proof."""
    from voila_app.identity import KERNEL_PROOF_HEADER, kernel_proof

    warm = warm_kernel(server)
    refused = [
        {},
        {KERNEL_PROOF_HEADER: kernel_proof(SECRET, visitor_a.kernel_id)},  # another kernel's
        {KERNEL_PROOF_HEADER: kernel_proof("another-secret-" + "x" * 30, warm)},  # another server's
        cookies(visitor_a.cookie),
    ]
    for headers in refused:
        assert asyncio.run(_query(server, warm, headers)) == (403, None), headers.keys()
    # visitor A's kernel read A's request when A's page took it; nothing is left there for anyone
    status, message = asyncio.run(
        _query(server, visitor_a.kernel_id, {KERNEL_PROOF_HEADER: kernel_proof(SECRET, visitor_a.kernel_id)})
    )
    assert (status, message) == (101, None)
    assert visitor_a.cookie not in server.log.read_text()


def test_an_oversized_websocket_frame_closes_that_connection_only(server: Server, visitor_a: Visitor) -> None:
    async def scenario() -> tuple[int | None, bool, bool]:
        big, big_session = await _connect(server, visitor_a.kernel_id, visitor_a.cookie)
        other, other_session = await _connect(server, visitor_a.kernel_id, visitor_a.cookie)
        try:
            assert await _kernel_answers(big, big_session)  # a normal message passes on the same connection
            # A frame announcing WS_MAX + 1024 bytes, its header alone: tornado refuses on the announced length and
            # drops the connection right after its close frame; payload bytes still unread by then make the kernel
            # reset the connection, which can reach the client before that close frame (seen in a loaded run).
            await big.protocol.stream.write(_frame_header(WS_MAX + 1024))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and await asyncio.wait_for(big.read_message(), 30) is not None:
                pass  # messages already on their way, then the close
            return big.close_code, await _kernel_answers(other, other_session), True
        finally:
            big.close()
            other.close()

    close_code, other_still_answers, _ = asyncio.run(scenario())
    assert close_code == 1009  # "message too big"
    assert other_still_answers  # the visitor's other connection and the server carry on
    assert websocket_status(server, visitor_a.kernel_id, visitor_a.cookie) == 101  # and a new one opens
    assert raw_get(server, "/voila/templates/playground/static/healthz.txt") == (200, "ok\n")


def test_new_visitors_from_one_address_are_rate_limited(server: Server, visitor_a: Visitor) -> None:
    source = "127.0.0.12"
    for _ in range(BURST):
        new_cookie(server, source)
    with server.client(source) as client:
        refused = client.get("/")
        assert refused.status_code == 429 and COOKIE_NAME not in refused.headers.get("set-cookie", "")
        assert 5 <= int(refused.headers["retry-after"]) <= 120
        assert "One moment" in refused.text and 'http-equiv="refresh"' in refused.text
        # a script cannot pick another bucket with a header: this peer is no trusted proxy
        assert client.get("/", headers={"X-Forwarded-For": "10.9.8.7"}).status_code == 429
        # a returning visitor (valid cookie) from the same address is never limited: the page, their kernel
        page = client.get("/", headers=cookies(visitor_a.cookie))
        assert page.status_code == 200 and '"kernelId"' in page.text
        # (that second kernel of A's goes with the page's unload beacon: the owner's shutdown is allowed)
        second = re.search(r'"kernelId":\s*"([0-9a-f-]{36})"', page.text).group(1)
        assert second != visitor_a.kernel_id
        beacon = client.post(f"/voila/api/shutdown/{second}", data={"_xsrf": "t"},
                             headers=cookies(visitor_a.cookie, _xsrf="t"))  # fmt: skip
        assert beacon.status_code == 204
        assert client.get(f"/api/kernels/{second}", headers=cookies(visitor_a.cookie)).status_code == 403  # gone
        assert client.get(f"/api/kernels/{visitor_a.kernel_id}", headers=cookies(visitor_a.cookie)).status_code == 200
    log = server.log.read_text()
    assert "over the rate limit: HTTP 429 to 1 request(s)" in log  # the first refusal, at once
    assert "429 GET / " not in log  # no access line per refused page: the gate's line counts them


def test_a_flood_of_refused_new_visitors_is_a_line_every_10_s_not_a_line_each(server: Server) -> None:
    """A script that keeps asking for new visitor cookies from one address fills no disk: the refusals are counted
    in one log line per address every 10 s, and Voila logs no access line for them."""
    before = server.log.read_text().count("over the rate limit")
    with server.client("127.0.0.31") as client:
        for _ in range(BURST):
            assert client.get("/").status_code == 302  # the address's burst
            client.cookies.clear()
        refused, start = 0, time.monotonic()
        for _ in range(300):
            client.cookies.clear()
            refused += client.get("/").status_code == 429
        seconds = time.monotonic() - start
    assert refused == 300
    lines = server.log.read_text().count("over the rate limit") - before
    assert 1 <= lines <= 1 + math.ceil(seconds / 10), (lines, seconds)  # the first at once, then one per 10 s


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_bucket(server: Server) -> None:
    with server.client(PROXY) as proxy:

        def first_visit(forwarded_for: str) -> int:
            proxy.cookies.clear()  # a new visitor each time
            return proxy.get("/", headers={"X-Forwarded-For": forwarded_for}).status_code

        assert [first_visit("10.0.0.1") for _ in range(BURST)] == [302] * BURST
        assert first_visit("10.0.0.1") == 429
        assert first_visit("203.0.113.9, 10.0.0.1") == 429  # what the client wrote left of its address is no help
        assert first_visit("10.0.0.2") == 302  # another client behind the same proxy
        proxy.cookies.clear()
        assert proxy.get("/").status_code == 302  # the proxy's own requests: its own bucket


CRAFTED = [
    "/voila/templates/../../etc/passwd",
    "/voila/templates/nonexistent/static/x.js",
    "/voila/templates/lab",
    "/voila/templates/lab/static/",
    "/voila/templates/lab/static/..%2f..%2fsetup.py",
    "/voila/templates/lab/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/voila/static/%2e%2e/x",
    "/voila/static/..%2f..%2fapp.py",
    "/voila/files/../../etc/passwd",
    "/voila/labextensions/nothing.js",
    "/voila/api/themes/nothing",
]


def test_crafted_template_and_static_urls_are_a_plain_404(server: Server) -> None:
    before = server.log.read_text()
    for path in CRAFTED:
        status, body = raw_get(server, path)
        assert status == 404, (path, status)
        assert not [word for word in ("Traceback", "/root", "site-packages", str(REPO)) if word in body], path
    assert raw_get(server, "/voila/templates/playground/static/healthz.txt") == (200, "ok\n")
    assert raw_get(server, "/voila/static/voila.js")[0] == 200  # Voila's own assets still load

    def new_lines() -> str:
        text = server.log.read_text()[len(before) :]
        return text if text.count("404 GET") >= len(CRAFTED) else ""

    logged = wait_for(new_lines, 10, "the 404s in the server's log")
    for path in CRAFTED:  # one access line each, nothing else about it
        about = [line for line in logged.splitlines() if f" {path} (" in line]
        assert len(about) == 1 and about[0].startswith(f"404 GET {path} ("), (path, about)
    assert "Traceback" not in logged and "Uncaught exception" not in logged


def test_plotly_comes_as_one_cacheable_file_not_as_every_pages_widget_state(server: Server) -> None:
    """The chart's front end (plotly's ~5 MB bundle) is a static file the browser caches, named with its version;
    the booth's pages carry a few hundred bytes that import it (issue 20 item 4: 5.09 MB per page load)."""
    from importlib.metadata import version

    import plotly

    from voila_app import PLOTLY_BUNDLE_PATH

    bundle = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"
    with server.client("127.0.0.16") as client:
        got = client.get(f"/{PLOTLY_BUNDLE_PATH}?v={version('plotly')}")
        assert got.status_code == 200 and got.content == bundle.read_bytes()
        assert got.headers["content-type"].startswith("text/javascript")
        max_age = int(re.search(r"max-age=(\d+)", got.headers["cache-control"])[1])
        assert max_age >= 365 * 86400, got.headers["cache-control"]
        for other in ("playground/static/widgetbundle.js", f"{PLOTLY_BUNDLE_PATH}.map", "playground/static/.."):
            response = client.get(f"/{other}")  # not that file: Voila's own routes answer (the page, or a 404)
            assert response.status_code != 200 and "javascript" not in response.headers.get("content-type", "")


# -- the message rate per kernel (the booth's defaults: bursts of 200, 50 a second; a connection takes 50) --------


FLOOD_BYTES = 32 * 1024  # each message; the flooder offers 4000 of them (128 MB), the server may pass ~100


def _comm_msg(session: str) -> str:
    return _message("comm_msg", session, {"comm_id": uuid.uuid4().hex, "data": {"pad": "x" * FLOOD_BYTES}})


async def _flood(ws: WebSocketClientConnection, session: str, ids: list[str], count: int = 4000) -> None:
    """Send ``count`` comm messages as fast as the connection takes them (their ids into ``ids``), until it closes."""
    with contextlib.suppress(WebSocketClosedError):
        for _ in range(count):
            message = _comm_msg(session)
            ids.append(json.loads(message)["header"]["msg_id"])
            await ws.write_message(message)


async def _watch(ws: WebSocketClientConnection, reached: set[str]) -> None:
    """The kernel's status messages (broadcast to all its connections): the ids of the messages it got."""
    while (raw := await ws.read_message()) is not None:
        if isinstance(raw, str) and '"status"' in raw:
            reached.add(json.loads(raw)["parent_header"].get("msg_id", ""))


async def _read_until_closed(ws: WebSocketClientConnection, timeout: float = 30) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_watch(ws, set()), timeout)


def test_a_message_flood_closes_its_own_websocket_and_reconnecting_gains_nothing(
    server: Server, visitor_a: Visitor, visitor_f: Visitor
) -> None:
    """A visitor's script floods their own kernel's websocket (the booth bench's comm flood grew the Voila server
    from 261 MB to 1.28 GB): the server closes it (1008) after about a burst, before parsing or queueing the rest,
    a reconnect gets no new burst, and another visitor's kernel answers meanwhile."""
    flooder, voila = visitor_f, psutil.Process(server.pid)
    log_before = len(server.log.read_text())

    async def scenario() -> dict:
        begin = time.monotonic()
        watcher, _ = await _connect(server, flooder.kernel_id, flooder.cookie)  # the kernel's 200 - 50 tokens
        reached: set[str] = set()
        watching = asyncio.create_task(_watch(watcher, reached))
        flood, session = await _connect(server, flooder.kernel_id, flooder.cookie)  # 100 left
        rss_before = voila.memory_info().rss
        ids: list[str] = []
        other, other_session = await _connect(server, visitor_a.kernel_id, visitor_a.cookie)
        # as the bench's flooders: nothing read while it sends (the server drops what comes after its close)
        _, other_answers = await asyncio.gather(_flood(flood, session, ids), _kernel_answers(other, other_session))
        await _read_until_closed(flood)
        closed_at = time.monotonic()
        rss_after = voila.memory_info().rss
        first = {"code": flood.close_code, "reason": flood.close_reason, "sent": len(ids),
                 "seconds": closed_at - begin}  # fmt: skip
        # reconnect and flood again until refused at the upgrade (while under a second's worth, 50, is left)
        statuses, again = [], []
        while (429, "1") not in statuses and time.monotonic() - closed_at < 15:
            try:
                ws, session = await _connect(server, flooder.kernel_id, flooder.cookie)
            except HTTPClientError as exc:
                statuses.append((exc.code, exc.response.headers.get("Retry-After") if exc.response else None))
                await asyncio.sleep(0.1)
                continue
            statuses.append((101, None))
            await asyncio.gather(_flood(ws, session, again, 500), _read_until_closed(ws))
        flooded_for = time.monotonic() - begin
        seen = -1
        while seen != len(reached):  # until the kernel has reported every message it got
            seen = len(reached)
            await asyncio.sleep(0.3)
        other.close()
        watcher.close()
        watching.cancel()
        return {"first": first, "first_reached": len(reached & set(ids)), "statuses": statuses,
                "again_reached": len(reached & set(again)), "flooded_for": flooded_for,
                "rss_mb": (rss_before / 2**20, rss_after / 2**20), "other_answers": other_answers}  # fmt: skip

    got = asyncio.run(scenario())
    first = got["first"]
    assert (first["code"], first["reason"]) == (1008, "over the message rate"), got
    # the burst less two connections' worth, plus the refill while it flooded (and what was on its way)
    assert 100 <= got["first_reached"] <= 100 + 50 * first["seconds"] + 10, got
    assert got["other_answers"], "another visitor's kernel did not answer during the flood"
    rss_before, rss_after = got["rss_mb"]
    assert rss_after - rss_before < 10, got  # nothing queued: not the 128 MB offered
    assert (429, "1") in got["statuses"], got  # a reconnect waits for its second's worth
    # no new burst, however it reconnects: all it got is the burst and the refill, less 50 per connection
    connections = 2 + got["statuses"].count((101, None))
    allowed = 200 + 50 * got["flooded_for"] - 50 * connections
    assert got["first_reached"] + got["again_reached"] <= allowed + 10, got
    line = f"Kernel {flooder.kernel_id}: a websocket over the message rate (burst 200, 50 a second); closed (1008)"
    log = server.log.read_text()
    assert line in log and log.count("over the message rate") == 1  # one line per kernel per 10 s at most
    flood_lines = log[log_before:].splitlines()
    assert len(flood_lines) < 60 and "Traceback" not in log, flood_lines  # no line per message, nor per reply
    assert websocket_status(server, visitor_a.kernel_id, visitor_a.cookie) == 101


def test_a_websocket_for_a_kernel_being_shut_down_is_refused_at_once(server: Server, visitor_f: Visitor) -> None:
    """A kernel on its way out (culled, replaced, its page closed) takes no new websocket: 403, not a wait for it."""
    visitor = visitor_f
    kernel = next(
        p for p in psutil.Process(server.pid).children(recursive=True) if visitor.kernel_id in " ".join(p.cmdline())
    )
    kernel.suspend()  # it answers nothing now: its shutdown waits (up to 5 s), and so would a websocket
    try:
        with server.client("127.0.0.17") as client, ThreadPoolExecutor(1) as pool:
            headers = cookies(visitor.cookie, _xsrf="t")
            beacon = pool.submit(client.post, f"/voila/api/shutdown/{visitor.kernel_id}", data={"_xsrf": "t"},
                                 headers=headers)  # fmt: skip
            assert wait_for(
                lambda: client.get(f"/api/kernels/{visitor.kernel_id}", headers=headers).status_code == 403,
                30,
                "the kernel's shutdown to begin",
                interval=0.05,
            )
            assert not beacon.done()  # still shutting down
            start = time.monotonic()
            assert websocket_status(server, visitor.kernel_id, visitor.cookie) == 403
            assert time.monotonic() - start < 10  # not the minute a websocket would wait for the kernel
            kernel.resume()
            assert beacon.result(timeout=30).status_code == 204
    finally:
        with contextlib.suppress(psutil.Error):
            kernel.resume()
    assert websocket_status(server, visitor.kernel_id, visitor.cookie) == 403  # and gone


def test_a_flood_of_refused_kernel_requests_is_a_line_every_10_s(server: Server, visitor_a: Visitor) -> None:
    """A script with its own cookie hammering another visitor's kernel routes gets 403 each time, and the log gets
    one line per address every 10 s (with the count held back), not a line (or two) per request."""
    mine = new_cookie(server, "127.0.0.41")
    before = server.log.read_text()
    with server.client("127.0.0.41") as client:
        start = time.monotonic()
        for _ in range(100):
            assert client.get(f"/api/kernels/{visitor_a.kernel_id}", headers=cookies(mine)).status_code == 403
            assert client.get("/api/kernels", headers=cookies(mine)).status_code == 403
        seconds = time.monotonic() - start
    added = server.log.read_text()[len(before) :]
    lines = [line for line in added.splitlines() if "403 GET /api/kernels" in line]
    assert 1 <= len(lines) <= 1 + math.ceil(seconds / 10), (lines, seconds)
    assert "wrote error" not in added


# -- no 500s, no floods, nothing from another host (issue 62 item 4, item 5's template) ---------------------------


def _log_since(server: Server, before: str) -> str:
    return server.log.read_text(errors="replace")[len(before) :]


def test_login_and_logout_send_the_browser_to_the_app_and_flood_no_log(server: Server) -> None:
    """The booth has no accounts: /login and /logout (Jupyter's logout page was a 500 with ~120 lines of traceback
    each time) send the browser to the app, with or without a cookie, whatever the method, and clear nothing."""
    mine = new_cookie(server, "127.0.0.51")
    before = server.log.read_text(errors="replace")
    start = time.monotonic()
    with server.client("127.0.0.51") as client:
        for _ in range(20):
            for cookie in (None, mine):
                for method, path in (("GET", "/logout"), ("GET", "/login"), ("POST", "/logout"), ("HEAD", "/login")):
                    got = client.request(method, path, headers=cookies(cookie))
                    assert got.status_code == (302 if method in ("GET", "HEAD") else 303), (method, path, got.text)
                    assert got.headers["location"] == "/" and "set-cookie" not in got.headers, got.headers
    seconds = time.monotonic() - start
    added = _log_since(server, before)
    assert "Traceback" not in added and "Uncaught" not in added and "500 " not in added, added[:2000]
    # 160 requests: at most a line per status and address every 10 s (302 and 303), not ~120 lines each
    assert len(added.splitlines()) <= 2 * (1 + math.ceil(seconds / 10)), added[:2000]
    assert len(added) < 2000


def test_a_browser_gone_mid_reply_leaves_no_task_error_in_the_log(server: Server, visitor_a: Visitor) -> None:
    """A tab that closes (TCP reset, no close frame) while the kernel's replies are on their way: the server drops
    them quietly ("Task exception was never retrieved ... WebSocketClosedError" with two tracebacks before, and an
    empty warning per reply), and the kernel keeps answering on a new connection."""
    before = server.log.read_text(errors="replace")
    url = f"ws://127.0.0.1:{server.port}/api/kernels/{visitor_a.kernel_id}/channels"
    for _ in range(2):  # each round: the connection's cost (50) and 40 messages, within the burst of 200
        session = uuid.uuid4().hex
        with sync_websocket(f"{url}?session_id={session}", additional_headers=cookies(visitor_a.cookie)) as ws:
            for _ in range(40):
                ws.send(_message("kernel_info_request", session))
            assert ws.recv(timeout=60)  # replies are flowing
            time.sleep(0.05)
            ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            ws.socket.close()  # a reset while the replies are still being written
        time.sleep(1.5)
    assert websocket_status(server, visitor_a.kernel_id, visitor_a.cookie) == 101
    added = _log_since(server, before)
    for word in ("Task exception was never retrieved", "WebSocketClosedError", "StreamClosedError", "Traceback"):
        assert word not in added, added[:3000]
    assert not re.search(r"WARNING \| *$", added, re.MULTILINE), added[:3000]  # Jupyter's empty warning per reply


def _external(url: str) -> bool:
    """A URL on another host than this machine (relative URLs, data: and localhost are local)."""
    parts = urlsplit(url.strip())
    if parts.scheme in ("", "data", "blob") and not url.strip().startswith("//"):
        return False
    return (parts.hostname or "") not in ("127.0.0.1", "localhost", "::1")


RESOURCE_URLS = [
    r"<script[^>]*\bsrc=[\"']([^\"']+)",
    r"<link[^>]*\bhref=[\"']([^\"']+)",
    r"\bimport\(\s*[\"']([^\"']+)",  # import("...") in a module script
    r"\bimport\s+[^;]*?\bfrom\s+[\"']([^\"']+)",
    r"url\(\s*[\"']?([^\"')]+)",  # CSS: fonts, images
    r"@import\s+[\"']([^\"']+)",
    r"=\s*[\"'](https?://[^\"']+\.m?js)[\"']",  # a script URL kept in a variable (mermaid's elkUrl)
]


def resource_urls(text: str) -> set[str]:
    return {m.group(1) for pattern in RESOURCE_URLS for m in re.finditer(pattern, text, re.IGNORECASE)}


def test_the_page_and_its_styles_and_scripts_name_no_other_host(server: Server, visitor_a: Visitor) -> None:
    """Nothing from a CDN (Voila's stock template asks Font Awesome twice from jsdelivr, mermaid from cdnjs, and
    voila.js falls back to MathJax from cdnjs): an offline booth or cluster gets the whole page."""
    page = visitor_a.page
    urls = resource_urls(page)
    assert any("voila.js" in u for u in urls) and any("voila-style.js" in u for u in urls), sorted(urls)
    assert not [u for u in urls if _external(u)], sorted(u for u in urls if _external(u))
    assert "cdn.jsdelivr.net" not in page and "cdnjs.cloudflare.com" not in page
    config = json.loads(re.search(r'<script id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S).group(1))
    # voila.js uses its bundled MathJax 3 unless the URL is the string "null" (then cdnjs's) or another URL
    assert config.get("fullMathjaxUrl") in (None, "") and config.get("mathjaxConfig") in (None, ""), config
    assets = [u for u in urls if u.startswith("/") and re.search(r"\.(js|css)(\?|$)", u)]
    assert len(assets) >= 3, assets
    with server.client("127.0.0.16") as client:
        for asset in assets:  # the template's own scripts and styles (Font Awesome's fonts inside voila-style.js)
            got = client.get(asset)
            assert got.status_code == 200, asset
            external = [u for u in resource_urls(got.text) if _external(u)]
            assert not external, (asset, external[:5])
