"""The Kubernetes backend over real HTTP: the real ``kubernetes`` client and ``kubeflow`` SDK against
kmock's KubernetesEmulator (extended in ``_k8s_sim``) driven by a controller simulator that replays the
real trainer output of the ``trained_tiny_job`` fixture and serves its model directory."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from _k8s_sim import Cluster, Scenario, crd_validator, synthetic_trainer_log, trainer_request
from _waiting import wait_for
from conftest import SHARED_DIR as SHARED

from playground.api import make_request
from playground.backends.kubernetes import KubernetesBackend
from playground.backends.kubernetes import trainjob as tj
from playground.cluster import manifests as m
from playground.errors import BackendError, JobNotFound, UserError
from playground.events import ClusterEvent, JobPhase, Log, Metric, Phase, Progress, parse_line
from playground.facade import Playground
from playground.run_request import REQUEST_ENV

REPO = Path(__file__).resolve().parents[1]
NS = "ml"


synthetic_log = synthetic_trainer_log


@pytest.fixture(scope="module")
def cluster():
    with Cluster(namespace=NS) as c:
        c.install_runtimes(*sorted((REPO / "deploy" / "runtimes").glob("*.yaml")))
        if (SHARED / "runtimes").is_dir():
            c.install_runtimes(*sorted((SHARED / "runtimes").glob("trainer-*.yaml")))
        if (SHARED / "crds").is_dir():  # the API server's schema validation, from the real CRDs
            crds = SHARED / "crds"
            checks = {
                "trainjobs": crd_validator(crds / "trainer.kubeflow.org_trainjobs.yaml", "v1alpha1"),
                "inferenceservices": crd_validator(crds / "serving.kserve.io_inferenceservices.yaml", "v1beta1"),
            }
            c.call(lambda: c.emu.validators.update(checks))
        yield c


@pytest.fixture
def k8s(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Playground:
    """The facade over a backend on the emulator through a kubeconfig file (jobs and their InferenceServices);
    the simulator reset to a short clean run."""
    monkeypatch.delenv("PLAYGROUND_KUEUE_QUEUE", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cluster.clear_faults()

    def reset() -> None:
        cluster.emu.drop_watch_after = None
        cluster.emu.drop_log_every = None
        cluster.emu.max_log_drops = None
        cluster.sim.scenario = Scenario(node_log=synthetic_log(), line_delay=0.002)
        cluster.sim.scenarios.clear()

    cluster.call(reset)
    kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
    return Playground(KubernetesBackend(kubeconfig=str(kubeconfig), drain_timeout=5, serve_timeout=60))


@pytest.fixture(scope="module")
def real_log(trained_tiny_job, session_home: Path) -> list[str]:
    """The trainer's real output for tiny-llama-cpu (what a TrainJob's node-0 pod would print)."""
    from playground.backends.local import LocalBackend

    return (LocalBackend(home=session_home).job_dir(trained_tiny_job.id) / "train.log").read_text().splitlines()


def split(events: list) -> dict[str, list]:
    out: dict[str, list] = {"phase": [], "progress": [], "metric": [], "log": [], "cluster": []}
    for e in events:
        key = {Phase: "phase", Progress: "progress", Metric: "metric", Log: "log", ClusterEvent: "cluster"}[type(e)]
        out[key].append(e)
    return out


def strip_time(events: list) -> list:
    return [dataclasses.replace(e, time=0.0) for e in events]


# -- the full path -----------------------------------------------------------------------------
@pytest.mark.slow
def test_train_follow_serve_chat_cleanup(cluster, k8s, trained_tiny_job, real_log, session_home, tmp_path):
    from playground.backends.local import LocalBackend
    from playground.blueprints import get_blueprint
    from playground.serving.client import chat
    from playground.serving.local import LocalServers

    servers = LocalServers(tmp_path / "kserve-home")
    cluster.sim.output_dir = LocalBackend(home=session_home).job_dir(trained_tiny_job.id) / "output"
    cluster.sim.servers = servers
    # the trainer also posts trainerStatus (every 2nd point): the stream still has each log point once
    cluster.sim.scenario = Scenario(node_log=real_log, line_delay=0.001, trainer_status_every=2)
    request = make_request("tiny-llama-cpu", labels={"owner": "alice@example.com", "session": "booth-7"})
    try:
        job = k8s.submit(request)
        assert job.backend == "kubernetes" and job.blueprint_id == "tiny-llama-cpu"

        # What was created is what --dry-run renders (same SDK builder), with our labels.
        created = cluster.get("trainjobs", job.id)
        rendered = tj.build_trainjob(k8s.backend._plan(request, name=job.id))
        assert created["spec"] == rendered["spec"]
        labels = created["metadata"]["labels"]
        assert labels[m.LABEL_BLUEPRINT] == "tiny-llama-cpu" and labels[m.LABEL_PREFIX + "session"] == "booth-7"
        assert labels[m.LABEL_PREFIX + "owner"] == "alice-example.com"
        assert created["spec"]["activeDeadlineSeconds"] == 1800
        assert created["spec"]["trainer"]["command"] == ["python", "-m", "playground.train"]
        assert "--output" in created["spec"]["trainer"]["args"]

        events = list(k8s.events(job.id, follow=True))
        parts = split(events)
        phases = [e.phase for e in parts["phase"]]
        assert phases == [
            JobPhase.PENDING,
            JobPhase.INITIALIZING,
            JobPhase.TRAINING,
            JobPhase.EVALUATING,
            JobPhase.SAVING,
            JobPhase.SUCCEEDED,
        ], phases
        # Progress comes from the replayed trainer log, point for point (trainerStatus adds no duplicates).
        expected = [e for e in map(parse_line, real_log) if isinstance(e, Progress)]
        assert strip_time(parts["progress"]) == strip_time(expected)
        assert cluster.get("trainjobs", job.id)["status"]["trainerStatus"]["progressPercentage"] == 100
        assert parts["progress"][-1].step == trained_tiny_job.params["max_steps"]
        assert {m_.name for m_ in parts["metric"]} >= {"eval_exact_match"}
        reasons = {e.reason for e in parts["cluster"]}
        assert {"Scheduled", "Started", "JobsCompleted"} <= reasons
        assert all(e.source == "node-0" for e in parts["log"])

        done = k8s.get(job.id)
        assert done.phase == JobPhase.SUCCEEDED and done.progress is not None
        assert done.model_dir == f"pvc://workspace-{job.id}/output/model"
        assert job.id in [j.id for j in k8s.list()]

        # Serve the fine-tuned and the base model (side by side) and chat through KServe's routes.
        with ThreadPoolExecutor(2) as pool:  # both InferenceServices come up at once, as in a cluster
            fine_tuned = pool.submit(k8s.serve, job.id)
            base = pool.submit(k8s.serve, job.id, base=True).result()
            endpoint = fine_tuned.result()
        assert endpoint.url.endswith("/openai/v1") and endpoint.backend == "kubernetes"
        isvc = cluster.get("inferenceservices", endpoint.name)
        assert isvc["spec"]["predictor"]["model"]["storageUri"] == done.model_dir
        assert base.kind == "base" and base.name == f"{job.id}-base"
        blueprint = get_blueprint("tiny-llama-cpu")
        tokens = blueprint.serving.max_new_tokens
        correct = 0
        for example in blueprint.examples:
            answer = str(chat(endpoint, example.prompt, max_tokens=tokens)).strip()
            correct += answer == example.expected
        assert correct >= 3, f"only {correct}/4 correct"
        assert isinstance(chat(base, "reverse: kube", max_tokens=tokens), str)
        assert {e.name for e in k8s.endpoints()} == {endpoint.name, base.name}

        k8s.unserve(base.url)
        assert [e.name for e in k8s.endpoints()] == [endpoint.name]
        k8s.delete(job.id)  # the job and its InferenceServices
        assert cluster.get("trainjobs", job.id) is None
        assert cluster.items("inferenceservices") == []
        with pytest.raises(JobNotFound):
            k8s.get(job.id)
        wait_for(lambda: not servers.list(), 20, "the deleted InferenceServices' model servers to stop")
    finally:
        servers.stop_all()


def test_lora_jobs_share_one_base_server_with_their_adapters(cluster, k8s, tmp_path):
    """Three LoRA jobs of one base model (two SFT blueprints' jobs with Kubeflow's initializers, one DPO job of
    another blueprint on the same hub model): one InferenceService on the vLLM runtime lists all three adapters
    (two serves racing, resolved by resourceVersion), each reached under its job id at the server's URL, and
    the base-side chat on the same server; unserving (or deleting) a job takes only its adapter off, and the
    server goes once nobody uses it."""
    from playground.serving import kserve as ks

    base_uri = "hf://Qwen/Qwen2.5-1.5B-Instruct"
    adapter = tmp_path / "output" / "model"  # what every job's workspace holds once done (a PEFT adapter)
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
    cluster.sim.output_dir = tmp_path / "output"
    cluster.call(lambda: cluster.sim.hub_models.add(base_uri))
    requests = [
        make_request("qwen2.5-1.5b-lora-alpaca", {"max_steps": 20}, owner="alice"),
        make_request("qwen2.5-1.5b-lora-alpaca", {"max_steps": 20}, owner="bob"),
        make_request("qwen2.5-1.5b-dpo-kubectl"),
    ]
    jobs = [k8s.submit(r) for r in requests]
    for job in jobs:
        list(k8s.events(job.id, follow=True))
    alice, bob, operator = (j.id for j in jobs)
    name = ks.shared_base_name(base_uri, NS)
    url = f"{cluster.url}/serving/{NS}/{name}/openai/v1"
    try:
        first = k8s.serve(alice)
        assert (first.url, first.model, first.job_id, first.kind) == (url, alice, alice, "fine-tuned")
        assert first.owner == "alice" and first.name == name
        with ThreadPoolExecutor(2) as pool:
            served = list(pool.map(k8s.serve, [bob, operator]))
        assert [(e.url, e.model) for e in served] == [(url, bob), (url, operator)]
        shared = [i["metadata"]["name"] for i in cluster.items("inferenceservices") if ks.is_shared(i)]
        assert shared == [name]  # one server
        isvc = cluster.get("inferenceservices", name)
        predictor = isvc["spec"]["predictor"]
        ids = sorted((alice, bob, operator))
        assert predictor["model"]["runtime"] == "kserve-vllmserver"
        assert predictor["model"]["args"] == [
            "--dtype=bfloat16",
            "--enable-lora",
            "--max-lora-rank=16",  # the DPO blueprint's rank
            "--max-loras=3",
            "--lora-modules",
            *(f"{j}=/mnt/adapters/{j}/output/model" for j in ids),
        ]
        assert predictor["storageUris"] == [
            {"uri": base_uri, "mountPath": "/mnt/models"},  # from the hub once, not each job's initializer copy
            *({"uri": f"pvc://workspace-{j}/output/model", "mountPath": f"/mnt/adapters/{j}"} for j in ids),
        ]
        on_it = lambda: [e for e in k8s.endpoints() if e.name == name]  # noqa: E731 - other tests' servers aside
        assert sorted((e.model, e.url, e.kind) for e in on_it()) == [(j, url, "fine-tuned") for j in ids]
        assert [e.model for e in k8s.endpoints(owner="alice")] == [alice]

        base = k8s.serve(alice, base=True)  # base-side chat: the same server, asked for the base model's name
        assert (base.url, base.model, base.kind, base.job_id, base.shared) == (url, name, "base", alice, True)
        assert cluster.get("inferenceservices", name)["spec"] == isvc["spec"]  # no restart for it

        k8s.unserve(url, owner="bob")  # bob's uses of the server, and only his
        left = cluster.get("inferenceservices", name)["spec"]["predictor"]
        assert [e["mountPath"] for e in left["storageUris"]] == ["/mnt/models"] + [
            f"/mnt/adapters/{j}" for j in sorted((alice, operator))
        ]
        assert "--max-loras=2" in left["model"]["args"] and not any(bob in a for a in left["model"]["args"])
        wait_for(lambda: bob not in {e.model for e in on_it()}, 20, "bob's adapter gone from the endpoints")
        with pytest.raises(UserError, match=rf"no InferenceService matches '{bob}'"):
            k8s.unserve(bob)
        k8s.delete(operator)  # deleting a job takes its adapter off too
        wait_for(lambda: {e.model for e in on_it()} == {alice, name}, 20, "alice's adapter and base chat")
        k8s.unserve(alice)  # her adapter and her base-side chat: nobody uses the server any more
        assert cluster.get("inferenceservices", name) is None
        assert on_it() == []
    finally:
        for job in jobs:
            with contextlib.suppress(JobNotFound):
                k8s.delete(job.id)
        cluster.call(lambda: cluster.sim.hub_models.discard(base_uri))


def test_history_replays_the_finished_job(cluster, k8s):
    job = k8s.submit(make_request("tiny-llama-cpu"))
    live = list(k8s.events(job.id, follow=True))
    again = list(k8s.events(job.id))  # a reloaded page: the whole history, no follow
    assert strip_time(split(again)["progress"]) == strip_time(split(live)["progress"])
    assert [e.phase for e in split(again)["phase"]][-1] == JobPhase.SUCCEEDED
    assert [e.line for e in split(again)["log"]] == [e.line for e in split(live)["log"]]


# -- resume after dropped connections ----------------------------------------------------------
def _follow_collect(k8s: KubernetesBackend, job_id: str) -> list:
    return list(k8s.events(job_id, follow=True))


def test_dropped_streams_resume_without_loss_or_repeats(cluster, k8s, real_log):
    cluster.sim.scenario = Scenario(node_log=real_log, line_delay=0.01, trainer_status_every=2)
    baseline = split(_follow_collect(k8s, k8s.submit(make_request("tiny-llama-cpu")).id))

    def flaky() -> None:
        cluster.emu.drop_watch_after = 2  # every watch connection is cut after 2 events
        cluster.emu.drop_log_every = 0.1  # log streams after 0.1 s, 6 times at most
        cluster.emu.max_log_drops = cluster.emu.dropped_logs + 6

    cluster.call(flaky)
    watches, logs = cluster.emu.dropped_watches, cluster.emu.dropped_logs
    flaky_backend = KubernetesBackend(kubeconfig=k8s.backend.kubeconfig, drain_timeout=5)
    got = split(_follow_collect(flaky_backend, flaky_backend.submit(make_request("tiny-llama-cpu")).id))
    assert cluster.emu.dropped_watches - watches >= 2 and cluster.emu.dropped_logs - logs >= 2
    assert flaky_backend.stats.reconnects >= 4
    assert strip_time(got["progress"]) == strip_time(baseline["progress"])
    assert [e.line for e in got["log"]] == [e.line for e in baseline["log"]]
    assert [e.phase for e in got["phase"]] == [e.phase for e in baseline["phase"]]
    assert sorted(e.reason for e in got["cluster"]) == sorted(e.reason for e in baseline["cluster"])
    assert [(x.name, x.value) for x in got["metric"]] == [(x.name, x.value) for x in baseline["metric"]]


def test_expired_resource_version_relists_and_emits_only_changes(cluster, k8s):
    cluster.sim.scenario = Scenario(node_log=synthetic_log(60), line_delay=0.05)
    job = k8s.submit(make_request("tiny-llama-cpu"))
    events: list = []
    seen_training = threading.Event()

    def consume() -> None:
        for event in k8s.events(job.id, follow=True):
            events.append(event)
            if isinstance(event, Progress):
                seen_training.set()

    thread = threading.Thread(target=consume)
    thread.start()
    assert seen_training.wait(30)
    cluster.put("configmaps", {"metadata": {"name": "unrelated-change"}})  # the store moves on...
    cluster.compact()  # ...and forgets its history: resuming from an older resourceVersion gets 410 Gone
    cluster.drop_streams()
    thread.join(60)
    assert not thread.is_alive()
    parts = split(events)
    assert k8s.backend.stats.relists >= 1
    assert [p.step for p in parts["progress"]] == list(range(5, 61, 5))
    assert [e.phase for e in parts["phase"]][-1] == JobPhase.SUCCEEDED
    keys = [(e.kind, e.reason, e.message) for e in parts["cluster"]]
    assert len(keys) == len(set(keys)), keys


# -- cluster states ----------------------------------------------------------------------------
def test_failed_job_names_step_reason_and_last_lines(cluster, k8s):
    cluster.sim.scenario = Scenario(node_log=synthetic_log(fail=True), exit_code=1, line_delay=0.002)
    job = k8s.submit(make_request("tiny-llama-cpu"))
    events = list(k8s.events(job.id, follow=True))
    final = events[-1]
    assert isinstance(final, Phase) and final.phase == JobPhase.FAILED
    assert "node-0 failed (Error, exit code 1)" in final.reason
    assert "CUDA out of memory" in final.reason
    failed = k8s.get(job.id)
    assert failed.phase == JobPhase.FAILED
    assert failed.message.startswith("node-0 failed (Error, exit code 1)") and "\n" not in failed.message
    assert any("CUDA out of memory" in line for line in failed.log_tail)


def test_kueue_queue_label_admission_and_unschedulable(cluster, k8s, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_KUEUE_QUEUE", "gpu-queue")
    backend = KubernetesBackend(kubeconfig=k8s.backend.kubeconfig, drain_timeout=5)
    cluster.sim.scenario = Scenario(node_log=synthetic_log(), hold_queue=True, unschedulable_for=0.3)
    job = backend.submit(make_request("tiny-llama-cpu"))
    assert cluster.get("trainjobs", job.id)["metadata"]["labels"][m.QUEUE_LABEL] == "gpu-queue"
    events: list = []
    queued = threading.Event()

    def consume() -> None:
        for event in backend.events(job.id, follow=True):
            events.append(event)
            if isinstance(event, ClusterEvent) and event.kind == "Queue" and event.reason == "Pending":
                queued.set()

    thread = threading.Thread(target=consume)
    thread.start()
    assert queued.wait(30)
    pending = backend.get(job.id)
    assert pending.phase == JobPhase.PENDING and "gpu-queue" in pending.message
    cluster.sim.admit("gpu-queue")
    thread.join(60)
    reasons = [e.reason for e in events if isinstance(e, ClusterEvent)]
    assert "insufficient unused quota" in next(e.message for e in events if getattr(e, "reason", "") == "Pending")
    assert reasons.index("Pending") < reasons.index("Admitted") < reasons.index("FailedScheduling")
    assert any(isinstance(e, ClusterEvent) and e.reason == "Unschedulable" for e in events)
    assert events[-1].phase == JobPhase.SUCCEEDED


def test_cancel_then_ttl_cleanup(cluster, k8s):
    cluster.sim.scenario = Scenario(node_log=synthetic_log(400), line_delay=0.05)
    job = k8s.submit(make_request("tiny-llama-cpu"))
    stream = k8s.events(job.id, follow=True)
    for event in stream:
        if isinstance(event, Progress):
            break
    stream.close()  # a closed stream stops its watches
    cancelled = k8s.cancel(job.id)
    assert cancelled.phase == JobPhase.CANCELLED
    assert list(k8s.events(job.id, follow=True))[-1].phase == JobPhase.CANCELLED
    assert cluster.get("trainjobs", job.id)["spec"]["suspend"] is True

    cluster.sim.scenario = Scenario(node_log=synthetic_log(), line_delay=0.001)
    ttl = Playground(
        KubernetesBackend(kubeconfig=k8s.backend.kubeconfig, ttl_seconds_after_finished=0, drain_timeout=5)
    )
    short = ttl.submit(make_request("tiny-llama-cpu"))
    assert list(ttl.events(short.id, follow=True))[-1].phase == JobPhase.SUCCEEDED
    finished = ttl.backend.get(short.id)
    assert finished.expires_at == finished.finished_at is not None  # TTL 0: it expires as it ends
    assert short.id in [j.id for j in ttl.backend.list()]  # the backend's list has no side effects...
    assert ttl.backend.expired() == [short.id] and cluster.get("trainjobs", short.id) is not None
    assert short.id not in [j.id for j in ttl.list()]  # ...the facade's cleanup deletes it on the next listing
    assert cluster.get("trainjobs", short.id) is None


def test_hub_blueprint_runs_the_project_trainer_with_initializers(cluster, k8s, monkeypatch):
    """Qwen on Kubernetes: Kubeflow's initializers, then the project's trainer; its @@playground lines give
    phases, progress and eval metrics (trainerStatus is posted at every point too: no duplicates)."""
    monkeypatch.setenv("HF_TOKEN", "hf_do_not_leak_me")
    log = synthetic_log(20)
    cluster.sim.scenarios["qwen2.5-1.5b-lora-alpaca"] = Scenario(node_log=log, line_delay=0.002, trainer_status_every=1)
    job = k8s.submit(make_request("qwen2.5-1.5b-lora-alpaca", {"max_steps": 20}))
    created = cluster.get("trainjobs", job.id)
    assert "hf_do_not_leak_me" not in yaml.safe_dump(created)
    spec = created["spec"]
    assert spec["runtimeRef"]["name"] == "playground-torch-hf"
    assert spec["trainer"]["command"] == ["python", "-m", "playground.train"]
    assert spec["initializer"]["model"]["storageUri"] == "hf://Qwen/Qwen2.5-1.5B-Instruct"
    events = list(k8s.events(job.id, follow=True))
    parts = split(events)
    assert {"dataset-initializer", "model-initializer"} <= {e.source for e in parts["log"]}
    assert [e.phase for e in parts["phase"]] == [
        JobPhase.PENDING,
        JobPhase.INITIALIZING,
        JobPhase.TRAINING,
        JobPhase.EVALUATING,
        JobPhase.SAVING,
        JobPhase.SUCCEEDED,
    ]
    assert [p.step for p in parts["progress"]] == [5, 10, 15, 20]
    assert [(x.name, x.value) for x in parts["metric"]] == [("eval_exact_match", 0.97)]
    done = k8s.get(job.id)
    assert done.model_dir == f"pvc://workspace-{job.id}/output/model"
    assert done.base_model == f"pvc://workspace-{job.id}/model"  # what the model initializer downloaded
    assert (done.progress.step, done.progress.total_steps) == (20, 20)  # from trainerStatus
    assert cluster.sim.errors == []  # every status the simulated trainer posted passed the CRD (and CEL) checks
    k8s.delete(job.id)


def test_progress_continues_from_trainer_status_when_the_log_is_lost(cluster, k8s):
    """Both sources, merged: node-0's log lines until reading them is forbidden mid-run, then
    status.trainerStatus; each step at most once, always forward, up to the last step."""
    log = synthetic_log(60)  # Initializing, a plain line, Training, progress 5..60, metric, Saving
    cut = 7  # the follower reads up to the progress line of step 20, then pods/log is forbidden
    cluster.sim.scenario = Scenario(node_log=log, line_delay=0.01, trainer_status_every=1, forbid_log_after=cut)
    job = k8s.submit(make_request("tiny-llama-cpu"))
    parts = split(list(k8s.events(job.id, follow=True)))
    steps = [p.step for p in parts["progress"]]
    assert steps[:4] == [5, 10, 15, 20]  # from the log, before it was lost
    assert steps[-1] == 60 and len(steps) > 4  # ...then from trainerStatus: the log never showed these
    assert steps == sorted(set(steps))  # no duplicates, never backwards
    # (trainerStatus carries the loss rounded to 5 decimals, as the trainer posts it)
    assert all(p.total_steps == 60 and p.loss == pytest.approx(3.0 / p.step, abs=1e-5) for p in parts["progress"])
    assert [e.line for e in parts["log"]] == ["tokenizer: 30 tokens"]  # nothing after the cut was readable
    assert [e.phase for e in parts["phase"]][-1] == JobPhase.SUCCEEDED
    # A reloaded page with the log unreadable: the history still ends at the last trainerStatus point.
    history = split(list(k8s.events(job.id)))
    assert [p.step for p in history["progress"]] == [60]
    assert [e.phase for e in history["phase"]][-1] == JobPhase.SUCCEEDED


@pytest.mark.skipif(not (SHARED / "runtimes").is_dir(), reason="../shared/runtimes (torchtune runtimes) absent")
def test_builtin_torchtune_opt_in_variant(cluster, k8s, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_do_not_leak_me")
    cluster.sim.scenarios["qwen2.5-1.5b-lora-alpaca"] = Scenario(node_log=["tune: step 1 loss 1.9"], line_delay=0.001)
    tune = KubernetesBackend(kubeconfig=k8s.backend.kubeconfig, trainer="builtin-torchtune", drain_timeout=5)
    request = make_request("qwen2.5-1.5b-lora-alpaca", {"max_steps": 20, "lora_rank": 16})
    job = tune.submit(request)
    created = cluster.get("trainjobs", job.id)
    assert "hf_do_not_leak_me" not in yaml.safe_dump(created)
    spec = created["spec"]
    assert spec["runtimeRef"] == {"name": "torchtune-qwen2.5-1.5b", "kind": "ClusterTrainingRuntime"}
    assert spec["initializer"]["model"]["storageUri"] == "hf://Qwen/Qwen2.5-1.5B-Instruct"
    assert {"max_steps_per_epoch=20", "model.lora_rank=16"} <= set(spec["trainer"]["args"])
    token = spec["initializer"]["model"]["env"][0]
    assert token["name"] == "ACCESS_TOKEN" and token["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
    events = list(tune.events(job.id, follow=True))
    sources = {e.source for e in events if isinstance(e, Log)}
    assert {"dataset-initializer", "model-initializer", "node-0"} <= sources
    phases = [e.phase for e in events if isinstance(e, Phase)]
    assert phases == [JobPhase.PENDING, JobPhase.INITIALIZING, JobPhase.TRAINING, JobPhase.SUCCEEDED]
    assert not any(isinstance(e, Progress) for e in events)  # what this variant cannot show
    assert tune.get(job.id).model_dir == f"pvc://initializer-{job.id}/output/epoch_0"


# -- errors: one line each ---------------------------------------------------------------------
def test_no_kubeconfig_and_unreachable(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(BackendError, match=r"no kubeconfig found at .*absent.* --kubeconfig"):
        KubernetesBackend().submit(make_request("tiny-llama-cpu"))
    with Cluster() as dead:
        kubeconfig = dead.kubeconfig(tmp_path / "kc")
        url = dead.url
    backend = KubernetesBackend(kubeconfig=str(kubeconfig))
    with pytest.raises(BackendError, match=rf"cannot reach the Kubernetes API at {url}: Connection refused"):
        backend.list()
    with pytest.raises(BackendError, match="context"):
        KubernetesBackend(kubeconfig=str(kubeconfig), context="nope").list()


def test_unauthorized_and_forbidden_name_the_verb_and_resource(cluster, k8s):
    cluster.fault(method="*", plural="*", status=401, reason="Unauthorized", message="Unauthorized")
    with pytest.raises(BackendError, match=r"rejected the credentials \(401 Unauthorized\)"):
        k8s.list()
    cluster.clear_faults()
    message = (
        'trainjobs.trainer.kubeflow.org is forbidden: User "system:serviceaccount:ml:viewer" cannot create '
        'resource "trainjobs" in API group "trainer.kubeflow.org" in the namespace "ml"'
    )
    cluster.fault(method="POST", plural="trainjobs", status=403, reason="Forbidden", message=message)
    with pytest.raises(BackendError) as err:
        k8s.submit(make_request("tiny-llama-cpu"))
    text = str(err.value)
    assert "user 'system:serviceaccount:ml:viewer' cannot create trainjobs.trainer.kubeflow.org" in text
    assert "namespace 'ml'" in text and "\n" not in text


def test_runtime_not_installed_lists_installed(cluster, k8s):
    saved = cluster.get("clustertrainingruntimes", "playground-torch")
    cluster.call(lambda: cluster.emu.delete("clustertrainingruntimes", None, "playground-torch"))
    before = len(cluster.items("trainjobs"))
    try:
        with pytest.raises(BackendError) as err:
            k8s.submit(make_request("tiny-llama-cpu"))
        installed = sorted(r["metadata"]["name"] for r in cluster.items("clustertrainingruntimes"))
        assert "'playground-torch' (blueprint tiny-llama-cpu) is not installed" in str(err.value)
        assert f"installed: {', '.join(installed) or 'none'}" in str(err.value)
        assert err.value.field == "kubernetes.runtime"
        assert len(cluster.items("trainjobs")) == before
    finally:
        saved["metadata"] = {"name": "playground-torch", "labels": saved["metadata"]["labels"]}
        cluster.put("clustertrainingruntimes", saved)


def test_invalid_spec_422_names_field_and_message(cluster, k8s):
    causes = [
        {
            "reason": "FieldValueInvalid",
            "field": "spec.trainer.numNodes",
            "message": "Invalid value: 0: spec.trainer.numNodes in body should be greater than or equal to 1",
        }
    ]
    cluster.fault(
        method="POST",
        plural="trainjobs",
        status=422,
        reason="Invalid",
        message='TrainJob.trainer.kubeflow.org "x" is invalid',
        details={"causes": causes},
    )
    with pytest.raises(BackendError) as err:
        k8s.submit(make_request("tiny-llama-cpu"))
    assert "field spec.trainer.numNodes: Invalid value: 0" in str(err.value) and err.value.field == (
        "spec.trainer.numNodes"
    )


def test_name_clash_409_and_serve_timeout(cluster, k8s):
    job = k8s.submit(make_request("tiny-llama-cpu"))
    list(k8s.events(job.id, follow=True))
    foreign = {"metadata": {"name": f"{job.id}-ft"}, "spec": {"predictor": {"model": {"storageUri": "s3://x/y"}}}}
    cluster.put("inferenceservices", foreign)
    with pytest.raises(BackendError, match=rf"inferenceservices.serving.kserve.io '{job.id}-ft' already exists"):
        k8s.serve(job.id)
    cluster.call(lambda: cluster.emu.delete("inferenceservices", NS, f"{job.id}-ft"))
    cluster.sim.output_dir = None  # KServe cannot load the model: never Ready
    slow = Playground(KubernetesBackend(kubeconfig=k8s.backend.kubeconfig, serve_timeout=2))
    with pytest.raises(BackendError, match=r"not Ready after 2s: .*ModelLoadFailed"):
        slow.serve(job.id)
    k8s.delete(job.id)


def test_unknown_job_and_unserve(k8s):
    with pytest.raises(JobNotFound, match="no TrainJob 'nope' in namespace 'ml'"):
        k8s.get("nope")
    with pytest.raises(JobNotFound):
        next(iter(k8s.events("nope", follow=True)))
    with pytest.raises(UserError, match="no InferenceService matches"):
        k8s.unserve("nope")
    with pytest.raises(UserError, match=r"--port applies to the local backend's model servers") as refused:
        k8s.serve("nope", port=8080)  # refused before the cluster is asked anything
    assert refused.value.field == "--port"


# -- no cluster: --dry-run ---------------------------------------------------------------------
def test_cli_dry_run_prints_yaml_without_a_cluster(tmp_path, monkeypatch, capsys):
    from playground.cli import main

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    code = main(["train", "tiny-llama-cpu", "--backend", "kubernetes", "--namespace", "team-a", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    trainjob = yaml.safe_load(out)
    assert trainjob["kind"] == "TrainJob" and trainjob["metadata"]["namespace"] == "team-a"
    assert "hf_secret_value" not in out
    name = trainjob["metadata"]["name"]
    assert main(["serve", name, "--backend", "kubernetes", "--dry-run"]) == 0
    isvc = yaml.safe_load(capsys.readouterr().out)
    assert isvc["kind"] == "InferenceService"
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == f"pvc://workspace-{name}/output/model"
    assert main(["serve", name, "--backend", "kubernetes", "--dry-run", "--base"]) == 0
    base = yaml.safe_load(capsys.readouterr().out)
    assert base["spec"]["predictor"]["model"]["storageUri"].endswith("/output/base-model")
    assert main(["train", "tiny-llama-cpu", "--backend", "kubernetes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("playground: error: no kubeconfig found") and "\n" not in err

    # the opt-in TorchTune variant, and settings checked before anything is rendered
    tune = ["train", "qwen2.5-1.5b-lora-alpaca", "--backend", "kubernetes", "--dry-run", "--trainer"]
    assert main([*tune, "builtin-torchtune"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["spec"]["runtimeRef"]["name"] == "torchtune-qwen2.5-1.5b"
    assert main([*tune, "deepspeed"]) == 2
    assert "trainer 'deepspeed' is unknown; allowed: playground, builtin-torchtune" in capsys.readouterr().err
    assert main(["train", "tiny-llama-cpu", "--trainer", "builtin-torchtune"]) == 2
    assert "--trainer only applies to --backend kubernetes" in capsys.readouterr().err
    monkeypatch.setenv("PLAYGROUND_KUEUE_QUEUE", "bad queue!!")
    assert main(["train", "tiny-llama-cpu", "--backend", "kubernetes", "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("playground: error: PLAYGROUND_KUEUE_QUEUE 'bad queue!!'")


def test_cli_dry_run_of_a_lora_job_prints_its_shared_base(tmp_path, monkeypatch, capsys):
    """``serve --dry-run`` for a LoRA job: the base model's shared InferenceService with this job's adapter (or,
    with ``--base``, its base-side chat) alone; a LoRA job on a packaged model is refused in one line."""
    from playground.cli import main
    from playground.serving import kserve as ks

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    name = m.new_job_name("llama-3.2-1b-lora-alpaca")
    assert main(["serve", name, "--backend", "kubernetes", "--dry-run"]) == 0
    isvc = yaml.safe_load(capsys.readouterr().out)
    base_uri = "hf://meta-llama/Llama-3.2-1B-Instruct"
    assert isvc["metadata"]["name"] == ks.shared_base_name(base_uri, isvc["metadata"]["namespace"])
    predictor = isvc["spec"]["predictor"]
    assert predictor["storageUris"] == [
        {"uri": base_uri, "mountPath": "/mnt/models"},
        {"uri": f"pvc://workspace-{name}/output/model", "mountPath": f"/mnt/adapters/{name}"},
    ]
    assert predictor["model"]["args"][-2:] == ["--lora-modules", f"{name}=/mnt/adapters/{name}/output/model"]
    assert predictor["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert main(["serve", name, "--backend", "kubernetes", "--dry-run", "--base"]) == 0
    base = yaml.safe_load(capsys.readouterr().out)
    base_args = base["spec"]["predictor"]["model"].get("args", [])
    assert base["metadata"]["name"] == isvc["metadata"]["name"] and "--enable-lora" not in base_args
    smollm2 = m.new_job_name("smollm2-135m-lora-kubectl")  # packaged base: the copy its trainer wrote
    assert main(["serve", smollm2, "--backend", "kubernetes", "--dry-run"]) == 0
    predictor = yaml.safe_load(capsys.readouterr().out)["spec"]["predictor"]
    uris = [e["uri"] for e in predictor["storageUris"]]
    assert uris == [f"pvc://workspace-{smollm2}/output/base-model", f"pvc://workspace-{smollm2}/output/model"]
    # CPU (no GPU asked: KServe's -cpu image): one adapter, two slots, the last left empty for base-model tokens
    assert "nvidia.com/gpu" not in predictor["model"]["resources"]["requests"]
    assert "--max-loras=2" in predictor["model"]["args"]


# -- nothing outlives an interrupted run ---------------------------------------------------------
def _running(backend: KubernetesBackend, job_id: str) -> None:
    """Follow until the first progress point (the job is training), then close the stream."""
    stream = backend.events(job_id, follow=True)
    for event in stream:
        if isinstance(event, Progress):
            break
    stream.close()


def test_e2e_cleanup_cancels_the_runs_trainjobs(cluster, k8s, monkeypatch, tmp_path):
    """A killed `playground e2e --backend kubernetes`: its cleanup cancels the TrainJobs that notebook run
    started (found by the run's label) and stops their InferenceServices; other jobs are left alone."""
    from playground.e2e import runner

    cluster.sim.scenario = Scenario(node_log=synthetic_log(400), line_delay=0.05)
    home = tmp_path / "playground-e2e-nb-x1" / "playground-home"  # what run_notebook passes
    monkeypatch.setenv("KUBECONFIG", k8s.backend.kubeconfig)
    monkeypatch.setenv("PLAYGROUND_E2E_RUN", runner._run_label(home))  # what run_notebook gives the kernel
    mine = KubernetesBackend(drain_timeout=5).submit(make_request("tiny-llama-cpu"))
    monkeypatch.delenv("PLAYGROUND_E2E_RUN")
    other = k8s.submit(make_request("tiny-llama-cpu"))
    _running(k8s, mine.id)
    said: list[str] = []
    runner._cleanup_jobs(home, "kubernetes", said.append, "nb")
    assert said == [f"[nb] cancelled job {mine.id} left running by the notebook"]
    assert k8s.get(mine.id).phase == JobPhase.CANCELLED
    assert cluster.get("trainjobs", mine.id)["spec"]["suspend"] is True  # its pods are gone, the GPU is free
    assert not k8s.get(other.id).done
    for job in (mine, other):
        k8s.delete(job.id)


def test_interrupted_headless_run_cancels_its_job(cluster, k8s, tmp_path):
    """A notebook interrupted while following (papermill's cell timeout, Ctrl-C) leaves no TrainJob running."""
    from playground.headless import run_blueprint

    cluster.sim.scenario = Scenario(node_log=synthetic_log(400), line_delay=0.05)

    def interrupt_at_first_step(message: str) -> None:
        if message.startswith("step "):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_blueprint("tiny-llama-cpu", backend=k8s, out_dir=tmp_path, say=interrupt_at_first_step)
    result = yaml.safe_load((tmp_path / "result.json").read_text())
    assert result["passed"] is False and result["error"].startswith("KeyboardInterrupt")
    assert k8s.get(result["job_id"]).phase == JobPhase.CANCELLED
    k8s.delete(result["job_id"])


def test_notebook_pod_volume_carries_your_data_file_to_the_trainer(cluster, k8s, tmp_path, monkeypatch):
    """In a notebook pod, a file on its workspace volume: the backend reads its own pod from the API, mounts the
    same claim in the trainer's pods, and the trainer's own argument check accepts the file where the pod sees it."""
    import json

    from playground.cluster.datafiles import DATA_MOUNT
    from playground.train.__main__ import prepare

    workspace = tmp_path / "home-jovyan"
    (workspace / "data").mkdir(parents=True)
    train = workspace / "data" / "talks.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) + "\n" for i in range(20)))
    cluster.put("pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "alice-notebook-0", "namespace": NS, "labels": {"app": "notebook"}},
        "spec": {
            "containers": [{"name": "notebook", "image": "jupyter",
                            "volumeMounts": [{"name": "ws", "mountPath": str(workspace)}]}],
            "volumes": [{"name": "ws", "persistentVolumeClaim": {"claimName": "workspace-alice"}}],
        },
    })  # fmt: skip
    monkeypatch.delenv("PLAYGROUND_DATA_PVC", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # as in a pod; the client still uses the kubeconfig
    monkeypatch.setenv("HOSTNAME", "alice-notebook-0")
    monkeypatch.setenv("POD_NAMESPACE", NS)
    job = k8s.submit(make_request("tiny-llama-cpu", {"max_steps": 20}, dataset_source=str(train)))
    spec = cluster.get("trainjobs", job.id)["spec"]
    pod = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    assert pod["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "workspace-alice"
    sent = trainer_request(spec["trainer"]["env"])
    assert sent.overrides.dataset == f"{DATA_MOUNT}/data/talks.jsonl"
    in_pod = sent.to_json().replace(DATA_MOUNT, str(workspace))  # the mount, as the trainer's pod has it
    monkeypatch.setenv(REQUEST_ENV, in_pod)
    assert prepare(["--output", str(tmp_path / "out")]).dataset_source == str(train)
    list(k8s.events(job.id, follow=True))
    assert k8s.get(job.id).phase == JobPhase.SUCCEEDED
    k8s.delete(job.id)

    monkeypatch.setenv("HOSTNAME", "someone-else-0")  # no such pod: nothing to mount, one line, nothing created
    before = len(cluster.items("trainjobs"))
    with pytest.raises(
        UserError, match=r"talks.jsonl': the kubernetes backend reads your file from a PersistentVolumeClaim"
    ):
        k8s.submit(make_request("tiny-llama-cpu", dataset_source=str(train)))
    assert len(cluster.items("trainjobs")) == before


def test_sdk_adapter_names_what_it_relies_on(k8s):
    """The SDK internals the project relies on (playground/backends/kubernetes/sdk.py) still exist: this fails when
    a kubeflow release moves them, instead of the first TorchTune submit failing or a long-lived app gathering
    threads."""
    from kubeflow.trainer.backends.kubernetes import utils
    from kubernetes import client

    from playground.cluster import sdk

    assert callable(utils.get_args_using_torchtune_config)
    trainer = k8s.backend.connection.trainer  # a real TrainerClient on the emulator
    assert isinstance(trainer.backend.custom_api.api_client, client.ApiClient)
    sdk.close_pools(trainer)
    assert k8s.backend.connection.sdk("get_runtime", "playground-torch").name == "playground-torch"  # still works
