"""Booth identity: the signed visitor cookie the Voila server sets and the kernel verifies."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tornado.web import create_signed_value

from voila_app import identity
from voila_app.identity import COOKIE_NAME, SECRET_ENV

SECRET = "s" * 40


def test_a_signed_visitor_id_round_trips() -> None:
    visitor = identity.new_visitor_id()
    assert identity.is_visitor_id(visitor)
    assert identity.verify(SECRET, identity.sign(SECRET, visitor)) == visitor
    assert identity.new_visitor_id() != visitor


def _swap_id(value: str, other: str) -> str:
    """Replace the (base64) value field of tornado's v2 signed format, keeping the signature."""
    fields = value.split("|")
    encoded = base64.b64encode(other.encode()).decode()
    fields[4] = f"{len(encoded)}:{encoded}"
    return "|".join(fields)


def _flip(text: str, index: int) -> str:
    return text[:index] + ("a" if text[index] != "a" else "b") + text[index + 1 :]


@pytest.mark.parametrize(
    "forge",
    [
        lambda v: identity.sign("another-secret-" + "x" * 30, v),  # signed with another secret
        lambda v: _flip(identity.sign(SECRET, v), -3),  # signature altered
        lambda v: _swap_id(identity.sign(SECRET, v), "v-" + "0" * 16),  # visitor id swapped, signature kept
        lambda v: create_signed_value(SECRET, "other_cookie", v).decode(),  # another cookie's signature
        lambda v: create_signed_value(SECRET, COOKIE_NAME, v, clock=lambda: time.time() - 8 * 86400).decode(),
        lambda v: create_signed_value(SECRET, COOKIE_NAME, "../../etc").decode(),  # not an id, though signed
        lambda v: v,  # an unsigned id
        lambda v: "",
        lambda v: "2|" * 5000,
        lambda v: "\x00\xff garbage",
    ],
)
def test_forged_altered_or_expired_cookies_are_no_identity(forge) -> None:
    assert identity.verify(SECRET, forge(identity.new_visitor_id())) is None


def test_the_kernel_reads_the_cookie_header_and_verifies_it() -> None:
    visitor = identity.new_visitor_id()
    value = identity.sign(SECRET, visitor)
    header = f'_xsrf=2|abc; {COOKIE_NAME}="{value}"; theme=dark'
    assert identity.cookie_value(header) == value
    assert identity.visitor_from_environ({"HTTP_COOKIE": header, SECRET_ENV: SECRET}) == visitor
    assert identity.visitor_from_environ({"HTTP_COOKIE": header}) is None  # no secret: no identity
    assert identity.visitor_from_environ({"HTTP_COOKIE": header, SECRET_ENV: "short"}) is None
    assert identity.visitor_from_environ({SECRET_ENV: SECRET}) is None  # no cookie
    assert identity.cookie_value('bad"header;;=') is None


def test_the_secret_comes_from_the_environment_or_a_private_file(tmp_path: Path) -> None:
    assert identity.booth_secret(tmp_path, {SECRET_ENV: SECRET}) == SECRET
    with pytest.raises(identity.IdentityError, match="at least 32"):
        identity.booth_secret(tmp_path, {SECRET_ENV: "too-short"})
    generated = identity.booth_secret(tmp_path, {})
    path = tmp_path / "booth" / "secret"
    assert len(generated) == 64 and path.read_text().strip() == generated
    assert path.stat().st_mode & 0o777 == 0o600
    assert identity.booth_secret(tmp_path, {}) == generated  # the same one after a restart
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".secret-")]  # no temp files left
    path.write_text("weak\n")
    with pytest.raises(identity.IdentityError, match="shorter than 32"):
        identity.booth_secret(tmp_path, {})


# -- the Voila server's booth limits (pure parts; tests/test_booth_server.py drives the real server) -------


