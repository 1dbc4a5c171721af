"""What a notebook did on the cluster, whichever client created it (the Kubeflow SDK, kubectl, the
project's backend): the TrainJobs created in the namespace during the notebook's window, with their
conditions, JobSet, pods, events, the failing step's and node-0's last log lines and the Trainer
controller's lines about them (where RBAC allows); and ``--cleanup``, which deletes exactly those.

A notebook's window: TrainJobs that did not exist when it started (a snapshot of their uids is taken
then) and whose ``creationTimestamp`` is between its start (to the second, the API's precision) and its
end. Nothing older is ever looked at or deleted. With ``--jobs`` > 1 the windows of notebooks running
side by side overlap, and each sees the others' TrainJobs.

Only the ``kubernetes`` client is used (imported lazily): no Kubeflow SDK, so the slim install works.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass, field
from typing import Any

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
NODE_STEPS = ("node", "trainer-node")  # the replicated job that trains (Trainer's runtimes name it so)
CONTROLLER_NAMESPACE = "kubeflow-system"
CONTROLLER_SELECTOR = "app.kubernetes.io/name=trainer"  # as upstream's hack/e2e-run-notebook.sh reads it
LOG_LINES = 40
CONTROLLER_LINES = 20
CONTROLLER_SCAN = 5000  # controller log lines read to find those about the notebook's TrainJobs
EVENTS = 12


@dataclass
class Window:
    """One notebook's window on the cluster: the TrainJobs that existed before it, and when it ran."""

    namespace: str
    started_at: float
    before: set[str] | None = None  # uids at the start (None: could not list; timestamps only)
    ended_at: float | None = None  # None: still running (a cancelled run)
    notes: list[str] = field(default_factory=list)

    def contains(self, job: dict[str, Any]) -> bool:
        meta = job.get("metadata") or {}
        if self.before is not None and meta.get("uid") in self.before:
            return False
        created = parse_time(meta.get("creationTimestamp"))
        if created is None or created < int(self.started_at):
            return False
        return self.ended_at is None or created <= self.ended_at + 1


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 timestamp as the API server writes it (``2025-01-02T03:04:05Z``), as epoch seconds."""
    if not text:
        return None
    try:
        return float(calendar.timegm(time.strptime(str(text)[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


class Cluster:
    """The Kubernetes API through the ``kubernetes`` client: the kubeconfig (``$KUBECONFIG``, else
    ``~/.kube/config``) or the in-cluster service account; the namespace given, else the context's."""

    def __init__(self, namespace: str | None = None) -> None:
        import os

        from kubernetes import client, config

        cfg = client.Configuration()
        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.environ.get("KUBECONFIG")
        context_ns = None
        if in_cluster:
            config.load_incluster_config(client_configuration=cfg)
            try:
                with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as fh:
                    context_ns = fh.read().strip()
            except OSError:
                context_ns = None
        else:
            # $KUBECONFIG as it is now: the client's own default was read once, when it was first imported
            kubeconfig = os.environ.get("KUBECONFIG") or None
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
            _contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
            context_ns = ((active or {}).get("context") or {}).get("namespace")
        self.namespace = namespace or context_ns or "default"
        self.api = client.ApiClient(cfg)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)

    def close(self) -> None:
        self.api.close()

    # -- the window ---------------------------------------------------------------------------------
    def trainjobs(self) -> list[dict[str, Any]]:
        data = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        return list(data.get("items") or [])

    def open_window(self, started_at: float) -> Window:
        window = Window(namespace=self.namespace, started_at=started_at)
        try:
            window.before = {(j.get("metadata") or {}).get("uid") for j in self.trainjobs()}
        except Exception as exc:  # RBAC, no CRD: the timestamps alone decide
            window.notes.append(f"could not list TrainJobs at the start: {short_error(exc)}")
        return window

    def created_in(self, window: Window) -> list[dict[str, Any]]:
        """The TrainJobs created during the window, oldest first."""
        jobs = [job for job in self.trainjobs() if window.contains(job)]
        return sorted(jobs, key=lambda j: (j.get("metadata") or {}).get("creationTimestamp") or "")

    def delete(self, window: Window) -> list[str]:
        """Delete the TrainJobs created during the window (their JobSets and pods go with them)."""
        from kubernetes import client

        deleted = []
        for job in self.created_in(window):
            name = job["metadata"]["name"]
            body = client.V1DeleteOptions(propagation_policy="Background")
            try:
                self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, body=body)
            except client.ApiException as exc:
                if exc.status != 404:  # already gone
                    raise
            deleted.append(name)
        return deleted

    # -- diagnostics --------------------------------------------------------------------------------
    def describe(self, window: Window, *, details: bool) -> list[dict[str, Any]]:
        """Each TrainJob of the window: name, state, conditions; with ``details`` also its JobSet's
        conditions, pods, events, the failing step's and node-0's last lines and the controller's lines."""
        jobs = [summary(job) for job in self.created_in(window)]
        if not details:
            return jobs
        controller = self._controller_lines([j["name"] for j in jobs]) if jobs else None
        for job in jobs:
            self._details(job)
            if controller is not None:
                job["controller_logs"] = controller.get(job["name"], [])
                job["controller_note"] = controller.get("", [None])[0]
        return jobs

    def _details(self, job: dict[str, Any]) -> None:
        name, notes = job["name"], job.setdefault("notes", [])
        try:
            jobset = self.custom.get_namespaced_custom_object(*JOBSET[:2], self.namespace, JOBSET[2], name)
            job["jobset_conditions"] = conditions(jobset)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:  # no JobSet (yet, or a local/SDK-only cluster)
                notes.append(f"JobSet: {short_error(exc)}")
        pods: list[Any] = []
        try:
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}").items
        except Exception as exc:
            notes.append(f"pods: {short_error(exc)}")
        job["pods"] = [pod_state(p) for p in pods]
        job["events"] = self._events([name, *(p.metadata.name for p in pods)], notes)
        failing = next((p for p in pods if pod_state(p)["failed"]), None)
        node0 = next(
            (
                p
                for p in pods
                if (p.metadata.labels or {}).get(RJOB_LABEL) in NODE_STEPS
                and (p.metadata.labels or {}).get(INDEX_LABEL, "0") == "0"
            ),
            None,
        )
        if failing is not None:
            job["failing_step"] = (failing.metadata.labels or {}).get(RJOB_LABEL) or failing.metadata.name
            job["failing_step_logs"] = self._log(failing.metadata.name, notes)
        if node0 is not None and node0 is not failing:
            job["node0_pod"] = node0.metadata.name
            job["node0_logs"] = self._log(node0.metadata.name, notes)

    def _events(self, names: list[str], notes: list[str]) -> list[dict[str, Any]]:
        try:
            items = self.core.list_namespaced_event(self.namespace).items
        except Exception as exc:
            notes.append(f"events: {short_error(exc)}")
            return []
        wanted = set(names)
        mine = [e for e in items if e.involved_object is not None and e.involved_object.name in wanted]
        mine.sort(key=lambda e: str(e.last_timestamp or e.event_time or e.first_timestamp or ""))
        warnings = [e for e in mine if e.type == "Warning"][-EVENTS:]  # kept first: they say what went wrong
        others = [e for e in mine if e.type != "Warning"][-(EVENTS - len(warnings)) :] if len(warnings) < EVENTS else []
        keep = [e for e in mine if e in warnings or e in others]
        return [
            {"type": e.type, "object": e.involved_object.name, "reason": e.reason, "message": one(e.message or "")}
            for e in keep
        ]

    def _log(self, pod: str, notes: list[str]) -> list[str]:
        try:
            text = self.core.read_namespaced_pod_log(pod, self.namespace, tail_lines=LOG_LINES)
        except Exception as exc:
            notes.append(f"log of {pod}: {short_error(exc)}")
            return []
        return str(text or "").splitlines()[-LOG_LINES:]

    def _controller_lines(self, names: list[str]) -> dict[str, list[str]]:
        """The Trainer controller's log lines naming each TrainJob; ``""`` holds a note when unreadable."""
        from kubernetes import client

        try:
            pods = self.core.list_namespaced_pod(CONTROLLER_NAMESPACE, label_selector=CONTROLLER_SELECTOR).items
            lines: list[str] = []
            for pod in pods:
                text = self.core.read_namespaced_pod_log(
                    pod.metadata.name, CONTROLLER_NAMESPACE, tail_lines=CONTROLLER_SCAN
                )
                lines += str(text or "").splitlines()
        except client.ApiException as exc:
            if exc.status == 403:
                return {"": [f"controller logs skipped: forbidden (RBAC) to read pods in {CONTROLLER_NAMESPACE}"]}
            return {"": [f"controller logs skipped: {short_error(exc)}"]}
        except Exception as exc:
            return {"": [f"controller logs skipped: {short_error(exc)}"]}
        if not pods:
            return {"": [f"controller logs: no pod labelled {CONTROLLER_SELECTOR} in {CONTROLLER_NAMESPACE}"]}
        return {name: [line for line in lines if name in line][-CONTROLLER_LINES:] for name in names}


