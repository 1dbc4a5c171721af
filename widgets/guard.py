"""The kernel's guard against hostile widget messages (standalone Voila drops ``execute_request`` but lets any
client send comm messages): every ``comm_open``/``comm_msg`` from the browser is checked for size and rate
before ipykernel sees it, the browser may open only a few comms, and a comm that fails logs one line to the
server's log (the kernel's real stderr) instead of sending a traceback with server paths to the browser. A flood
writes little: dropped messages are at most one line a second per reason, and so are repeated comm errors
("No such comm: ..."), each with a count of the ones since the last line.

Limits (settings, defaults sized for a booth on 2 cores / 24 GB; a legitimate page sends messages of at most a
few KB, ~30 per second while a slider is dragged, and opens 1-2 comms):
``PLAYGROUND_WIDGET_MAX_MESSAGE_BYTES`` (64 KiB in booth mode; the upload limit + 1 MiB otherwise),
``PLAYGROUND_WIDGET_MESSAGES_PER_SECOND`` (50, bursts of 500) and ``PLAYGROUND_WIDGET_MAX_CLIENT_COMMS`` (20).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from voila_app.limits import Throttle

COMM_LOGGERS = ("ipykernel.comm", "comm", "Comm")
BOOTH_MAX_MESSAGE_BYTES = 64 * 1024
RATE_BURST_SECONDS = 10  # the bucket holds this many seconds' worth of messages
LOG_SECONDS = 1.0  # one line at most this often per reason (dropped messages) or per kind of comm error
THROTTLED = "_playground_throttled"  # a log record's attribute: counted already, passes the filter


class _OneLine(logging.Formatter):
    """The message and the exception's type only: no traceback, no paths."""

    def format(self, record: logging.LogRecord) -> str:
        kind = f" ({record.exc_info[0].__name__})" if record.exc_info and record.exc_info[0] else ""
        return f"[playground.guard] {record.getMessage()}{kind}"


class RepeatedLines(logging.Filter):
    """The same line over and over (``No such comm: %s`` for every message to an unknown comm): one a second per
    logger and message, the one that passes counting those held back since the last."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.throttle = Throttle(LOG_SECONDS, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, THROTTLED, False):
            return True
        passed = self.throttle.passes(f"{record.name}:{record.msg}")
        if passed is None:
            return False
        count, seconds = passed
        if count > 1:
            record.msg = f"{record.msg} ({count} such lines in {seconds:.1f} s)"
        return True


def quiet_comm_errors() -> None:
    """Comm failures go to the kernel's real stderr as one line (repeats throttled), never to the browser."""
    for name in COMM_LOGGERS:
        logger = logging.getLogger(name)
        if any(getattr(h, "_playground_guard", False) for h in logger.handlers):
            continue
        handler = logging.StreamHandler(sys.__stderr__)
        handler.setFormatter(_OneLine())
        handler.addFilter(RepeatedLines())
        handler._playground_guard = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False


def _setting(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        return max(1, int(raw)) if raw else default
    except ValueError:
        return default


@dataclass
class Limits:
    max_message_bytes: int
    messages_per_second: int
    max_client_comms: int

    @classmethod
    def from_env(cls, *, booth: bool) -> Limits:
        from widgets.userdata import MAX_UPLOAD_BYTES

        size = BOOTH_MAX_MESSAGE_BYTES if booth else MAX_UPLOAD_BYTES + 1024 * 1024
        return cls(
            _setting("PLAYGROUND_WIDGET_MAX_MESSAGE_BYTES", size),
            _setting("PLAYGROUND_WIDGET_MESSAGES_PER_SECOND", 50),
            _setting("PLAYGROUND_WIDGET_MAX_CLIENT_COMMS", 20),
        )


def message_bytes(msg: dict[str, Any]) -> int:
    """The size of a message's content and binary buffers."""
    try:
        content = len(json.dumps(msg.get("content"), default=str))
    except (TypeError, ValueError):
        content = 0
    return content + sum(len(memoryview(b).cast("B")) for b in msg.get("buffers") or [])


class CommGuard:
    """Wraps a kernel's comm handlers; a refused message is dropped, with a line in the server's log at most once a
    second per reason ("dropped 57 widget messages in 1.0 s: more than 50 per second")."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self.tokens = float(limits.messages_per_second * RATE_BURST_SECONDS)
        self.last = clock()
        self.client_comms = 0
        self.dropped = 0
        self.log_lines = Throttle(LOG_SECONDS, clock)

    def _refuse(self, reason: str, why: str) -> bool:
        self.dropped += 1
        passed = self.log_lines.passes(reason)
        if passed is not None:
            count, seconds = passed
            what = "a widget message" if count == 1 else f"{count} widget messages in {seconds:.1f} s"
            logging.getLogger("ipykernel.comm").warning("dropped %s: %s", what, why, extra={THROTTLED: True})
        return False

    def allow(self, msg_type: str, msg: dict[str, Any]) -> bool:
        now = self.clock()
        capacity = self.limits.messages_per_second * RATE_BURST_SECONDS
        self.tokens = min(capacity, self.tokens + (now - self.last) * self.limits.messages_per_second)
        self.last = now
        if self.tokens < 1:
            return self._refuse("rate", f"more than {self.limits.messages_per_second} per second")
        self.tokens -= 1
        size = message_bytes(msg)
        if size > self.limits.max_message_bytes:
            return self._refuse("size", f"{size} bytes > {self.limits.max_message_bytes}")
        if msg_type == "comm_open":
            if self.client_comms >= self.limits.max_client_comms:
                return self._refuse("comms", f"the browser opened {self.client_comms} comms already")
            self.client_comms += 1
        return True

    def wrap(self, msg_type: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(stream: Any, ident: Any, msg: dict[str, Any]) -> Any:
            if self.allow(msg_type, msg):
                return handler(stream, ident, msg)
            return None

        guarded._playground_guard = self  # type: ignore[attr-defined]
        return guarded


def guard_kernel(*, booth: bool) -> CommGuard | None:
    """Install the guard in the running IPython kernel (once); None outside a kernel."""
    quiet_comm_errors()
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    handlers = getattr(kernel, "shell_handlers", None)
    if not isinstance(handlers, dict):
        return None
    existing = getattr(handlers.get("comm_msg"), "_playground_guard", None)
    if existing is not None:
        return existing
    guard = CommGuard(Limits.from_env(booth=booth))
    for msg_type in ("comm_open", "comm_msg"):
        if msg_type in handlers:
            handlers[msg_type] = guard.wrap(msg_type, handlers[msg_type])
    return guard