def test_the_token_bucket_allows_a_burst_then_the_rate() -> None:
    from voila_app.limits import TokenBucket

    bucket = TokenBucket(per_minute=20, burst=3)
    assert [bucket.take("a", now=100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take("a", now=100.0) == pytest.approx(3.0)  # one token every 3 s
    assert bucket.take("b", now=100.0) == 0.0  # another address: its own bucket
    assert bucket.take("a", now=101.5) == pytest.approx(1.5)  # refused takes nothing
    assert bucket.take("a", now=103.0) == 0.0
    assert bucket.take("a", now=103.0) > 0
    assert [bucket.take("a", now=1000.0) for _ in range(4)][-1] > 0  # refilled to the burst, never beyond


def test_the_token_bucket_forgets_full_buckets_first_and_stays_bounded() -> None:
    from voila_app.limits import TokenBucket

    bucket = TokenBucket(per_minute=60, burst=2, max_keys=3)
    for _ in range(2):
        bucket.take("flooder", now=0.0)
    for i in range(10):  # many one-off addresses: the bucket table stays bounded
        bucket.take(f"10.0.0.{i}", now=0.0)
    assert len(bucket) <= 3
    bucket = TokenBucket(per_minute=60, burst=2, max_keys=2)
    bucket.take("old", now=0.0)
    bucket.take("flooder", now=4.0), bucket.take("flooder", now=4.0)
    bucket.take("new", now=5.0)  # one too many: "old" is full again by now, forgotten; "flooder" is not
    assert len(bucket) == 2
    assert bucket.take("flooder", now=5.0) == 0.0 and bucket.take("flooder", now=5.0) > 0  # 1 token, not 2


def test_kernel_websockets_have_a_message_rate_and_a_few_connections_per_kernel() -> None:
    from voila_app.limits import KernelSockets

    now = [0.0]
    sockets = KernelSockets(per_second=50, burst=200, clock=lambda: now[0])
    assert sockets.connect("k") is None  # a connection takes one second's worth: 150 messages left at once
    assert sum(sockets.message("k") for _ in range(400)) == 150
    assert sockets.connect("other") is None and sockets.message("other")  # another kernel: its own bucket
    now[0] += 0.1
    assert sum(sockets.message("k") for _ in range(100)) == 5  # 50 a second
    why, wait = sockets.connect("k")  # reconnecting gains nothing: refused until a second's worth is back
    assert why == "over the message rate" and wait == pytest.approx(1.0)
    now[0] += 1.0
    assert sockets.connect("k") is None and not sockets.message("k")  # and the new connection has it spent
    now[0] += 60.0  # full again (200, never more): 4 connections at most, waiting or open
    assert [sockets.connect("k") for _ in range(2)] == [None, None]  # 4 counted now (the 2 above are open)
    assert sockets.connect("k")[0] == "4 connections to this kernel already"
    sockets.disconnect("k")
    assert sockets.connect("k") is None  # room again, and 200 - 3 * 50 tokens left for it
    assert sockets.connect("k")[0] == "4 connections to this kernel already"
    now[0] += 60.0
    for _ in range(10):
        sockets.disconnect("k")  # more than were counted: never below zero
    assert sockets.connections == {"other": 1}


def test_a_throttle_lets_one_event_a_period_through_with_a_count() -> None:
    from voila_app.limits import Throttle

    now = [100.0]
    throttle = Throttle(10.0, clock=lambda: now[0])
    assert throttle.passes("k") == (1, 0.0)
    assert [throttle.passes("k") for _ in range(5)] == [None] * 5
    assert throttle.passes("j") == (1, 0.0)  # per key
    now[0] += 10.0
    assert throttle.passes("k") == (6, 10.0)  # this one and the 5 held back since the last
    now[0] += 30.0
    assert throttle.passes("k") == (1, 30.0)


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "client"),
    [
        ("203.0.113.5", None, "", "203.0.113.5"),
        ("203.0.113.5", "10.1.1.1", "", "203.0.113.5"),  # no trusted proxy: the header is ignored
        ("203.0.113.5", "10.1.1.1", "10.0.0.5", "203.0.113.5"),  # an untrusted peer's header is ignored
        ("10.0.0.5", "198.51.100.7", "10.0.0.5", "198.51.100.7"),
        ("10.0.0.5", "1.2.3.4, 198.51.100.7", "10.0.0.5", "198.51.100.7"),  # the client's own entries: ignored
        ("10.0.0.5", "1.2.3.4, 198.51.100.7, 10.244.1.9", "10.0.0.5,10.244.0.0/16", "198.51.100.7"),  # 2 proxies
        ("10.0.0.5", "10.0.0.5", "10.0.0.5", "10.0.0.5"),  # only proxies: the left-most
        ("10.0.0.5", "unknown", "10.0.0.5", "10.0.0.5"),  # unreadable: the proxy itself, not a made-up key
        ("10.0.0.5", " , ", "10.0.0.5", "10.0.0.5"),
        ("::ffff:10.0.0.5", "[2001:db8::1]", "10.0.0.5", "2001:db8::1"),  # IPv4-mapped peer, bracketed IPv6
    ],
)
def test_the_client_address_trusts_forwarded_for_only_from_trusted_proxies(peer, forwarded, trusted, client) -> None:
    from voila_app.limits import client_address, parse_trusted_proxies

    assert client_address(peer, forwarded, parse_trusted_proxies("--booth-trusted-proxy", trusted)) == client


