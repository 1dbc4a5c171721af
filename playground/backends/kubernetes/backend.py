"""The Kubernetes backend: blueprint jobs as Kubeflow Trainer v2 TrainJobs (training only; their InferenceServices
are :mod:`playground.serving.kserve`'s).

By concern: the cluster plumbing it shares with the kuberay backend and the KServe model servers is
:mod:`playground.cluster`'s (the connection, labels and options, your data files through a PVC, watches, Kueue) and
what it shares with the kuberay backend :mod:`playground.backends.cluster_backend`'s; here: the TrainJob manifests
(``trainjob``), TrainJob → Job read through the typed API models (``mapping``), phases from conditions and pods
(``status``) and the live follow (``follow``).
Following a job holds one watch per resource kind (the TrainJob, its pods, Events) plus one log stream per step pod,
all resuming after a dropped connection. Nothing contacts the cluster before it is needed, so ``render_train`` works
without a kubeconfig. ``list`` has no side effects: jobs past their TTL are found by ``expired`` and deleted by the
facade's cleanup.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

from playground.backends.cluster_backend import ClusterBackend
from playground.backends.kubernetes import mapping
from playground.backends.kubernetes import trainjob as tj
from playground.backends.kubernetes.follow import JobFollow, LogSource, history
from playground.backends.kubernetes.status import StreamState, cluster_phase
from playground.blueprints import Blueprint, get_blueprint
from playground.cluster import manifests as m
from playground.cluster.pods import container_name, failure, step_name
from playground.errors import BackendError, JobNotFound
from playground.events import Event, JobPhase, Phase
from playground.owner import OPERATOR, Owner
from playground.types import Job, RunRequest

TRAINJOBS = "trainjobs.trainer.kubeflow.org"
RUNTIMES = "clustertrainingruntimes.trainer.kubeflow.org"


class KubernetesBackend(ClusterBackend):
    """Blueprint jobs as TrainJobs, served by KServe. Options fall back to env (PLAYGROUND_*)."""

    name = "kubernetes"
    job_api = (m.GROUP, m.VERSION, m.TRAINJOB_PLURAL)
    watch_kind = "trainjob"
    workload_owner = "TrainJob"

    # -- manifests (no cluster) ------------------------------------------------------------------
    def plan_job(self, blueprint: Blueprint, request: RunRequest, opts: m.ClusterOptions, name: str) -> Any:
        """The job object's plan: a TrainJob's here (the kuberay backend: a RayJob's)."""
        return tj.plan_trainjob(blueprint, request, opts, name)

    def render_train(self, request: RunRequest) -> str:
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

        from playground.cluster.errors import root_cause

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
    def prepare(self, request: RunRequest) -> tj.TrainJobPlan:
        return self._plan(request)  # bad input fails here, before the cluster is contacted

    def create(self, request: RunRequest, prepared: tj.TrainJobPlan) -> Job:
        plan = prepared
        self._check_runtime(get_blueprint(request.blueprint_id), plan.runtime)
        body = tj.build_trainjob(plan)
        try:
            self.custom.create_namespaced_custom_object(m.GROUP, m.VERSION, self.namespace, m.TRAINJOB_PLURAL, body)
        except Exception as exc:
            raise self._error(exc, "create", TRAINJOBS, plan.name) from None
        return self.get(plan.name)

    def _get_trainjob(self, job_id: str, owner: Owner = OPERATOR) -> dict[str, Any]:
        """The TrainJob; JobNotFound when it does not exist or is not ``owner``'s to see."""
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
        if not m.visible_to(labels, owner):
            raise not_found  # someone else's job: reported like an unknown one
        return obj

    def pod_selector(self, job_id: str) -> str:
        return f"{m.JOBSET_NAME_LABEL}={job_id}"

    def _tail(self, pod: dict[str, Any], lines: int = 20) -> list[str]:
        try:
            text = self.core.read_namespaced_pod_log(
                pod["metadata"]["name"], self.namespace, container=container_name(pod), tail_lines=lines
            )
        except Exception:  # the tail is a courtesy; the phase is what matters
            return []
        return [line for line in str(text).splitlines() if line.strip()]

    def get(self, job_id: str, *, owner: Owner = OPERATOR) -> Job:
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
        return self._with_queue_position(job, trainjob.metadata.labels or {}, bool(trainjob.spec.suspend))

    def _list_trainjobs(self, owner: Owner = OPERATOR) -> dict[str, Any]:
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

    def list(self, *, owner: Owner = OPERATOR) -> list[Job]:
        data = self._list_trainjobs(owner)
        jobs = [mapping.to_job(obj, None) for obj in data.get("items") or []]
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)

    # -- events ---------------------------------------------------------------------------------
    def events(self, job_id: str, follow: bool = False, *, owner: Owner = OPERATOR) -> Iterator[Event]:
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
        watchers = self._follow_inputs(job_id, trainjob.metadata.labels or {}, state, inbox.put)
        session = JobFollow(
            state=state,
            watchers=watchers,
            logs=logs,
            inbox=inbox,
            drain_timeout=self.drain_timeout,
            fail=lambda kind, exc: self._error(exc, "watch", TRAINJOBS if kind == "trainjob" else "pods"),
        )
        yield from session.events()

    # -- control --------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, owner: Owner = OPERATOR) -> Job:
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

    def delete(self, job_id: str, *, owner: Owner = OPERATOR) -> None:
        self._get_trainjob(job_id, owner)
        try:
            self.connection.sdk("delete_job", job_id)
        except Exception as exc:
            raise self._error(exc, "delete", TRAINJOBS, job_id) from None
