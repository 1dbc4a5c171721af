"""Booth limits of the Voila server that need no server to test: the new-visitor rate limit per client
address (a token bucket), the client's address behind trusted proxies, the websocket message rate and
connections per kernel (:class:`KernelSockets`), and the settings' parsing.

Pure Python (no tornado, no Voila): ``playground app`` imports it to check its flags before it starts
Voila, and :mod:`voila_app.server` uses it for every page load without a valid visitor cookie.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

NEW_VISITORS_PER_MINUTE_ENV = "PLAYGROUND_BOOTH_NEW_VISITORS_PER_MINUTE"
NEW_VISITORS_BURST_ENV = "PLAYGROUND_BOOTH_NEW_VISITORS_BURST"
TRUSTED_PROXIES_ENV = "PLAYGROUND_BOOTH_TRUSTED_PROXIES"
WEBSOCKET_MAX_BYTES_ENV = "PLAYGROUND_BOOTH_WEBSOCKET_MAX_BYTES"
WEBSOCKET_MESSAGES_BURST_ENV = "PLAYGROUND_BOOTH_WEBSOCKET_MESSAGES_BURST"
WEBSOCKET_MESSAGES_PER_SECOND_ENV = "PLAYGROUND_BOOTH_WEBSOCKET_MESSAGES_PER_SECOND"

# A booth's visitors often share one NAT / Wi-Fi address: a burst of 30 new visitors at once, then 20 a minute.
NEW_VISITORS_PER_MINUTE = 20.0
NEW_VISITORS_BURST = 30
# The kernel's guard refuses widget messages over 64 KiB in booth mode; a page sends at most ~10 KB per frame
# (measured: the largest browser -> server frame of a page load and a form filled in is 9.5 KB).
WEBSOCKET_MAX_BYTES = 128 * 1024
# Websocket messages from the browsers of one kernel: a real page (Chromium, a 70 s visit: page load, a form
# filled in, Launch, the monitor) sends 35 in its busiest second and 365 in all; a flood queued every message in
# the server (261 MB -> 1.28 GB in 60 s). A new connection takes one second's worth, so reconnecting gains nothing.
WEBSOCKET_MESSAGES_BURST = 200
WEBSOCKET_MESSAGES_PER_SECOND = 50.0
WEBSOCKETS_PER_KERNEL = 4  # connections waiting or open per kernel; beyond: HTTP 429 (a page opens 1)
CLOSE_LOG_SECONDS = 10.0  # one log line per kernel at most this often about connections closed over the rate
# The server's log under a flood: unexpected errors (an exception, a 5xx) are one line each, at most this many a
# minute per kind (exception and route); other 4xx access lines at most this many a minute per status and address.
ERROR_LINES_PER_MINUTE = 5
CLIENT_ERROR_LINES_PER_MINUTE = 30
LOG_TRACEBACKS_ENV = "PLAYGROUND_BOOTH_LOG_TRACEBACKS"  # "1": unexpected errors are logged with their traceback
MAX_TRACKED_ADDRESSES = 10_000  # buckets kept at most (a full bucket is forgotten first: it is the default)
IPV6_PREFIX = 64  # one IPv6 client holds a whole /64: it shares one bucket


class SettingError(ValueError):
    """A booth setting with a value outside its allowed range; the message is one line naming it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Limits:
    """The Voila server's booth limits (see README "Run a booth")."""

    new_visitors_per_minute: float = NEW_VISITORS_PER_MINUTE
    new_visitors_burst: int = NEW_VISITORS_BURST
    trusted_proxies: tuple[Network, ...] = ()
    websocket_max_bytes: int = WEBSOCKET_MAX_BYTES
    websocket_messages_burst: int = WEBSOCKET_MESSAGES_BURST
    websocket_messages_per_second: float = WEBSOCKET_MESSAGES_PER_SECOND


