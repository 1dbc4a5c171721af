"""Booth mode on the Kubernetes backend, over real HTTP against the emulator (``_k8s_sim``): owner labels on
TrainJobs and InferenceServices, every call filtered by owner, the per-visitor quota, and the Kueue
queue position from the visibility API (with the "waiting for admission" fallback where it is absent)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from _k8s_sim import Cluster, Scenario, synthetic_trainer_log
from _waiting import wait_for

from playground.api import make_request
from playground.backends.kubernetes import KubernetesBackend
from playground.booth import BoothPolicy, QuotaExceeded, owner_key
from playground.cluster import manifests as m
from playground.errors import JobNotFound, UserError
from playground.events import JobPhase, Phase, Queued
from playground.facade import Playground
from playground.owner import Owner
from playground.serving import kserve as ks

REPO = Path(__file__).resolve().parents[1]
NS = "booth"


@pytest.fixture(scope="module")
def cluster():
    with Cluster(namespace=NS) as c:
        c.install_runtimes(REPO / "deploy" / "runtimes" / "playground-torch.yaml")
        yield c


@pytest.fixture
def kubeconfig(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_home: Path) -> str:
    monkeypatch.delenv("PLAYGROUND_KUEUE_QUEUE", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def reset() -> None:
        cluster.emu.kueue_visibility = False
        cluster.sim.scenario = Scenario(node_log=synthetic_trainer_log(), line_delay=0.002)

    cluster.call(reset)
    return str(cluster.kubeconfig(tmp_path / "kubeconfig"))


def held_in_queue(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, queue: str) -> None:
    """Jobs wait in Kueue queue ``queue`` until ``cluster.sim.admit(queue)``."""
    monkeypatch.setenv("PLAYGROUND_KUEUE_QUEUE", queue)
    cluster.sim.scenario = Scenario(node_log=synthetic_trainer_log(), hold_queue=True)


def test_owner_labels_isolation_and_quota(cluster, kubeconfig, monkeypatch):
    held_in_queue(cluster, monkeypatch, "owners-q")
    backend = Playground(KubernetesBackend(kubeconfig=kubeconfig, drain_timeout=5, policy=BoothPolicy()))
    alice = backend.submit(make_request("tiny-llama-cpu", owner="alice@example.com"))
    bob = backend.submit(make_request("tiny-llama-cpu", owner="bob"))
    operator = backend.submit(make_request("tiny-llama-cpu"))  # no owner: the operator's, no quota

    meta = cluster.get("trainjobs", alice.id)["metadata"]
    assert meta["labels"][m.LABEL_OWNER] == owner_key("alice@example.com")
    assert meta["annotations"][m.ANN_OWNER] == "alice@example.com"
    assert m.LABEL_OWNER not in cluster.get("trainjobs", operator.id)["metadata"]["labels"]
    assert alice.owner == "alice@example.com" and backend.get(operator.id).owner is None

    assert [j.id for j in backend.list(owner="alice@example.com")] == [alice.id]
    assert {alice.id, bob.id, operator.id} <= {j.id for j in backend.list()}  # the operator sees all
    a = "alice@example.com"
    for job_id, call in (
        (bob.id, lambda: backend.get(bob.id, owner=a)),
        (bob.id, lambda: list(backend.events(bob.id, owner=a))),
        (bob.id, lambda: backend.cancel(bob.id, owner=a)),
        (bob.id, lambda: backend.delete(bob.id, owner=a)),
        (bob.id, lambda: backend.serve(bob.id, base=True, owner=a)),
        (operator.id, lambda: backend.get(operator.id, owner=a)),
    ):
        with pytest.raises(JobNotFound) as info:
            call()
        assert str(info.value) == f"no TrainJob {job_id!r} in namespace {NS!r}"  # exactly as for an unknown job
    assert backend.get(bob.id).phase == JobPhase.PENDING  # untouched

    with pytest.raises(QuotaExceeded, match=r"^you already have a job running; wait for it to finish or cancel it$"):
        backend.submit(make_request("tiny-llama-cpu", owner="alice@example.com"))
    assert len(backend.list(owner="alice@example.com")) == 1  # nothing was created
    assert backend.cancel(alice.id, owner="alice@example.com").phase == JobPhase.CANCELLED
    backend.delete(alice.id, owner="alice@example.com")  # deleting does not give the hourly quota back
    capped = KubernetesBackend(kubeconfig=kubeconfig, policy=BoothPolicy(max_jobs_per_owner_per_hour=1))
    with pytest.raises(QuotaExceeded, match=r"^hourly limit of 1 jobs reached; try again in (59|60) minutes$"):
        capped.submit(make_request("tiny-llama-cpu", owner="alice@example.com"))
    for job in (bob, operator):
        backend.delete(job.id)


def test_inference_services_carry_and_filter_by_owner(cluster, kubeconfig):
    from playground.blueprints import get_blueprint

    backend = Playground(KubernetesBackend(kubeconfig=kubeconfig))
    blueprint = get_blueprint("tiny-llama-cpu")
    for job, owner in (("job-a", "alice"), ("job-b", "bob")):
        body = ks.build_inferenceservice(
            job, blueprint, "pvc://x/output/model", backend.backend.opts, base=False, owner=Owner.visitor(owner)
        )
        assert body["metadata"]["labels"][m.LABEL_OWNER] == owner_key(owner)
        cluster.put("inferenceservices", body)
        name = body["metadata"]["name"]
        # The simulator finds no model there (ModelLoadFailed); then mark it Ready, as KServe would once loaded.
        wait_for(lambda n=name: "ModelLoadFailed" in str(cluster.get("inferenceservices", n)), 30, "the simulator")
        ready = {"url": f"http://{job}.example", "conditions": [{"type": "Ready", "status": "True"}]}
        cluster.call(lambda n=name, r=ready: cluster.emu.patch("inferenceservices", NS, n, {"status": r}))
    try:
        assert [e.job_id for e in backend.endpoints(owner="alice")] == ["job-a"]
        assert backend.endpoints(owner="alice")[0].owner == "alice"
        assert {e.job_id for e in backend.endpoints()} >= {"job-a", "job-b"}
        with pytest.raises(UserError, match="no InferenceService matches 'job-b'"):
            backend.unserve("job-b", owner="alice")
        assert cluster.get("inferenceservices", "job-b-ft") is not None
        backend.unserve("job-b", owner="bob")
        assert cluster.get("inferenceservices", "job-b-ft") is None
    finally:
        backend.unserve("job-a")


def test_kueue_position_from_the_visibility_api(cluster, kubeconfig, monkeypatch):
    held_in_queue(cluster, monkeypatch, "visible-q")
    cluster.call(lambda: setattr(cluster.emu, "kueue_visibility", True))
    backend = KubernetesBackend(kubeconfig=kubeconfig, drain_timeout=5)
    backend.queue_poll_seconds = 0.2
    first = backend.submit(make_request("tiny-llama-cpu"))
    second = backend.submit(make_request("tiny-llama-cpu"))
    wait_for(lambda: backend.get(second.id).queue_position == 2, 30, "the second job at position 2")
    job = backend.get(second.id)
    assert job.phase == JobPhase.PENDING and job.message == "queued in Kueue queue 'visible-q': position 2"
    assert backend.get(first.id).queue_position == 1

    events: list = []
    moved = threading.Event()

    def consume() -> None:
        for event in backend.events(second.id, follow=True):
            events.append(event)
            if isinstance(event, Queued) and event.position == 1:
                moved.set()

    thread = threading.Thread(target=consume)
    thread.start()
    wait_for(lambda: any(isinstance(e, Queued) for e in events), 30, "a Queued event")
    backend.cancel(first.id)  # the job ahead leaves: the second moves up
    assert moved.wait(30)
    cluster.sim.admit("visible-q")
    thread.join(60)
    queued = [e for e in events if isinstance(e, Queued)]
    assert [e.position for e in queued] == [2, 1] and all(e.estimated_wait_seconds is None for e in queued)
    started = next(i for i, e in enumerate(events) if isinstance(e, Phase) and e.phase != JobPhase.PENDING)
    assert events.index(queued[-1]) < started  # positions only while it waits
    assert isinstance(events[-1], Phase) and events[-1].phase == JobPhase.SUCCEEDED
    assert backend.get(second.id).queue_position is None


def test_without_the_visibility_api_a_job_is_waiting_for_admission(cluster, kubeconfig, monkeypatch):
    held_in_queue(cluster, monkeypatch, "plain-q")  # the emulator answers 404, as clusters without it do
    backend = KubernetesBackend(kubeconfig=kubeconfig, drain_timeout=5)
    backend.queue_poll_seconds = 0.2
    job = backend.submit(make_request("tiny-llama-cpu"))
    wait_for(lambda: cluster.get("trainjobs", job.id)["spec"].get("suspend"), 30, "the job suspended by Kueue")
    pending = backend.get(job.id)
    assert pending.queue_position is None
    assert pending.message == "queued in Kueue queue 'plain-q': waiting for admission"
    cluster.sim.admit("plain-q")
    events = list(backend.events(job.id, follow=True))
    assert not any(isinstance(e, Queued) for e in events) and events[-1].phase == JobPhase.SUCCEEDED
