"""KServe model servers on KServe's vLLM runtime (``kserve-vllmserver``): the engine the local backend runs,
behind the same OpenAI-compatible routes (``<status.url>/openai/v1``); waited on with one watch.

The design (issue 59, "KServe the same way"):

* A **LoRA job** (the project's trainer saves a PEFT adapter as the job's model dir) is served as an adapter on
  one ``InferenceService`` per base model, shared by every job of that base (every visitor's, in booth mode).
  Its ``spec.predictor.storageUris`` lists the base (at ``/mnt/models``, the runtime's ``--model``) and each
  job's workspace PVC (at ``/mnt/adapters/<job>``); its ``args`` extend the runtime's with ``--enable-lora
  --max-lora-rank=R --max-loras=N --lora-modules <job>=/mnt/adapters/<job>/output/model ...``. The chat client
  asks for the model ``<job id>``; base-side chat asks the same server for the base (``--served-model-name``
  is the InferenceService's name). Who uses the server is recorded in two annotations (adapters, base users),
  from which the spec is rebuilt on every change (a merge patch guarded by ``resourceVersion``).
* A **full fine-tune** (and the base of one, e.g. a scratch model) gets an InferenceService of its own on the
  same runtime: ``<job>-ft`` / ``<job>-base`` with ``storageUri``.
* ``unserve`` takes the job's adapter (or base use) off the shared server and deletes the server when nobody
  uses it any more: a base server holds a GPU (or several CPU cores) and restarting it costs one model load,
  the same as rolling it for a changed adapter list.

Why not ``LLMInferenceService`` (``spec.model.lora.adapters``): it is the llm-d stack (Gateway API, inference
scheduler, LeaderWorkerSet) with GPU-only presets, where the ``kserve-vllmserver`` runtime runs on any KServe
install and picks the CPU image when no GPU is asked, as the CPU blueprints need; its ``adapters`` are
``x-kubernetes-preserve-unknown-fields`` in the CRD, so the schema checks nothing there, whereas every field
emitted here is checked by the real InferenceService schema, and the args against the runtime's command. Both
restart the server when the adapter list changes (vLLM's ``--lora-modules`` are read at start; runtime loading
is a development-mode API that a restarted or second replica would not repeat).

Needs: KServe >= 0.16 (``storageUris``; on Knative, the init-container feature flag), the
``kserve-vllmserver`` ClusterServingRuntime, and ReadWriteMany workspace PVCs when jobs train and serve on
different nodes (KServe mounts each ``pvc://`` entry's whole claim, read-only).

Names: KServe's default domain template ``{{ .Name }}-{{ .Namespace }}`` names the host after the predictor
service ``<isvc>-predictor``, and a DNS label holds at most 63 characters, so
len(isvc) + len("-predictor-") + len(namespace) <= 63. Job names are at most 26 characters and InferenceService
names ``<job>-ft``/``<job>-base`` at most 31, which leaves 21 for the namespace (the documented
``blueprint-playground`` has 20). In a longer namespace the name is shortened, a hash of the job name keeping it
unique. A shared base is named ``<model>-<hash of its URI>``, cut to the same budget.
"""

from __future__ import annotations

import hashlib
import json
import queue
import re
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from playground.blueprints import Blueprint, get_blueprint
from playground.cluster import manifests as m
from playground.cluster.connection import Connection
from playground.cluster.watch import ObjectChanged, ResourceWatcher, WatchFailed, WatchStats
from playground.errors import BackendError, UserError, shown
from playground.owner import OPERATOR, Owner
from playground.serving.base import ModelServers, model_to_serve
from playground.types import Endpoint, Job

KSERVE_GROUP = "serving.kserve.io"
KSERVE_VERSION = "v1beta1"
ISVC_PLURAL = "inferenceservices"
ISVCS = "inferenceservices.serving.kserve.io"
KSERVE_HOST_INFIX = "-predictor-"
RUNTIME = "kserve-vllmserver"  # ../shared/runtimes/kserve-vllmserver.yaml: python -m vllm.entrypoints.openai...
MODEL_FORMAT = "vLLM"  # the runtime's supportedModelFormats
MODEL_MOUNT = "/mnt/models"  # the runtime's --model
ADAPTER_MOUNT = "/mnt/adapters"
KIND_SHARED = "shared-base"  # LABEL_KIND of a base server shared by the LoRA jobs of one base model
ANN_ADAPTERS = m.LABEL_PREFIX + "adapters"  # {job id: {"uri", "rank", "owner"}}
ANN_BASE_USERS = m.LABEL_PREFIX + "base-users"  # {job id: owner}: jobs whose base-side chat uses it
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks (vllm/config/lora.py)
PORT_IS_LOCAL = (
    "--port applies to the local backend's model servers (an InferenceService is reached at its cluster URL); "
    "allowed: --backend local"
)
_SLUG = re.compile(r"[^a-z0-9]+")


