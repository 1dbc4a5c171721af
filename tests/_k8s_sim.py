"""A Kubernetes API over real HTTP (kmock's KubernetesEmulator, extended) and a small controller simulator.

The real ``kubernetes`` client and ``kubeflow`` SDK talk to it through a kubeconfig. What the
emulator adds to kmock's in-memory object store is what those clients rely on: resourceVersions,
watches that resume from a resourceVersion (410 Gone once compacted), label/field selectors,
merge patches, the ``status`` subresource, pod logs (follow, timestamps, sinceSeconds), injected
faults (401/403/409/422...) and dropped connections. The simulator plays Kubeflow Trainer, JobSet,
Kueue and KServe: TrainJob → step pods → logs (replayed from a real trainer log) → trainerStatus →
Complete/Failed; InferenceService → Ready with a URL proxied to a local model server. ``KubeRaySimulator`` plays
KubeRay (and Kueue's RayJob integration): RayJob → RayCluster → head/worker pods → submitter Job replaying a Ray
driver log → jobDeploymentStatus/jobStatus → Complete/Failed, suspend and deletion.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import json
import random
import re
import string
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal.k8s import KubernetesError

from playground.events import EVENT_PREFIX, JobPhase, Metric, Phase, Progress, format_event_line, parse_line

CLUSTER_SCOPED = {"clustertrainingruntimes", "clusterservingruntimes", "namespaces", "nodes"}
KINDS = {
    "trainjobs": "TrainJob",
    "clustertrainingruntimes": "ClusterTrainingRuntime",
    "trainingruntimes": "TrainingRuntime",
    "inferenceservices": "InferenceService",
    "pods": "Pod",
    "events": "Event",
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "rayjobs": "RayJob",
    "rayclusters": "RayCluster",
    "jobs": "Job",
    "workloads": "Workload",
}
API_VERSIONS = {
    "trainjobs": "trainer.kubeflow.org/v1alpha1",
    "clustertrainingruntimes": "trainer.kubeflow.org/v1alpha1",
    "trainingruntimes": "trainer.kubeflow.org/v1alpha1",
    "inferenceservices": "serving.kserve.io/v1beta1",
    "rayjobs": "ray.io/v1",
    "rayclusters": "ray.io/v1",
    "jobs": "batch/v1",
    "workloads": "kueue.x-k8s.io/v1beta2",
}


def now_iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else time.time(), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def nano_iso(ts: float) -> str:
    whole = int(ts)
    nanos = round((ts - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    return datetime.fromtimestamp(whole, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null removes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def label_match(selector: str | None, labels: dict[str, str]) -> bool:
    for term in _split_selector(selector or ""):
        m = re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\((.*)\)", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            if (labels.get(m.group(1)) in values) != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def field_match(selector: str | None, obj: dict[str, Any]) -> bool:
    for term in _split_selector(selector or ""):
        neg = "!=" in term
        key, value = term.split("!=" if neg else "=", 1)
        cur: Any = obj
        for part in key.strip().split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if (str(cur) == value.strip()) == neg:
            return False
    return True


def invalid(plural: str, name: str, problems: list[tuple[str, str]]) -> KubernetesError:
    """The API server's 422 for an object that fails its schema (one cause per problem)."""
    causes = [{"reason": "FieldValueInvalid", "field": f, "message": msg} for f, msg in problems]
    text = "; ".join(f"{f}: {msg}" for f, msg in problems)
    return KubernetesError(
        status=422,
        reason="Invalid",
        message=f'{KINDS.get(plural, plural)} "{name}" is invalid: {text}',
        details={"name": name, "kind": KINDS.get(plural, plural), "causes": causes},
    )


