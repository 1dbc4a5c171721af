"""List-then-watch with resourceVersion resume, and pod-log following that resumes by timestamp.

Each watcher is one long-lived request per resource kind; a dropped connection resumes from the
last resourceVersion seen (a 410 Gone relists and emits only what changed), so the consumer sees
every change once: nothing lost, nothing repeated. Log followers use ``timestamps=true`` and skip
lines up to the last (timestamp, count) seen when they reconnect.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)


# -- what the watchers and log followers report (one consumer dispatches on the type) ---------------
@dataclass(frozen=True)
class ObjectChanged:
    """A watched object was ADDED, MODIFIED or DELETED (``kind``: the watcher's name)."""

    kind: str
    change: str
    obj: dict[str, Any]


@dataclass(frozen=True)
class Synced:
    """The watcher's first list is delivered: the consumer has seen every object that exists."""

    kind: str


@dataclass(frozen=True)
class WatchFailed:
    """The watch gave up (a non-transient error, or too many transient ones)."""

    kind: str
    error: BaseException


@dataclass(frozen=True)
class LogLine:
    source: str
    line: str


@dataclass(frozen=True)
class LogEnded:
    """The log stream of ``source`` is over (the container ended, or the follower stopped or failed)."""

    source: str
    error: BaseException | None = None


WatchItem = ObjectChanged | Synced | WatchFailed | LogLine | LogEnded
Sink = Callable[[WatchItem], None]


class WatchStats:
    """Request counters (shared by the watchers of one session; read by the benchmark)."""

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0
        self.reconnects = 0
        self.log_requests = 0
        self.relists = 0
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    @property
    def requests(self) -> int:
        return self.lists + self.watches + self.log_requests


def _is_transient(exc: BaseException) -> bool:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as Urllib3Error

    if isinstance(exc, ApiException):
        return exc.status in (0, 429, 500, 502, 503, 504)
    return isinstance(exc, Urllib3Error | ConnectionError | TimeoutError | OSError | ValueError)


class ResourceWatcher(threading.Thread):
    """Keep one resource kind in sync: ``sink(ObjectChanged(kind, type, obj))`` for every change.

    ``list_call`` is a kubernetes-client list function with the namespace/selectors bound
    (e.g. ``partial(core.list_namespaced_pod, ns, label_selector=...)``).
    """

    def __init__(
        self,
        kind: str,
        list_call: Callable[..., Any],
        sink: Sink,
        stop: threading.Event,
        *,
        timeout_seconds: int = 600,
        stats: WatchStats | None = None,
    ) -> None:
        super().__init__(name=f"watch-{kind}", daemon=True)
        self.kind = kind
        self.list_call = list_call
        self.sink = sink
        self.stop_event = stop
        self.timeout_seconds = timeout_seconds
        self.stats = stats or WatchStats()
        self.versions: dict[str, str] = {}  # uid -> last resourceVersion delivered
        self.objects: dict[str, dict[str, Any]] = {}
        self.resource_version: str | None = None
        self._resp: Any = None
        self.synced = threading.Event()

    # -- delivery with de-duplication ------------------------------------------------------------
    def _deliver(self, etype: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid") or meta.get("name", "")
        rv = meta.get("resourceVersion")
        if etype == "DELETED":
            if self.versions.pop(uid, None) is None and uid not in self.objects:
                return
            self.objects.pop(uid, None)
        else:
            if rv is not None and self.versions.get(uid) == rv:
                return  # already delivered (a replay after a resume)
            self.versions[uid] = rv or ""
            self.objects[uid] = obj
        self.sink(ObjectChanged(self.kind, etype, obj))

    def _relist(self) -> None:
        resp = self.list_call(_preload_content=False)
        self.stats.add("lists")
        data = json.loads(resp.data)
        items = data.get("items") or []
        present = set()
        for obj in items:
            meta = obj.setdefault("metadata", {})
            uid = meta.get("uid") or meta.get("name", "")
            present.add(uid)
            self._deliver("ADDED" if uid not in self.versions else "MODIFIED", obj)
        for uid in [u for u in self.versions if u not in present]:
            self._deliver("DELETED", self.objects.get(uid) or {"metadata": {"uid": uid}})
        self.resource_version = (data.get("metadata") or {}).get("resourceVersion")
        if not self.synced.is_set():
            self.synced.set()
            self.sink(Synced(self.kind))

    def stop(self) -> None:
        self.stop_event.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # best effort: the thread ends on its own anyway
                resp.shutdown()

    def run(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        failures = 0
        while not self.stop_event.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                resp = self.list_call(
                    watch=True,
                    resource_version=self.resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self.timeout_seconds,
                    _preload_content=False,
                    _request_timeout=(10, self.timeout_seconds + 30),
                )
                self._resp = resp
                self.stats.add("watches")
                try:
                    for line in iter_resp_lines(resp):
                        if self.stop_event.is_set():
                            break
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        etype, obj = event.get("type"), event.get("object") or {}
                        if etype == "ERROR":
                            if obj.get("code") == 410:  # too old: relist, emit only the differences
                                self.stats.add("relists")
                                self.resource_version = None
                                break
                            from kubernetes.client.exceptions import ApiException

                            raise ApiException(status=obj.get("code", 500), reason=obj.get("message", ""))
                        rv = (obj.get("metadata") or {}).get("resourceVersion")
                        if rv:
                            self.resource_version = rv
                        if etype != "BOOKMARK":
                            self._deliver(etype, obj)
                        failures = 0
                finally:
                    self._resp = None
                    resp.release_conn()
            except Exception as exc:
                if self.stop_event.is_set():
                    break
                from kubernetes.client.exceptions import ApiException

                if isinstance(exc, ApiException) and exc.status == 410:
                    self.resource_version = None
                    continue
                if not _is_transient(exc) or failures >= 30:
                    self.sink(WatchFailed(self.kind, exc))
                    return
                failures += 1
                self.stats.add("reconnects")
                self.stop_event.wait(min(0.1 * 2**failures, 5.0))


def parse_timestamp(text: str) -> float:
    """RFC 3339 (nano) → epoch seconds with full precision kept as a sortable float."""
    text = text.rstrip("Z")
    if "." in text:
        head, frac = text.split(".", 1)
        frac = (frac + "000000000")[:9]
    else:
        head, frac = text, "0"
    base = datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp()
    return base + int(frac) / 1e9


class LogFollower(threading.Thread):
    """Follow one container's log: ``sink(LogLine(source, line))``, then ``sink(LogEnded(source))`` once.

    Reconnects after a dropped stream without losing or repeating lines (timestamps).
    ``is_finished()`` tells whether the container has terminated (from the pod watcher); a
    stream that ends while the container still runs is a dropped connection.
    """

    def __init__(
        self,
        core: Any,
        namespace: str,
        pod: str,
        container: str,
        source: str,
        sink: Sink,
        stop: threading.Event,
        *,
        follow: bool = True,
        is_finished: Callable[[], bool] = lambda: True,
        stats: WatchStats | None = None,
    ) -> None:
        super().__init__(name=f"logs-{pod}", daemon=True)
        self.core, self.namespace, self.pod, self.container = core, namespace, pod, container
        self.source, self.sink, self.stop_event = source, sink, stop
        self.follow = follow
        self.is_finished = is_finished
        self.stats = stats or WatchStats()
        self.last_ts: float | None = None
        self.at_last = 0  # lines already delivered that carry exactly last_ts
        self.lines = 0
        self._skip = 0
        self._resp: Any = None

    def stop(self) -> None:
        self.stop_event.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()

    def _open(self) -> Any:
        """GET .../pods/NAME/log?timestamps=true[&follow=true][&sinceTime=T].

        ``sinceTime`` (the node's clock, second precision) bounds what a resume re-reads to the
        last second seen; the generated client has no parameter for it, so this goes through
        ``call_api`` the way ``read_namespaced_pod_log`` does.
        """
        query: list[tuple[str, Any]] = [("container", self.container), ("timestamps", True)]
        if self.follow:
            query.append(("follow", True))
        if self.last_ts is not None:
            since = datetime.fromtimestamp(int(self.last_ts), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            query.append(("sinceTime", since))
        api = self.core.api_client
        return api.call_api(
            "/api/v1/namespaces/{namespace}/pods/{name}/log",
            "GET",
            {"name": self.pod, "namespace": self.namespace},
            query,
            {"Accept": "text/plain"},
            response_type="str",
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=(10, None),
        )

    def _accept(self, raw: str) -> None:
        stamp, _, text = raw.partition(" ")
        try:
            ts = parse_timestamp(stamp)
        except ValueError:
            ts, text = None, raw
        if ts is not None and self.last_ts is not None and ts < self.last_ts:
            return  # delivered before the reconnect
        if ts is not None and ts == self.last_ts:
            if self._skip > 0:
                self._skip -= 1
                return
            self.at_last += 1
        elif ts is not None:
            self.last_ts, self.at_last, self._skip = ts, 1, 0
        self.lines += 1
        self.sink(LogLine(self.source, text))

    def run(self) -> None:
        failures = 0
        error: BaseException | None = None
        try:
            while not self.stop_event.is_set():
                self._skip = self.at_last
                clean = False
                before = self.lines
                try:
                    resp = self._open()
                    self._resp = resp
                    self.stats.add("log_requests")
                    buffer = b""
                    for chunk in resp.stream(amt=None, decode_content=False):
                        buffer += chunk
                        while b"\n" in buffer:
                            line, buffer = buffer.split(b"\n", 1)
                            self._accept(line.decode("utf-8", "replace"))
                        if self.stop_event.is_set():
                            break
                    if buffer:
                        self._accept(buffer.decode("utf-8", "replace"))
                    clean = True
                    resp.release_conn()
                except Exception as exc:
                    if self.stop_event.is_set():
                        return
                    if self.lines > before:
                        failures = 0  # it was making progress: a fresh drop, not a failing endpoint
                    if not _is_transient(exc) or failures >= 30:
                        error = exc
                        return
                    failures += 1
                    self.stats.add("reconnects")
                finally:
                    self._resp = None
                if not self.follow:
                    return
                if clean and self.is_finished():
                    return
                self.stop_event.wait(min(0.1 * 2**failures, 2.0) if not clean else 0.2)
        finally:
            self.sink(LogEnded(self.source, error))