def isvc_name(job_name: str, base: bool, namespace: str) -> str:
    """``<job>-ft`` / ``<job>-base``, shortened (with a hash of the job name) when KServe's host label
    ``<isvc>-predictor-<namespace>`` would pass 63 characters."""
    suffix = "base" if base else "ft"
    return _fitted(job_name, suffix, namespace, job_name)


def shared_base_name(base_uri: str, namespace: str) -> str:
    """``<model>-<hash of the base URI>``: the InferenceService every LoRA job of ``base_uri`` is served on."""
    slug = _SLUG.sub("-", base_uri.split("://")[-1].rsplit("/", 1)[-1].lower()).strip("-")
    if not slug or not slug[0].isalpha():
        slug = "m" + slug
    return _fitted(slug, "", namespace, base_uri)


def _fitted(stem: str, suffix: str, namespace: str, unique: str) -> str:
    """``<stem>-<suffix>`` within KServe's host label budget, else ``<stem cut>-<hash of unique>-<suffix>``;
    always hashed when ``suffix`` is empty (a shared base's name is its URI's hash)."""
    budget = m.DNS_LABEL_MAX - len(KSERVE_HOST_INFIX) - len(namespace)
    tail = f"-{suffix}" if suffix else ""
    name = f"{stem}{tail}"
    if suffix and len(name) <= budget:
        return name
    digest = hashlib.sha1(unique.encode()).hexdigest()[:6]
    keep = budget - len(tail) - len(digest) - 1
    if keep < 1:
        raise UserError(
            f"namespace {shown(namespace)} is too long to serve from: KServe's host label "
            f"<name>{KSERVE_HOST_INFIX}<namespace> must fit in {m.DNS_LABEL_MAX} characters; "
            f"use a namespace of at most {m.DNS_LABEL_MAX - len(KSERVE_HOST_INFIX) - len(tail) - len(digest) - 2} "
            "characters",
            field="namespace",
        )
    return f"{stem[:keep].rstrip('-')}-{digest}{tail}"


def _vllm_model(blueprint: Blueprint, opts: m.ClusterOptions, uri: str) -> dict[str, Any]:
    """``spec.predictor.model`` on the vLLM runtime: resources from the blueprint (a GPU when it trains on one;
    without, the controller runs the runtime's ``-cpu`` image), the dtype, the hub token for ``hf://``."""
    res = blueprint.resources
    requests = {"cpu": str(res.cpu or "1"), "memory": str(res.memory or "4Gi")}
    if res.gpus_per_node:
        requests["nvidia.com/gpu"] = "1"
    model: dict[str, Any] = {
        "modelFormat": {"name": MODEL_FORMAT},
        "runtime": RUNTIME,
        "resources": {"requests": requests, "limits": dict(requests)},
    }
    if blueprint.model.dtype != "auto":
        model["args"] = [f"--dtype={blueprint.model.dtype}"]
    if uri.startswith("hf://"):
        # a plain dict in the manifest (the Trainer API's model object would not serialize as one)
        model["env"] = [m.secret_env("HF_TOKEN", opts, optional=not blueprint.model.gated).to_dict()]
    return model


def _metadata(name: str, opts: m.ClusterOptions, labels: dict[str, str], owner: Owner) -> dict[str, Any]:
    labels = {**labels, m.LABEL_MANAGED: m.MANAGED_BY, **opts.extra_labels}
    owner_labels, owner_annotations = m.owner_metadata(owner)
    labels.update(owner_labels)
    metadata: dict[str, Any] = {"name": name, "namespace": opts.namespace, "labels": labels}
    if owner_annotations:
        metadata["annotations"] = owner_annotations
    return metadata