@dataclass
class Fault:
    """Answer matching requests with an API error (``times`` < 0: forever)."""

    method: str
    plural: str
    status: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    times: int = -1
    name: str | None = None
    subresource: str | None = None  # e.g. "log": only pods/log requests


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator with resourceVersions, resumable watches, selectors, logs and faults."""

    store: dict[tuple[str, str | None, str], dict[str, Any]] = attrs.field(factory=dict)
    changes: list[tuple[int, str, str, dict[str, Any]]] = attrs.field(factory=list)
    rv: int = 0
    compacted: int = 0
    faults: list[Fault] = attrs.field(factory=list)
    pod_logs: dict[tuple[str, str], dict[str, Any]] = attrs.field(factory=dict)
    hooks: list[Callable[[str, str, dict[str, Any]], None]] = attrs.field(factory=list)
    # plural -> check(obj) returning [(field, message)]: the API server's schema validation (422)
    validators: dict[str, Callable[[dict[str, Any]], list[tuple[str, str]]]] = attrs.field(factory=dict)
    counts: Counter = attrs.field(factory=Counter)
    drop_watch_after: int | None = None  # cut every watch stream after N events (network drop)
    drop_log_every: float | None = None  # cut every log stream after this many seconds...
    max_log_drops: int | None = None  # ...this many times in all
    proxies: dict[tuple[str, str], tuple[str, str]] = attrs.field(factory=dict)  # isvc -> (url, model)
    change_rvs: list[int] = attrs.field(factory=list)
    log_read: dict[tuple[str, str], int] = attrs.field(factory=dict)  # (ns, pod) -> lines a follower was sent
    _read_pulse: asyncio.Event | None = attrs.field(default=None)
    _pulse: asyncio.Event | None = attrs.field(default=None)
    _log_pulse: asyncio.Event | None = attrs.field(default=None)
    _session: aiohttp.ClientSession | None = attrs.field(default=None)
    generation: int = 0  # bumped by drop_all(): open streams close at once
    dropped: int = 0
    dropped_watches: int = 0
    dropped_logs: int = 0
    kueue_visibility: bool = False  # serve Kueue's visibility API (pendingworkloads); else 404 like most clusters
    pending_workloads: dict[tuple[str, str], list[dict[str, Any]]] = attrs.field(factory=dict)  # (ns, queue)

    def pulse(self, logs: bool = False) -> asyncio.Event:
        """The event the next change sets (objects, or pod logs): waiters take it before looking."""
        if logs:
            if self._log_pulse is None:
                self._log_pulse = asyncio.Event()
            return self._log_pulse
        if self._pulse is None:
            self._pulse = asyncio.Event()
        return self._pulse

    # -- state ---------------------------------------------------------------------------------
    async def notify(self) -> None:
        old, self._pulse = self.pulse(), asyncio.Event()
        old.set()

    async def notify_logs(self) -> None:
        old, self._log_pulse = self.pulse(logs=True), asyncio.Event()
        old.set()

    def _record(self, plural: str, etype: str, obj: dict[str, Any]) -> None:
        self.changes.append((self.rv, plural, etype, copy.deepcopy(obj)))
        self.change_rvs.append(self.rv)
        for hook in list(self.hooks):
            hook(etype, plural, obj)

    def _stamp(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def create(self, plural: str, ns: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = name
        ns = None if plural in CLUSTER_SCOPED else (ns or meta.get("namespace") or "default")
        key = (plural, ns, name)
        if key in self.store:
            group = API_VERSIONS.get(plural, "v1").split("/")[0] if "/" in API_VERSIONS.get(plural, "") else ""
            full = f"{plural}.{group}" if group else plural
            raise KubernetesError(
                status=409,
                reason="AlreadyExists",
                message=f'{full} "{name}" already exists',
                details={"name": name, "group": group, "kind": plural},
            )
        if ns:
            meta["namespace"] = ns
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_iso())
        meta["generation"] = 1
        obj.setdefault("kind", KINDS.get(plural, plural.capitalize()))
        obj.setdefault("apiVersion", API_VERSIONS.get(plural, "v1"))
        self._stamp(obj)
        self.store[key] = obj
        self._record(plural, "ADDED", obj)
        return obj

    def patch(self, plural: str, ns: str | None, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        ns = None if plural in CLUSTER_SCOPED else ns
        key = (plural, ns, name)
        if key not in self.store:
            raise KubernetesError(status=404, reason="NotFound", message=f'{plural} "{name}" not found')
        patch = dict(patch)
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        current = self.store[key]["metadata"].get("resourceVersion")
        if expected is not None and expected != current:  # the API server's optimistic concurrency on a patch
            raise KubernetesError(
                status=409,
                reason="Conflict",
                message=f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                details={"name": name, "kind": plural},
            )
        if "metadata" in patch:
            patch["metadata"] = {k: v for k, v in patch["metadata"].items() if k not in ("resourceVersion", "uid")}
        obj = merge_patch(self.store[key], patch)
        check = self.validators.get(plural)  # an update is validated too (status included)
        problems = check(obj) if check else []
        if problems:
            raise invalid(plural, name, problems)
        if obj.get("spec") != self.store[key].get("spec"):
            obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        self._stamp(obj)
        self.store[key] = obj
        self._record(plural, "MODIFIED", obj)
        return obj

    def delete(self, plural: str, ns: str | None, name: str) -> dict[str, Any]:
        ns = None if plural in CLUSTER_SCOPED else ns
        obj = self.store.pop((plural, ns, name), None)
        if obj is None:
            raise KubernetesError(status=404, reason="NotFound", message=f'{plural} "{name}" not found')
        obj = copy.deepcopy(obj)
        self._stamp(obj)
        self._record(plural, "DELETED", obj)
        return obj

    def compact(self) -> None:
        """Forget the change history (as etcd compaction does): older resourceVersions get 410 Gone."""
        self.compacted = self.rv
        self.changes.clear()
        self.change_rvs.clear()

    def items(self, plural: str, ns: str | None = None) -> list[dict[str, Any]]:
        return [o for (p, n, _), o in self.store.items() if p == plural and (ns is None or n == ns)]

    # -- pod logs ------------------------------------------------------------------------------
    async def wait_log_read(self, ns: str, pod: str, lines: int) -> None:
        """Until a follower has been sent ``lines`` lines of the pod's log (no polling: each send wakes us)."""
        while self.log_read.get((ns, pod), 0) < lines:
            if self._read_pulse is None:
                self._read_pulse = asyncio.Event()
            await self._read_pulse.wait()

    def _sent(self, ns: str, pod: str, index: int) -> None:
        self.log_read[(ns, pod)] = max(index, self.log_read.get((ns, pod), 0))
        pulse, self._read_pulse = self._read_pulse, None
        if pulse is not None:
            pulse.set()

    def append_log(self, ns: str, pod: str, line: str) -> None:
        entry = self.pod_logs.setdefault((ns, pod), {"lines": [], "done": False})
        ts = time.time()
        if entry["lines"] and ts <= entry["lines"][-1][0]:
            ts = entry["lines"][-1][0] + 1e-6
        entry["lines"].append((ts, line))

    def end_log(self, ns: str, pod: str) -> None:
        self.pod_logs.setdefault((ns, pod), {"lines": [], "done": False})["done"] = True

    # -- HTTP ----------------------------------------------------------------------------------
    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        path = request.url.path
        if path.startswith("/serving/"):
            return await self._proxy(request)
        if path == "/debug/counts":  # for the benchmark (not counted itself)
            return aiohttp.web.json_response(
                {"|".join(k) if isinstance(k, tuple) else k: v for k, v in self.counts.items()}
            )
        res = request.resource
        if res is None or res.plural is None:
            return await super()._handle(request)
        plural = res.plural
        method = str(request.method.value if hasattr(request.method, "value") else request.method).upper()
        params = request.params
        sub = request.subresource
        kind = (
            "watch"
            if str(params.get("watch", "")).lower() in ("true", "1")
            else ("log" if sub == "log" else ("get" if request.name else "list"))
        )
        self.counts[(method, plural, kind if method == "GET" else method.lower())] += 1
        self.counts["total"] += 1
        for fault in self.faults:
            hit = fault.method in (method, "*") and fault.plural in (plural, "*") and fault.times != 0
            hit = hit and fault.subresource in (None, sub)
            if hit and (fault.name is None or fault.name == request.name):
                fault.times -= 1
                raise KubernetesError(
                    status=fault.status, reason=fault.reason, message=fault.message, details=fault.details
                )
        ns = request.namespace
        if plural in CLUSTER_SCOPED:
            ns = None
        if method == "GET" and plural == "localqueues" and sub == "pendingworkloads":
            return self._pending_workloads(ns or "default", request.name or "")
        if method == "GET" and kind == "log":
            return await self._serve_log(request, ns or "default", request.name or "")
        if method == "GET" and kind == "watch":
            return await self._watch(request, plural, ns)
        if method == "GET" and request.name:
            obj = self.store.get((plural, ns, request.name))
            if obj is None:
                raise KubernetesError(status=404, reason="NotFound", message=f'{plural} "{request.name}" not found')
            return aiohttp.web.json_response(obj)
        if method == "GET":
            items = self._select(plural, ns, params)
            return aiohttp.web.json_response(
                {
                    "apiVersion": API_VERSIONS.get(plural, "v1"),
                    "kind": KINDS.get(plural, plural) + "List",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": items,
                }
            )
        if method == "POST":
            check = self.validators.get(plural)
            problems = check(request.data or {}) if check else []
            if problems:
                raise invalid(plural, ((request.data or {}).get("metadata") or {}).get("name", ""), problems)
            obj = self.create(plural, ns, request.data or {})
            await self.notify()
            return aiohttp.web.json_response(obj, status=201)
        if method in ("PATCH", "PUT") and request.name:
            data = request.data or {}
            if sub == "status":
                data = {"status": data.get("status")}
            obj = self.patch(plural, ns, request.name, data)
            await self.notify()
            await self.notify_logs()  # a cancel may have ended pod logs
            return aiohttp.web.json_response(obj)
        if method == "DELETE" and request.name:
            obj = self.delete(plural, ns, request.name)
            await self.notify()
            return aiohttp.web.json_response(obj)
        return await super()._handle(request)

    def _pending_workloads(self, ns: str, queue: str) -> aiohttp.web.StreamResponse:
        """Kueue's visibility API: a LocalQueue's pending Workloads with their positions (0 = next)."""
        if not self.kueue_visibility:
            raise KubernetesError(
                status=404, reason="NotFound", message="the server could not find the requested resource"
            )
        items = [
            {**w, "positionInLocalQueue": i, "positionInClusterQueue": i}
            for i, w in enumerate(self.pending_workloads.get((ns, queue), []))
        ]
        summary = {"kind": "PendingWorkloadsSummary", "apiVersion": "visibility.kueue.x-k8s.io/v1beta1"}
        return aiohttp.web.json_response({**summary, "metadata": {}, "items": items})

    def _select(self, plural: str, ns: str | None, params: dict[str, str]) -> list[dict[str, Any]]:
        out = []
        for obj in self.items(plural, ns):
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if label_match(params.get("labelSelector"), labels) and field_match(params.get("fieldSelector"), obj):
                out.append(obj)
        return out

    def _matches(self, plural: str, ns: str | None, params: dict[str, str], p: str, obj: dict[str, Any]) -> bool:
        if p != plural:
            return False
        if ns is not None and (obj.get("metadata") or {}).get("namespace") != ns:
            return False
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return label_match(params.get("labelSelector"), labels) and field_match(params.get("fieldSelector"), obj)

    async def _watch(self, request: kmock.Request, plural: str, ns: str | None) -> aiohttp.web.StreamResponse:
        params = request.params
        rv_text = params.get("resourceVersion") or ""
        timeout = float(params.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        generation = self.generation
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request._raw_request)
        sent = 0

        async def send(event: dict[str, Any]) -> bool:
            nonlocal sent
            await resp.write(json.dumps(event).encode() + b"\n")
            sent += 1
            if self.drop_watch_after is not None and sent >= self.drop_watch_after:
                self.dropped += 1
                self.dropped_watches += 1
                request._raw_request.transport.close()  # an abrupt drop, not a clean end
                return False
            return True

        try:
            if rv_text in ("", "0"):
                cursor = self.rv
                for obj in self._select(plural, ns, params):
                    if not await send({"type": "ADDED", "object": obj}):
                        return resp
            else:
                cursor = int(rv_text)
                if cursor < self.compacted:
                    gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410}
                    gone |= {"reason": "Expired", "message": f"too old resource version: {cursor} ({self.compacted})"}
                    await send({"type": "ERROR", "object": gone})
                    return resp
            while time.monotonic() < deadline:
                pulse = self.pulse()
                pending = self.changes[bisect.bisect_right(self.change_rvs, cursor) :]
                for rv, p, etype, obj in pending:
                    cursor = rv
                    if self._matches(plural, ns, params, p, obj) and not await send({"type": etype, "object": obj}):
                        return resp
                if generation != self.generation:
                    request._raw_request.transport.close()
                    return resp
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pulse.wait(), timeout=max(0.01, deadline - time.monotonic()))
            if str(params.get("allowWatchBookmarks", "")).lower() == "true":
                await send(
                    {
                        "type": "BOOKMARK",
                        "object": {"kind": KINDS.get(plural), "metadata": {"resourceVersion": str(cursor)}},
                    }
                )
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError, aiohttp.ClientConnectionResetError):
            pass
        return resp

    async def _serve_log(self, request: kmock.Request, ns: str, name: str) -> aiohttp.web.StreamResponse:
        pod = self.store.get(("pods", ns, name))
        if pod is None:
            raise KubernetesError(status=404, reason="NotFound", message=f'pods "{name}" not found')
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        state = statuses[0].get("state", {}) if statuses else {}
        if not ("running" in state or "terminated" in state):
            waiting = (state.get("waiting") or {}).get("reason", "ContainerCreating")
            raise KubernetesError(
                status=400,
                reason="BadRequest",
                message=f'container "{request.params.get("container", "")}" in pod "{name}" is waiting to start: '
                + waiting,
            )
        params = request.params
        follow = str(params.get("follow", "")).lower() == "true"
        stamps = str(params.get("timestamps", "")).lower() == "true"
        since = float(params["sinceSeconds"]) if "sinceSeconds" in params else None
        tail = int(params["tailLines"]) if "tailLines" in params else None
        entry = self.pod_logs.setdefault((ns, name), {"lines": [], "done": False})
        lines = entry["lines"]
        start = 0
        if since is not None:
            cutoff = time.time() - since
            start = next((i for i, (ts, _) in enumerate(lines) if ts >= cutoff), len(lines))
        if "sinceTime" in params:  # RFC 3339, second precision (as the API server takes it)
            cutoff = datetime.fromisoformat(params["sinceTime"].replace("Z", "+00:00")).timestamp()
            start = next((i for i, (ts, _) in enumerate(lines) if ts >= cutoff), len(lines))
        if tail is not None:
            start = max(start, len(lines) - tail)

        def render(ts: float, text: str) -> bytes:
            return ((nano_iso(ts) + " " if stamps else "") + text + "\n").encode()

        if not follow:
            return aiohttp.web.Response(
                body=b"".join(render(*item) for item in lines[start:]), content_type="text/plain"
            )
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request._raw_request)
        generation, index, opened = self.generation, start, time.monotonic()
        try:
            while True:
                pulse = self.pulse(logs=True)
                while index < len(lines):
                    await resp.write(render(*lines[index]))
                    index += 1
                self._sent(ns, name, index)
                budget = self.max_log_drops is None or self.dropped_logs < self.max_log_drops
                if self.drop_log_every is not None and time.monotonic() - opened >= self.drop_log_every and budget:
                    self.dropped += 1
                    self.dropped_logs += 1
                    request._raw_request.transport.close()  # a flaky network: the stream dies mid-way
                    return resp
                if entry["done"] or generation != self.generation:
                    break
                wait = 1.0 if self.drop_log_every is None else max(0.01, self.drop_log_every)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pulse.wait(), timeout=wait)
            if generation != self.generation:
                request._raw_request.transport.close()
                return resp
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError, aiohttp.ClientConnectionResetError):
            pass
        return resp

    async def _proxy(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """KServe's ingress: /serving/<ns>/<isvc>/openai/v1/... → the local model server's /v1/..."""
        parts = request.url.path.split("/")
        ns, name, rest = parts[2], parts[3], "/".join(parts[4:])
        target = self.proxies.get((ns, name))
        if target is None or not rest.startswith("openai/v1"):
            return aiohttp.web.json_response({"error": f"no route for {request.url.path}"}, status=404)
        base, model = target
        url = base.rstrip("/") + rest[len("openai/v1") :]
        body = request.body
        if request.data and isinstance(request.data, dict) and "model" in request.data:
            body = json.dumps({**request.data, "model": model}).encode()
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with self._session.request(str(request.method.value), url, data=body or None, headers=headers) as up:
            payload = await up.read()
            return aiohttp.web.Response(body=payload, status=up.status, content_type=up.content_type)


def pod_manifest(job: dict[str, Any], rjob: str, container: str, image: str = "sim") -> dict[str, Any]:
    name = job["metadata"]["name"]
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
    labels = {
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/replicatedjob-name": rjob,
        "batch.kubernetes.io/job-completion-index": "0",
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer" if rjob == "node" else rjob,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-{rjob}-0-0-{suffix}", "labels": labels},
        "spec": {"containers": [{"name": container, "image": image}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
    }


@dataclass
class Scenario:
    """What the simulated trainer does: the node-0 log it prints (replayed), and how it ends."""

    node_log: list[str] = field(default_factory=list)
    exit_code: int = 0
    line_delay: float = 0.0
    unschedulable_for: float = 0.0  # node pod Unschedulable this long first
    hold_queue: bool = False  # Kueue keeps the job suspended until admit() is called
    start_delay: float = 0.0
    # status.trainerStatus as the trainer posts it (kubeflow's update_trainjob_status): every N progress
    # lines, and always the last one; 0: never (a Trainer without the TrainJobStatus gate)
    trainer_status_every: int = 0
    # once a follower has read this many node-0 log lines, reading that pod's log is forbidden (403) and
    # open streams drop: the reader loses the log mid-run
    forbid_log_after: int | None = None


class TrainerSimulator:
    """Plays Kubeflow Trainer + JobSet + Kueue + kubelet + KServe against the emulator's store."""

    def __init__(self, emu: ClusterEmulator, loop: asyncio.AbstractEventLoop) -> None:
        self.emu = emu
        self.loop = loop
        self.scenario = Scenario()
        self.scenarios: dict[str, Scenario] = {}  # by TrainJob name or blueprint label
        self.output_dir: Path | None = None  # what every job's /workspace/output holds once done
        self.servers: Any = None  # playground.serving.local.LocalServers
        self.hub_models: set[str] = set()  # hf:// models KServe's storage initializer can download here
        self.isvc_generations: dict[str, int] = {}  # the spec generation each InferenceService was rolled out at
        self.admitted: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.errors: list[BaseException] = []
        emu.hooks.append(self._on_change)

    def _on_change(self, etype: str, plural: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{plural}/{meta.get('namespace')}/{meta.get('name')}"
        if plural == "trainjobs" and etype == "ADDED":
            self._spawn(key, self._run_trainjob(meta["namespace"], meta["name"]))
        elif plural == "trainjobs" and etype == "DELETED":
            task = self.tasks.pop(key, None)
            if task:
                task.cancel()
            for pod in self.emu.items("pods", meta.get("namespace")):
                if pod["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == meta["name"]:
                    self.emu.delete("pods", meta["namespace"], pod["metadata"]["name"])
        elif plural == "trainjobs" and etype == "MODIFIED" and (obj.get("spec") or {}).get("suspend"):
            if (meta.get("annotations") or {}).get("blueprint-playground.dev/cancelled"):
                task = self.tasks.pop(key, None)
                if task:
                    task.cancel()
                for pod in self.emu.items("pods", meta.get("namespace")):  # JobSet removes a suspended job's pods
                    if pod["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == meta["name"]:
                        self.emu.end_log(meta["namespace"], pod["metadata"]["name"])
                        self.emu.delete("pods", meta["namespace"], pod["metadata"]["name"])
        elif plural == "inferenceservices" and etype == "ADDED":
            self.isvc_generations[key] = meta.get("generation", 1)
            self._spawn(key, self._run_isvc(meta["namespace"], meta["name"]))
        elif plural == "inferenceservices" and etype == "MODIFIED":
            generation = meta.get("generation", 1)
            if generation > self.isvc_generations.get(key, generation):  # a new spec: KServe rolls the predictor
                self.isvc_generations[key] = generation
                task = self.tasks.pop(key, None)
                if task:
                    task.cancel()
                self._spawn(key, self._run_isvc(meta["namespace"], meta["name"]))
        elif plural == "inferenceservices" and etype == "DELETED":
            self.emu.proxies.pop((meta.get("namespace"), meta.get("name")), None)
            if self.servers is not None:
                self.loop.run_in_executor(None, self._stop_server, meta["name"])

    def _stop_server(self, name: str) -> None:
        with contextlib.suppress(Exception):  # already gone
            self.servers.stop(name)

    def _spawn(self, key: str, coro: Any) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # surfaced by the tests
                self.errors.append(exc)

        self.tasks[key] = self.loop.create_task(guarded())

    async def _event(self, ns: str, kind: str, name: str, reason: str, message: str, etype: str = "Normal") -> None:
        self.emu.create(
            "events",
            ns,
            {
                "metadata": {"generateName": f"{name}."},
                "involvedObject": {"kind": kind, "name": name, "namespace": ns},
                "reason": reason,
                "message": message,
                "type": etype,
                "firstTimestamp": now_iso(),
                "lastTimestamp": now_iso(),
                "count": 1,
            },
        )
        await self.emu.notify()

    async def _patch(self, plural: str, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        if (plural, ns, name) not in self.emu.store:
            return None
        obj = self.emu.patch(plural, ns, name, patch)
        await self.emu.notify()
        return obj

    async def _condition(self, ns: str, name: str, ctype: str, status: str, reason: str, message: str) -> None:
        job = self.emu.store.get(("trainjobs", ns, name))
        if job is None:
            return
        conds = [c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] != ctype]
        conds.append(
            {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": now_iso()}
        )
        await self._patch("trainjobs", ns, name, {"status": {"conditions": conds}})

    async def _pod_state(self, ns: str, pod: str, phase: str, state: dict[str, Any], **extra: Any) -> None:
        obj = self.emu.store.get(("pods", ns, pod))
        if obj is None:
            return
        spec = obj["spec"]["containers"][0]
        running = "running" in state
        cstatus = {
            "name": spec["name"],
            "image": spec.get("image", "sim"),
            "imageID": "" if "waiting" in state else f"docker.io/{spec.get('image', 'sim')}@sha256:{'0' * 64}",
            "ready": running,
            "started": running,
            "restartCount": 0,
            "state": state,
        }
        status = {"phase": phase, "containerStatuses": [cstatus], **extra}
        if phase != "Pending":
            status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
            status.setdefault("startTime", now_iso())
        await self._patch("pods", ns, pod, {"status": status})

    async def _run_pod(
        self, ns: str, job: dict[str, Any], rjob: str, container: str, lines: list[str], sc: Scenario
    ) -> int:
        pod = self.emu.create("pods", ns, pod_manifest(job, rjob, container))
        name = pod["metadata"]["name"]
        await self.emu.notify()
        await self._event(ns, "Pod", name, "Scheduled", f"Successfully assigned {ns}/{name} to sim-node-1")
        await self._pod_state(ns, name, "Pending", {"waiting": {"reason": "ContainerCreating"}})
        await self._pod_state(ns, name, "Running", {"running": {"startedAt": now_iso()}})
        await self._event(ns, "Pod", name, "Started", f"Started container {container}")
        job_name = job["metadata"]["name"]
        parsed = [parse_line(x) for x in lines]
        points = [e for e in parsed if isinstance(e, Progress)]
        for i, line in enumerate(lines):
            self.emu.append_log(ns, name, line)
            event = parsed[i]
            if isinstance(event, Progress) and rjob == "node" and sc.trainer_status_every:
                index = points.index(event)
                if (index + 1) % sc.trainer_status_every == 0 or index == len(points) - 1:
                    await self._trainer_status(ns, job_name, event)
            if rjob == "node" and sc.forbid_log_after is not None and i + 1 == sc.forbid_log_after:
                await self.emu.notify_logs()
                await self.emu.wait_log_read(ns, name, i + 1)  # the follower has these lines; then it loses access
                self.emu.faults.append(
                    Fault("GET", "pods", 403, "Forbidden", "pods/log is forbidden", name=name, subresource="log")
                )
                self.emu.generation += 1  # open streams close (after what was written): the reader reconnects
                await self.emu.notify_logs()
                await self.emu.notify()
            if i % 20 == 0 or sc.line_delay:
                await self.emu.notify_logs()
            if sc.line_delay:
                await asyncio.sleep(sc.line_delay)
        code = sc.exit_code if rjob == "node" else 0
        self.emu.end_log(ns, name)
        await self.emu.notify_logs()
        term = {
            "terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "finishedAt": now_iso()}
        }
        await self._pod_state(ns, name, "Succeeded" if code == 0 else "Failed", term)
        return code

    async def _trainer_status(self, ns: str, name: str, p: Progress) -> None:
        """What the trainer posts through kubeflow's update_trainjob_status (values as strings)."""
        metrics = {"step": p.step, "total_steps": p.total_steps}
        if p.loss is not None:
            metrics["loss"] = round(p.loss, 5)
        status = {
            "progressPercentage": int(100 * p.step / max(1, p.total_steps)),
            "lastUpdatedTime": now_iso(),
            "metrics": [{"name": k, "value": str(v)} for k, v in metrics.items()],
        }
        if p.eta_seconds is not None:
            status["estimatedRemainingSeconds"] = int(p.eta_seconds)
        await self._patch("trainjobs", ns, name, {"status": {"trainerStatus": status}})

    async def _run_trainjob(self, ns: str, name: str) -> None:
        job = self.emu.store[("trainjobs", ns, name)]
        blueprint = job["metadata"].get("labels", {}).get("blueprint-playground.dev/blueprint", "")
        sc = self.scenarios.get(name) or self.scenarios.get(blueprint, self.scenario)  # by TrainJob name, blueprint
        await asyncio.sleep(sc.start_delay)
        queue = job["metadata"].get("labels", {}).get("kueue.x-k8s.io/queue-name")
        workload = f"trainjob-{name}-{uuid.uuid4().hex[:5]}"
        if queue:
            await self._patch("trainjobs", ns, name, {"spec": {"suspend": True}})
            await self._condition(ns, name, "Suspended", "True", "Suspended", "TrainJob is suspended")
            if sc.hold_queue:
                msg = "couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu"
                msg += " in flavor gpu, 1 more needed"
                await self._event(ns, "Workload", workload, "Pending", msg)
                owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": name}
                entry = {"metadata": {"name": workload, "namespace": ns, "ownerReferences": [owner]}, "priority": 0}
                waiting = self.emu.pending_workloads.setdefault((ns, queue), [])
                waiting.append({**entry, "localQueueName": queue})
                try:
                    await self.admitted.setdefault(queue, asyncio.Event()).wait()
                finally:  # admitted, cancelled or deleted: no longer pending
                    waiting[:] = [w for w in waiting if w["metadata"]["name"] != workload]
            await self._event(
                ns, "Workload", workload, "QuotaReserved", f"Quota reserved in ClusterQueue cluster-{queue}"
            )
            await self._event(ns, "Workload", workload, "Admitted", f"Admitted by ClusterQueue cluster-{queue}")
            await self._patch("trainjobs", ns, name, {"spec": {"suspend": False}})
            await self._condition(ns, name, "Suspended", "False", "Resumed", "TrainJob is resumed")
        await self._event(ns, "TrainJob", name, "SuccessfulCreateJobSet", f"Created JobSet {name}")
        job = self.emu.store[("trainjobs", ns, name)]
        if (job.get("spec") or {}).get("initializer"):
            for rjob in ("dataset-initializer", "model-initializer"):
                uri = job["spec"]["initializer"].get(rjob.split("-")[0], {}).get("storageUri", "")
                lines = [f"Downloading {uri}", f"{rjob}: done"]
                await self._run_pod(ns, job, rjob, rjob, lines, sc)
        if sc.unschedulable_for:
            pod = self.emu.create("pods", ns, pod_manifest(job, "node", "node"))
            pname = pod["metadata"]["name"]
            cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
            cond["message"] = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
            await self._patch("pods", ns, pname, {"status": {"phase": "Pending", "conditions": [cond]}})
            await self._event(ns, "Pod", pname, "FailedScheduling", cond["message"], "Warning")
            await asyncio.sleep(sc.unschedulable_for)
            self.emu.delete("pods", ns, pname)
        code = await self._run_pod(ns, job, "node", "node", sc.node_log, sc)
        if code == 0:
            await self._condition(ns, name, "Complete", "True", "JobsCompleted", "TrainJob is completed")
        else:
            await self._event(ns, "TrainJob", name, "FailedJobs", "ReplicatedJob node has failed jobs", "Warning")
            await self._condition(ns, name, "Failed", "True", "FailedJobs", "jobset failed: ReplicatedJob node failed")

    def admit(self, queue: str) -> None:
        self.loop.call_soon_threadsafe(self.admitted.setdefault(queue, asyncio.Event()).set)

    def _loadable(self, uri: str) -> bool:
        """Whether KServe would find ``uri``: a job's output on its workspace PVC, or a downloadable hub model."""
        if uri.startswith("hf://"):
            return uri in self.hub_models
        return self._local(uri) is not None

    def _local(self, uri: str) -> Path | None:
        match = re.fullmatch(r"pvc://[^/]+/output/(.+)", uri)
        local = self.output_dir / match.group(1) if match and self.output_dir else None
        return local if local is not None and local.is_dir() else None

    async def _run_isvc(self, ns: str, name: str) -> None:
        """Roll out an InferenceService's current spec: one ``storageUri`` (served by a local model server when
        ``servers`` is set), or ``storageUris`` (a base with LoRA adapters on the vLLM runtime: Ready once every
        entry is there; no model server behind it here)."""
        isvc = self.emu.store[("inferenceservices", ns, name)]
        predictor = isvc["spec"]["predictor"]
        entries = predictor.get("storageUris") or []
        uris = [e["uri"] for e in entries] or [predictor["model"]["storageUri"]]
        generation = isvc["metadata"].get("generation", 1)
        conds = [{"type": "PredictorReady", "status": "False", "reason": "Initializing"}]
        conds.append({"type": "Ready", "status": "False", "reason": "Initializing", "message": "loading the model"})
        status = {"observedGeneration": generation, "conditions": conds}
        await self._patch("inferenceservices", ns, name, {"status": status})
        missing = [u for u in uris if not self._loadable(u)]
        if missing or (not entries and self.servers is None):
            why = f"{(missing or uris)[0]}: no such model"
            conds = [{"type": "Ready", "status": "False", "reason": "ModelLoadFailed", "message": why}]
            await self._patch("inferenceservices", ns, name, {"status": {"conditions": conds}})
            return
        if not entries:
            local = self._local(uris[0])
            kind = isvc["metadata"].get("labels", {}).get("blueprint-playground.dev/kind", "fine-tuned")
            endpoint = await self.loop.run_in_executor(
                None, lambda: self.servers.start(str(local), kind=kind, name=name)
            )
            self.emu.proxies[(ns, name)] = (endpoint.url, endpoint.model)
        url = f"{self.emu_url}/serving/{ns}/{name}"
        ready = [{"type": t, "status": "True", "lastTransitionTime": now_iso()} for t in ("PredictorReady", "Ready")]
        status = {"url": url, "observedGeneration": generation, "conditions": ready}
        await self._patch("inferenceservices", ns, name, {"status": status})

    emu_url: str = ""


class Cluster:
    """The emulator + simulator on a background event loop, driven from synchronous tests."""

    def __init__(self, namespace: str = "ml") -> None:
        self.namespace = namespace
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Future | None = None
        self.thread = threading.Thread(target=self._main, name="k8s-emulator", daemon=True)
        self.emu: ClusterEmulator
        self.sim: TrainerSimulator
        self.ray: KubeRaySimulator
        self.url = ""

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        with contextlib.suppress(asyncio.CancelledError):  # stopped by __exit__
            self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        async with ClusterEmulator() as emu, kmock.Server(emu) as server:
            self.emu = emu
            self.url = str(server.url).rstrip("/")
            self.sim = TrainerSimulator(emu, self.loop)
            self.sim.emu_url = self.url
            self.ray = KubeRaySimulator(self.sim)
            self._stop = self.loop.create_future()
            self._ready.set()
            await self._stop
            if emu._session is not None:
                await emu._session.close()

    def __enter__(self) -> Cluster:
        self.thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the emulator did not start")
        self.put(
            "configmaps",
            {
                "metadata": {"name": "kubeflow-trainer-public", "namespace": "kubeflow-system"},
                "data": {"kubeflow_trainer_version": "v2.3.0"},
            },
            namespace="kubeflow-system",
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        async def finish() -> None:
            for task in list(self.sim.tasks.values()):
                task.cancel()
            self.emu.generation += 1  # close the streams still open, or the server waits for them
            await self.emu.notify()
            await self.emu.notify_logs()
            if self._stop is not None and not self._stop.done():
                self._stop.set_result(None)

        asyncio.run_coroutine_threadsafe(finish(), self.loop)
        self.thread.join(5)
        if self.thread.is_alive():  # a client still holds a keep-alive connection: the server would wait for it
            self.loop.call_soon_threadsafe(lambda: [task.cancel() for task in asyncio.all_tasks(self.loop)])
            self.thread.join(30)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            result = fn()
            await self.emu.notify()
            await self.emu.notify_logs()
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def put(self, plural: str, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return self.call(lambda: self.emu.create(plural, namespace or self.namespace, obj))

    def get(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        ns = None if plural in CLUSTER_SCOPED else (namespace or self.namespace)
        return self.call(lambda: copy.deepcopy(self.emu.store.get((plural, ns, name))))

    def items(self, plural: str) -> list[dict[str, Any]]:
        return self.call(lambda: copy.deepcopy(self.emu.items(plural)))

    def fault(self, **kwargs: Any) -> Fault:
        fault = Fault(**kwargs)
        self.call(lambda: self.emu.faults.append(fault))
        return fault

    def clear_faults(self) -> None:
        self.call(self.emu.faults.clear)

    def compact(self) -> None:
        self.call(self.emu.compact)

    def drop_streams(self) -> None:
        """Cut every open watch and log stream (as a load balancer restart would)."""

        async def bump() -> None:
            self.emu.generation += 1
            await self.emu.notify_logs()

        asyncio.run_coroutine_threadsafe(bump(), self.loop).result(30)
        self.call(lambda: None)

    def install_runtimes(self, *paths: Path) -> list[str]:
        names = []
        for path in paths:
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "ClusterTrainingRuntime":
                    self.put("clustertrainingruntimes", doc)
                    names.append(doc["metadata"]["name"])
        return names

    def kubeconfig(self, path: Path, *, namespace: str | None = None, token: str = "sim-token") -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
            "users": [{"name": "dev", "user": {"token": token}}],
            "contexts": [
                {"name": "sim", "context": {"cluster": "sim", "user": "dev", "namespace": namespace or self.namespace}}
            ],
            "current-context": "sim",
        }
        path.write_text(yaml.safe_dump(config))
        return path


def synthetic_trainer_log(steps: int = 20, *, fail: bool = False) -> list[str]:
    """A short trainer log in the trainer's line protocol (for runs that are not about parsing)."""
    lines = [format_event_line(Phase(JobPhase.INITIALIZING, "loading the model")), "tokenizer: 30 tokens"]
    lines.append(format_event_line(Phase(JobPhase.TRAINING, "")))
    for step in range(5, steps + 1, 5):
        lines.append(
            format_event_line(Progress(step=step, total_steps=steps, loss=3.0 / step, eta_seconds=steps - step))
        )
    if fail:
        lines += ["Traceback (most recent call last):", "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"]
        lines.append(format_event_line(Phase(JobPhase.FAILED, "RuntimeError: CUDA out of memory")))
        return lines
    lines.append(format_event_line(Phase(JobPhase.EVALUATING, "answering 50 held-out requests")))
    lines.append(format_event_line(Metric("eval_exact_match", 0.97)))
    lines.append(format_event_line(Phase(JobPhase.SAVING, "")))
    return lines


def serve_main(argv: list[str] | None = None) -> None:
    """Run the emulator + simulator standalone (the benchmark's cluster): prints its URL, runs until stdin closes."""
    import argparse
    import sys

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--line-delay", type=float, default=1.0)
    parser.add_argument(
        "--runtime", default=str(Path(__file__).resolve().parents[1] / "deploy/runtimes/playground-torch.yaml")
    )
    args = parser.parse_args(argv)
    with Cluster() as cluster:
        cluster.install_runtimes(Path(args.runtime))
        cluster.sim.scenario = Scenario(node_log=synthetic_trainer_log(args.steps), line_delay=args.line_delay)
        print(cluster.url, flush=True)
        sys.stdin.read()


def trainer_log(lines: list[str], *, step_limit: int | None = None) -> list[str]:
    """Trainer output to replay; ``step_limit`` keeps the progress lines up to that step."""
    out = []
    for line in lines:
        event = parse_line(line)
        if step_limit is not None and isinstance(event, Progress) and event.step > step_limit:
            continue
        out.append(line)
    return out


__all__ = ["EVENT_PREFIX", "Cluster", "ClusterEmulator", "Fault", "Scenario", "TrainerSimulator", "trainer_log"]

if __name__ == "__main__":
    serve_main()


def crd_schema(crd_file: Path, version: str) -> dict[str, Any]:
    crd = yaml.load(crd_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(f"{crd_file.name}: no version {version}")


def _unknown_fields(schema: dict[str, Any], data: Any, path: str) -> list[tuple[str, str]]:
    """Fields a structural schema would prune (the API server's strict field validation rejects them)."""
    out: list[tuple[str, str]] = []
    if isinstance(data, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in data.items():
            sub = (props or {}).get(key)
            if sub is not None:
                out += _unknown_fields(sub, value, f"{path}.{key}" if path else key)
            elif isinstance(extra, dict):
                out += _unknown_fields(extra, value, f"{path}.{key}")
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields") and extra is not True:
                out.append((f"{path}.{key}" if path else key, "unknown field"))
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(data):
            out += _unknown_fields(schema["items"], item, f"{path}[{i}]")
    return out


def cel_violations(schema: dict[str, Any], data: Any, path: str = "") -> list[tuple[str, str]]:
    """The CRD's CEL rules (``x-kubernetes-validations``) that ``data`` breaks, evaluated with cel-python.

    Transition rules (those reading ``oldSelf``) only apply to updates and are skipped; a rule applies
    where its field is present, as on the API server.
    """
    import celpy

    out: list[tuple[str, str]] = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" in rule["rule"]:
            continue
        result = _cel_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(data)})
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            out.append((path or "(root)", rule.get("message") or f"failed rule: {rule['rule']}"))
    if isinstance(data, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, value in data.items():
            sub = props.get(key) or (extra if isinstance(extra, dict) else None)
            if sub is not None:
                out += cel_violations(sub, value, f"{path}.{key}" if path else key)
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(data):
            out += cel_violations(schema["items"], item, f"{path}[{i}]")
    return out


_CEL_PROGRAMS: dict[str, Any] = {}


def _cel_program(rule: str) -> Any:
    if rule not in _CEL_PROGRAMS:
        import celpy

        env = celpy.Environment()
        _CEL_PROGRAMS[rule] = env.program(env.compile(rule))
    return _CEL_PROGRAMS[rule]


def crd_validator(crd_file: Path, version: str) -> Callable[[dict[str, Any]], list[tuple[str, str]]]:
    """Check an object as the API server would on create: the CRD's openAPIV3Schema (jsonschema),
    unknown fields (pruned / rejected by strict field validation) and its CEL rules."""
    import jsonschema

    schema = crd_schema(crd_file, version)
    validator = jsonschema.Draft7Validator(schema)

    def check(obj: dict[str, Any]) -> list[tuple[str, str]]:
        problems = [
            (".".join(str(p) for p in err.absolute_path) or "(root)", err.message)
            for err in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
        ]
        return problems + _unknown_fields(schema, obj, "") + cel_violations(schema, obj)

    return check


# -- KubeRay: RayJob → RayCluster → head/worker pods → submitter Job → Ray job status ----------------------------
RAY_WORKER_PREFIX = "\x1b[36m(RayTrainWorker pid=123, ip=10.0.0.5)\x1b[0m "


def ray_driver_log(trainer_lines: list[str], *, fail: bool = False) -> list[str]:
    """A Ray Train driver's log around the trainer's output, as ``ray job logs`` streams it: Ray's own lines, every
    line of rank 0 behind Ray's coloured ``(RayTrainWorker pid=N, ip=A)`` prefix, then the driver's verdict."""
    lines = [
        "2026-08-20 10:00:00,000\tINFO worker.py:1660 -- Connecting to existing Ray cluster at address: 10.0.0.4:6379",
        "2026-08-20 10:00:01,000\tINFO worker.py:1843 -- Connected to Ray cluster. View the dashboard at 10.0.0.4:8265",
    ]
    lines += [RAY_WORKER_PREFIX + line for line in trainer_lines]
    if fail:
        reason = "RuntimeError: the trainer exited with code 1 (its last lines are above)"
        lines += [format_event_line(Phase(JobPhase.FAILED, reason)), f"playground.train.on_ray: error: {reason}"]
    return lines


def kuberay_problems(job: dict[str, Any]) -> list[str]:
    """What KubeRay's own validation (utils/validation.go: ValidateRayJobMetadata/Spec) rejects; the RayJob then
    ends ValidationFailed. The subset the playground's RayJobs could break."""
    meta, spec = job.get("metadata") or {}, job.get("spec") or {}
    name = meta.get("name", "")
    problems = []
    if len(name) > 47 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        problems.append("The RayJob metadata is invalid: RayJob name should be a valid DNS1035 label of at most 47")
    if spec.get("suspend") and not spec.get("shutdownAfterJobFinishes"):
        problems.append("a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended")
    if (spec.get("ttlSecondsAfterFinished") or 0) < 0:
        problems.append("TTLSecondsAfterFinished must be a non-negative integer")
    cluster = spec.get("rayClusterSpec")
    if not cluster:
        problems.append("one of RayClusterSpec or ClusterSelector must be set")
        return problems
    if not ((cluster.get("headGroupSpec") or {}).get("template") or {}).get("spec", {}).get("containers"):
        problems.append("headGroupSpec should have at least one container")
    for group in cluster.get("workerGroupSpecs") or []:
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not (group.get("template") or {}).get("spec", {}).get("containers"):
            problems.append("workerGroupSpec should have at least one container")
        if not cluster.get("enableInTreeAutoscaling") and (low is None or high is None):
            problems.append(f"worker group {group.get('groupName')} must set both minReplicas and maxReplicas")
        elif low is not None and high is not None and low > high:
            problems.append(f"worker group {group.get('groupName')} has minReplicas greater than maxReplicas")
    if spec.get("activeDeadlineSeconds") is not None and spec["activeDeadlineSeconds"] <= 0:
        problems.append("activeDeadlineSeconds must be a positive integer")
    return problems


def _rand(k: int = 5) -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=k))


class KubeRaySimulator:
    """Plays KubeRay's RayJob and RayCluster controllers, the Job controller, the kubelet and Kueue's RayJob
    integration against the emulator's store, in the order the real ones act:

    RayJob ADDED → (KubeRay's validation) → New → Initializing (jobId, rayClusterName, startTime) → a suspended one
    goes Suspending → Suspended (Kueue: a Workload, admission, then ``spec.suspend: false`` → New again) → RayCluster
    with head and worker pods (Scheduled, Running; a worker Unschedulable first when the scenario says) → cluster
    ready → the submitter Job named like the RayJob and its pod (``ray job submit``, then ``ray job logs --follow``
    replaying the scenario's driver log; ``submitter_failures`` first pods that die half way, the next replays the log
    from its start) → jobStatus PENDING → RUNNING → SUCCEEDED/FAILED and jobDeploymentStatus Complete/Failed →
    after the TTL the RayCluster is deleted. ``spec.suspend: true`` while Initializing/Running deletes the cluster
    and the submitter and ends Suspended; Kueue unsuspends an admitted RayJob again unless its Workload was
    deactivated (``spec.active: false``), which evicts it. Deleting the RayJob deletes what it owns.
    """

    def __init__(self, trainer: TrainerSimulator) -> None:
        self.sim = trainer
        self.emu = trainer.emu
        self.loop = trainer.loop
        self.scenario = Scenario()  # node_log: the driver's log lines (see ray_driver_log)
        self.scenarios: dict[str, Scenario] = {}  # by RayJob name or blueprint label
        self.submitter_failures = 0  # submitter pods that die half way before one streams the whole log
        self.cluster_ttl: float | None = 0.05  # stands for spec.ttlSecondsAfterFinished (None: the spec's)
        self.kueue_delay = 0.01  # how soon Kueue reacts (admission, unsuspending an admitted job)
        self.emu.hooks.append(self._on_change)

    @property
    def errors(self) -> list[BaseException]:
        return self.sim.errors

    # -- reacting to changes (hooks run in the emulator's loop, synchronously) -------------------------------
    def _on_change(self, etype: str, plural: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace"), meta.get("name")
        if plural == "rayjobs":
            key = f"rayjobs/{ns}/{name}"
            deployment = (obj.get("status") or {}).get("jobDeploymentStatus", "")
            suspend = bool((obj.get("spec") or {}).get("suspend"))
            if etype == "ADDED":
                self.sim._spawn(key, self._run(ns, name))
            elif etype == "DELETED":
                for suffix in ("", "/suspend", "/kueue"):
                    task = self.sim.tasks.pop(key + suffix, None)
                    if task:
                        task.cancel()
                self._collect(ns, meta.get("uid"), name)
            elif suspend and deployment in ("Initializing", "Running") and not self._busy(f"{key}/suspend"):
                task = self.sim.tasks.pop(key, None)
                if task:
                    task.cancel()
                self.sim._spawn(f"{key}/suspend", self._suspend(ns, name))
            elif not suspend and deployment == "Suspended" and not self._busy(key):
                self.sim._spawn(key, self._run(ns, name))  # resumed (Kueue admitted it): a new cluster
        elif plural == "workloads" and etype == "MODIFIED" and self._deactivated(obj):
            self.sim._spawn(f"workloads/{ns}/{name}/evict", self._evict(ns, name))

    def _deactivated(self, workload: dict[str, Any]) -> bool:
        """``spec.active: false`` on a Workload not evicted yet (nor being evicted)."""
        meta = workload.get("metadata") or {}
        key = f"workloads/{meta.get('namespace')}/{meta.get('name')}/evict"
        inactive = (workload.get("spec") or {}).get("active") is False
        return inactive and not self._condition_true(workload, "Evicted") and not self._busy(key)

    def _busy(self, key: str) -> bool:
        task = self.sim.tasks.get(key)
        return task is not None and not task.done()

    @staticmethod
    def _condition_true(obj: dict[str, Any], ctype: str) -> bool:
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c.get("type") == ctype and c.get("status") == "True" for c in conds)

    def _owned(self, plural: str, ns: str, uid: str | None) -> list[dict[str, Any]]:
        return [
            o
            for o in self.emu.items(plural, ns)
            if any(r.get("uid") == uid for r in (o.get("metadata") or {}).get("ownerReferences") or [])
        ]

    def _collect(self, ns: str, uid: str | None, name: str) -> None:
        """Kubernetes' garbage collector: what the deleted RayJob owned (cluster, submitter, pods, Workload, PVC)."""
        for cluster in self._owned("rayclusters", ns, uid):
            self._delete_cluster(ns, cluster)
        for job in self._owned("jobs", ns, uid):
            self._delete_submitter(ns, job)
        for plural in ("workloads", "persistentvolumeclaims"):
            for obj in self._owned(plural, ns, uid):
                self.emu.delete(plural, ns, obj["metadata"]["name"])

    def _delete_cluster(self, ns: str, cluster: dict[str, Any]) -> None:
        cname = cluster["metadata"]["name"]
        for pod in self.emu.items("pods", ns):
            if (pod["metadata"].get("labels") or {}).get("ray.io/cluster") == cname:
                self.emu.end_log(ns, pod["metadata"]["name"])
                self.emu.delete("pods", ns, pod["metadata"]["name"])
        if ("rayclusters", ns, cname) in self.emu.store:
            self.emu.delete("rayclusters", ns, cname)

    def _delete_submitter(self, ns: str, job: dict[str, Any]) -> None:
        jname = job["metadata"]["name"]
        for pod in self.emu.items("pods", ns):
            if (pod["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name") == jname:
                self.emu.end_log(ns, pod["metadata"]["name"])
                self.emu.delete("pods", ns, pod["metadata"]["name"])
        if ("jobs", ns, jname) in self.emu.store:
            self.emu.delete("jobs", ns, jname)

    # -- the RayJob controller -------------------------------------------------------------------------------
    def _status(self, ns: str, name: str, **status: Any) -> Any:
        return self.sim._patch("rayjobs", ns, name, {"status": status})

    def _scenario(self, job: dict[str, Any]) -> Scenario:
        name = job["metadata"]["name"]
        blueprint = (job["metadata"].get("labels") or {}).get("blueprint-playground.dev/blueprint", "")
        return self.scenarios.get(name) or self.scenarios.get(blueprint, self.scenario)

    async def _run(self, ns: str, name: str) -> None:
        job = self.emu.store.get(("rayjobs", ns, name))
        if job is None:
            return
        problems = kuberay_problems(job)
        if problems:
            await self.sim._event(ns, "RayJob", name, "InvalidRayJobSpec", f"{ns}/{name}: {problems[0]}", "Warning")
            await self._status(
                ns, name, jobDeploymentStatus="ValidationFailed", reason="ValidationFailed", message=problems[0]
            )
            return
        sc = self._scenario(job)
        await asyncio.sleep(sc.start_delay)
        queue = (job["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name")
        if queue and not self._busy(f"rayjobs/{ns}/{name}/kueue") and not self._workload(ns, name):
            self.sim._spawn(f"rayjobs/{ns}/{name}/kueue", self._admit(ns, name, queue, sc))
        job_id, cluster_name = f"{name}-{_rand()}", f"{name}-{_rand()}"
        await self._status(
            ns,
            name,
            jobDeploymentStatus="Initializing",
            jobStatus="",
            jobId=job_id,
            rayClusterName=cluster_name,
            startTime=now_iso(),
        )
        if (self.emu.store[("rayjobs", ns, name)].get("spec") or {}).get("suspend"):
            return  # the hook moves it on: Suspending → Suspended, until Kueue admits it
        job = self.emu.store[("rayjobs", ns, name)]
        cluster = await self._create_cluster(ns, job, cluster_name, sc)
        if cluster is None:
            return
        url = f"{name}-head-svc.{ns}.svc.cluster.local:8265"
        await self.sim._event(ns, "RayJob", name, "CreatedService", f"Created the service {ns}/{name}-head-svc")
        await self._status(ns, name, dashboardURL=url, rayClusterStatus=cluster["status"])
        code = await self._submit(ns, name, job_id, url, sc)
        current = self.emu.store.get(("rayjobs", ns, name))
        if current is None or current["status"].get("jobDeploymentStatus") != "Running":
            return
        ray_lines = [line for line in sc.node_log][-20:]
        if code == 0:
            await self._status(
                ns,
                name,
                jobStatus="SUCCEEDED",
                jobDeploymentStatus="Complete",
                endTime=now_iso(),
                message="Job finished successfully.",
                succeeded=1,
            )
        else:
            message = (
                f"Job entrypoint command failed with exit code {code}, last available logs (truncated to "
                "20,000 chars):\n" + "\n".join(ray_lines)
            )
            await self._status(
                ns,
                name,
                jobStatus="FAILED",
                jobDeploymentStatus="Failed",
                reason="AppFailed",
                message=message,
                endTime=now_iso(),
                failed=1,
            )
        spec = self.emu.store[("rayjobs", ns, name)]["spec"]
        if spec.get("shutdownAfterJobFinishes"):  # KubeRay deletes the cluster after the TTL
            ttl = self.cluster_ttl if self.cluster_ttl is not None else spec.get("ttlSecondsAfterFinished", 0)
            await asyncio.sleep(ttl)
            current = self.emu.store.get(("rayclusters", ns, cluster_name))
            if current is not None:
                self._delete_cluster(ns, current)
                await self.sim._event(ns, "RayJob", name, "DeletedRayCluster", f"Deleted cluster {ns}/{cluster_name}")
        await self.emu.notify()
        await self.emu.notify_logs()

    async def _create_cluster(
        self, ns: str, job: dict[str, Any], cluster_name: str, sc: Scenario
    ) -> dict[str, Any] | None:
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": name, "uid": uid, "controller": True}
        labels = dict(job["metadata"].get("labels") or {})
        labels |= {
            "ray.io/originated-from-cr-name": name,
            "ray.io/originated-from-crd": "RayJob",
            "ray.io/job-submission-mode": job["spec"].get("submissionMode", "K8sJobMode"),
        }
        cluster = {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {"name": cluster_name, "namespace": ns, "labels": labels, "ownerReferences": [owner]},
            "spec": copy.deepcopy(job["spec"]["rayClusterSpec"]),
        }
        check = self.emu.validators.get("rayclusters")  # the API server validates what KubeRay creates
        problems = check(cluster) if check else []
        if problems:
            self.errors.append(AssertionError(f"RayCluster {cluster_name} is invalid: {problems}"))
            return None
        self.emu.create("rayclusters", ns, cluster)
        await self.sim._event(ns, "RayJob", name, "CreatedRayCluster", f"Created RayCluster {ns}/{cluster_name}")
        spec = cluster["spec"]
        head = await self._ray_pod(ns, cluster_name, "head", "headgroup", spec["headGroupSpec"]["template"])
        workers = []
        for group in spec.get("workerGroupSpecs") or []:
            for _ in range(group.get("replicas", 1)):
                workers.append(await self._ray_pod(ns, cluster_name, "worker", group["groupName"], group["template"]))
        if sc.unschedulable_for and workers:
            cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
            cond["message"] = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
            await self.sim._patch("pods", ns, workers[0], {"status": {"phase": "Pending", "conditions": [cond]}})
            await self.sim._event(ns, "Pod", workers[0], "FailedScheduling", cond["message"], "Warning")
            await asyncio.sleep(sc.unschedulable_for)
        for pod in [head, *workers]:
            if ("pods", ns, pod) not in self.emu.store:
                return None
            await self.sim._event(ns, "Pod", pod, "Scheduled", f"Successfully assigned {ns}/{pod} to sim-node-1")
            await self.sim._pod_state(ns, pod, "Pending", {"waiting": {"reason": "ContainerCreating"}})
            await self.sim._pod_state(ns, pod, "Running", {"running": {"startedAt": now_iso()}})
        replicas = len(workers)
        status = {
            "state": "ready",
            "desiredWorkerReplicas": replicas,
            "readyWorkerReplicas": replicas,
            "availableWorkerReplicas": replicas,
            "lastUpdateTime": now_iso(),
        }
        return await self.sim._patch("rayclusters", ns, cluster_name, {"status": status})

    async def _ray_pod(self, ns: str, cluster: str, node_type: str, group: str, template: dict[str, Any]) -> str:
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        labels |= {
            "ray.io/is-ray-node": "yes",
            "ray.io/cluster": cluster,
            "ray.io/node-type": node_type,
            "ray.io/group": group,
            "ray.io/identifier": f"{cluster}-{node_type}",
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
        stem = f"{cluster}-head" if node_type == "head" else f"{cluster}-{group}-worker"
        pod = self.emu.create(
            "pods",
            ns,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{stem}-{_rand()}", "labels": labels},
                "spec": copy.deepcopy(template["spec"]),
                "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
            },
        )
        name = pod["metadata"]["name"]
        reason = "CreatedHeadPod" if node_type == "head" else "CreatedWorkerPod"
        await self.sim._event(ns, "RayCluster", cluster, reason, f"Created {node_type} Pod {ns}/{name}")
        return name

    async def _submit(self, ns: str, name: str, job_id: str, url: str, sc: Scenario) -> int:
        """The submitter Job and its pods; returns the Ray job's exit code."""
        rayjob = self.emu.store[("rayjobs", ns, name)]
        uid = rayjob["metadata"]["uid"]
        origin = {
            "ray.io/originated-from-cr-name": name,
            "ray.io/originated-from-crd": "RayJob",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
        template = copy.deepcopy(
            rayjob["spec"].get("submitterPodTemplate")
            or {"spec": {"containers": [{"name": "ray-job-submitter", "image": "sim"}], "restartPolicy": "Never"}}
        )
        template.setdefault("metadata", {}).setdefault("labels", {}).update(origin)
        container = template["spec"]["containers"][0]
        entrypoint = rayjob["spec"].get("entrypoint", "")
        container.setdefault("command", ["/bin/bash", "-ce", "--"])
        container.setdefault(
            "args",
            [
                f"ray job submit --address http://{url} --no-wait --submission-id {job_id} -- "
                f"{entrypoint} ; ray job logs --address http://{url} --follow {job_id}"
            ],
        )
        owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": name, "uid": uid, "controller": True}
        batch = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": dict(origin), "ownerReferences": [owner]},
            "spec": {"backoffLimit": 2, "template": template},
        }
        self.emu.create("jobs", ns, batch)
        await self.sim._event(ns, "RayJob", name, "CreatedRayJobSubmitter", f"Created Kubernetes Job {ns}/{name}")
        await self._status(
            ns, name, jobDeploymentStatus="Running", jobStatus="PENDING", message="Job has not started yet."
        )
        driver = list(sc.node_log)
        for attempt in range(self.submitter_failures + 1):
            last = attempt == self.submitter_failures
            labels = {**template["metadata"]["labels"], "batch.kubernetes.io/job-name": name, "job-name": name}
            pod = self.emu.create(
                "pods",
                ns,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name}-{_rand()}",
                        "labels": labels,
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name}],
                    },
                    "spec": copy.deepcopy(template["spec"]),
                    "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
                },
            )
            pname = pod["metadata"]["name"]
            await self.sim._event(ns, "Job", name, "SuccessfulCreate", f"Created pod: {pname}")
            await self.sim._pod_state(ns, pname, "Pending", {"waiting": {"reason": "ContainerCreating"}})
            await self.sim._pod_state(ns, pname, "Running", {"running": {"startedAt": now_iso()}})
            if attempt == 0:
                self._log(
                    ns,
                    pname,
                    [
                        f"Job submission server address: http://{url}",
                        "",
                        "-" * 50,
                        f"Job '{job_id}' submitted successfully",
                        "-" * 50,
                        "",
                        "Next steps",
                        "  Query the logs of the job:",
                        f"    ray job logs {job_id}",
                        "  Query the status of the job:",
                        f"    ray job status {job_id}",
                        "  Request the job to be stopped:",
                        f"    ray job stop {job_id}",
                        "",
                    ],
                )
                await self._status(ns, name, jobStatus="RUNNING", message="Job is currently running.")
            lines = driver if last else driver[: len(driver) // 2]
            for i, line in enumerate(lines):
                if ("pods", ns, pname) not in self.emu.store:
                    return 1  # suspended or deleted under it
                self.emu.append_log(ns, pname, line)
                if i % 20 == 0 or sc.line_delay:
                    await self.emu.notify_logs()
                if sc.line_delay:
                    await asyncio.sleep(sc.line_delay)
            if last:
                verdict = "succeeded" if sc.exit_code == 0 else "failed"
                tail = ["", "-" * 30, f"Job '{job_id}' {verdict}", "-" * 30, ""]
                if sc.exit_code:  # `ray job logs` prints the status message: the log's tail once more
                    tail += [
                        f"Status message: Job entrypoint command failed with exit code {sc.exit_code}, last "
                        "available logs (truncated to 20,000 chars):",
                        *driver[-20:],
                    ]
                self._log(ns, pname, tail)
            self.emu.end_log(ns, pname)
            await self.emu.notify_logs()
            code = 0 if last else 1  # `ray job logs --follow` exits 0 whatever the Ray job's verdict
            term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "finishedAt": now_iso()}
            await self.sim._pod_state(ns, pname, "Succeeded" if code == 0 else "Failed", {"terminated": term})
        conds = [{"type": "Complete", "status": "True", "lastTransitionTime": now_iso()}]
        await self.sim._patch("jobs", ns, name, {"status": {"succeeded": 1, "conditions": conds}})
        return sc.exit_code

    def _log(self, ns: str, pod: str, lines: list[str]) -> None:
        for line in lines:
            self.emu.append_log(ns, pod, line)

    async def _suspend(self, ns: str, name: str) -> None:
        """KubeRay's Suspending: the cluster and the submitter go, the Ray job's status is reset, then Suspended;
        Kueue unsuspends a RayJob whose Workload is still admitted and active."""
        await self._status(ns, name, jobDeploymentStatus="Suspending")
        job = self.emu.store.get(("rayjobs", ns, name))
        if job is None:
            return
        uid = job["metadata"]["uid"]
        for cluster in self._owned("rayclusters", ns, uid):
            self._delete_cluster(ns, cluster)
            await self.sim._event(
                ns, "RayJob", name, "DeletedRayCluster", f"Deleted cluster {ns}/{cluster['metadata']['name']}"
            )
        for batch in self._owned("jobs", ns, uid):
            self._delete_submitter(ns, batch)
            await self.sim._event(
                ns, "RayJob", name, "DeletedRayJobSubmitter", f"Deleted submitter K8s Job {ns}/{name}"
            )
        await self.emu.notify_logs()
        await self._status(
            ns,
            name,
            jobDeploymentStatus="Suspended",
            jobStatus="",
            rayClusterName="",
            jobId="",
            dashboardURL="",
            message="",
            reason="",
            rayClusterStatus=None,
        )
        self.sim.tasks.pop(f"rayjobs/{ns}/{name}/suspend", None)
        workload = self._workload(ns, name)
        if workload is not None and self._condition_true(workload, "Admitted") and workload["spec"].get("active", True):
            await asyncio.sleep(self.kueue_delay)  # Kueue: "Job admitted, unsuspending"
            await self.sim._patch("rayjobs", ns, name, {"spec": {"suspend": False}})

    # -- Kueue ----------------------------------------------------------------------------------------------
    def _workload(self, ns: str, name: str) -> dict[str, Any] | None:
        job = self.emu.store.get(("rayjobs", ns, name))
        uid = job["metadata"]["uid"] if job else None
        found = self._owned("workloads", ns, uid) if uid else []
        return found[0] if found else None

    async def _admit(self, ns: str, name: str, queue: str, sc: Scenario) -> None:
        job = self.emu.store[("rayjobs", ns, name)]
        uid = job["metadata"]["uid"]
        owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": name, "uid": uid, "controller": True}
        wname = f"rayjob-{name}-{uuid.uuid4().hex[:5]}"
        workload = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": wname, "labels": {"kueue.x-k8s.io/job-uid": uid}, "ownerReferences": [owner]},
            "spec": {"active": True, "queueName": queue, "podSets": []},
        }
        self.emu.create("workloads", ns, workload)
        if sc.hold_queue:
            msg = "couldn't assign flavors to pod set head: insufficient unused quota for cpu in flavor default"
            await self.sim._event(ns, "Workload", wname, "Pending", msg)
            entry = {"metadata": {"name": wname, "namespace": ns, "ownerReferences": [owner]}, "priority": 0}
            waiting = self.emu.pending_workloads.setdefault((ns, queue), [])
            waiting.append({**entry, "localQueueName": queue})
            try:
                await self.sim.admitted.setdefault(queue, asyncio.Event()).wait()
            finally:
                waiting[:] = [w for w in waiting if w["metadata"]["name"] != wname]
        await asyncio.sleep(self.kueue_delay)
        current = self.emu.store.get(("workloads", ns, wname))
        if current is None or current["spec"].get("active") is False:
            return
        await self.sim._event(ns, "Workload", wname, "QuotaReserved", f"Quota reserved in ClusterQueue cluster-{queue}")
        await self.sim._event(ns, "Workload", wname, "Admitted", f"Admitted by ClusterQueue cluster-{queue}")
        conds = [
            {"type": t, "status": "True", "reason": t, "message": "", "lastTransitionTime": now_iso()}
            for t in ("QuotaReserved", "Admitted")
        ]
        await self.sim._patch("workloads", ns, wname, {"status": {"conditions": conds}})
        while True:  # Kueue unsuspends the admitted job once KubeRay reports it suspended (or not yet started)
            rayjob = self.emu.store.get(("rayjobs", ns, name))
            if rayjob is None:
                return
            deployment = (rayjob.get("status") or {}).get("jobDeploymentStatus", "")
            if deployment in ("Suspended", "") or not rayjob["spec"].get("suspend"):
                break
            pulse = self.emu.pulse()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pulse.wait(), timeout=0.5)
        await self.sim._patch("rayjobs", ns, name, {"spec": {"suspend": False}})
        self.sim.tasks.pop(f"rayjobs/{ns}/{name}/kueue", None)

    async def _evict(self, ns: str, wname: str) -> None:
        """A deactivated Workload: Kueue evicts it and keeps its job suspended (it is never requeued)."""
        workload = self.emu.store.get(("workloads", ns, wname))
        if workload is None:
            return
        conds = [c for c in (workload.get("status") or {}).get("conditions") or [] if c["type"] != "Admitted"]
        conds.append(
            {
                "type": "Evicted",
                "status": "True",
                "reason": "Deactivated",
                "message": "The workload is deactivated",
                "lastTransitionTime": now_iso(),
            }
        )
        await self.sim._patch("workloads", ns, wname, {"status": {"conditions": conds}})
        await self.sim._event(ns, "Workload", wname, "EvictedDueToDeactivated", "The workload is deactivated")
        for ref in workload["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "RayJob" and ("rayjobs", ns, ref["name"]) in self.emu.store:
                await self.sim._patch("rayjobs", ns, ref["name"], {"spec": {"suspend": True}})


def trainer_request(env: list[dict[str, Any]]) -> Any:
    """The run request a trainer pod reads: its container env's ``PLAYGROUND_RUN_REQUEST``, validated as the trainer
    validates it (``RunRequest.from_json``)."""
    from playground.run_request import REQUEST_ENV, RunRequest

    return RunRequest.from_json(next(item["value"] for item in env if item["name"] == REQUEST_ENV))
