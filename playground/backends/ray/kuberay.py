"""The ``kuberay`` backend: blueprint jobs as KubeRay ``RayJob``s (Ray Train on Kubernetes), served by KServe.

It is the Kubernetes backend with a RayJob in place of the TrainJob: the same connection, options (namespace,
context, kubeconfig, Kueue queue, HF token Secret, image, TTL, booth policy), labels and owner filtering, the same
watches (one per resource kind, resumed from the last resourceVersion) and log followers, and the same workspace
PVC that KServe serves from. What differs, by concern:

- manifests (:mod:`.rayjob`; read back: :mod:`.rayjob_status`): ``spec.entrypoint`` runs
  ``python -m playground.train.on_ray`` (Ray Train's ``TorchTrainer`` around the project's trainer) with the TrainJob's
  trainer arguments; ``spec.rayClusterSpec`` is a head and one worker group sized from the blueprint; the workspace
  PVC is created beside the RayJob (and owned by it).
- phases: ``status.jobDeploymentStatus`` (New, Initializing, Running, Complete, Failed, Suspended…) and
  ``status.jobStatus`` (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED), the pods' problems while the cluster comes up,
  then the trainer's own events for Initializing/Training/Saving.
- following (:mod:`.kuberay_follow`) and logs: the submitter pod's (KubeRay's K8sJobMode runs ``ray job submit``
  then ``ray job logs --follow`` in a batch Job named like the RayJob): the driver's log, with Ray's
  ``(RayTrainWorker pid=N, ip=A)`` prefixes and colours removed (:mod:`.logs`). A retried submitter replays the log
  from the start: each line is emitted once.
- cancel: ``spec.suspend: true`` (KubeRay deletes the RayCluster and the submitter, the RayJob stays, marked
  cancelled); a Kueue-managed RayJob's Workload is deactivated first (``spec.active: false``), or Kueue would
  unsuspend it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

from playground.backends.kubernetes import manifests as m
from playground.backends.kubernetes import queue as kueue
from playground.backends.kubernetes.backend import KubernetesBackend
from playground.backends.kubernetes.status import started
from playground.backends.kubernetes.watch import LogEnded, LogFollower, LogLine, ResourceWatcher, WatchItem
from playground.backends.ray import rayjob as rj
from playground.backends.ray import rayjob_status as rs
from playground.backends.ray.kuberay_follow import RayJobFollow, RayJobState
from playground.blueprints import Blueprint
from playground.booth import owner_key
from playground.errors import BackendError, JobNotFound, UserError, shown
from playground.events import Event, JobPhase, Phase
from playground.types import Job, TrainRequest

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
WORKLOADS = "workloads.kueue.x-k8s.io"
PVCS = "persistentvolumeclaims"
TAIL_LINES = 200  # of the driver's log read by ``get`` (progress, metrics, a failure's last lines)


def check_trainer(trainer: str | None) -> None:
    """The kuberay backend runs only the project's trainer (under Ray Train): a one-line error otherwise."""
    for value, setting in ((trainer, "trainer"), (os.environ.get("PLAYGROUND_K8S_TRAINER"), "PLAYGROUND_K8S_TRAINER")):
        if value and value != m.PLAYGROUND:
            raise UserError(
                f"{setting} {shown(value)}: the kuberay backend runs the playground trainer under Ray Train "
                f"(builtin-torchtune runs on Kubeflow Trainer: --backend kubernetes); allowed: {m.PLAYGROUND}",
                field=setting,
            )
        if value:  # an explicit choice wins over the env
            return