def test_an_ipv6_client_is_bucketed_by_its_64_prefix() -> None:
    from voila_app.limits import bucket_key

    assert bucket_key("2001:db8:1:2:aaaa::1") == bucket_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert bucket_key("2001:db8:1:3::1") != bucket_key("2001:db8:1:2::1")
    assert bucket_key("192.0.2.1") == "192.0.2.1"


def test_booth_limit_settings_come_from_flags_then_environment_then_defaults() -> None:
    from voila_app import limits

    assert limits.limits_from({}) == limits.Limits()
    assert (limits.Limits().new_visitors_per_minute, limits.Limits().new_visitors_burst) == (20.0, 30)
    env = {
        limits.NEW_VISITORS_PER_MINUTE_ENV: "6",
        limits.NEW_VISITORS_BURST_ENV: "12",
        limits.TRUSTED_PROXIES_ENV: "10.0.0.5, 10.244.0.0/16",
        limits.WEBSOCKET_MAX_BYTES_ENV: "65536",
        limits.WEBSOCKET_MESSAGES_BURST_ENV: "300",
        limits.WEBSOCKET_MESSAGES_PER_SECOND_ENV: "12.5",
    }
    assert (limits.Limits().websocket_messages_burst, limits.Limits().websocket_messages_per_second) == (200, 50.0)
    got = limits.limits_from(env)
    assert (got.new_visitors_per_minute, got.new_visitors_burst, got.websocket_max_bytes) == (6.0, 12, 65536)
    assert (got.websocket_messages_burst, got.websocket_messages_per_second) == (300, 12.5)
    assert limits.limits_from(env, messages_per_second="80").websocket_messages_per_second == 80.0
    assert [str(n) for n in got.trusted_proxies] == ["10.0.0.5/32", "10.244.0.0/16"]
    assert limits.limits_from(env, burst="50", trusted_proxies="").new_visitors_burst == 50  # the flag wins
    assert limits.limits_from(env, trusted_proxies="").trusted_proxies == ()


@pytest.mark.parametrize(
    ("kwargs", "env", "needle"),
    [
        ({"per_minute": "0"}, {}, "--booth-new-visitors-per-minute '0': allowed: a number from 0.1 to 100000"),
        ({"per_minute": "nan"}, {}, "--booth-new-visitors-per-minute 'nan': allowed: a number"),
        ({}, {"PLAYGROUND_BOOTH_NEW_VISITORS_PER_MINUTE": "lots"}, "PLAYGROUND_BOOTH_NEW_VISITORS_PER_MINUTE 'lots'"),
        ({"burst": "1.5"}, {}, "--booth-new-visitors-burst '1.5': allowed: an integer from 1 to 100000"),
        ({}, {"PLAYGROUND_BOOTH_NEW_VISITORS_BURST": "0"}, "PLAYGROUND_BOOTH_NEW_VISITORS_BURST '0': allowed"),
        ({"trusted_proxies": "10.0.0.5,proxy.local"}, {}, "--booth-trusted-proxy 'proxy.local': allowed: IP"),
        ({}, {"PLAYGROUND_BOOTH_TRUSTED_PROXIES": "10.0.0.300"}, "PLAYGROUND_BOOTH_TRUSTED_PROXIES '10.0.0.300'"),
        ({"websocket_max_bytes": "100"}, {}, "--booth-websocket-max-bytes '100': allowed: an integer from 16384"),
        ({"messages_burst": "5"}, {}, "--booth-websocket-messages-burst '5': allowed: an integer from 10 to 100000"),
        ({}, {"PLAYGROUND_BOOTH_WEBSOCKET_MESSAGES_BURST": "many"}, "PLAYGROUND_BOOTH_WEBSOCKET_MESSAGES_BURST 'many'"),
        ({"messages_per_second": "0.5"}, {}, "--booth-websocket-messages-per-second '0.5': allowed: a number from 1"),
        ({}, {"PLAYGROUND_BOOTH_WEBSOCKET_MESSAGES_PER_SECOND": "inf"}, "MESSAGES_PER_SECOND 'inf': allowed: a number"),
    ],
)
def test_bad_booth_limit_settings_are_one_line_naming_the_setting(kwargs, env, needle) -> None:
    from voila_app.limits import SettingError, limits_from

    with pytest.raises(SettingError) as caught:
        limits_from(env, **kwargs)
    assert needle in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(caught.value.field)