def parse_number(name: str, text: str, low: float, high: float, unit: str) -> float:
    """A number setting from ``low`` to ``high``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # also refuses nan and inf
        shown = text.strip()[:60]
        raise SettingError(name, f"{name} {shown!r}: allowed: a number from {low:g} to {high:g} ({unit})")
    return value


def parse_rate(name: str, text: str) -> float:
    """New visitors per minute: a number from 0.1 to 100000."""
    return parse_number(name, text, 0.1, 100_000, "new visitors a minute")


def parse_int(name: str, text: str, low: int, high: int, unit: str) -> int:
    """An integer setting from ``low`` to ``high``."""
    try:
        value = int(text.strip())
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise SettingError(name, f"{name} {text.strip()[:60]!r}: allowed: an integer from {low} to {high} ({unit})")
    return value


def parse_trusted_proxies(name: str, text: str) -> tuple[Network, ...]:
    """Comma-separated IP addresses or networks (CIDR) of reverse proxies whose X-Forwarded-For is trusted."""
    networks = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise SettingError(
                name,
                f"{name} {item[:60]!r}: allowed: IP addresses or networks, comma-separated "
                "(e.g. 10.0.0.5,10.244.0.0/16)",
            ) from None
    return tuple(networks)


def limits_from(
    environ: Mapping[str, str],
    *,
    per_minute: str | None = None,
    burst: str | None = None,
    trusted_proxies: str | None = None,
    websocket_max_bytes: str | None = None,
    messages_burst: str | None = None,
    messages_per_second: str | None = None,
) -> Limits:
    """The limits from command-line values (named by their flag) or else the environment, else the defaults.

    Raises :class:`SettingError` with one line naming the flag or variable and the allowed values.
    """

    def pick(flag_value: str | None, flag: str, env: str) -> tuple[str, str] | None:
        if flag_value is not None:
            return flag, flag_value
        if environ.get(env, "").strip():
            return env, environ[env]
        return None

    limits = Limits()
    if given := pick(per_minute, "--booth-new-visitors-per-minute", NEW_VISITORS_PER_MINUTE_ENV):
        limits = replace(limits, new_visitors_per_minute=parse_rate(*given))
    if given := pick(burst, "--booth-new-visitors-burst", NEW_VISITORS_BURST_ENV):
        limits = replace(limits, new_visitors_burst=parse_int(*given, 1, 100_000, "new visitors at once"))
    if given := pick(trusted_proxies, "--booth-trusted-proxy", TRUSTED_PROXIES_ENV):
        limits = replace(limits, trusted_proxies=parse_trusted_proxies(*given))
    if given := pick(websocket_max_bytes, "--booth-websocket-max-bytes", WEBSOCKET_MAX_BYTES_ENV):
        limits = replace(limits, websocket_max_bytes=parse_int(*given, 16 * 1024, 64 * 1024 * 1024, "bytes"))
    if given := pick(messages_burst, "--booth-websocket-messages-burst", WEBSOCKET_MESSAGES_BURST_ENV):
        burst = parse_int(*given, 10, 100_000, "websocket messages per kernel at once")
        limits = replace(limits, websocket_messages_burst=burst)
    if given := pick(messages_per_second, "--booth-websocket-messages-per-second", WEBSOCKET_MESSAGES_PER_SECOND_ENV):
        rate = parse_number(*given, 1, 100_000, "websocket messages a second per kernel")
        limits = replace(limits, websocket_messages_per_second=rate)
    return limits


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().removeprefix("[").split("]")[0].split("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def client_address(peer: str, forwarded_for: str | None, trusted: Sequence[Network]) -> str:
    """The client's address: the socket's peer, unless the peer is a trusted proxy; then the right-most
    ``X-Forwarded-For`` entry that is not itself a trusted proxy (entries further left were written by
    the client and prove nothing). An untrusted peer's header is ignored, so a script cannot pick its
    own bucket; a trusted proxy's unreadable header counts as the proxy itself."""
    peer_address = _address(peer)
    if peer_address is None:
        return peer
    if not forwarded_for or not any(peer_address in net for net in trusted):
        return str(peer_address)
    hops = [hop for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            return str(peer_address)
        if not any(address in net for net in trusted):
            return str(address)
    return str(_address(hops[0])) if hops else str(peer_address)


def bucket_key(address: str) -> str:
    """The rate-limit bucket of a client address: the address itself, or its /64 for IPv6."""
    parsed = _address(address)
    if isinstance(parsed, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{parsed}/{IPV6_PREFIX}", strict=False))
    return str(parsed) if parsed is not None else address[:64]


class TokenBucket:
    """One token bucket per key: ``burst`` tokens, refilled at ``per_minute`` a minute.

    At most ``max_keys`` buckets are kept: beyond that, full buckets (the same as no bucket) go first,
    then the least recently used ones (an attacker with many addresses can only forget buckets, which
    gives a burst back to an address, never take tokens from another)."""

    def __init__(self, per_minute: float, burst: int, *, max_keys: int = MAX_TRACKED_ADDRESSES) -> None:
        if per_minute <= 0 or burst < 1:
            raise ValueError("per_minute must be > 0 and burst >= 1")
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def _tokens(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + max(0.0, now - at) * self.rate)

    def take(self, key: str, now: float | None = None, cost: float = 1.0) -> float:
        """Take ``cost`` tokens for ``key``: 0.0 when granted, else the seconds until they are available
        (a refused take takes nothing)."""
        now = time.monotonic() if now is None else now
        tokens = self._tokens(key, now)
        if tokens >= cost:
            self._buckets[key] = (tokens - cost, now)
            self._buckets.move_to_end(key)
            self._forget(now)
            return 0.0
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        return (cost - tokens) / self.rate

    def __len__(self) -> int:
        return len(self._buckets)

    def _forget(self, now: float) -> None:
        if len(self._buckets) <= self.max_keys:
            return
        for key in [k for k in self._buckets if self._tokens(k, now) >= self.burst]:
            del self._buckets[key]
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)


class Throttle:
    """At most one event a ``period`` per key gets through; the one that does counts those held back."""

    def __init__(self, period: float, clock: Callable[[], float] = time.monotonic, max_keys: int = 1000) -> None:
        self.period = period
        self.clock = clock
        self.max_keys = max_keys
        self._last: OrderedDict[str, tuple[float, int]] = OrderedDict()  # key -> (when one got through, held since)

    def passes(self, key: str) -> tuple[int, float] | None:
        """None: held back (counted). Else (events since the last one that got through, this one included;
        the seconds since that one, 0.0 for a key's first)."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.period:
            self._last[key] = (last[0], last[1] + 1)
            return None
        self._last[key] = (now, 0)
        self._last.move_to_end(key)
        while len(self._last) > self.max_keys:
            self._last.popitem(last=False)
        return (1, 0.0) if last is None else (last[1] + 1, now - last[0])


class LineBudget:
    """At most ``lines`` log lines a ``period`` per kind; the rest are held back and counted, and the next line of
    that kind that gets through says how many (``suppressed K similar``)."""

    def __init__(
        self, lines: int, period: float = 60.0, clock: Callable[[], float] = time.monotonic, max_kinds: int = 1000
    ) -> None:
        self.lines = lines
        self.period = period
        self.clock = clock
        self.max_kinds = max_kinds
        self._kinds: OrderedDict[str, tuple[float, int, int]] = OrderedDict()  # kind -> (window start, used, held)

    def passes(self, kind: str) -> int | None:
        """None: held back (counted). Else the number of lines of this kind held back since the last one that got
        through (0 when none)."""
        now = self.clock()
        start, used, held = self._kinds.get(kind, (now, 0, 0))
        if now - start >= self.period:
            start, used = now, 0
        if used >= self.lines:
            self._kinds[kind] = (start, used, held + 1)
            return None
        self._kinds[kind] = (start, used + 1, 0)
        self._kinds.move_to_end(kind)
        while len(self._kinds) > self.max_kinds:
            self._kinds.popitem(last=False)
        return held


class KernelSockets:
    """The booth's bounds on the kernel websockets (``/api/kernels/ID/channels``), per kernel: at most
    ``max_connections`` waiting or open, and a token bucket for the messages from its browsers
    (``burst`` at once, refilled at ``per_second``; a new connection takes one second's worth, at most half
    the burst, and needs that much left). The Voila server asks it before every connection and every
    message (:class:`voila_app.server.BoothKernelSocket`); a message over the rate closes its connection."""

    def __init__(
        self,
        per_second: float = WEBSOCKET_MESSAGES_PER_SECOND,
        burst: int = WEBSOCKET_MESSAGES_BURST,
        *,
        max_connections: int = WEBSOCKETS_PER_KERNEL,
        clock: Callable[[], float] = time.monotonic,
        max_kernels: int = MAX_TRACKED_ADDRESSES,
    ) -> None:
        self.per_second = per_second
        self.burst = burst
        self.connect_cost = min(per_second, burst / 2)
        self.max_connections = max_connections
        self.clock = clock
        self.bucket = TokenBucket(per_second * 60, burst, max_keys=max_kernels)
        self.connections: dict[str, int] = {}
        self.close_log = Throttle(CLOSE_LOG_SECONDS, clock)

    @classmethod
    def from_limits(cls, limits: Limits) -> KernelSockets:
        return cls(limits.websocket_messages_per_second, limits.websocket_messages_burst)

    def connect(self, kernel_id: str) -> tuple[str, float] | None:
        """A new connection to ``kernel_id``: None when it may go ahead (counted: call :meth:`disconnect` once
        it is gone), else (why not, the seconds to wait)."""
        if self.connections.get(kernel_id, 0) >= self.max_connections:
            return f"{self.max_connections} connections to this kernel already", 5.0
        wait = self.bucket.take(kernel_id, self.clock(), cost=self.connect_cost)
        if wait > 0:
            return "over the message rate", wait
        self.connections[kernel_id] = self.connections.get(kernel_id, 0) + 1
        return None

    def disconnect(self, kernel_id: str) -> None:
        left = self.connections.get(kernel_id, 0) - 1
        if left > 0:
            self.connections[kernel_id] = left
        else:
            self.connections.pop(kernel_id, None)

    def message(self, kernel_id: str) -> bool:
        """Whether a message from a browser to ``kernel_id`` may pass (a token taken); False: over the rate."""
        return self.bucket.take(kernel_id, self.clock()) == 0.0
