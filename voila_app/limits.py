"""Booth limits of the Voila server that need no server to test: the new-visitor rate limit per client
address (a token bucket), the client's address behind trusted proxies, and the settings' parsing.

Pure Python (no tornado, no Voila): ``playground app`` imports it to check its flags before it starts
Voila, and :mod:`voila_app.server` uses it for every page load without a valid visitor cookie.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

NEW_VISITORS_PER_MINUTE_ENV = "PLAYGROUND_BOOTH_NEW_VISITORS_PER_MINUTE"
NEW_VISITORS_BURST_ENV = "PLAYGROUND_BOOTH_NEW_VISITORS_BURST"
TRUSTED_PROXIES_ENV = "PLAYGROUND_BOOTH_TRUSTED_PROXIES"
WEBSOCKET_MAX_BYTES_ENV = "PLAYGROUND_BOOTH_WEBSOCKET_MAX_BYTES"

# A booth's visitors often share one NAT / Wi-Fi address: a burst of 30 new visitors at once, then 20 a minute.
NEW_VISITORS_PER_MINUTE = 20.0
NEW_VISITORS_BURST = 30
# The kernel's guard refuses widget messages over 64 KiB in booth mode; a page sends at most ~10 KB per frame
# (measured: the largest browser -> server frame of a page load and a form filled in is 9.5 KB).
WEBSOCKET_MAX_BYTES = 128 * 1024
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


def parse_rate(name: str, text: str) -> float:
    """New visitors per minute: a number from 0.1 to 100000."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.1 <= value <= 100_000:  # also refuses nan and inf
        shown = text.strip()[:60]
        raise SettingError(name, f"{name} {shown!r}: allowed: a number from 0.1 to 100000 (new visitors a minute)")
    return value


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

    def take(self, key: str, now: float | None = None) -> float:
        """Take a token for ``key``: 0.0 when granted, else the seconds until one is available."""
        now = time.monotonic() if now is None else now
        tokens = self._tokens(key, now)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            self._buckets.move_to_end(key)
            self._forget(now)
            return 0.0
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        return (1.0 - tokens) / self.rate

    def __len__(self) -> int:
        return len(self._buckets)

    def _forget(self, now: float) -> None:
        if len(self._buckets) <= self.max_keys:
            return
        for key in [k for k in self._buckets if self._tokens(k, now) >= self.burst]:
            del self._buckets[key]
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
