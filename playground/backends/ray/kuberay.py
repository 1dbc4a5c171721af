"""The ``kuberay`` backend: blueprint jobs as KubeRay ``RayJob``s (Ray Train on Kubernetes), served by KServe.

It shares with the kubernetes backend (:class:`~playground.backends.cluster_backend.ClusterBackend`, on
:mod:`playground.cluster`'s plumbing) all but the job object, a RayJob in place of the TrainJob: the same
connection, options (namespace, context, kubeconfig, Kueue queue, HF token Secret, image, TTL, booth policy), labels
and owner filtering, the same watches (one per resource kind, resumed from the last resourceVersion) and log
followers, and the same workspace PVC that KServe serves from. What differs, by concern:

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
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

from playground.backends.cluster_backend import ClusterBackend
from playground.backends.ray import rayjob as rj
from playground.backends.ray import rayjob_status as rs
from playground.backends.ray.kuberay_follow import RayJobFollow, RayJobState
from playground.blueprints import Blueprint
from playground.cluster import manifests as m
from playground.cluster.pods import started
from playground.cluster.watch import LogEnded, LogFollower, LogLine, WatchItem
from playground.errors import BackendError, JobNotFound, UserError, shown
from playground.events import Event, JobPhase, Phase
from playground.owner import OPERATOR, Owner
from playground.types import Job, RunRequest

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


class KubeRayBackend(ClusterBackend):
    """Blueprint jobs as KubeRay RayJobs, served by KServe. Options fall back to env (PLAYGROUND_*)."""

    name = "kuberay"
    job_api = (rj.GROUP, rj.VERSION, rj.RAYJOB_PLURAL)
    watch_kind = "rayjob"
    workload_owner = "RayJob"

    def __init__(self, *args: Any, trainer: str | None = None, **kwargs: Any) -> None:
        """:class:`ClusterBackend`'s options; ``trainer`` can only be the playground's (Ray Train runs it)."""
        check_trainer(trainer)
        super().__init__(*args, trainer=m.PLAYGROUND, **kwargs)

    # -- manifests (no cluster) ------------------------------------------------------------------
    def plan_job(self, blueprint: Blueprint, request: RunRequest, opts: m.ClusterOptions, name: str) -> rj.RayJobPlan:
        return rj.plan_rayjob(blueprint, request, opts, name)

    def render_train(self, request: RunRequest) -> str:
        return rj.to_yaml(self._plan(request))

    # -- jobs -----------------------------------------------------------------------------------
    def _rayjobs(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.custom, method)(rj.GROUP, rj.VERSION, *args, **kwargs)

    def create(self, request: RunRequest, prepared: rj.RayJobPlan) -> Job:  # type: ignore[override]
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

    def _get_rayjob(self, job_id: str, owner: Owner = OPERATOR) -> dict[str, Any]:
        """The RayJob; JobNotFound when it does not exist or is not ``owner``'s to see."""
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
        if not m.visible_to(labels, owner):
            raise not_found  # someone else's job: reported like an unknown one
        return obj

    def pod_selector(self, job_id: str) -> str:
        return f"{m.LABEL_JOB}={job_id},{rj.LABEL_RAY_ROLE}"

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

    def get(self, job_id: str, *, owner: Owner = OPERATOR) -> Job:
        obj = self._get_rayjob(job_id, owner)
        pods = self._pods(job_id)
        lines = self._driver_tail(pods)
        job = rs.to_job(obj, pods, rs.LogSummary.read(lines) if lines is not None else None)
        view = rs.RayJobView.from_dict(obj)
        return self._with_queue_position(job, view.metadata.labels, bool(view.spec.suspend))

    def list(self, *, owner: Owner = OPERATOR) -> list[Job]:
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
    def events(self, job_id: str, follow: bool = False, *, owner: Owner = OPERATOR) -> Iterator[Event]:
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
        watchers = self._follow_inputs(job_id, view.metadata.labels, state, inbox.put)
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

    # -- control --------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, owner: Owner = OPERATOR) -> Job:
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

    def delete(self, job_id: str, *, owner: Owner = OPERATOR) -> None:
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