def build_inferenceservice(
    job_name: str,
    blueprint: Blueprint,
    storage_uri: str,
    opts: m.ClusterOptions,
    *,
    base: bool,
    owner: Owner = OPERATOR,
) -> dict[str, Any]:
    """An InferenceService of its own on the vLLM runtime serving ``storage_uri`` (a full fine-tune, or the base
    of one), labelled as ``owner``'s; the model name to ask for is the InferenceService's name (the runtime's
    ``--served-model-name``)."""
    name = isvc_name(job_name, base, opts.namespace)
    model = {**_vllm_model(blueprint, opts, storage_uri), "storageUri": storage_uri}
    labels = {
        m.LABEL_JOB: job_name,
        m.LABEL_KIND: "base" if base else "fine-tuned",
        m.LABEL_BLUEPRINT: m.label_value(blueprint.id),
    }
    return {
        "apiVersion": f"{KSERVE_GROUP}/{KSERVE_VERSION}",
        "kind": "InferenceService",
        "metadata": _metadata(name, opts, labels, owner),
        "spec": {"predictor": {"model": model}},
    }


def adapter_path(job_id: str, uri: str) -> str:
    """Where the adapter of ``job_id`` (``pvc://CLAIM/PATH``) is in the server: KServe mounts the whole claim of
    a ``pvc://`` entry of ``storageUris`` at its ``mountPath``."""
    match = re.fullmatch(r"pvc://[^/]+/?(.*)", uri)
    if match is None:
        raise UserError(f"adapter {shown(uri)} of job {job_id!r}: allowed: pvc://CLAIM/PATH", field="model_dir")
    return f"{ADAPTER_MOUNT}/{job_id}/{match.group(1)}".rstrip("/")


def lora_args(adapters: dict[str, dict[str, Any]], *, gpu: bool) -> list[str]:
    """vLLM's LoRA flags for ``adapters`` (job id -> {"uri", "rank"}): each served under its job id.

    On CPU (the runtime's ``-cpu`` image) one adapter slot more than adapters, left empty: vLLM's CPU LoRA arithmetic
    reads a base-model token's slot ``-1`` as the *last* slot, so with every slot taken a base chat batched with an
    adapter's is answered with that adapter added (docs/guide/serving.md; the local servers mend it with a plugin
    the runtime's image does not have). An empty last slot adds nothing."""
    if not adapters:
        return []
    rank = max(int(a.get("rank") or 1) for a in adapters.values())
    max_rank = next((r for r in VLLM_LORA_RANKS if r >= rank), rank)
    modules = [f"{job}={adapter_path(job, a['uri'])}" for job, a in sorted(adapters.items())]
    slots = len(adapters) if gpu else len(adapters) + 1
    return ["--enable-lora", f"--max-lora-rank={max_rank}", f"--max-loras={slots}", "--lora-modules", *modules]


def _on_gpu(model: dict[str, Any]) -> bool:
    """Whether ``spec.predictor.model`` asks for a GPU (else KServe runs the runtime's CPU image)."""
    return "nvidia.com/gpu" in ((model.get("resources") or {}).get("requests") or {})