@contextmanager
def _configured_booth(*options: str) -> Iterator[tuple[Any, dict[str, Any], list]]:
    """A configured BoothVoila (not serving), its tornado settings and its route rules, on an event loop of its own;
    its warm-kernel pool shut down after.

    Voila's kernel manager queues a warm kernel's start on the current event loop as it is made; left there, that
    task runs in a later test's loop, fails (no web app), and its unretrieved error is logged when the garbage
    collector frees it: inside whatever that test runs (once, inside ``ast.parse``, whose 3.11 recursion counter
    the traceback's own ``ast.parse`` then broke: "AST constructor recursion depth mismatch").
    """
    from voila_app import CONFIG_DIR
    from voila_app.server import BoothVoila

    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "playground.ipynb"
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        app = BoothVoila()
        app.initialize([str(notebook), "--no-browser", *options, f"--Voila.config_file_paths={CONFIG_DIR}"])
        settings = app.init_settings()
        app.identity_provider, app.authorizer = settings["identity_provider"], settings["authorizer"]
        yield app, settings, app.init_handlers()
        loop.run_until_complete(app.kernel_manager.shutdown_all())
        assert not asyncio.all_tasks(loop)  # nothing of this app left to run in another test
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def test_booth_voila_guards_every_kernel_route_and_static_route() -> None:
    """The handler classes booth mode gives Voila's own routes (the real list of a configured BoothVoila)."""
    from tornado.web import StaticFileHandler

    from voila_app.server import (
        BoothKernelSocket,
        RefusedHandler,
        _ClaimOnHandOut,
        _KernelQuery,
        _NotFoundOnBadPath,
        _OwnedKernelRoute,
        _VisitorPage,
    )

    with _configured_booth(
        "--BoothVoila.trusted_proxies=10.0.0.5", "--BoothVoila.websocket_messages_per_second=20"
    ) as (app, settings, rules):
        assert settings["websocket_max_message_size"] == 128 * 1024
        sockets = settings["playground_kernel_sockets"]
        socket_limits = (sockets.burst, sockets.per_second, sockets.connect_cost, sockets.max_connections)
        assert socket_limits == (200, 20.0, 20.0, 4)
        assert [str(n) for n in settings["playground_new_visitor_gate"].trusted_proxies] == ["10.0.0.5/32"]
        kernel_routes = [r for r in rules if ("kernel" in r[0] or "shutdown" in r[0]) and "/voila/query/" not in r[0]]
        assert len(kernel_routes) >= 3  # /api/kernels/<id>, its /channels, /voila/api/shutdown/<id>
        assert all(issubclass(r[1], _OwnedKernelRoute) for r in kernel_routes if r[1] is not RefusedHandler)
        # the warm kernels' route: only a kernel of this server may read it, so no visitor cookie is asked there
        [query] = [r for r in rules if "/voila/query/" in r[0]]
        assert issubclass(query[1], _KernelQuery) and not issubclass(query[1], _OwnedKernelRoute)
        assert isinstance(app.kernel_manager, _ClaimOnHandOut)  # a page that takes a warm kernel makes it its visitor's
        [page] = [r for r in rules if r[0] == "/(.*)"]
        assert issubclass(page[1], _VisitorPage)  # the cookie before any kernel, warm or cold
        assert [r[0] for r in kernel_routes if issubclass(r[1], BoothKernelSocket)] == [
            r"/api/kernels/(?P<kernel_id>\w+-\w+-\w+-\w+-\w+)/channels"
        ]
        statics = [r for r in rules if issubclass(r[1], StaticFileHandler)]
        assert len(statics) >= 4 and all(issubclass(r[1], _NotFoundOnBadPath) for r in statics)
        patterns = [r[0] for r in rules]
        assert patterns.index("/api/.*") == len(patterns) - 2 and patterns[-1] == "/(.*)"  # before the page route