def summary(job: dict[str, Any]) -> dict[str, Any]:
    meta, conds = job.get("metadata") or {}, conditions(job)
    return {
        "name": meta.get("name"),
        "created": meta.get("creationTimestamp"),
        "state": state(conds),
        "conditions": conds,
    }


def conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {k: c.get(k) for k in ("type", "status", "reason", "message")}
        for c in ((obj.get("status") or {}).get("conditions") or [])
    ]


def state(conds: list[dict[str, Any]]) -> str:
    """Failed / Complete / Suspended / Created, from the TrainJob's true conditions."""
    true = {c["type"] for c in conds if str(c.get("status")) == "True"}
    for kind in ("Failed", "Complete", "Suspended"):
        if kind in true:
            return kind
    return "Created"


def pod_state(pod: Any) -> dict[str, Any]:
    status = pod.status
    phase = getattr(status, "phase", None) or "?"
    detail, failed = "", phase == "Failed"
    for cs in getattr(status, "container_statuses", None) or []:
        st = cs.state
        if st is not None and st.terminated is not None:
            detail = f"{st.terminated.reason or 'terminated'} (exit {st.terminated.exit_code})"
            failed = failed or (st.terminated.exit_code or 0) != 0
        elif st is not None and st.waiting is not None:
            detail = f"waiting: {st.waiting.reason or ''}".rstrip()
    return {
        "name": pod.metadata.name,
        "step": (pod.metadata.labels or {}).get(RJOB_LABEL),
        "phase": phase,
        "detail": detail,
        "failed": failed,
    }


def one(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_error(exc: BaseException) -> str:
    """One line for an API error: ``403 Forbidden`` (+ the server's message), or the exception's."""
    status = getattr(exc, "status", None)
    if status:
        reason = getattr(exc, "reason", "") or ""
        message = ""
        body = getattr(exc, "body", None)
        if body:
            import json

            try:
                message = json.loads(body).get("message") or ""
            except (ValueError, AttributeError):
                message = ""
        return one(f"{status} {reason}" + (f": {message}" if message else ""))
    return one(f"{type(exc).__name__}: {exc}")
