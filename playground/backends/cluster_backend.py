"""What the backends whose jobs are objects on a cluster share (``kubernetes``: a Kubeflow TrainJob; ``kuberay``: a
KubeRay RayJob), so that neither imports the other: the connection and options (namespace, context, kubeconfig,
Kueue queue, HF token Secret, image, trainer, TTL, booth policy), the job's plan under them, its pods, the namespace's
Events, Kueue's queue position, and one watch per resource kind. The cluster plumbing itself is
:mod:`playground.cluster`'s (shared with the KServe model servers)."""

from __future__ import annotations

import dataclasses
import json
import threading
from functools import partial
from typing import Any, ClassVar

from playground.backends.base import Backend
from playground.blueprints import Blueprint, get_blueprint
from playground.booth import BoothPolicy
from playground.cluster import manifests as m
from playground.cluster import queue as kueue
from playground.cluster.connection import Connection
from playground.cluster.datafiles import in_pod, own_pod_claims
from playground.cluster.watch import ResourceWatcher, WatchStats
from playground.errors import BackendError
from playground.events import JobPhase
from playground.types import Job, RunRequest


class ClusterBackend(Backend):
    """A backend whose jobs are custom objects on a cluster. Options fall back to env (PLAYGROUND_*).

    A subclass names its job object: :attr:`job_api` (group, version, plural), :attr:`watch_kind` (its watch's kind),
    :attr:`workload_owner` (the owner kind of its Kueue Workload), and :meth:`plan_job` / :meth:`pod_selector`.
    """

    job_api: ClassVar[tuple[str, str, str]]  # (group, version, plural) of the job object
    watch_kind: ClassVar[str]  # the job object's watch kind ("trainjob", "rayjob")
    workload_owner: ClassVar[str]  # the kind that owns its Kueue Workload ("TrainJob", "RayJob")
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
    def _plan(self, request: RunRequest, name: str | None = None) -> Any:
        """The job's plan (:meth:`plan_job`) under this backend's options; with your data file on this notebook
        pod's volume and no claim configured, the pod's own claims (the same claim is mounted in the job's pods)."""
        blueprint = get_blueprint(request.blueprint_id)
        name = name or m.new_job_name(blueprint.id)
        opts = self.opts
        if not opts.data_claims and m.local_data_files(blueprint, request) and in_pod():
            opts = dataclasses.replace(opts, data_claims=tuple(own_pod_claims(lambda: self.core)))
        return self.plan_job(blueprint, request, opts, name)

    def plan_job(self, blueprint: Blueprint, request: RunRequest, opts: m.ClusterOptions, name: str) -> Any:
        """The job object's plan (a TrainJob's, a RayJob's)."""
        raise NotImplementedError

    def prepare(self, request: RunRequest) -> Any:
        return self._plan(request)  # bad input fails here, before the cluster is contacted

    # -- pods, Events, Kueue ------------------------------------------------------------------------
    def pod_selector(self, job_id: str) -> str:
        """The label selector of the job's pods."""
        raise NotImplementedError

    def _pods(self, job_id: str) -> list[dict[str, Any]]:
        try:
            resp = self.core.list_namespaced_pod(
                self.namespace, label_selector=self.pod_selector(job_id), _preload_content=False
            )
        except Exception as exc:
            raise self._error(exc, "list", "pods") from None
        return json.loads(resp.data).get("items") or []

    def _namespace_events(self) -> list[dict[str, Any]]:
        try:
            resp = self.core.list_namespaced_event(self.namespace, _preload_content=False)
            return json.loads(resp.data).get("items") or []
        except Exception:  # events are advisory (RBAC may hide them)
            return []

    def _queue_position(self, queue_name: str, job_id: str) -> int | None:
        return kueue.pending_position(
            self.custom.api_client, self.namespace, queue_name, job_id, owner_kind=self.workload_owner
        )

    def _with_queue_position(self, job: Job, labels: dict[str, str], suspended: bool) -> Job:
        """A pending job suspended in a Kueue queue: its position there, where Kueue's visibility API answers."""
        queue_name = labels.get(m.QUEUE_LABEL)
        if queue_name and job.phase == JobPhase.PENDING and suspended:
            job.queue_position = self._queue_position(queue_name, job.id)
            if job.queue_position is not None:  # else the message stays "... waiting for admission"
                job.message = f"queued in Kueue queue {queue_name!r}: position {job.queue_position}"
        return job

    @property
    def cleanup_interval(self) -> float | None:
        """Every list: only jobs submitted with a TTL (booth mode, or the option) ever expire."""
        return 0.0

    # -- watches ----------------------------------------------------------------------------------
    def watchers(self, job_id: str, sink: Any, stop: threading.Event) -> list[ResourceWatcher]:
        """One watch per resource kind for a job: its job object, its pods, the namespace's Events."""
        ns, t = self.namespace, self.watch_timeout
        group, version, plural = self.job_api
        job = partial(
            self.custom.list_namespaced_custom_object,
            group,
            version,
            ns,
            plural,
            field_selector=f"metadata.name={job_id}",
        )
        pods = partial(self.core.list_namespaced_pod, ns, label_selector=self.pod_selector(job_id))
        events = partial(self.core.list_namespaced_event, ns)
        return [
            ResourceWatcher(kind, call, sink, stop, timeout_seconds=t, stats=self.stats)
            for kind, call in ((self.watch_kind, job), ("pod", pods), ("event", events))
        ]

    def queue_poller(self, labels: dict[str, str], job_id: str, state: Any, sink: Any) -> list[kueue.QueuePoller]:
        """Kueue's pending position while the job waits (``state.phase``), where its visibility API answers: one
        poller for a job in a Kueue queue, none otherwise."""
        queue_name = labels.get(m.QUEUE_LABEL)
        if not queue_name:
            return []
        return [
            kueue.QueuePoller(
                partial(self._queue_position, queue_name, job_id),
                lambda: state.phase in (None, JobPhase.PENDING),
                sink,
                threading.Event(),
                interval=self.queue_poll_seconds,
            )
        ]

    def _follow_inputs(self, job_id: str, labels: dict[str, str], state: Any, sink: Any) -> list[Any]:
        """Everything a live follow listens to: the job's watches and, in a Kueue queue, its position poller."""
        return [*self.watchers(job_id, sink, threading.Event()), *self.queue_poller(labels, job_id, state, sink)]