def test_without_warm_kernels_the_booth_has_no_query_route_and_no_pool() -> None:
    from voila_app.server import _ClaimOnHandOut, _VisitorPage

    with _configured_booth("--BoothVoila.preheat_kernels=0") as (app, _, rules):
        assert not [r for r in rules if "/voila/query/" in r[0]]
        assert not isinstance(app.kernel_manager, _ClaimOnHandOut)
        assert app.voila_configuration.prelaunch_hook is None  # the page route calls it, so Voila must not
        assert issubclass(next(r[1] for r in rules if r[0] == "/(.*)"), _VisitorPage)


def test_a_kernel_proof_is_bound_to_the_kernel_and_the_secret() -> None:
    from voila_app.identity import kernel_proof, kernel_proof_ok

    secret, kernel = "k" * 40, "2466d213-d9c5-407b-ba1c-45bddcaa8a69"
    proof = kernel_proof(secret, kernel)
    assert kernel_proof_ok(secret, kernel, proof)
    assert not kernel_proof_ok(secret, "fba7ae07-eaf7-43a5-a7a3-2efa24a42db6", proof)  # another kernel's
    assert not kernel_proof_ok("j" * 40, kernel, proof)  # another server's
    assert not kernel_proof_ok(secret, kernel, "") and not kernel_proof_ok("", kernel, kernel_proof("", kernel))


def test_a_kernel_that_was_not_preheated_does_not_wait_for_a_request() -> None:
    from voila_app.identity import SECRET_ENV, receive_request

    cold = {"VOILA_PREHEAT": "False", "VOILA_KERNEL_ID": "2466d213-d9c5-407b-ba1c-45bddcaa8a69", SECRET_ENV: "k" * 40}
    assert receive_request(cold) is False and "HTTP_COOKIE" not in cold
    # preheated, but nothing listens where the server should be: no identity, at once (fail closed)
    warm = {**cold, "VOILA_PREHEAT": "True", "VOILA_APP_PORT": str(_closed_port())}
    assert receive_request(warm, open_timeout=5) is False and "HTTP_COOKIE" not in warm


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- errors and the log (issue 62 item 4) -------------------------------------------------------------------------


def test_a_line_budget_lets_a_few_lines_a_minute_through_then_says_how_many_it_held() -> None:
    from voila_app.limits import LineBudget

    now = [0.0]
    budget = LineBudget(3, 60.0, clock=lambda: now[0])
    assert [budget.passes("a") for _ in range(3)] == [0, 0, 0]
    assert [budget.passes("a") for _ in range(17)] == [None] * 17
    assert budget.passes("b") == 0  # per kind
    now[0] += 59.0
    assert budget.passes("a") is None
    now[0] += 1.0
    assert budget.passes("a") == 18  # the next line that gets through says "suppressed 18 similar"
    assert [budget.passes("a") for _ in range(2)] == [0, 0]


def test_every_booth_route_has_safe_errors_and_login_logout_are_the_booths_own() -> None:
    from tornado.websocket import WebSocketHandler

    from voila_app.server import NoAccountsHandler, _BoothErrors, _QuietWrites

    with _configured_booth() as (_, _, rules):
        assert all(issubclass(r[1], _BoothErrors) for r in rules), [r[1] for r in rules]
        assert [r[0] for r in rules if r[1] is NoAccountsHandler] == ["/login", "/logout"]
        sockets = [r for r in rules if issubclass(r[1], WebSocketHandler)]
        assert len(sockets) == 2 and all(issubclass(r[1], _QuietWrites) for r in sockets)  # kernel + warm query


