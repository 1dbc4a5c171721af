"""Booth mode inside the Voila server (loaded by ``voila_app/config/voila.py`` only).

- :func:`visitor_cookie` runs before every page request (:class:`_VisitorPage`): a browser without a valid
  visitor cookie gets a new signed one and is redirected once to the same page, so the request
  that starts (or is handed) a kernel always carries it (Voila passes the ``Cookie`` header to the kernel as
  ``HTTP_COOKIE``; the kernel verifies it, see :mod:`voila_app.identity`).
- **Warm kernels** (``BoothVoila.preheat_kernels``, default 1): Voila's kernel pool keeps kernels that already
  imported the app, waiting for a page (:func:`voila_app.identity.receive_request`). The page request that takes
  one makes its visitor the kernel's owner (:class:`_ClaimOnHandOut`) and Voila sends it the request's headers over
  ``/voila/query/<kernel>``, a route only a kernel of this server can read (:class:`_KernelQuery`: an HMAC of the
  kernel id under the booth secret); the kernel then verifies the cookie as a cold one does. Warm kernels count
  toward ``max_kernels``; with none ready a page starts its kernel as before.
- :class:`BoothKernelManager` caps live kernels (``max_kernels``; beyond it the page is a friendly
  HTTP 503 "the booth is full" that refreshes itself), keeps at most ``max_kernels_per_visitor``
  per visitor (a reload replaces the visitor's oldest kernel), and culls a kernel whose browser
  has been gone for ``cull_idle_timeout`` seconds even while its widgets still stream updates
  (Jupyter's own rule also waits for the kernel to be inactive, which never happens while a job
  it follows is training).
- :class:`BoothVoila` (``python -m voila_app``) is Voila with the booth's bounds on what a script can do:
  a kernel's websocket and REST routes answer 403 unless the request's verified visitor cookie owns
  that kernel (no ``/api/...`` route lists kernels), frames from the browser are capped
  (``websocket_max_message_size``), so are the messages a second per kernel and its connections
  (:class:`BoothKernelSocket`), new visitor cookies are rate-limited per client address (a 429
  page), and crafted template/static URLs are a plain 404 (no traceback in the log, no path anywhere).
- Errors cannot flood or leak (:class:`_BoothErrors` on every route): tornado's plain error page (Jupyter's failed in
  standalone Voila, turning ``/logout`` into a 500 with ~120 lines of traceback), ``/login`` and ``/logout`` sent to
  the app (:class:`NoAccountsHandler`), an unexpected error one rate-limited log line (:func:`log_limited`; its
  traceback with ``BoothVoila.log_tracebacks``), and writes to a websocket whose browser left dropped quietly
  (:class:`_QuietWrites`, :func:`quiet_loop_errors`).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
import os
import re
import time
import warnings
from asyncio import Future
from collections.abc import Awaitable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from jupyter_server.services.kernels.websocket import KernelWebsocketHandler
from jupyter_server.utils import url_path_join
from tornado.httputil import HTTPServerRequest
from tornado.iostream import StreamClosedError
from tornado.log import access_log
from tornado.web import Finish, HTTPError, RequestHandler, StaticFileHandler
from tornado.websocket import WebSocketClosedError, WebSocketHandler
from traitlets import Bool, Float, Integer, Unicode, default
from traitlets.config import Config
from voila.app import Voila
from voila.handler import BaseVoilaHandler, VoilaHandler
from voila.request_info_handler import RequestInfoSocketHandler
from voila.shutdown_kernel_handler import VoilaShutdownKernelHandler

from voila_app import PLOTLY_BUNDLE_PATH, identity, limits

log = logging.getLogger("voila_app")

RETRY_ARG = "visitor"  # marks the redirect after setting the cookie (a browser that refuses cookies)

NO_COOKIES_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Blueprint Playground: cookies needed</title>
<style>body{font-family:system-ui,sans-serif;max-width:36em;margin:4em auto;color:#222}</style></head>
<body><h1>Cookies needed</h1>
<p>The booth remembers your training jobs with one cookie (a random visitor number, nothing else).
Allow cookies for this site, then <a href="{url}">try again</a>.</p></body></html>
"""