def _storage_uris(base_uri: str, adapters: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    entries = [{"uri": base_uri, "mountPath": MODEL_MOUNT}]
    entries += [{"uri": a["uri"], "mountPath": f"{ADAPTER_MOUNT}/{job}"} for job, a in sorted(adapters.items())]
    return entries


def _engine_args(args: list[str]) -> list[str]:
    """The args before the LoRA flags (what the server runs with whatever adapters it holds)."""
    return args[: args.index("--enable-lora")] if "--enable-lora" in args else list(args)


def build_shared_base(
    base_uri: str,
    blueprint: Blueprint,
    opts: m.ClusterOptions,
    *,
    adapters: dict[str, dict[str, Any]],
    base_users: dict[str, str | None],
) -> dict[str, Any]:
    """The InferenceService of ``base_uri`` with ``adapters`` (job id -> {"uri", "rank", "owner"}) as LoRA
    modules and ``base_users`` (job id -> owner) chatting with the base itself."""
    model = _vllm_model(blueprint, opts, base_uri)
    args = [*model.pop("args", []), *lora_args(adapters, gpu=_on_gpu(model))]
    if args:
        model["args"] = args
    labels = {m.LABEL_KIND: KIND_SHARED}  # no job, blueprint or owner of its own: it serves many
    metadata = _metadata(shared_base_name(base_uri, opts.namespace), opts, labels, OPERATOR)
    metadata["annotations"] = _use_annotations(base_uri, adapters, base_users)
    return {
        "apiVersion": f"{KSERVE_GROUP}/{KSERVE_VERSION}",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {"predictor": {"model": model, "storageUris": _storage_uris(base_uri, adapters)}},
    }


def _use_annotations(base_uri: str, adapters: dict[str, Any], base_users: dict[str, Any]) -> dict[str, str]:
    return {
        m.ANN_BASE: base_uri,
        ANN_ADAPTERS: json.dumps(adapters, sort_keys=True),
        ANN_BASE_USERS: json.dumps(base_users, sort_keys=True),
    }


def uses_of(isvc: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, str | None]]:
    """(adapters, base users) recorded on a shared base InferenceService (empty where unreadable)."""
    annotations = _at(isvc, "metadata", "annotations") or {}
    found: list[dict[str, Any]] = []
    for key in (ANN_ADAPTERS, ANN_BASE_USERS):
        try:
            value = json.loads(annotations.get(key) or "{}")
        except ValueError:
            value = {}
        found.append(value if isinstance(value, dict) else {})
    return found[0], found[1]


def is_shared(isvc: dict[str, Any]) -> bool:
    return _at(isvc, "metadata", "labels", m.LABEL_KIND) == KIND_SHARED


def serves_adapter(blueprint: Blueprint, model_uri: str, job_id: str) -> bool:
    """Whether a job's model is a PEFT adapter: a LoRA blueprint trained by the project's trainer (a
    builtin-torchtune run writes a merged model under ``epoch_0``, served on its own)."""
    return blueprint.method.kind == "lora" and model_uri == m.output_uri(job_id, blueprint, m.PLAYGROUND)


def _base_source(job_id: str, blueprint: Blueprint) -> str:
    """Where a LoRA job's base is loaded from: its source (a hub id: one download per base model), or for a model
    shipped in a Python package the copy its trainer wrote to the job's workspace (``output/base-model``)."""
    source = blueprint.model.source
    return m.base_model_uri(job_id, blueprint) if source.startswith("pkg://") else source


def refuse_unloadable(uri: str, blueprint: Blueprint, what: str) -> str:
    """``uri``, or a one-line error where it is a model inside a Python package (nothing KServe can load)."""
    if uri.startswith("pkg://"):
        raise UserError(
            f"the base model of {blueprint.id!r} is {uri}, a model shipped in a Python package that KServe "
            f"cannot load; serve {what} with the local backend (--backend local)",
            field="base",
        )
    return uri