def _serve_broken_route(monkeypatch: pytest.MonkeyPatch, requests: int, tracebacks: bool) -> list:
    """``requests`` GETs over real HTTP to a booth route that raises; the responses."""
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port
    from tornado.web import Application

    from voila_app import server

    class Broken(server._BoothErrors):
        def get(self) -> None:
            raise RuntimeError("the disk is full\nsecond line of the message")

    monkeypatch.setattr(server, "_log_tracebacks", tracebacks)

    async def scenario() -> list:
        sock, port = bind_unused_port()
        http = HTTPServer(Application([("/broken", Broken)], log_function=server.log_request))
        http.add_sockets([sock])
        client = AsyncHTTPClient()
        try:
            return [await client.fetch(f"http://127.0.0.1:{port}/broken", raise_error=False) for _ in range(requests)]
        finally:
            http.stop()
            client.close()

    return asyncio.run(scenario())


def test_an_unexpected_error_is_a_plain_500_and_one_rate_limited_log_line(monkeypatch, caplog) -> None:
    """Whatever breaks in a route: the visitor gets tornado's plain 500 (no message, no traceback), the log one line
    per error, at most ERROR_LINES_PER_MINUTE a minute per kind, then one line saying how many were held back;
    the operator's setting (BoothVoila.log_tracebacks) adds the traceback."""
    from voila_app import limits, server

    now = [0.0]
    monkeypatch.setattr(server, "_error_lines", limits.LineBudget(limits.ERROR_LINES_PER_MINUTE, clock=lambda: now[0]))
    caplog.set_level(logging.INFO)
    responses = _serve_broken_route(monkeypatch, 20, tracebacks=False)
    assert {r.code for r in responses} == {500}
    body = responses[0].body.decode()
    assert "disk is full" not in body and "Traceback" not in body and "500: Internal Server Error" in body
    errors = [r for r in caplog.records if "Unexpected error in GET /broken" in r.getMessage()]
    assert len(errors) == limits.ERROR_LINES_PER_MINUTE and all(r.exc_info is None for r in errors)
    assert errors[0].getMessage().endswith("RuntimeError: the disk is full")  # one line: the message's first
    access = [r for r in caplog.records if r.getMessage().startswith("500 GET /broken")]
    assert len(access) == limits.ERROR_LINES_PER_MINUTE
    assert "Traceback" not in caplog.text and len(caplog.text.splitlines()) <= 2 * limits.ERROR_LINES_PER_MINUTE

    caplog.clear()
    now[0] += 60.0  # a minute later, with tracebacks on
    _serve_broken_route(monkeypatch, 1, tracebacks=True)
    [error] = [r for r in caplog.records if "Unexpected error in GET /broken" in r.getMessage()]
    assert error.getMessage().endswith(f"(suppressed {20 - limits.ERROR_LINES_PER_MINUTE} similar)")
    assert error.exc_info is not None and "Traceback" in caplog.text


def test_the_event_loop_drops_writes_to_closed_sockets_and_logs_other_lost_errors_once(caplog) -> None:
    """A task nobody awaited that failed on a closed websocket (a browser gone) is no error; another one is one
    line, not asyncio's "Task exception was never retrieved" with a traceback."""
    import gc

    from tornado.iostream import StreamClosedError
    from tornado.websocket import WebSocketClosedError

    from voila_app.server import quiet_loop_errors

    async def fail(exc: BaseException) -> None:
        raise exc

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(quiet_loop_errors)
        for exc in (WebSocketClosedError(), StreamClosedError(), ValueError("lost in a task")):
            asyncio.ensure_future(fail(exc))  # noqa: RUF006 - unawaited on purpose: what a lost write does
        await asyncio.sleep(0.05)
        gc.collect()  # the finished tasks are freed: their unretrieved errors reported now

    caplog.set_level(logging.INFO)
    asyncio.run(scenario())
    gc.collect()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["Unexpected error in the server's event loop: ValueError: lost in a task"], lines
