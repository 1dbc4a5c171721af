"""KServe model servers: a finished TrainJob's model (or its base model) as an ``InferenceService`` on the
HuggingFace runtime, whose OpenAI-compatible routes live under ``/openai/v1``; waited on with one watch.

Names: KServe's default domain template ``{{ .Name }}-{{ .Namespace }}`` names the host after the predictor
service ``<isvc>-predictor``, and a DNS label holds at most 63 characters, so
len(isvc) + len("-predictor-") + len(namespace) <= 63. Job names are at most 26 characters and InferenceService
names ``<job>-ft``/``<job>-base`` at most 31, which leaves 21 for the namespace (the documented
``blueprint-playground`` has 20). In a longer namespace the name is shortened, a hash of the job name keeping it
unique.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from functools import partial
from typing import Any

from playground.backends.kubernetes import manifests as m
from playground.backends.kubernetes.connection import Connection
from playground.backends.kubernetes.watch import ObjectChanged, ResourceWatcher, WatchFailed, WatchStats
from playground.blueprints import Blueprint, get_blueprint
from playground.errors import BackendError, UserError, shown
from playground.serving.base import ModelServers, model_to_serve
from playground.types import Endpoint, Job

KSERVE_GROUP = "serving.kserve.io"
KSERVE_VERSION = "v1beta1"
ISVC_PLURAL = "inferenceservices"
ISVCS = "inferenceservices.serving.kserve.io"
KSERVE_HOST_INFIX = "-predictor-"
PORT_IS_LOCAL = (
    "--port applies to the local backend's model servers (an InferenceService is reached at its cluster URL); "
    "allowed: --backend local"
)


def isvc_name(job_name: str, base: bool, namespace: str) -> str:
    """``<job>-ft`` / ``<job>-base``, shortened (with a hash of the job name) when KServe's host label
    ``<isvc>-predictor-<namespace>`` would pass 63 characters."""
    suffix = "base" if base else "ft"
    budget = m.DNS_LABEL_MAX - len(KSERVE_HOST_INFIX) - len(namespace)
    name = f"{job_name}-{suffix}"
    if len(name) <= budget:
        return name
    digest = hashlib.sha1(job_name.encode()).hexdigest()[:6]
    keep = budget - len(suffix) - len(digest) - 2
    if keep < 1:
        raise UserError(
            f"namespace {shown(namespace)} is too long to serve from: KServe's host label "
            f"<name>{KSERVE_HOST_INFIX}<namespace> must fit in {m.DNS_LABEL_MAX} characters; "
            f"use a namespace of at most {m.DNS_LABEL_MAX - len(KSERVE_HOST_INFIX) - len(suffix) - len(digest) - 3} "
            "characters",
            field="namespace",
        )
    return f"{job_name[:keep].rstrip('-')}-{digest}-{suffix}"


def build_inferenceservice(
    job_name: str,
    blueprint: Blueprint,
    storage_uri: str,
    opts: m.ClusterOptions,
    *,
    base: bool,
    owner: str | None = None,
) -> dict[str, Any]:
    """A KServe InferenceService on the Hugging Face runtime serving ``storage_uri``."""
    name = isvc_name(job_name, base, opts.namespace)
    res = blueprint.resources
    requests = {"cpu": str(res.cpu or "1"), "memory": str(res.memory or "4Gi")}
    limits = dict(requests)
    args: list[str] = []
    if res.gpus_per_node:
        limits["nvidia.com/gpu"] = "1"
        requests["nvidia.com/gpu"] = "1"
    else:
        args.append("--backend=huggingface")  # vLLM needs a GPU; the transformers backend runs on CPU
    if blueprint.model.dtype != "auto":
        args.append(f"--dtype={blueprint.model.dtype}")
    model: dict[str, Any] = {
        "modelFormat": {"name": "huggingface"},
        "storageUri": storage_uri,
        "resources": {"requests": requests, "limits": limits},
    }
    if args:
        model["args"] = args
    if storage_uri.startswith("hf://"):
        # a plain dict in the manifest (the Trainer API's model object would not serialize as one)
        model["env"] = [m.secret_env("HF_TOKEN", opts, optional=not blueprint.model.gated).to_dict()]
    labels = {
        m.LABEL_JOB: job_name,
        m.LABEL_KIND: "base" if base else "fine-tuned",
        m.LABEL_BLUEPRINT: m.label_value(blueprint.id),
        m.LABEL_MANAGED: m.MANAGED_BY,
        **opts.extra_labels,
    }
    owner_labels, owner_annotations = m.owner_metadata(owner)
    labels.update(owner_labels)
    metadata: dict[str, Any] = {"name": name, "namespace": opts.namespace, "labels": labels}
    if owner_annotations:
        metadata["annotations"] = owner_annotations
    return {
        "apiVersion": f"{KSERVE_GROUP}/{KSERVE_VERSION}",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {"predictor": {"model": model}},
    }


class KServeServers(ModelServers):
    """InferenceServices in the connection's namespace, labelled with their job, kind and owner."""

    name = "kubernetes"

    def __init__(
        self,
        connection: Connection,
        opts: m.ClusterOptions,
        *,
        serve_timeout: float = 600.0,
        stats: WatchStats | None = None,
    ) -> None:
        self.connection = connection
        self.opts = opts
        self.serve_timeout = serve_timeout
        self.stats = stats if stats is not None else WatchStats()

    @property
    def namespace(self) -> str:
        return self.connection.namespace

    def _call(self, verb: str, method: str, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
        try:
            return getattr(self.connection.custom, method)(KSERVE_GROUP, KSERVE_VERSION, *args, **kwargs)
        except Exception as exc:
            raise self.connection.error(exc, verb, ISVCS, name) from None

    def _isvcs(self, selector: str) -> list[dict[str, Any]]:
        data = self._call("list", "list_namespaced_custom_object", self.namespace, ISVC_PLURAL, label_selector=selector)
        return data.get("items") or []

    def _delete(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.connection.custom.delete_namespaced_custom_object(
                KSERVE_GROUP, KSERVE_VERSION, self.namespace, ISVC_PLURAL, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise self.connection.error(exc, "delete", ISVCS, name) from None
        except Exception as exc:
            raise self.connection.error(exc, "delete", ISVCS, name) from None

    @staticmethod
    def _endpoint(isvc: dict[str, Any]) -> Endpoint | None:
        meta = isvc.get("metadata") or {}
        status = isvc.get("status") or {}
        url = status.get("url")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if not url or not ready:
            return None
        labels = meta.get("labels") or {}
        return Endpoint(
            url=url.rstrip("/") + "/openai/v1",
            model=meta.get("name", ""),
            job_id=labels.get(m.LABEL_JOB),
            kind=labels.get(m.LABEL_KIND, "fine-tuned"),
            backend="kubernetes",
            name=meta.get("name"),
            owner=_at(meta, "annotations", m.ANN_OWNER),
        )

    def storage_uri(self, job: Job, blueprint: Blueprint, *, base: bool) -> str:
        """What the InferenceService loads: the job's model directory on its workspace PVC, or its base model."""
        if not base:
            return model_to_serve(job, base=False)
        uri = job.base_model or m.base_model_uri(job.id, blueprint)
        if uri.startswith("pkg://"):  # a model file inside a Python package: nothing KServe can load
            raise UserError(
                f"the base model of {blueprint.id!r} is {uri}, a model shipped in a Python package that KServe "
                "cannot load; serve the base model with the local backend (playground serve JOB --base)",
                field="base",
            )
        return uri

    def check_port(self, port: int | None) -> None:
        if port is not None:
            raise UserError(PORT_IS_LOCAL, field="--port")

    def serve(self, job: Job, *, base: bool = False, port: int | None = None) -> Endpoint:
        from kubernetes.client.exceptions import ApiException

        self.check_port(port)
        blueprint = get_blueprint(job.blueprint_id)
        uri = self.storage_uri(job, blueprint, base=base)
        body = build_inferenceservice(job.id, blueprint, uri, self.opts, base=base, owner=job.owner)
        name = body["metadata"]["name"]
        custom = self.connection.custom
        try:
            custom.create_namespaced_custom_object(KSERVE_GROUP, KSERVE_VERSION, self.namespace, ISVC_PLURAL, body)
        except ApiException as exc:
            if exc.status != 409:
                raise self.connection.error(exc, "create", ISVCS, name) from None
            existing = custom.get_namespaced_custom_object(
                KSERVE_GROUP, KSERVE_VERSION, self.namespace, ISVC_PLURAL, name
            )
            owned = _at(existing, "metadata", "labels", m.LABEL_JOB) == job.id
            if not owned or _at(existing, "spec", "predictor", "model", "storageUri") != uri:
                raise self.connection.error(exc, "create", ISVCS, name) from None
        except Exception as exc:
            raise self.connection.error(exc, "create", ISVCS, name) from None
        return self._wait_ready(name)

    def _wait_ready(self, name: str) -> Endpoint:
        """Watch the InferenceService until Ready (one watch, no polling) or ``serve_timeout``."""
        inbox: queue.Queue = queue.Queue()
        stop = threading.Event()
        watcher = ResourceWatcher(
            "isvc",
            partial(
                self.connection.custom.list_namespaced_custom_object,
                KSERVE_GROUP,
                KSERVE_VERSION,
                self.namespace,
                ISVC_PLURAL,
                field_selector=f"metadata.name={name}",
            ),
            inbox.put,
            stop,
            timeout_seconds=max(30, int(self.serve_timeout)),
            stats=self.stats,
        )
        deadline = time.monotonic() + self.serve_timeout
        last: dict[str, Any] = {}
        watcher.start()
        try:
            while time.monotonic() < deadline:
                try:
                    item = inbox.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                except queue.Empty:
                    continue
                if isinstance(item, WatchFailed):
                    raise self.connection.error(item.error, "watch", ISVCS, name)
                if not isinstance(item, ObjectChanged):
                    continue
                if item.change == "DELETED":
                    raise BackendError(f"InferenceService {name!r} was deleted while waiting for it")
                last = item.obj
                endpoint = self._endpoint(last)
                if endpoint is not None:
                    return endpoint
        finally:
            watcher.stop()
        not_ready = [
            f"{c.get('type')}: {c.get('reason') or c.get('status')} {c.get('message') or ''}".strip()
            for c in _at(last, "status", "conditions") or []
            if c.get("status") != "True"
        ]
        why = "; ".join(not_ready) or "no status reported (is KServe installed?)"
        raise BackendError(f"InferenceService {name!r} not Ready after {self.serve_timeout:g}s: {why}")

    def unserve(self, target: str, *, owner: str | None = None) -> None:
        matched = [
            isvc
            for isvc in self._isvcs(f"{m.LABEL_MANAGED}={m.MANAGED_BY}{m.owner_selector(owner)}")
            if target
            in (
                isvc["metadata"]["name"],
                _at(isvc, "metadata", "labels", m.LABEL_JOB),
                _at(isvc, "status", "url"),
                (_at(isvc, "status", "url") or "").rstrip("/") + "/openai/v1",
            )
        ]
        if not matched:
            raise UserError(
                f"no InferenceService matches {target!r} (an endpoint URL, InferenceService name or job id)",
                field="target",
            )
        for isvc in matched:
            self._delete(isvc["metadata"]["name"])

    def endpoints(self, *, owner: str | None = None) -> list[Endpoint]:
        found = [self._endpoint(i) for i in self._isvcs(f"{m.LABEL_MANAGED}={m.MANAGED_BY}{m.owner_selector(owner)}")]
        return [e for e in found if e is not None]

    def stop_job(self, job_id: str) -> None:
        for isvc in self._isvcs(f"{m.LABEL_JOB}={job_id}"):
            self._delete(isvc["metadata"]["name"])

    def render(self, job: Job | str, *, base: bool = False) -> str:
        """The InferenceService ``serve`` would create, without a cluster (a job id made by this backend)."""
        job_id = job if isinstance(job, str) else job.id
        blueprint = blueprint_of_name(job_id)
        kind = self.opts.trainer
        uri = m.base_model_uri(job_id, blueprint, kind=kind) if base else m.output_uri(job_id, blueprint, kind)
        return m.to_yaml(build_inferenceservice(job_id, blueprint, uri, self.opts, base=base))


def _at(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]…`` of an InferenceService read as JSON, None where a level is missing."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def blueprint_of_name(job_id: str) -> Blueprint:
    """The blueprint a job name was made from (names are ``<blueprint stem>-<suffix>``)."""
    from playground.blueprints import load_catalog

    stem = job_id.rsplit("-", 1)[0]
    for blueprint in load_catalog().values():
        if m.job_stem(blueprint.id) == stem:
            return blueprint
    raise UserError(
        f"cannot tell the blueprint of job {job_id!r} from its name without a cluster; "
        "give a job name made by `playground train --backend kubernetes`",
        field="job",
    )