class KServeServers(ModelServers):
    """InferenceServices in the connection's namespace: one per full fine-tune (labelled with its job, kind and
    owner) and one shared base per base model carrying the LoRA jobs' adapters (their owners in annotations)."""

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

    # -- the API calls ----------------------------------------------------------------------------
    def _call(self, verb: str, method: str, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
        try:
            return getattr(self.connection.custom, method)(KSERVE_GROUP, KSERVE_VERSION, *args, **kwargs)
        except Exception as exc:
            raise self.connection.error(exc, verb, ISVCS, name) from None

    def _isvcs(self, selector: str) -> list[dict[str, Any]]:
        data = self._call("list", "list_namespaced_custom_object", self.namespace, ISVC_PLURAL, label_selector=selector)
        return data.get("items") or []

    def _managed(self) -> list[dict[str, Any]]:
        return self._isvcs(f"{m.LABEL_MANAGED}={m.MANAGED_BY}")

    def _get(self, name: str) -> dict[str, Any] | None:
        """The InferenceService ``name``; None where there is none."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.connection.custom.get_namespaced_custom_object(
                KSERVE_GROUP, KSERVE_VERSION, self.namespace, ISVC_PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise self.connection.error(exc, "get", ISVCS, name) from None
        except Exception as exc:
            raise self.connection.error(exc, "get", ISVCS, name) from None

    def _create(self, body: dict[str, Any]) -> Exception | None:
        """Create ``body``; the API's 409 where one of that name exists, else None."""
        from kubernetes.client.exceptions import ApiException

        name = body["metadata"]["name"]
        try:
            self.connection.custom.create_namespaced_custom_object(
                KSERVE_GROUP, KSERVE_VERSION, self.namespace, ISVC_PLURAL, body
            )
        except ApiException as exc:
            if exc.status == 409:
                return exc
            raise self.connection.error(exc, "create", ISVCS, name) from None
        except Exception as exc:
            raise self.connection.error(exc, "create", ISVCS, name) from None
        return None

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

    # -- reading status -------------------------------------------------------------------------------
    @staticmethod
    def _endpoints_of(isvc: dict[str, Any]) -> list[Endpoint]:
        """What a Ready InferenceService serves (one endpoint per adapter and base user of a shared base);
        nothing while it is not Ready or has not caught up with its latest spec."""
        meta = isvc.get("metadata") or {}
        status = isvc.get("status") or {}
        url = status.get("url")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        observed = status.get("observedGeneration")
        stale = observed is not None and observed < meta.get("generation", 0)
        if not url or not ready or stale:
            return []
        url = url.rstrip("/") + "/openai/v1"
        name = meta.get("name", "")
        if not is_shared(isvc):
            labels = meta.get("labels") or {}
            return [
                Endpoint(
                    url=url,
                    model=name,
                    job_id=labels.get(m.LABEL_JOB),
                    kind=labels.get(m.LABEL_KIND, "fine-tuned"),
                    backend="kubernetes",
                    name=name,
                    owner=_at(meta, "annotations", m.ANN_OWNER),
                )
            ]
        adapters, users = uses_of(isvc)
        found = [
            Endpoint(url=url, model=job, job_id=job, backend="kubernetes", name=name, owner=use.get("owner"))
            for job, use in sorted(adapters.items())
        ]
        found += [
            Endpoint(
                url=url, model=name, job_id=job, kind="base", backend="kubernetes", name=name, owner=who, shared=True
            )
            for job, who in sorted(users.items())
        ]
        return found

    def storage_uri(self, job: Job, blueprint: Blueprint, *, base: bool) -> str:
        """What a server of its own loads: the job's model directory on its workspace PVC, or its base model."""
        if not base:
            return model_to_serve(job, base=False)
        uri = job.base_model or m.base_model_uri(job.id, blueprint)
        return refuse_unloadable(uri, blueprint, "the base model (playground serve JOB --base)")

    def shared_base_uri(self, job: Job, blueprint: Blueprint) -> str:
        """The base model a LoRA job's adapter needs: its source (the hub id), also where the job trained on a
        copy that Kubeflow's model initializer put in its workspace (read from the TrainJob)."""
        uri = job.base_model or _base_source(job.id, blueprint)
        if uri.startswith("pvc://") and not uri.endswith("/output/base-model"):  # the initializer's copy: its source
            uri = self._initializer_source(job.id) or blueprint.model.source
        return refuse_unloadable(uri, blueprint, f"job {job.id}")

    def _initializer_source(self, job_id: str) -> str | None:
        try:
            trainjob = self.connection.custom.get_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.TRAINJOB_PLURAL, job_id
            )
        except Exception:  # gone or unreadable: the blueprint's source
            return None
        return _at(trainjob, "spec", "initializer", "model", "storageUri")

    def check_port(self, port: int | None) -> None:
        if port is not None:
            raise UserError(PORT_IS_LOCAL, field="--port")

    # -- the ModelServers interface ------------------------------------------------------------------
    def serve(self, job: Job, *, base: bool = False, port: int | None = None) -> Endpoint:
        self.check_port(port)
        blueprint = get_blueprint(job.blueprint_id)
        if blueprint.method.kind == "lora" and base:
            return self._serve_shared(job, blueprint, base=True)
        if not base and serves_adapter(blueprint, model_to_serve(job, base=False), job.id):
            return self._serve_shared(job, blueprint, base=False)
        uri = self.storage_uri(job, blueprint, base=base)
        body = build_inferenceservice(job.id, blueprint, uri, self.opts, base=base, owner=Owner(job.owner))
        name = body["metadata"]["name"]
        conflict = self._create(body)
        if conflict is not None:
            existing = self._get(name) or {}
            owned = _at(existing, "metadata", "labels", m.LABEL_JOB) == job.id
            if not owned or _at(existing, "spec", "predictor", "model", "storageUri") != uri:
                raise self.connection.error(conflict, "create", ISVCS, name)
        return self._wait_ready(name, None)

    def _serve_shared(self, job: Job, blueprint: Blueprint, *, base: bool) -> Endpoint:
        """Add ``job``'s adapter (or its base-side chat) to the shared server of its base model, creating the
        server where none runs, and wait until it serves it."""
        base_uri = self.shared_base_uri(job, blueprint)
        adapters: dict[str, dict[str, Any]] = {}
        users: dict[str, str | None] = {}
        if base:
            users[job.id] = job.owner
        else:
            uri = model_to_serve(job, base=False)
            adapter_path(job.id, uri)  # a pvc:// URI, or a one-line error
            rank = int(job.params.get("lora_rank", blueprint.method.rank))
            adapters[job.id] = {"uri": uri, "rank": rank, "owner": job.owner}
        body = build_shared_base(base_uri, blueprint, self.opts, adapters=adapters, base_users=users)
        name = body["metadata"]["name"]

        def join(held: dict[str, Any], using: dict[str, Any]) -> None:
            held.update(adapters)
            using.update(users)

        for _attempt in range(8):
            conflict = self._create(body)
            if conflict is None:
                break
            existing = self._get(name)
            if existing is None:  # deleted since: create it again
                continue
            if not is_shared(existing) or _at(existing, "metadata", "annotations", m.ANN_BASE) != base_uri:
                raise self.connection.error(conflict, "create", ISVCS, name)
            if self._change_uses(existing, join):
                break
        else:
            raise BackendError(f"InferenceService {name!r} kept changing while adding {job.id!r}; try again")
        kind = "base" if base else "fine-tuned"
        return self._wait_ready(name, lambda e: e.job_id == job.id and e.kind == kind)

    def _change_uses(self, isvc: dict[str, Any], change: Callable[[dict, dict], None]) -> bool:
        """Apply ``change(adapters, base_users)`` to a shared base: patch its annotations, ``storageUris`` and
        LoRA args (guarded by its resourceVersion), or delete it when nobody uses it; False on a conflict."""
        from kubernetes.client.exceptions import ApiException

        meta = isvc["metadata"]
        adapters, users = uses_of(isvc)
        change(adapters, users)
        if not adapters and not users:
            self._delete(meta["name"])
            return True
        base_uri = (meta.get("annotations") or {})[m.ANN_BASE]
        model = _at(isvc, "spec", "predictor", "model") or {}
        args = [*_engine_args(model.get("args") or []), *lora_args(adapters, gpu=_on_gpu(model))]
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": _use_annotations(base_uri, adapters, users),
            },
            "spec": {"predictor": {"storageUris": _storage_uris(base_uri, adapters), "model": {"args": args or None}}},
        }
        try:
            self.connection.custom.patch_namespaced_custom_object(
                KSERVE_GROUP, KSERVE_VERSION, self.namespace, ISVC_PLURAL, meta["name"], patch
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise self.connection.error(exc, "patch", ISVCS, meta["name"]) from None
        except Exception as exc:
            raise self.connection.error(exc, "patch", ISVCS, meta["name"]) from None
        return True

    def _leave(self, name: str, change: Callable[[dict, dict], None]) -> None:
        for _attempt in range(8):
            existing = self._get(name)
            if existing is None or self._change_uses(existing, change):
                return
        raise BackendError(f"InferenceService {name!r} kept changing while taking jobs off it; try again")

    def _wait_ready(self, name: str, wanted: Callable[[Endpoint], bool] | None) -> Endpoint:
        """Watch the InferenceService until it is Ready on its latest spec and serves what ``wanted`` picks (one
        watch, no polling), or ``serve_timeout``."""
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
                found = [e for e in self._endpoints_of(last) if wanted is None or wanted(e)]
                if found:
                    return found[0]
        finally:
            watcher.stop()
        not_ready = [
            f"{c.get('type')}: {c.get('reason') or c.get('status')} {c.get('message') or ''}".strip()
            for c in _at(last, "status", "conditions") or []
            if c.get("status") != "True"
        ]
        why = "; ".join(not_ready) or "no status reported (is KServe installed?)"
        raise BackendError(f"InferenceService {name!r} not Ready after {self.serve_timeout:g}s: {why}")

    def unserve(self, target: str, *, owner: Owner = OPERATOR) -> None:
        """Stop a server of its own (named by URL, name or job id), or take uses off a shared base: the job's
        (``target`` a job id) or every one (``target`` the server's URL or name); ``owner``'s only (the operator:
        anyone's)."""
        wanted = target.strip().rstrip("/")
        matched = False
        for isvc in self._managed():
            name = isvc["metadata"]["name"]
            url = (_at(isvc, "status", "url") or "").rstrip("/")
            names_it = wanted in (name, url, url + "/openai/v1") if url else wanted == name
            if not is_shared(isvc):
                mine = m.visible_to(_at(isvc, "metadata", "labels") or {}, owner)
                if mine and (names_it or _at(isvc, "metadata", "labels", m.LABEL_JOB) == wanted):
                    self._delete(name)
                    matched = True
                continue
            leaving = _leaving(wanted, names_it, owner)
            adapters, users = uses_of(isvc)
            if any(leaving(job, use.get("owner")) for job, use in adapters.items()) or any(
                leaving(job, who) for job, who in users.items()
            ):
                self._leave(name, partial(_drop_uses, leaving))
                matched = True
        if not matched:
            raise UserError(
                f"no InferenceService matches {target!r} (an endpoint URL, InferenceService name or job id)",
                field="target",
            )

    def endpoints(self, *, owner: Owner = OPERATOR) -> list[Endpoint]:
        found = [e for isvc in self._managed() for e in self._endpoints_of(isvc)]
        return [e for e in found if owner.sees(e.owner)]

    def stop_job(self, job_id: str) -> None:
        for isvc in self._isvcs(f"{m.LABEL_JOB}={job_id}"):
            self._delete(isvc["metadata"]["name"])
        leaving = _leaving(job_id, False, OPERATOR)
        for isvc in self._isvcs(f"{m.LABEL_KIND}={KIND_SHARED}"):
            adapters, users = uses_of(isvc)
            if job_id in adapters or job_id in users:
                self._leave(isvc["metadata"]["name"], partial(_drop_uses, leaving))

    def stop_all(self) -> list[Endpoint]:
        """Every server, shared ones included, deleted once (the operator's ``unserve --all``)."""
        stopped = self.endpoints()
        for isvc in self._managed():
            self._delete(isvc["metadata"]["name"])
        return stopped

    def render(self, job: Job | str, *, base: bool = False) -> str:
        """The InferenceService ``serve`` would create, without a cluster (a job id made by this backend): for a
        LoRA job the shared base with this job's adapter (or base chat) alone; ``serve`` adds to a running one."""
        job_id = job if isinstance(job, str) else job.id
        blueprint = blueprint_of_name(job_id)
        kind = self.opts.trainer
        model_uri = m.output_uri(job_id, blueprint, kind)
        if blueprint.method.kind == "lora" and (base or serves_adapter(blueprint, model_uri, job_id)):
            base_uri = refuse_unloadable(_base_source(job_id, blueprint), blueprint, f"job {job_id}")
            adapters = {} if base else {job_id: {"uri": model_uri, "rank": blueprint.method.rank, "owner": None}}
            users: dict[str, str | None] = {job_id: None} if base else {}
            return m.to_yaml(build_shared_base(base_uri, blueprint, self.opts, adapters=adapters, base_users=users))
        uri = m.base_model_uri(job_id, blueprint, kind=kind) if base else model_uri
        return m.to_yaml(build_inferenceservice(job_id, blueprint, uri, self.opts, base=base))


def _leaving(wanted: str, whole_server: bool, owner: Owner) -> Callable[[str, str | None], bool]:
    """Whether a use (job id, its owner's id) of a shared base leaves: the job is ``wanted`` or the whole server
    is named, and ``owner`` sees it (the operator: anyone's)."""
    return lambda job, who: (whole_server or job == wanted) and owner.sees(who)


def _drop_uses(leaving: Callable[[str, str | None], bool], adapters: dict, users: dict) -> None:
    for job in [j for j, use in adapters.items() if leaving(j, use.get("owner"))]:
        del adapters[job]
    for job in [j for j, who in users.items() if leaving(j, who)]:
        del users[job]


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
