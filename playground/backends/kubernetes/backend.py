"""The Kubernetes backend: blueprint jobs as Kubeflow Trainer v2 TrainJobs (training only; their InferenceServices
are :mod:`playground.serving.kserve`'s).

By concern: the cluster connection (``connection``; the SDK's internals in ``sdk``), the TrainJob manifests
(``manifests``; your data files through a PVC: ``datafiles``), TrainJob → Job read through the typed API models
(``mapping``), phases from conditions and pods (``status``), watches (``watch``) and the live follow (``follow``).
Following a job holds one watch per resource kind (the TrainJob, its pods, Events) plus one log stream per step pod,
all resuming after a dropped connection. Nothing contacts the cluster before it is needed, so ``render_train`` works
without a kubeconfig. ``list`` has no side effects: jobs past their TTL are found by ``expired`` and deleted by the
facade's cleanup.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

from playground.backends.base import Backend
from playground.backends.kubernetes import manifests as m
from playground.backends.kubernetes import mapping
from playground.backends.kubernetes import queue as kueue
from playground.backends.kubernetes import trainjob as tj
from playground.backends.kubernetes.connection import Connection
from playground.backends.kubernetes.datafiles import in_pod, own_pod_claims
from playground.backends.kubernetes.follow import JobFollow, LogSource, history
from playground.backends.kubernetes.status import (
    StreamState,
    cluster_phase,
    container_name,
    failure,
    step_name,
)
from playground.backends.kubernetes.watch import ResourceWatcher, WatchStats
from playground.blueprints import Blueprint, get_blueprint
from playground.booth import BoothPolicy, owner_key
from playground.errors import BackendError, JobNotFound
from playground.events import Event, JobPhase, Phase
from playground.types import Job, TrainRequest

TRAINJOBS = "trainjobs.trainer.kubeflow.org"
RUNTIMES = "clustertrainingruntimes.trainer.kubeflow.org"


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
        self.connection = Connection(namespace, context, kubeconfig)
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

    # -- connection (shared with the KServe model servers) ----------------------------------------
    @property
    def namespace(self) -> str:
        return self.connection.namespace

    @property
    def kubeconfig(self) -> str | None:
        return self.connection.kubeconfig

    @property
    def context(self) -> str | None:
        return self.connection.context

    @property
    def custom(self):
        return self.connection.custom

    @property
    def core(self):
        return self.connection.core

    def _error(self, exc: BaseException, verb: str, resource: str, name: str | None = None) -> BackendError:
        return self.connection.error(exc, verb, resource, name)

    # -- manifests (no cluster) ------------------------------------------------------------------
    def _plan(self, request: TrainRequest, name: str | None = None) -> Any:
        """The job's plan (:meth:`plan_job`) under this backend's options; with your data file on this notebook
        pod's volume and no claim configured, the pod's own claims (the same claim is mounted in the job's pods)."""
        blueprint = get_blueprint(request.blueprint_id)
        name = name or m.new_job_name(blueprint.id)
        opts = self.opts
        if not opts.data_claims and m.local_data_files(blueprint, request) and in_pod():
            opts = dataclasses.replace(opts, data_claims=tuple(own_pod_claims(lambda: self.core)))
        return self.plan_job(blueprint, request, opts, name)

    def plan_job(self, blueprint: Blueprint, request: TrainRequest, opts: m.ClusterOptions, name: str) -> Any:
        """The job object's plan: a TrainJob's here (the kuberay backend: a RayJob's)."""
        return tj.plan_trainjob(blueprint, request, opts, name)

    def render_train(self, request: TrainRequest) -> str:
        return m.to_yaml(tj.build_trainjob(self._plan(request)))

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

        from playground.backends.kubernetes.errors import root_cause

        try:
            runtime = self.connection.sdk("get_runtime", name)
        except Exception as exc:
            root = root_cause(exc)
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
    def prepare(self, request: TrainRequest) -> tj.TrainJobPlan:
        return self._plan(request)  # bad input fails here, before the cluster is contacted

    def create(self, request: TrainRequest, prepared: tj.TrainJobPlan) -> Job:
        plan = prepared
        self._check_runtime(get_blueprint(request.blueprint_id), plan.runtime)
        body = tj.build_trainjob(plan)
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
        labels = mapping.typed(obj).metadata.labels or {}
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
        job = mapping.to_job(obj, pods, tail)
        trainjob = mapping.typed(obj)
        queue_name = (trainjob.metadata.labels or {}).get(m.QUEUE_LABEL)
        if queue_name and job.phase == JobPhase.PENDING and trainjob.spec.suspend:
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
        jobs = [mapping.to_job(obj, None) for obj in data.get("items") or []]
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)

    @property
    def cleanup_interval(self) -> float | None:
        """Every list: only jobs submitted with a TTL (booth mode, or the option) ever expire."""
        return 0.0

    # -- events ---------------------------------------------------------------------------------
    def events(self, job_id: str, follow: bool = False, *, owner: str | None = None) -> Iterator[Event]:
        obj = self._get_trainjob(job_id, owner)  # JobNotFound before anything starts
        trainjob = mapping.typed(obj)
        created = mapping.seconds(trainjob.metadata.creation_timestamp)
        yield Phase(JobPhase.PENDING, "TrainJob created", time=created or time.time())
        state = StreamState(job_id, job=obj, rank=0, phase=JobPhase.PENDING)
        logs = LogSource(self.core, self.namespace, self.stats)
        if not follow:
            yield from history(state, self._get_trainjob(job_id), self._pods(job_id), self._namespace_events(), logs)
            return
        inbox: queue.Queue = queue.Queue()
        watchers: list[Any] = self.watchers(job_id, inbox.put, threading.Event())
        queue_name = (trainjob.metadata.labels or {}).get(m.QUEUE_LABEL)
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
        try:
            self.connection.sdk("delete_job", job_id)
        except Exception as exc:
            raise self._error(exc, "delete", TRAINJOBS, job_id) from None