class KubeRayBackend(KubernetesBackend):
    """Blueprint jobs as KubeRay RayJobs, served by KServe. Options fall back to env (PLAYGROUND_*)."""

    name = "kuberay"

    def __init__(self, *args: Any, trainer: str | None = None, **kwargs: Any) -> None:
        """:class:`KubernetesBackend`'s options; ``trainer`` can only be the playground's (Ray Train runs it)."""
        check_trainer(trainer)
        super().__init__(*args, trainer=m.PLAYGROUND, **kwargs)

    # -- manifests (no cluster) ------------------------------------------------------------------
    def plan_job(self, blueprint: Blueprint, request: TrainRequest, opts: m.ClusterOptions, name: str) -> rj.RayJobPlan:
        return rj.plan_rayjob(blueprint, request, opts, name)

    def render_train(self, request: TrainRequest) -> str:
        return rj.to_yaml(self._plan(request))

    # -- jobs -----------------------------------------------------------------------------------
    def prepare(self, request: TrainRequest) -> rj.RayJobPlan:  # type: ignore[override]
        return self._plan(request)  # bad input fails here, before the cluster is contacted

    def _rayjobs(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.custom, method)(rj.GROUP, rj.VERSION, *args, **kwargs)

    def create(self, request: TrainRequest, prepared: rj.RayJobPlan) -> Job:  # type: ignore[override]
        """The workspace PVC, then the RayJob (the PVC is removed again if the RayJob cannot be created), then the
        PVC's owner reference to the RayJob so that deleting the RayJob by any means deletes its workspace."""
        from kubernetes.client.exceptions import ApiException

        plan = prepared
        claim = rj.build_workspace_pvc(plan)
        try:
            self.core.create_namespaced_persistent_volume_claim(self.namespace, claim)
        except Exception as exc:
            raise self._error(exc, "create", PVCS, plan.workspace_claim) from None
        try:
            created = self._rayjobs(
                "create_namespaced_custom_object", self.namespace, rj.RAYJOB_PLURAL, rj.build_rayjob(plan)
            )
        except Exception as exc:
            self._delete_claim(plan.name)
            if isinstance(exc, ApiException) and exc.status == 404:
                raise BackendError(
                    f"the cluster has no RayJob API ({rj.GROUP}/{rj.VERSION}): install the KubeRay operator "
                    "(helm install kuberay-operator kuberay/kuberay-operator), or use --backend kubernetes",
                    field="backend",
                ) from None
            raise self._error(exc, "create", rj.RAYJOBS, plan.name) from None
        owned = {"metadata": {"ownerReferences": [rj.owner_reference(created)]}}
        with contextlib.suppress(Exception):  # best effort: ``delete`` deletes the claim with the job anyway
            self.core.patch_namespaced_persistent_volume_claim(plan.workspace_claim, self.namespace, owned)
        return self.get(plan.name)

    def _get_rayjob(self, job_id: str, owner: str | None = None) -> dict[str, Any]:
        """The RayJob; JobNotFound when it does not exist or (with ``owner``) is someone else's."""
        from kubernetes.client.exceptions import ApiException

        not_found = JobNotFound(f"no RayJob {job_id!r} in namespace {self.namespace!r}", field="job")
        try:
            obj = self._rayjobs("get_namespaced_custom_object", self.namespace, rj.RAYJOB_PLURAL, job_id)
        except ApiException as exc:
            if exc.status == 404:
                raise not_found from None
            raise self._error(exc, "get", rj.RAYJOBS, job_id) from None
        except Exception as exc:
            raise self._error(exc, "get", rj.RAYJOBS, job_id) from None
        labels = rs.RayJobView.from_dict(obj).metadata.labels
        if labels.get(m.LABEL_MANAGED) != m.MANAGED_BY:
            raise not_found  # a RayJob the playground did not make
        if owner is not None and labels.get(m.LABEL_OWNER) != owner_key(owner):
            raise not_found  # someone else's job: reported like an unknown one
        return obj

    def _pod_selector(self, job_id: str) -> str:
        return f"{m.LABEL_JOB}={job_id},{rj.LABEL_RAY_ROLE}"

    def _pods(self, job_id: str) -> list[dict[str, Any]]:
        try:
            resp = self.core.list_namespaced_pod(
                self.namespace, label_selector=self._pod_selector(job_id), _preload_content=False
            )
        except Exception as exc:
            raise self._error(exc, "list", "pods") from None
        return json.loads(resp.data).get("items") or []

    def _driver_tail(self, pods: list[dict[str, Any]]) -> list[str] | None:
        """The last lines of the driver's log (the newest submitter pod that ran); None when there is none."""
        ran = [p for p in rs.submitters(pods) if started(p)]
        if not ran:
            return None
        try:
            text = self.core.read_namespaced_pod_log(
                rs.pod_name(ran[-1]), self.namespace, container=rj.SUBMITTER_CONTAINER, tail_lines=TAIL_LINES
            )
        except Exception:  # the log is a courtesy; the phase is what matters
            return None
        return str(text).splitlines()

    def get(self, job_id: str, *, owner: str | None = None) -> Job:
        obj = self._get_rayjob(job_id, owner)
        pods = self._pods(job_id)
        lines = self._driver_tail(pods)
        job = rs.to_job(obj, pods, rs.LogSummary.read(lines) if lines is not None else None)
        view = rs.RayJobView.from_dict(obj)
        queue_name = view.metadata.labels.get(m.QUEUE_LABEL)
        if queue_name and job.phase == JobPhase.PENDING and view.spec.suspend:
            job.queue_position = kueue.pending_position(
                self.custom.api_client, self.namespace, queue_name, job_id, owner_kind="RayJob"
            )
            if job.queue_position is not None:  # else the message stays "... waiting for admission"
                job.message = f"queued in Kueue queue {queue_name!r}: position {job.queue_position}"
        return job

    def list(self, *, owner: str | None = None) -> list[Job]:
        try:
            data = self._rayjobs(
                "list_namespaced_custom_object",
                self.namespace,
                rj.RAYJOB_PLURAL,
                label_selector=f"{m.LABEL_MANAGED}={m.MANAGED_BY}{m.owner_selector(owner)}",
            )
        except Exception as exc:
            raise self._error(exc, "list", rj.RAYJOBS) from None
        jobs = [rs.to_job(obj, None) for obj in data.get("items") or []]
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)

    # -- events ---------------------------------------------------------------------------------
    def events(self, job_id: str, follow: bool = False, *, owner: str | None = None) -> Iterator[Event]:
        obj = self._get_rayjob(job_id, owner)  # JobNotFound before anything starts
        view = rs.RayJobView.from_dict(obj)
        yield Phase(
            JobPhase.PENDING, "RayJob created", time=rs.seconds(view.metadata.creation_timestamp) or time.time()
        )
        state = RayJobState(job_id, rank=0, phase=JobPhase.PENDING, reason="RayJob created")
        if not follow:
            yield from self._history(state, job_id)
            return
        inbox: queue.Queue = queue.Queue()
        watchers: list[Any] = self.watchers(job_id, inbox.put, threading.Event())
        queue_name = view.metadata.labels.get(m.QUEUE_LABEL)
        if queue_name:  # Kueue's pending position, where its visibility API answers
            watchers.append(
                kueue.QueuePoller(
                    partial(
                        kueue.pending_position,
                        self.custom.api_client,
                        self.namespace,
                        queue_name,
                        job_id,
                        owner_kind="RayJob",
                    ),
                    lambda: state.phase in (None, JobPhase.PENDING),
                    inbox.put,
                    threading.Event(),
                    interval=self.queue_poll_seconds,
                )
            )
        session = RayJobFollow(
            state=state,
            watchers=watchers,
            follower=partial(self._log_follower, stats=self.stats),
            inbox=inbox,
            drain_timeout=self.drain_timeout,
            fail=lambda kind, exc: self._error(exc, "watch", rj.RAYJOBS if kind == "rayjob" else "pods"),
        )
        yield from session.events()

    def _log_follower(self, pod: dict[str, Any], sink: Callable[[WatchItem], None], stop: threading.Event, **kw: Any):
        name = rs.pod_name(pod)
        return LogFollower(self.core, self.namespace, name, rj.SUBMITTER_CONTAINER, name, sink, stop, **kw)

    def _history(self, state: RayJobState, job_id: str) -> Iterator[Event]:
        """The whole story as it stands (no follow): pods, Events, the driver's log, then the RayJob."""
        obj, pods = self._get_rayjob(job_id), self._pods(job_id)
        state.job = obj
        for pod in pods:
            yield from state.on_pod("ADDED", pod)
        for ev in self._namespace_events():
            yield from state.on_event(ev)
        for pod in rs.submitters(pods):
            if not started(pod):
                continue
            items: list[WatchItem] = []
            self._log_follower(pod, items.append, threading.Event(), follow=False, stats=self.stats).run()
            for item in items:
                if isinstance(item, LogLine):
                    yield from state.on_log(item.source, item.line)
                elif isinstance(item, LogEnded) and item.error is not None:
                    yield from state.on_log_lost(item.source)
        yield from state.on_job("MODIFIED", obj)  # after the log: it is the finer source
        end = state.final_phase()
        if end is not None:
            yield end

    def watchers(self, job_id: str, sink: Any, stop: threading.Event) -> list[ResourceWatcher]:
        """One watch per resource kind for a job: its RayJob, its Ray pods (head, workers, submitter), Events."""
        ns, t = self.namespace, self.watch_timeout
        rayjob = partial(
            self.custom.list_namespaced_custom_object,
            rj.GROUP,
            rj.VERSION,
            ns,
            rj.RAYJOB_PLURAL,
            field_selector=f"metadata.name={job_id}",
        )
        pods = partial(self.core.list_namespaced_pod, ns, label_selector=self._pod_selector(job_id))
        events = partial(self.core.list_namespaced_event, ns)
        return [
            ResourceWatcher(kind, call, sink, stop, timeout_seconds=t, stats=self.stats)
            for kind, call in (("rayjob", rayjob), ("pod", pods), ("event", events))
        ]

    # -- control --------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, owner: str | None = None) -> Job:
        """Suspend the RayJob (KubeRay deletes its RayCluster and submitter; the RayJob stays) and mark it cancelled;
        under Kueue, deactivate its Workload first so that Kueue does not admit and unsuspend it again."""
        job = self.get(job_id, owner=owner)
        if job.done:
            return job
        obj = self._get_rayjob(job_id)
        problem: BackendError | None = None
        if m.QUEUE_LABEL in rs.RayJobView.from_dict(obj).metadata.labels:
            try:
                self._deactivate_workloads(obj)
            except BackendError as exc:
                problem = exc
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"annotations": {m.ANN_CANCELLED: "true", rj.ANN_CANCELLED_AT: now}},
            "spec": {"suspend": True},
        }
        try:
            self._rayjobs("patch_namespaced_custom_object", self.namespace, rj.RAYJOB_PLURAL, job_id, body)
        except Exception as exc:
            raise self._error(exc, "patch", rj.RAYJOBS, job_id) from None
        if problem is not None:
            raise BackendError(
                f"RayJob {job_id!r} is suspended, but its Kueue Workload could not be deactivated, so Kueue may "
                f"admit it again: {problem}",
                field="job",
            )
        return self.get(job_id)

    def _deactivate_workloads(self, rayjob: dict[str, Any]) -> None:
        """``spec.active: false`` on the Kueue Workloads the RayJob owns (Kueue's documented way to stop a workload
        for good); nothing when the cluster has no Kueue."""
        from kubernetes.client.exceptions import ApiException

        meta = rs.RayJobView.from_dict(rayjob).metadata
        for version in KUEUE_VERSIONS:
            try:
                data = self.custom.list_namespaced_custom_object(KUEUE_GROUP, version, self.namespace, "workloads")
            except ApiException as exc:
                if exc.status == 404:
                    continue  # this version is not served (or no Kueue at all)
                raise self._error(exc, "list", WORKLOADS) from None
            except Exception as exc:
                raise self._error(exc, "list", WORKLOADS) from None
            for workload in data.get("items") or []:
                wmeta = workload.get("metadata") or {}
                refs = wmeta.get("ownerReferences") or []
                if any(
                    r.get("kind") == "RayJob" and r.get("uid") in (meta.uid, None) and r.get("name") == meta.name
                    for r in refs
                ):
                    try:
                        self.custom.patch_namespaced_custom_object(
                            KUEUE_GROUP,
                            version,
                            self.namespace,
                            "workloads",
                            wmeta["name"],
                            {"spec": {"active": False}},
                        )
                    except Exception as exc:
                        raise self._error(exc, "patch", WORKLOADS, wmeta["name"]) from None
            return

    def _delete_claim(self, job_id: str) -> None:
        from kubernetes.client.exceptions import ApiException

        name = m.workspace_pvc(job_id, m.PLAYGROUND)
        try:
            self.core.delete_namespaced_persistent_volume_claim(name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise self._error(exc, "delete", PVCS, name) from None
        except Exception as exc:
            raise self._error(exc, "delete", PVCS, name) from None

    def delete(self, job_id: str, *, owner: str | None = None) -> None:
        """Delete the RayJob (KubeRay stops the Ray job; its RayCluster and submitter go with it) and its workspace."""
        from kubernetes.client.exceptions import ApiException

        self._get_rayjob(job_id, owner)
        try:
            self._rayjobs("delete_namespaced_custom_object", self.namespace, rj.RAYJOB_PLURAL, job_id)
        except ApiException as exc:
            if exc.status != 404:
                raise self._error(exc, "delete", rj.RAYJOBS, job_id) from None
        except Exception as exc:
            raise self._error(exc, "delete", rj.RAYJOBS, job_id) from None
        self._delete_claim(job_id)
