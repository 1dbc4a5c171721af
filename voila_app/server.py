"""Booth mode inside the Voila server (loaded by ``voila_app/config/voila.py`` only).

- :func:`prelaunch_hook` runs before Voila starts a visitor's kernel: a browser without a valid
  visitor cookie gets a new signed one and is redirected once to the same page, so the request
  that starts the kernel always carries it (Voila passes the ``Cookie`` header to the kernel as
  ``HTTP_COOKIE``; the kernel verifies it, see :mod:`voila_app.identity`).
- :class:`BoothKernelManager` caps live kernels (``max_kernels``; beyond it the page is a friendly
  HTTP 503 "the booth is full" that refreshes itself), keeps at most ``max_kernels_per_visitor``
  per visitor (a reload replaces the visitor's oldest kernel), and culls a kernel whose browser
  has been gone for ``cull_idle_timeout`` seconds even while its widgets still stream updates
  (Jupyter's own rule also waits for the kernel to be inactive, which never happens while a job
  it follows is training).
"""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado.web import Finish, HTTPError, RequestHandler
from traitlets import Integer
from traitlets.config import Config

from voila_app import identity

RETRY_ARG = "visitor"  # marks the redirect after setting the cookie (a browser that refuses cookies)

NO_COOKIES_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Blueprint Playground: cookies needed</title>
<style>body{font-family:system-ui,sans-serif;max-width:36em;margin:4em auto;color:#222}</style></head>
<body><h1>Cookies needed</h1>
<p>The booth remembers your training jobs with one cookie (a random visitor number, nothing else).
Allow cookies for this site, then <a href="{url}">try again</a>.</p></body></html>
"""


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


def prelaunch_hook(req: RequestHandler, notebook: Any, cwd: str) -> None:
    """Give a browser without a valid visitor cookie a new one, then send it back to the same page."""
    secret = _secret()
    if identity.verify(secret, req.get_cookie(identity.COOKIE_NAME)):
        return None  # the kernel Voila starts next reads and verifies the same cookie
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

    # -- accounting ----------------------------------------------------------------------------

    @property
    def live_kernels(self) -> int:
        return len(self.list_kernel_ids()) + self._starting

    def kernels_of(self, visitor: str) -> list[str]:
        """The visitor's live kernels, oldest first."""
        return [k for k, v in self._visitor_of.items() if v == visitor and k in self]

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

    async def _make_room_for(self, visitor: str) -> None:
        """Shut down the visitor's oldest kernels (unconnected ones first) beyond the per-visitor cap,
        or one of them when the booth is full (a reload must not lock its owner out)."""
        mine = self.kernels_of(visitor)
        excess = len(mine) + 1 - max(1, self.max_kernels_per_visitor)
        if mine and self.live_kernels >= self.max_kernels:
            excess = max(excess, 1)  # a full booth: a returning visitor's reload takes over their own seat
        if excess <= 0:
            return
        by_preference = sorted(mine, key=lambda k: (self._kernel_connections.get(k, 0) > 0, mine.index(k)))
        for kernel_id in by_preference[:excess]:
            self.log.info("Replacing visitor kernel %s (a newer page load by the same visitor)", kernel_id)
            await self.shutdown_kernel(kernel_id)

    async def shutdown_kernel(self, kernel_id: str, *args: Any, **kwargs: Any) -> None:
        try:
            await super().shutdown_kernel(kernel_id, *args, **kwargs)
        finally:
            self._visitor_of.pop(kernel_id, None)
            self._disconnected_since.pop(kernel_id, None)

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


def configure(c: Config) -> None:
    """Booth settings for Voila's config file (the CLI of ``playground app --booth`` sets the numbers)."""
    c.VoilaConfiguration.prelaunch_hook = prelaunch_hook
    c.VoilaConfiguration.http_header_envs = ["Cookie"]
    c.VoilaConfiguration.multi_kernel_manager_class = BoothKernelManager