TOO_MANY_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Blueprint Playground: one moment</title>
<meta http-equiv="refresh" content="{seconds}">
<style>body{font-family:system-ui,sans-serif;max-width:36em;margin:4em auto;color:#222}</style></head>
<body><h1>One moment, please</h1>
<p>Many new visitors have just arrived from your network. This page tries again by itself in
{seconds} seconds.</p></body></html>
"""

GATE_SETTING = "playground_new_visitor_gate"  # the tornado setting BoothVoila puts the gate in
SOCKETS_SETTING = "playground_kernel_sockets"  # ... and the kernel websockets' bounds (limits.KernelSockets)


class NewVisitorGate:
    """The rate limit on new visitor cookies per client address (see :mod:`voila_app.limits`)."""

    def __init__(self, settings: limits.Limits) -> None:
        self.bucket = limits.TokenBucket(settings.new_visitors_per_minute, settings.new_visitors_burst)
        self.trusted_proxies = settings.trusted_proxies
        self.refusal_log = limits.Throttle(limits.CLOSE_LOG_SECONDS)  # a flood of refusals is one line per address

    def client(self, request: HTTPServerRequest) -> str:
        peer = request.remote_ip or ""  # Voila's server does not set xheaders: this is the socket's peer
        return limits.client_address(peer, request.headers.get("X-Forwarded-For"), self.trusted_proxies)

    def wait_seconds(self, request: HTTPServerRequest) -> tuple[str, float]:
        """(the client's address, 0 when it may get a new visitor cookie now, else seconds to wait)."""
        client = self.client(request)
        return client, self.bucket.take(limits.bucket_key(client))


_default_gate: NewVisitorGate | None = None


def _gate(req: RequestHandler) -> NewVisitorGate:
    global _default_gate
    gate = req.settings.get(GATE_SETTING)
    if gate is None:  # Voila itself with our config file: the default limits
        _default_gate = _default_gate or NewVisitorGate(limits.Limits())
        gate = _default_gate
    return gate


_default_sockets: limits.KernelSockets | None = None


def _sockets(req: RequestHandler) -> limits.KernelSockets:
    global _default_sockets
    sockets = req.settings.get(SOCKETS_SETTING)
    if sockets is None:
        _default_sockets = _default_sockets or limits.KernelSockets()
        sockets = _default_sockets
    return sockets


def _secret() -> str:
    secret = os.environ.get(identity.SECRET_ENV, "")
    if len(secret) < identity.MIN_SECRET_CHARS:  # `playground app --booth` always sets it
        raise HTTPError(500, "booth mode without %s", identity.SECRET_ENV)
    return secret


def _with_query(uri: str, **params: str) -> str:
    parts = urlsplit(uri)
    query = "&".join(q for q in (parts.query, urlencode(params)) if q)
    return urlunsplit(("", "", parts.path, query, ""))


def _without_query_arg(uri: str, name: str) -> str:
    parts = urlsplit(uri)
    kept = [q for q in parts.query.split("&") if q and q.split("=", 1)[0] != name]
    return urlunsplit(("", "", parts.path, "&".join(kept), ""))


def visitor_cookie(req: RequestHandler) -> None:
    """Give a browser without a valid visitor cookie a new one, then send it back to the same page."""
    secret = _secret()
    if identity.verify(secret, req.get_cookie(identity.COOKIE_NAME)):
        return None  # the kernel Voila starts next reads and verifies the same cookie
    gate = _gate(req)
    client, wait = gate.wait_seconds(req.request)
    if wait > 0:
        seconds = max(5, math.ceil(wait))
        if (passed := gate.refusal_log.passes(client)) is not None:
            count, since = passed
            log.warning(
                "New visitors from %s over the rate limit: HTTP 429 to %d request(s) in %.0f s, retry after %d s",
                client,
                count,
                since,
                seconds,
            )
        req.set_status(429)
        req.set_header("Retry-After", str(seconds))
        req.set_header("Cache-Control", "no-store")
        raise Finish(TOO_MANY_PAGE.replace("{seconds}", str(seconds)))
    req.set_cookie(
        identity.COOKIE_NAME,
        identity.sign(secret, identity.new_visitor_id()),
        expires_days=identity.MAX_AGE_DAYS,
        httponly=True,
        samesite="Lax",
        secure=req.request.protocol == "https",
    )
    req.set_header("Cache-Control", "no-store")
    if req.get_argument(RETRY_ARG, None) is not None:  # we were here already: cookies are off
        req.set_status(400)
        url = _without_query_arg(req.request.uri or "/", RETRY_ARG)
        raise Finish(NO_COOKIES_PAGE.replace("{url}", url or "/"))
    req.redirect(_with_query(req.request.uri or "/", **{RETRY_ARG: "new"}))
    raise Finish()


class BoothKernelManager(AsyncMappingKernelManager):
    """A kernel manager with a cap on live kernels, per-visitor replacement and fast culling."""

    max_kernels = Integer(16, config=True, help="Live visitor kernels at most; beyond: HTTP 503 'the booth is full'.")
    max_kernels_per_visitor = Integer(
        2, config=True, help="Kernels one visitor may hold; a new page load replaces the oldest beyond this."
    )
    page_load_grace = Integer(
        120, config=True, help="Seconds a new kernel may wait for its browser's first connection (slow page loads)."
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._starting = 0
        self._visitor_of: dict[str, str] = {}
        self._disconnected_since: dict[str, float] = {}
        self._shutting_down: set[str] = set()
        self._replacing: set[asyncio.Future[None]] = set()  # shutdowns the page that replaced them does not wait for

    # -- accounting ----------------------------------------------------------------------------

    @property
    def live_kernels(self) -> int:
        return len(self.list_kernel_ids()) + self._starting

    def owner_of(self, kernel_id: str) -> str | None:
        """The visitor whose page load started the kernel (None: unknown kernel, no visitor, or a kernel being
        shut down: a websocket for it would wait for a kernel that is going away)."""
        if kernel_id not in self or kernel_id in self._shutting_down:
            return None
        return self._visitor_of.get(kernel_id)

    def kernels_of(self, visitor: str) -> list[str]:
        """The visitor's live kernels (none being shut down), oldest first."""
        return [k for k, v in self._visitor_of.items() if v == visitor and k in self and k not in self._shutting_down]

    async def start_kernel(self, *args: Any, **kwargs: Any) -> str:
        if kwargs.get("kernel_id") is not None and kwargs["kernel_id"] in self:
            return await super().start_kernel(*args, **kwargs)
        visitor = identity.visitor_from_environ(kwargs.get("env") or {})
        if visitor:
            await self._make_room_for(visitor)
        if self.live_kernels >= self.max_kernels:
            live, cap = self.live_kernels, self.max_kernels
            self.log.warning("Booth full: %d live kernels (max %d); page load refused", live, cap)
            raise HTTPError(503, "the booth is full (%d of %d places taken)", live, cap)
        self._starting += 1
        try:
            kernel_id = await super().start_kernel(*args, **kwargs)
        finally:
            self._starting -= 1
        if visitor:
            self._visitor_of[kernel_id] = visitor
        # No browser yet: it connects once the page has rendered (the app notebook run in this kernel,
        # which takes long on a busy machine), so the clock starts later than for a browser that left.
        self._disconnected_since[kernel_id] = time.monotonic() + self.page_load_grace
        return kernel_id

    async def claim(self, kernel_id: str, visitor: str | None) -> None:
        """A warm kernel handed to a page request: ``visitor`` owns it from now on (None: nobody, so no route of it
        answers), beyond the per-visitor cap their oldest kernel goes, and the culling clock waits for the page."""
        if visitor:
            await self._make_room_for(visitor, adding=False)
            self._visitor_of[kernel_id] = visitor
        self._disconnected_since[kernel_id] = time.monotonic() + self.page_load_grace

    def refill(self) -> None:
        """Top up the warm kernels after one went away (nothing without preheating)."""

    async def _make_room_for(self, visitor: str, *, adding: bool = True) -> None:
        """Shut down the visitor's oldest kernels (unconnected ones first) beyond the per-visitor cap,
        or one of them when the booth is full and a kernel is about to be started for them (``adding``: a reload
        must not lock its owner out)."""
        mine = self.kernels_of(visitor)
        excess = len(mine) + 1 - max(1, self.max_kernels_per_visitor)
        if adding and mine and self.live_kernels >= self.max_kernels:
            excess = max(excess, 1)  # a full booth: a returning visitor's reload takes over their own seat
        if excess <= 0:
            return
        by_preference = sorted(mine, key=lambda k: (self._kernel_connections.get(k, 0) > 0, mine.index(k)))
        for kernel_id in by_preference[:excess]:
            self.log.info("Replacing visitor kernel %s (a newer page load by the same visitor)", kernel_id)
            if adding:  # its seat is needed first
                await self.shutdown_kernel(kernel_id)
            else:  # a warm kernel taken: no seat needed, so the page does not wait for the old kernel to go
                self._shutting_down.add(kernel_id)  # refused from now on, and no longer one of the visitor's
                task = asyncio.ensure_future(self.shutdown_kernel(kernel_id))
                self._replacing.add(task)
                task.add_done_callback(self._replacing.discard)

    async def shutdown_kernel(self, kernel_id: str, *args: Any, **kwargs: Any) -> None:
        self._shutting_down.add(kernel_id)  # culled, replaced or closed by its page: refused from now on
        try:
            await super().shutdown_kernel(kernel_id, *args, **kwargs)
        finally:
            self._shutting_down.discard(kernel_id)
            self._visitor_of.pop(kernel_id, None)
            self._disconnected_since.pop(kernel_id, None)
            RequestInfoSocketHandler._cache.pop(kernel_id, None)  # a request never read: its cookie kept no longer
        self.refill()  # a seat is free: a warm kernel may take it

    # -- culling -------------------------------------------------------------------------------

    def notify_connect(self, kernel_id: str) -> None:
        super().notify_connect(kernel_id)
        self._disconnected_since.pop(kernel_id, None)

    def notify_disconnect(self, kernel_id: str) -> None:
        super().notify_disconnect(kernel_id)
        if kernel_id in self and not self._kernel_connections.get(kernel_id, 0):
            self._disconnected_since[kernel_id] = time.monotonic()

    async def cull_kernel_if_idle(self, kernel_id: str) -> None:
        since = self._disconnected_since.get(kernel_id)
        if (
            since is not None
            and self.cull_idle_timeout > 0
            and not self._kernel_connections.get(kernel_id, 0)
            and time.monotonic() - since > self.cull_idle_timeout
        ):
            self.log.warning(
                "Culling kernel %s: no browser connected for %d seconds", kernel_id, time.monotonic() - since
            )
            await self.shutdown_kernel(kernel_id)
            return
        await super().cull_kernel_if_idle(kernel_id)


# -- the Voila server's routes --------------------------------------------------------------------


def request_visitor(handler: RequestHandler) -> str | None:
    """The verified visitor id of a request's cookie (None: no cookie, or a forged/expired one)."""
    secret = os.environ.get(identity.SECRET_ENV, "")
    if len(secret) < identity.MIN_SECRET_CHARS:
        return None
    return identity.verify(secret, handler.get_cookie(identity.COOKIE_NAME))


def _route_kernel_id(handler: RequestHandler) -> str:
    """The kernel id a route's URL names (its ``kernel_id`` group, else its first group; "" for none)."""
    return handler.path_kwargs.get("kernel_id") or (handler.path_args[0] if handler.path_args else "")


# -- errors and the log: no 500 from a route a visitor reaches, no traceback, no flood ------------------------------

_error_lines = limits.LineBudget(limits.ERROR_LINES_PER_MINUTE)  # unexpected errors, per kind
_client_error_lines = limits.LineBudget(limits.CLIENT_ERROR_LINES_PER_MINUTE)  # other 4xx access lines, per address


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


_log_tracebacks = _env_flag(limits.LOG_TRACEBACKS_ENV)  # BoothVoila.log_tracebacks sets it when the server starts


def log_limited(kind: str, line: str, *, level: int = logging.ERROR, exc_info: Any = None) -> bool:
    """``line`` in the server's log unless ``kind`` is over its budget (``limits.ERROR_LINES_PER_MINUTE``; the next
    line that gets through says how many were held back), with the traceback only when the operator asked for
    tracebacks (``BoothVoila.log_tracebacks``). False: held back."""
    held = _error_lines.passes(kind)
    if held is None:
        return False
    if held:
        line += f" (suppressed {held} similar)"
    log.log(level, line, exc_info=exc_info if _log_tracebacks and exc_info is not None else None)
    return True


def _one_line(exc: BaseException | None) -> str:
    """An exception as ``Type: first line of its message`` (at most 300 characters of it)."""
    if exc is None:
        return "unknown error"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def quiet_loop_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's handler of errors nobody awaited: a browser gone while something was still being sent to it
    is no error at all; anything else is one rate-limited line (not asyncio's traceback each)."""
    exc = context.get("exception")
    if isinstance(exc, (WebSocketClosedError, StreamClosedError)):
        return
    what = _one_line(exc) if exc is not None else str(context.get("message", ""))[:300]
    kind = f"loop {type(exc).__name__}" if exc is not None else f"loop {what}"
    log_limited(kind, f"Unexpected error in the server's event loop: {what}", exc_info=exc)


class _BoothErrors(RequestHandler):
    """Every route of the booth: an error page that cannot fail itself (Jupyter's templated one does in standalone
    Voila: no ``static_path``, so every error became a 500 with three tracebacks), no traceback to the visitor, and
    an unexpected error is one log line (:func:`log_limited`)."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if isinstance(self, BaseVoilaHandler):  # the app's own pages (e.g. 503 "the booth is full")
            try:
                super().write_error(status_code, **kwargs)
                return
            except Exception:
                self.clear()
                self.set_status(status_code)
        if isinstance(self, APIHandler):  # JSON, as Jupyter's, without its "wrote error" line per request
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"message": self._reason}))
            return
        RequestHandler.write_error(self, status_code)  # tornado's plain page, never a traceback

    def log_exception(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        route = type(self).__name__
        if isinstance(value, HTTPError):  # an answer, not an error: tornado's line (if any) within the budget
            message = value.get_message()
            if message:
                line = f"{value.status_code} {self._request_summary()}: {message}"
                log_limited(f"{value.status_code} {route}", line, level=logging.WARNING)
            return
        line = f"Unexpected error in {self._request_summary()}: {_one_line(value)}"
        log_limited(f"{getattr(typ, '__name__', typ)} {route}", line, exc_info=(typ, value, tb))


class _PlainErrors(_BoothErrors):
    """Tornado's plain error page whatever the route (see :class:`_BoothErrors`)."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        RequestHandler.write_error(self, status_code)  # no traceback, whatever serve_traceback says


def _retrieved(future: Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # a browser gone mid-write: nothing to report, and asyncio then reports nothing either


class _QuietWrites(WebSocketHandler):
    """A websocket whose browser has gone drops what is still sent to it. Tornado's write then fails in a task nobody
    awaits (Jupyter's kernel socket, Voila's query socket), and asyncio logged "Task exception was never retrieved"
    with two tracebacks each time a tab closed; a write after the close raised, and Jupyter logged an empty warning."""

    def write_message(self, message: bytes | str | dict[str, Any], binary: bool = False) -> Future[None]:
        try:
            sent = super().write_message(message, binary)
        except WebSocketClosedError:
            sent = Future()
            sent.set_result(None)
            return sent
        sent.add_done_callback(_retrieved)
        return sent


class NoAccountsHandler(_PlainErrors):
    """``/login`` and ``/logout``. The booth has no accounts (a visitor is a random id in a signed cookie), so both
    send the browser to the app and change nothing. No cookie is cleared: a logout that any page could trigger (a
    link, an image) would cut visitors off from their running jobs, and a visitor gains nothing by dropping their id.
    Any method (nothing changes, so no XSRF token is asked); the log gets one line per address every 10 s."""

    def check_xsrf_cookie(self) -> None:
        return None

    def _to_app(self, *args: Any, **kwargs: Any) -> None:
        self.set_header("Cache-Control", "no-store")
        to = self.settings.get("base_url") or "/"
        self.redirect(to, status=302 if self.request.method in ("GET", "HEAD") else 303)

    get = head = post = put = delete = patch = _to_app


class _OwnedKernelRoute(RequestHandler):
    """A route naming a kernel: 403 unless the request's verified visitor started that kernel."""

    def prepare(self) -> Awaitable[None] | None:
        kernel_id = _route_kernel_id(self)
        manager = self.settings.get("kernel_manager")
        owner = manager.owner_of(kernel_id) if isinstance(manager, BoothKernelManager) else None
        visitor = request_visitor(self)
        if owner is None or visitor != owner:
            raise HTTPError(403)  # the same for an unknown kernel: no probing
        return super().prepare()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if status_code == 403:  # refused by the owner check: tornado's plain page (Jupyter's logs a line for each)
            RequestHandler.write_error(self, status_code, **kwargs)
            return
        super().write_error(status_code, **kwargs)


_page_visitor: contextvars.ContextVar[str | None] = contextvars.ContextVar("playground_page_visitor", default=None)


class _VisitorPage(RequestHandler):
    """The page route: the visitor cookie (:func:`visitor_cookie`) before anything else, and the verified visitor
    known to the kernel manager while it hands this request a warm kernel (:class:`_ClaimOnHandOut`)."""

    async def prepare(self) -> None:
        result = super().prepare()
        if result is not None:
            await result
        path = self.path_args[0] if self.path_args else ""
        if self._finished or (getattr(self, "notebook_path", None) and path):
            return  # answered already, or a file URL Voila redirects: no page, no kernel, no new visitor
        visitor_cookie(self)

    async def get(self, *args: Any, **kwargs: Any) -> None:
        token = _page_visitor.set(request_visitor(self))
        try:
            await super().get(*args, **kwargs)
        finally:
            _page_visitor.reset(token)


class _ClaimOnHandOut:
    """Mixed into the pooling kernel manager Voila derives from :class:`BoothKernelManager` when it preheats: the
    page request that takes a warm kernel gives it its owner (:meth:`BoothKernelManager.claim`); a warm kernel is
    started only while the booth has a free seat, and again when one frees up; one that failed to start is dropped
    from the pool (the page then starts its own kernel, or is told the booth is full)."""

    _closing = False
    _pools: dict[str, list[Any]]
    notebook_path: str | None

    async def get_rendered_notebook(self, notebook_name: str, *args: Any, **kwargs: Any) -> Any:
        rendered = await super().get_rendered_notebook(notebook_name, *args, **kwargs)  # type: ignore[misc]
        await self.claim(rendered[2], _page_visitor.get())  # type: ignore[attr-defined]
        return rendered

    def _drop_failed(self, notebook_name: str | None) -> None:
        pool = self._pools.get(notebook_name or "", [])
        for task in [t for t in pool if t.done() and (t.cancelled() or t.exception() is not None)]:
            pool.remove(task)
            why = "cancelled" if task.cancelled() else type(task.exception()).__name__
            log.warning("A warm kernel did not start (%s); dropped from the pool", why)

    def get_pool_size(self, notebook_name: str) -> int:
        self._drop_failed(notebook_name)
        return super().get_pool_size(notebook_name)  # type: ignore[misc]

    def fill_if_needed(self, delay: float | None = None, notebook_name: str | None = None, **kwargs: Any) -> None:
        self._drop_failed(notebook_name)
        if self._closing or self.live_kernels >= self.max_kernels:  # type: ignore[attr-defined]
            return  # no free seat: refilled when a kernel goes (refill)
        super().fill_if_needed(delay, notebook_name, **kwargs)  # type: ignore[misc]

    def refill(self) -> None:
        if self.notebook_path is not None:
            self.fill_if_needed(notebook_name=self.notebook_path)

    async def shutdown_all(self, *args: Any, **kwargs: Any) -> None:
        self._closing = True  # the server is stopping: no warm kernel in place of the ones going
        await super().shutdown_all(*args, **kwargs)  # type: ignore[misc]


WARM_REFILL_DELAY = 5.0  # seconds after a warm kernel is taken before its successor starts: not while the page renders


def preheating(manager: BoothKernelManager) -> BoothKernelManager:
    """``manager`` (an instance of the class Voila derived for its kernel pool) with :class:`_ClaimOnHandOut`."""
    cls = type(manager)
    manager.__class__ = type(f"Booth{cls.__name__}", (_ClaimOnHandOut, cls), {"__module__": __name__})
    manager.fill_delay = WARM_REFILL_DELAY  # type: ignore[attr-defined]
    return manager


class _KernelQuery(WebSocketHandler):
    """Voila's ``/voila/query/<kernel>``: a warm kernel waits there for the request that takes it (with the
    visitor's cookie). Only that kernel may connect: the request must carry
    :func:`voila_app.identity.kernel_proof` of the kernel id (403 otherwise, before the upgrade); the request is
    forgotten once delivered."""

    async def get(self, *args: Any, **kwargs: Any) -> None:
        kernel_id = _route_kernel_id(self)
        proof = self.request.headers.get(identity.KERNEL_PROOF_HEADER, "")
        if not identity.kernel_proof_ok(_secret(), kernel_id, proof):
            raise HTTPError(403)
        await super().get(*args, **kwargs)

    def open(self, *args: Any, **kwargs: Any) -> None:
        super().open(*args, **kwargs)
        kernel_id = _route_kernel_id(self)
        RequestInfoSocketHandler._cache.pop(kernel_id, None)  # delivered on open, or sent live later


class BoothKernelSocket(WebSocketHandler):
    """The kernel websocket's bounds (:class:`voila_app.limits.KernelSockets`, one per server): a connection
    beyond the kernel's few (waiting for the kernel or open), or while its messages are over the rate, is
    refused at the upgrade (HTTP 429); a message over the rate closes its connection (1008, policy
    violation) before anything parses or queues it; the rest that arrive before it is gone are dropped unread,
    and the kernel's replies to it unsent. One log line per kernel every 10 s at most, with a count."""

    _over_rate = False

    async def get(self, *args: Any, **kwargs: Any) -> None:
        kernel_id = _route_kernel_id(self)
        sockets = _sockets(self)
        refused = sockets.connect(kernel_id)
        if refused is not None:
            why, wait = refused
            self.set_status(429)
            self.set_header("Retry-After", str(max(1, math.ceil(wait))))
            self.finish(f"429: {why}")
            return
        try:
            await super().get(*args, **kwargs)
        finally:
            sockets.disconnect(kernel_id)

    def on_message(self, message: str | bytes) -> Awaitable[None] | None:
        if self._over_rate:
            return None  # closing: dropped unread
        sockets = _sockets(self)
        kernel_id = getattr(self, "kernel_id", "")
        if sockets.message(kernel_id):
            return super().on_message(message)
        self._over_rate = True
        self.close(1008, "over the message rate")
        if (passed := sockets.close_log.passes(kernel_id)) is not None:
            count, seconds = passed
            what = "a websocket" if count == 1 else f"{count} websockets in {seconds:.0f} s"
            log.warning(
                "Kernel %s: %s over the message rate (burst %d, %g a second); closed (1008)",
                kernel_id,
                what,
                sockets.burst,
                sockets.per_second,
            )
        return None

    def write_message(self, message: bytes | str | dict[str, Any], binary: bool = False) -> Future[None]:
        if self._over_rate:  # closing: the kernel's replies are dropped, not a "closed" warning each
            done: Future[None] = Future()
            done.set_result(None)
            return done
        return super().write_message(message, binary)


class _NotFoundOnBadPath(StaticFileHandler):
    """A static route: a path it cannot serve (malformed, outside its roots, absent) is a plain 404, with no
    traceback or file system path in the log or the response."""

    async def get(self, path: str, include_body: bool = True) -> None:
        try:
            await super().get(path, include_body=include_body)
        except HTTPError as exc:
            if exc.status_code in (403, 404):
                raise HTTPError(404) from None  # its log message may name a server path
            raise
        except Exception:
            if self._headers_written:
                raise
            raise HTTPError(404) from None


class RefusedHandler(_PlainErrors):
    """Any other ``/api/...`` route (kernel lists, sessions, actions): 403, and no kernel started."""

    def prepare(self) -> None:
        raise HTTPError(403)


def booth_handler_class(pattern: str, handler: type[RequestHandler]) -> type[RequestHandler]:
    """The class a route of Voila's gets in booth mode (the same one when nothing changes)."""
    mixins: list[type] = []
    if issubclass(handler, RequestInfoSocketHandler):  # read by a warm kernel, which has no visitor cookie
        bases = (_KernelQuery, _QuietWrites, _BoothErrors, handler)
        return type(f"Booth{handler.__name__}", bases, {"__module__": __name__})
    if issubclass(handler, VoilaHandler):
        mixins.append(_VisitorPage)
    if "(?P<kernel_id>" in pattern or issubclass(handler, VoilaShutdownKernelHandler):
        mixins.append(_OwnedKernelRoute)
    if issubclass(handler, KernelWebsocketHandler):
        mixins.append(BoothKernelSocket)
    if issubclass(handler, StaticFileHandler):
        mixins.append(_NotFoundOnBadPath)
    if issubclass(handler, WebSocketHandler):
        mixins.append(_QuietWrites)
    if issubclass(handler, JupyterHandler) and issubclass(handler, (StaticFileHandler, WebSocketHandler)):
        mixins.append(_PlainErrors)
    else:
        mixins.append(_BoothErrors)  # every route: no error page that fails, one log line per unexpected error
    return type(f"Booth{handler.__name__}", (*mixins, handler), {"__module__": __name__})


_BUNDLE_DIR, _BUNDLE_NAME = PLOTLY_BUNDLE_PATH.rsplit("/", 1)
PLOTLY_BUNDLE_ROUTE = f"/{re.escape(_BUNDLE_DIR)}/({re.escape(_BUNDLE_NAME)})"  # that one file


def plotly_bundle_file() -> Path:
    """plotly's FigureWidget front end (an ES module of ~5 MB), as installed."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"


class _PlotlyBundle(_NotFoundOnBadPath, _PlainErrors):
    """plotly's widget bundle as a static file the browser caches (``?v=VERSION``: a year), instead of ~5 MB of
    widget state sent over every page's websocket (see :func:`widgets.monitor.loss_chart`)."""

    def get_absolute_path(self, root: str, path: str) -> str:
        return str(plotly_bundle_file())  # the route's pattern admits only this file's name

    def get_content_type(self) -> str:
        return "text/javascript"


class BoothVoila(Voila):
    """Voila for a public booth: kernel routes only for their visitor, bounded websocket frames, messages and
    connections per kernel, a rate limit on new visitors per client address, plain 404s for bad static URLs.
    ``playground app --booth`` runs it (``python -m voila_app``) and sets the limits from its flags."""

    new_visitors_per_minute = Float(
        limits.NEW_VISITORS_PER_MINUTE, config=True, help="New visitor cookies a minute per client address."
    )
    new_visitors_burst = Integer(limits.NEW_VISITORS_BURST, config=True, help="New visitor cookies at once.")
    trusted_proxies = Unicode(
        "", config=True, help="Comma-separated proxy addresses/networks whose X-Forwarded-For is trusted."
    )
    websocket_max_bytes = Integer(
        limits.WEBSOCKET_MAX_BYTES, config=True, help="Largest websocket frame from a browser; bigger: closed."
    )
    websocket_messages_burst = Integer(
        limits.WEBSOCKET_MESSAGES_BURST, config=True, help="Websocket messages from browsers per kernel at once."
    )
    websocket_messages_per_second = Float(
        limits.WEBSOCKET_MESSAGES_PER_SECOND,
        config=True,
        help="Websocket messages a second per kernel from browsers, after the burst; more: that connection closed.",
    )

    preheat_kernels = Integer(
        1,
        config=True,
        help="Warm kernels kept ready (the app imported, waiting for a page); they count toward max_kernels. 0: none.",
    )
    log_tracebacks = Bool(
        config=True,
        help=f"Log unexpected errors with their traceback (default: one line each, rate-limited); "
        f"{limits.LOG_TRACEBACKS_ENV}=1 sets it.",
    )

    @default("log_tracebacks")
    def _log_tracebacks_from_environment(self) -> bool:
        return _env_flag(limits.LOG_TRACEBACKS_ENV)

    def booth_limits(self) -> limits.Limits:
        return limits.limits_from(
            {},
            per_minute=str(self.new_visitors_per_minute),
            burst=str(self.new_visitors_burst),
            trusted_proxies=self.trusted_proxies,
            websocket_max_bytes=str(self.websocket_max_bytes),
            messages_burst=str(self.websocket_messages_burst),
            messages_per_second=str(self.websocket_messages_per_second),
        )

    def init_settings(self) -> dict[str, Any]:
        warm = max(0, self.preheat_kernels)
        self.voila_configuration.preheat_kernel = warm > 0
        self.voila_configuration.default_pool_size = warm
        self.voila_configuration.prelaunch_hook = None  # the page route gives the cookie (_VisitorPage), warm or cold
        if self.ip and self.ip not in ("0.0.0.0", "localhost") and ":" not in self.ip:  # IPv4: no brackets needed
            os.environ["VOILA_APP_IP"] = self.ip  # where a warm kernel reaches this server (identity.receive_request)
        global _log_tracebacks
        _log_tracebacks = self.log_tracebacks
        settings = super().init_settings()
        if warm and isinstance(self.kernel_manager, BoothKernelManager):
            preheating(self.kernel_manager)
        booth = self.booth_limits()
        settings["websocket_max_message_size"] = booth.websocket_max_bytes
        settings["log_function"] = log_request
        settings[GATE_SETTING] = NewVisitorGate(booth)
        settings[SOCKETS_SETTING] = limits.KernelSockets.from_limits(booth)
        return settings

    def init_handlers(self) -> list[Any]:
        handlers: list[Any] = []
        for rule in super().init_handlers():
            if isinstance(rule, tuple) and len(rule) >= 2 and isinstance(rule[1], type):
                rule = (rule[0], booth_handler_class(rule[0], rule[1]), *rule[2:])
            handlers.append(rule)
        no_accounts = [url_path_join(self.server_url, route) for route in ("/login", "/logout")]
        handlers = [r for r in handlers if not (isinstance(r, tuple) and r[0] in no_accounts)]  # Jupyter's logout
        catch_all = url_path_join(self.server_url, r"/(.*)")
        at = next((i for i, r in enumerate(handlers) if isinstance(r, tuple) and r[0] == catch_all), len(handlers))
        handlers.insert(at, (url_path_join(self.server_url, r"/api/.*"), RefusedHandler))
        bundle = url_path_join(self.server_url, PLOTLY_BUNDLE_ROUTE)
        handlers.insert(at, (bundle, _PlotlyBundle, {"path": str(plotly_bundle_file().parent)}))
        handlers[at:at] = [(re.escape(route), NoAccountsHandler) for route in no_accounts]
        return handlers

    def start(self) -> None:
        with warnings.catch_warnings():  # the loop Voila is about to run (made already: its kernel pool queued on it)
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.get_event_loop().set_exception_handler(quiet_loop_errors)
        super().start()


_refusal_lines = limits.Throttle(limits.CLOSE_LOG_SECONDS)


def log_request(handler: RequestHandler) -> None:
    """Tornado's access log line, but a flood cannot fill the disk: a page refused over the new-visitor rate is left
    to the gate's own line (one per address every 10 s, with a count); other refusals (403, 429) and /login, /logout
    are one line per client address and status every 10 s, with the count of those held back; a 5xx is within the
    budget of unexpected errors (:func:`log_limited`); other 4xx at most ``CLIENT_ERROR_LINES_PER_MINUTE`` a minute
    per address and status."""
    status = handler.get_status()
    if status == 429 and isinstance(handler, _VisitorPage):
        return
    line = f"{status} {handler._request_summary()} {1000.0 * handler.request.request_time():.2f}ms"
    if status >= 500:
        log_limited(f"{status} {type(handler).__name__}", line)
        return
    if 400 <= status < 500 and status not in (403, 429):
        held = _client_error_lines.passes(f"{status} {handler.request.remote_ip}")
        if held is not None:
            access_log.warning(line + (f" (suppressed {held} similar)" if held else ""))
        return
    if status in (403, 429) or isinstance(handler, NoAccountsHandler):
        passed = _refusal_lines.passes(f"{status} {handler.request.remote_ip}")
        if passed is None:
            return
        held, since = passed[0] - 1, passed[1]
        write = access_log.info if status < 400 else access_log.warning
        write(line + (f" (and {held} more {status} to this address in {since:.0f} s)" if held else ""))
        return
    access_log.info(line)


main = BoothVoila.launch_instance


def configure(c: Config) -> None:
    """Booth settings for Voila's config file (the CLI of ``playground app --booth`` sets the numbers)."""
    c.VoilaConfiguration.http_header_envs = ["Cookie"]
    c.VoilaConfiguration.multi_kernel_manager_class = BoothKernelManager
