"""The Kubernetes backend: Kubeflow Trainer v2 TrainJobs (kubeflow SDK) and KServe InferenceServices.

The kubeflow SDK's ``TrainerClient`` holds the connection and checks the runtime (``get_runtime``)
and deletes jobs (``delete_job``); the TrainJob itself is assembled from the Trainer API models in
``manifests`` (the SDK's ``train()`` has no field for ``numProcPerNode``, Secret-backed env or the
TorchTune settings we pass), so ``--dry-run`` prints exactly what ``submit`` creates. Following a job
holds one watch per resource kind (the TrainJob, its pods, Events) plus one log stream per step pod,
all resuming after a dropped connection (``follow``). Nothing contacts the cluster before it is
needed, so ``render_train``/``render_serve`` work without a kubeconfig.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from playground.backends.base import Backend
from playground.backends.kubernetes import manifests as m
from playground.backends.kubernetes import queue as kueue
from playground.backends.kubernetes.datafiles import in_pod, own_pod_claims
from playground.backends.kubernetes.errors import api_error
from playground.backends.kubernetes.follow import JobFollow, LogSource, history
from playground.backends.kubernetes.status import (
    StreamState,
    cluster_phase,
    conditions,
    container_name,
    failure,
    step_name,
    trainer_progress,
)
from playground.backends.kubernetes.watch import ObjectChanged, ResourceWatcher, WatchFailed, WatchStats
from playground.blueprints import Blueprint, get_blueprint, load_catalog
from playground.booth import BoothPolicy, SubmissionLedger, owner_key, submit_lock
from playground.errors import BackendError, JobNotFound, UserError
from playground.events import EVENT_PREFIX, Event, JobPhase, Phase
from playground.paths import ensure_writable_dir, playground_home
from playground.types import Endpoint, Job, TrainRequest

TRAINJOBS = "trainjobs.trainer.kubeflow.org"
ISVCS = "inferenceservices.serving.kserve.io"
RUNTIMES = "clustertrainingruntimes.trainer.kubeflow.org"
IN_CLUSTER_NS = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
PORT_IS_LOCAL = (
    "--port applies to the local backend's model servers (an InferenceService is reached at its cluster URL); "
    "allowed: --backend local"
)


def _ts(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class KubernetesBackend(Backend):
    """Blueprint jobs as TrainJobs, served by KServe. Options fall back to env (PLAYGROUND_*)."""

    name = "kubernetes"
    queue_poll_seconds = kueue.POLL_SECONDS  # how often a follower asks Kueue for a queued job's position

    def __init__(
        self,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | None = None,
        *,
        queue: str | None = None,
        hf_token_secret: str | None = None,
        image: str | None = None,
        trainer: str | None = None,
        ttl_seconds_after_finished: int | None = None,
        watch_timeout: int = 600,
        serve_timeout: float = 600.0,
        drain_timeout: float = 15.0,
        labels: dict[str, str] | None = None,
        policy: BoothPolicy | None = None,
    ) -> None:
        self.policy = policy if policy is not None else BoothPolicy.from_settings()
        if ttl_seconds_after_finished is None and self.policy is not None:
            ttl_seconds_after_finished = self.policy.finished_ttl_seconds
        self.context = context
        self.kubeconfig = kubeconfig
        self._namespace = namespace
        self.opts = m.ClusterOptions.from_env(
            namespace=self.namespace,
            queue=queue,
            hf_token_secret=hf_token_secret,
            image=image,
            trainer=trainer,
            ttl_seconds_after_finished=ttl_seconds_after_finished,
            extra_labels=dict(labels or {}),
        )
        self.watch_timeout = watch_timeout
        self.serve_timeout = serve_timeout
        self.drain_timeout = drain_timeout
        self.stats = WatchStats()
        self._client: Any = None
        self._lock = threading.Lock()
        self._sdk_lock = threading.Lock()

    # -- connection ------------------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        """--namespace, else the kubeconfig context's, else the pod's, else ``default`` (no request made)."""
        if self._namespace:
            return self._namespace
        ns = None
        try:
            from kubernetes import config

            path = self._kubeconfig_path()
            if path and os.path.exists(path):
                contexts, active = config.list_kube_config_contexts(config_file=path)
                ctx = next((c for c in contexts if c["name"] == self.context), active) if self.context else active
                ns = ((ctx or {}).get("context") or {}).get("namespace")
            elif IN_CLUSTER_NS.exists():
                ns = IN_CLUSTER_NS.read_text().strip()
        except Exception:  # a broken kubeconfig is reported when connecting
            ns = None
        self._namespace = ns or "default"
        return self._namespace

    def _kubeconfig_path(self) -> str | None:
        if self.kubeconfig:
            return os.path.expanduser(self.kubeconfig)
        env = os.environ.get("KUBECONFIG")
        if env:
            return os.path.expanduser(env.split(os.pathsep)[0])
        return os.path.expanduser("~/.kube/config")

    def _configuration(self):
        from kubernetes import client, config

        cfg = client.Configuration()
        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not (
            self.kubeconfig or os.environ.get("KUBECONFIG")
        )
        path = self._kubeconfig_path()
        if not in_cluster:
            if not path or not os.path.exists(path):
                raise BackendError(
                    f"no kubeconfig found at {path} and not running inside a cluster; "
                    "pass --kubeconfig FILE / --context NAME or set KUBECONFIG",
                    field="kubeconfig",
                )
            try:
                config.load_kube_config(config_file=path, context=self.context, client_configuration=cfg)
            except config.ConfigException as exc:
                raise BackendError(f"kubeconfig {path}: {' '.join(str(exc).split())}", field="context") from None
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException as exc:
                raise BackendError(f"in-cluster config: {exc}") from None
        cfg.connection_pool_maxsize = 64  # one stream per watch and per followed log
        return cfg

    @property
    def client(self):
        """The kubeflow SDK ``TrainerClient`` (connected on first use)."""
        with self._lock:
            if self._client is None:
                import logging

                from kubeflow.common.types import KubernetesBackendConfig
                from kubeflow.trainer import TrainerClient

                cfg = self._configuration()
                logging.getLogger("kubeflow.trainer.backends.kubernetes.backend").setLevel(logging.ERROR)
                try:
                    config = KubernetesBackendConfig(
                        namespace=self.namespace, context=self.context, client_configuration=cfg
                    )
                    self._client = TrainerClient(config)
                except Exception as exc:
                    raise self._error(exc, "connect to", "the Kubernetes API") from None
                self.host = cfg.host
            return self._client

    def _sdk(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a TrainerClient method, then drop the thread pool its async requests start (4 threads)."""
        client = self.client
        with self._sdk_lock:
            try:
                return getattr(client, method)(*args, **kwargs)
            finally:
                client.backend.custom_api.api_client.close()

    @property
    def custom(self):
        return self.client.backend.custom_api

    @property
    def core(self):
        return self.client.backend.core_api

    def _error(self, exc: BaseException, verb: str, resource: str, name: str | None = None) -> BackendError:
        if isinstance(exc, UserError):
            return exc  # type: ignore[return-value]
        host = getattr(self, "host", None)
        return api_error(exc, verb=verb, resource=resource, namespace=self.namespace, name=name, host=host)

    # -- manifests (no cluster) ------------------------------------------------------------------
    def _plan(self, request: TrainRequest, name: str | None = None) -> m.TrainJobPlan:
        blueprint = get_blueprint(request.blueprint_id)
        name = name or m.new_job_name(blueprint.id)
        opts = self.opts
        if not opts.data_claims and m.local_data_files(blueprint, request) and in_pod():
            # Your file on this notebook pod's volume: the same claim is mounted in the trainer's pods.
            opts = dataclasses.replace(opts, data_claims=tuple(own_pod_claims(lambda: self.core)))
        return m.plan_trainjob(blueprint, request, opts, name)

    def render_train(self, request: TrainRequest) -> str:
        return m.to_yaml(m.build_trainjob(self._plan(request)))

    def _blueprint_of_name(self, job_id: str) -> Blueprint:
        """The blueprint a job name was made from (names are ``<blueprint stem>-<suffix>``)."""
        stem = job_id.rsplit("-", 1)[0]
        for blueprint in load_catalog().values():
            if m.job_stem(blueprint.id) == stem:
                return blueprint
        raise UserError(
            f"cannot tell the blueprint of job {job_id!r} from its name without a cluster; "
            "give a job name made by `playground train --backend kubernetes`",
            field="job",
        )

    def render_serve(self, job_id: str, *, base: bool = False) -> str:
        blueprint = self._blueprint_of_name(job_id)
        kind = self.opts.trainer
        uri = m.base_model_uri(job_id, blueprint, kind=kind) if base else m.output_uri(job_id, blueprint, kind)
        return m.to_yaml(m.build_inferenceservice(job_id, blueprint, uri, self.opts, base=base))

    # -- runtimes ---------------------------------------------------------------------------------
    def installed_runtimes(self) -> list[str]:
        try:
            data = self.custom.list_cluster_custom_object(m.GROUP, m.VERSION, m.CTR_PLURAL)
        except Exception as exc:
            raise self._error(exc, "list", RUNTIMES) from None
        return sorted(item["metadata"]["name"] for item in data.get("items") or [])

    def _check_runtime(self, blueprint: Blueprint, name: str) -> None:
        """The runtime is installed and takes this trainer kind (the SDK's ``get_runtime`` reads its type)."""
        from kubeflow.trainer.types import types
        from kubernetes.client.exceptions import ApiException

        from playground.backends.kubernetes.errors import _root

        try:
            runtime = self._sdk("get_runtime", name)
        except Exception as exc:
            root = _root(exc)
            if not (isinstance(root, ApiException) and root.status == 404):
                raise self._error(exc, "get", RUNTIMES, name) from None
            installed = self.installed_runtimes()
            hint = "kubectl apply -k deploy/" if name.startswith("playground") else "the Kubeflow Trainer runtimes"
            raise BackendError(
                f"training runtime {name!r} (blueprint {blueprint.id}) is not installed; installed: "
                f"{', '.join(installed) or 'none'}; install it with {hint}",
                field="kubernetes.runtime",
            ) from None
        wanted = (
            types.TrainerType.BUILTIN_TRAINER if self.opts.trainer == m.TORCHTUNE else types.TrainerType.CUSTOM_TRAINER
        )
        if runtime.trainer.trainer_type != wanted:
            raise BackendError(
                f"training runtime {name!r} (framework {runtime.trainer.framework}) cannot run the "
                f"{self.opts.trainer} trainer",
                field="kubernetes.runtime",
            )

    # -- jobs -----------------------------------------------------------------------------------
    def submit(self, request: TrainRequest) -> Job:
        if self.policy is None or request.owner is None:
            return self._submit(request)
        # Booth: the quota check and the create are one step for every kernel of this app (its home).
        home = ensure_writable_dir(playground_home(), what="state dir")
        with submit_lock(home):
            ledger = SubmissionLedger(home)
            jobs = self.list(owner=request.owner)
            times = max(ledger.times(request.owner), [j.created_at for j in jobs], key=len)
            self.policy.check_quota(jobs, times)
            job = self._submit(request)
            ledger.record(request.owner)
            return job

    def _submit(self, request: TrainRequest) -> Job:
        plan = self._plan(request)  # bad input fails here, before the cluster is contacted
        self._check_runtime(get_blueprint(request.blueprint_id), plan.runtime)
        body = m.build_trainjob(plan)
        try:
            self.custom.create_namespaced_custom_object(m.GROUP, m.VERSION, self.namespace, m.TRAINJOB_PLURAL, body)
        except Exception as exc:
            raise self._error(exc, "create", TRAINJOBS, plan.name) from None
        return self.get(plan.name)

    def _get_trainjob(self, job_id: str, owner: str | None = None) -> dict[str, Any]:
        """The TrainJob; JobNotFound when it does not exist or (with ``owner``) is someone else's."""
        from kubernetes.client.exceptions import ApiException

        not_found = JobNotFound(f"no TrainJob {job_id!r} in namespace {self.namespace!r}", field="job")
        try:
            obj = self.custom.get_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.TRAINJOB_PLURAL, job_id
            )
        except ApiException as exc:
            if exc.status == 404:
                raise not_found from None
            raise self._error(exc, "get", TRAINJOBS, job_id) from None
        except Exception as exc:
            raise self._error(exc, "get", TRAINJOBS, job_id) from None
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if owner is not None and labels.get(m.LABEL_OWNER) != owner_key(owner):
            raise not_found  # someone else's job: reported like an unknown one
        return obj

    def _pods(self, job_id: str) -> list[dict[str, Any]]:
        try:
            resp = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{m.JOBSET_NAME_LABEL}={job_id}", _preload_content=False
            )
        except Exception as exc:
            raise self._error(exc, "list", "pods") from None
        return json.loads(resp.data).get("items") or []

    def _tail(self, pod: dict[str, Any], lines: int = 20) -> list[str]:
        try:
            text = self.core.read_namespaced_pod_log(
                pod["metadata"]["name"], self.namespace, container=container_name(pod), tail_lines=lines
            )
        except Exception:  # the tail is a courtesy; the phase is what matters
            return []
        return [line for line in str(text).splitlines() if line.strip()]

    def _job(self, obj: dict[str, Any], pods: list[dict[str, Any]] | None, tail: list[str] | None = None) -> Job:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        ann = meta.get("annotations") or {}
        phase, reason = cluster_phase(obj, pods or [])
        conds = conditions(obj)
        finished_at = None
        for ctype in ("Complete", "Failed"):
            if conds.get(ctype, {}).get("status") == "True":
                finished_at = _ts(conds[ctype].get("lastTransitionTime"))
        starts = [_ts((p.get("status") or {}).get("startTime")) for p in pods or []]
        progress, metrics = trainer_progress(obj)
        log_tail = list(tail or [])
        message = reason
        plain = [line for line in log_tail if EVENT_PREFIX not in line]
        if phase == JobPhase.FAILED and plain:
            message = f"{reason}; last log line: {plain[-1]}"
        try:
            params = json.loads(ann.get(m.ANN_PARAMS, "{}"))
        except ValueError:
            params = {}
        return Job(
            id=meta.get("name", ""),
            blueprint_id=self._blueprint_id(labels),
            backend=self.name,
            phase=phase,
            params=params,
            created_at=_ts(meta.get("creationTimestamp")) or time.time(),
            started_at=min((s for s in starts if s), default=None),
            finished_at=finished_at,
            message=message,
            progress=progress,
            metrics={k: v for k, v in metrics.items() if k.startswith("eval")},
            model_dir=ann.get(m.ANN_OUTPUT) if phase == JobPhase.SUCCEEDED else None,
            base_model=ann.get(m.ANN_BASE),
            log_tail=log_tail,
            labels={k[len(m.LABEL_PREFIX) :]: v for k, v in labels.items() if k.startswith(m.LABEL_PREFIX)},
            owner=ann.get(m.ANN_OWNER),
        )

    @staticmethod
    def _blueprint_id(labels: dict[str, str]) -> str:
        value = labels.get(m.LABEL_BLUEPRINT, "")
        catalog = load_catalog()
        return value if value in catalog else next((b for b in catalog if m.label_value(b) == value), value)

    def get(self, job_id: str, *, owner: str | None = None) -> Job:
        obj = self._get_trainjob(job_id, owner)
        pods = self._pods(job_id)
        tail = None
        phase, _ = cluster_phase(obj, pods)
        if phase == JobPhase.FAILED:
            failing = [p for p in sorted(pods, key=step_name) if failure(p)] or [
                p for p in pods if step_name(p) == "node-0"
            ]
            tail = self._tail(failing[0]) if failing else None
        job = self._job(obj, pods, tail)
        queue_name = ((obj.get("metadata") or {}).get("labels") or {}).get(m.QUEUE_LABEL)
        if queue_name and job.phase == JobPhase.PENDING and (obj.get("spec") or {}).get("suspend"):
            job.queue_position = kueue.pending_position(self.custom.api_client, self.namespace, queue_name, job_id)
            if job.queue_position is not None:  # else the message stays "... waiting for admission"
                job.message = f"queued in Kueue queue {queue_name!r}: position {job.queue_position}"
        return job

    def _list_trainjobs(self, owner: str | None = None) -> dict[str, Any]:
        try:
            return self.custom.list_namespaced_custom_object(
                m.GROUP,
                m.VERSION,
                self.namespace,
                m.TRAINJOB_PLURAL,
                label_selector=f"{m.LABEL_MANAGED}={m.MANAGED_BY}{m.owner_selector(owner)}",
            )
        except Exception as exc:
            raise self._error(exc, "list", TRAINJOBS) from None

    def list(self, *, owner: str | None = None) -> list[Job]:
        data = self._list_trainjobs(owner)
        jobs = [self._job(obj, None) for obj in data.get("items") or []]
        jobs = [j for j in jobs if not self._expired(j, data)]
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)

    def cleanup(self, *, now: float | None = None) -> list[str]:
        """Delete finished TrainJobs (and their InferenceServices) past their TTL; the names deleted."""
        data = self._list_trainjobs()
        return [
            job.id for job in (self._job(o, None) for o in data.get("items") or []) if self._expired(job, data, now)
        ]

    def _expired(self, job: Job, data: dict[str, Any], now: float | None = None) -> bool:
        """Optional TTL after finish (annotation set at submit): delete the job and its servers."""
        obj = next(o for o in data.get("items") or [] if o["metadata"]["name"] == job.id)
        ttl = (obj["metadata"].get("annotations") or {}).get(m.ANN_TTL)
        now = time.time() if now is None else now
        if ttl is None or not job.done or job.finished_at is None or now < job.finished_at + int(ttl):
            return False
        try:
            self.delete(job.id)
        except UserError:
            return False
        return True

    # -- events ---------------------------------------------------------------------------------
    def events(self, job_id: str, follow: bool = False, *, owner: str | None = None) -> Iterator[Event]:
        obj = self._get_trainjob(job_id, owner)  # JobNotFound before anything starts
        created = _ts((obj.get("metadata") or {}).get("creationTimestamp"))
        yield Phase(JobPhase.PENDING, "TrainJob created", time=created or time.time())
        state = StreamState(job_id, job=obj, rank=0, phase=JobPhase.PENDING)
        logs = LogSource(self.core, self.namespace, self.stats)
        if not follow:
            yield from history(state, self._get_trainjob(job_id), self._pods(job_id), self._namespace_events(), logs)
            return
        inbox: queue.Queue = queue.Queue()
        watchers: list[Any] = self.watchers(job_id, inbox.put, threading.Event())
        queue_name = ((obj.get("metadata") or {}).get("labels") or {}).get(m.QUEUE_LABEL)
        if queue_name:  # Kueue's pending position, where its visibility API answers
            watchers.append(
                kueue.QueuePoller(
                    partial(kueue.pending_position, self.custom.api_client, self.namespace, queue_name, job_id),
                    lambda: state.phase in (None, JobPhase.PENDING),
                    inbox.put,
                    threading.Event(),
                    interval=self.queue_poll_seconds,
                )
            )
        session = JobFollow(
            state=state,
            watchers=watchers,
            logs=logs,
            inbox=inbox,
            drain_timeout=self.drain_timeout,
            fail=lambda kind, exc: self._error(exc, "watch", TRAINJOBS if kind == "trainjob" else "pods"),
        )
        yield from session.events()

    def _namespace_events(self) -> list[dict[str, Any]]:
        try:
            resp = self.core.list_namespaced_event(self.namespace, _preload_content=False)
            return json.loads(resp.data).get("items") or []
        except Exception:  # events are advisory (RBAC may hide them)
            return []

    def watchers(self, job_id: str, sink: Any, stop: threading.Event) -> list[ResourceWatcher]:
        """One watch per resource kind for a job: its TrainJob, its pods, the namespace's Events."""
        ns, t = self.namespace, self.watch_timeout
        return [
            ResourceWatcher(
                "trainjob",
                partial(
                    self.custom.list_namespaced_custom_object,
                    m.GROUP,
                    m.VERSION,
                    ns,
                    m.TRAINJOB_PLURAL,
                    field_selector=f"metadata.name={job_id}",
                ),
                sink,
                stop,
                timeout_seconds=t,
                stats=self.stats,
            ),
            ResourceWatcher(
                "pod",
                partial(self.core.list_namespaced_pod, ns, label_selector=f"{m.JOBSET_NAME_LABEL}={job_id}"),
                sink,
                stop,
                timeout_seconds=t,
                stats=self.stats,
            ),
            ResourceWatcher(
                "event", partial(self.core.list_namespaced_event, ns), sink, stop, timeout_seconds=t, stats=self.stats
            ),
        ]

    # -- control --------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, owner: str | None = None) -> Job:
        job = self.get(job_id, owner=owner)
        if job.done:
            return job
        body = {"metadata": {"annotations": {m.ANN_CANCELLED: "true"}}, "spec": {"suspend": True}}
        try:
            self.custom.patch_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.TRAINJOB_PLURAL, job_id, body
            )
        except Exception as exc:
            raise self._error(exc, "patch", TRAINJOBS, job_id) from None
        return self.get(job_id)

    def delete(self, job_id: str, *, owner: str | None = None) -> None:
        self._get_trainjob(job_id, owner)
        for isvc in self._isvcs(f"{m.LABEL_JOB}={job_id}"):
            self._delete_isvc(isvc["metadata"]["name"])
        try:
            self._sdk("delete_job", job_id)
        except Exception as exc:
            raise self._error(exc, "delete", TRAINJOBS, job_id) from None

    # -- serving --------------------------------------------------------------------------------
    def _isvcs(self, selector: str) -> list[dict[str, Any]]:
        try:
            data = self.custom.list_namespaced_custom_object(
                m.KSERVE_GROUP, m.KSERVE_VERSION, self.namespace, m.ISVC_PLURAL, label_selector=selector
            )
        except Exception as exc:
            raise self._error(exc, "list", ISVCS) from None
        return data.get("items") or []

    def _delete_isvc(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                m.KSERVE_GROUP, m.KSERVE_VERSION, self.namespace, m.ISVC_PLURAL, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise self._error(exc, "delete", ISVCS, name) from None
        except Exception as exc:
            raise self._error(exc, "delete", ISVCS, name) from None

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
            owner=(meta.get("annotations") or {}).get(m.ANN_OWNER),
        )

    def serve(self, job_id: str, *, base: bool = False, owner: str | None = None, port: int | None = None) -> Endpoint:
        from kubernetes.client.exceptions import ApiException

        if port is not None:
            raise UserError(PORT_IS_LOCAL, field="--port")
        job = self.get(job_id, owner=owner)
        blueprint = get_blueprint(job.blueprint_id)
        if base:
            uri = job.base_model or m.base_model_uri(job_id, blueprint)
            if uri.startswith("pkg://"):  # a model file inside a Python package: nothing KServe can load
                raise UserError(
                    f"the base model of {blueprint.id!r} is {uri}, a model shipped in a Python package that KServe "
                    "cannot load; serve the base model with the local backend (playground serve JOB --base)",
                    field="base",
                )
        else:
            if job.phase != JobPhase.SUCCEEDED or not job.model_dir:
                raise UserError(f"job {job_id} is {job.phase}; it can be served once it has Succeeded", field="job")
            uri = job.model_dir
        body = m.build_inferenceservice(job_id, blueprint, uri, self.opts, base=base, owner=job.owner)
        name = body["metadata"]["name"]
        try:
            self.custom.create_namespaced_custom_object(
                m.KSERVE_GROUP, m.KSERVE_VERSION, self.namespace, m.ISVC_PLURAL, body
            )
        except ApiException as exc:
            if exc.status != 409:
                raise self._error(exc, "create", ISVCS, name) from None
            existing = self.custom.get_namespaced_custom_object(
                m.KSERVE_GROUP, m.KSERVE_VERSION, self.namespace, m.ISVC_PLURAL, name
            )
            labels = (existing.get("metadata") or {}).get("labels") or {}
            model = ((existing.get("spec") or {}).get("predictor") or {}).get("model") or {}
            if labels.get(m.LABEL_JOB) != job_id or model.get("storageUri") != uri:
                raise self._error(exc, "create", ISVCS, name) from None
        except Exception as exc:
            raise self._error(exc, "create", ISVCS, name) from None
        return self._wait_ready(name)

    def _wait_ready(self, name: str) -> Endpoint:
        """Watch the InferenceService until Ready (one watch, no polling) or ``serve_timeout``."""
        inbox: queue.Queue = queue.Queue()
        stop = threading.Event()
        watcher = ResourceWatcher(
            "isvc",
            partial(
                self.custom.list_namespaced_custom_object,
                m.KSERVE_GROUP,
                m.KSERVE_VERSION,
                self.namespace,
                m.ISVC_PLURAL,
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
                    raise self._error(item.error, "watch", ISVCS, name)
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
            for c in (last.get("status") or {}).get("conditions") or []
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
                (isvc["metadata"].get("labels") or {}).get(m.LABEL_JOB),
                (isvc.get("status") or {}).get("url"),
                ((isvc.get("status") or {}).get("url") or "").rstrip("/") + "/openai/v1",
            )
        ]
        if not matched:
            raise UserError(
                f"no InferenceService matches {target!r} (an endpoint URL, InferenceService name or job id)",
                field="target",
            )
        for isvc in matched:
            self._delete_isvc(isvc["metadata"]["name"])

    def endpoints(self, *, owner: str | None = None) -> list[Endpoint]:
        found = [self._endpoint(i) for i in self._isvcs(f"{m.LABEL_MANAGED}={m.MANAGED_BY}{m.owner_selector(owner)}")]
        return [e for e in found if e is not None]
