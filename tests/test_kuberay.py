"""The kuberay backend: RayJob manifests against the real KubeRay CRDs (schema and CEL), then the whole path over
real HTTP with the real ``kubernetes`` client against the emulator, whose simulator plays KubeRay (RayJob →
RayCluster → head/worker pods → submitter Job replaying a Ray driver log → jobDeploymentStatus/jobStatus), Kueue
and KServe (``tests/_k8s_sim.py``). No real Ray and no training here: the driver's log is replayed."""

from __future__ import annotations

import dataclasses
import functools
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from _k8s_sim import (
    Cluster,
    Scenario,
    crd_validator,
    kuberay_problems,
    ray_driver_log,
    synthetic_trainer_log,
    trainer_request,
)
from _waiting import wait_for
from conftest import SHARED_DIR as SHARED

from playground.api import DEFAULT_BLUEPRINT, make_request
from playground.backends.kubernetes import trainjob as tj
from playground.backends.ray import rayjob as rj
from playground.backends.ray.kuberay import KubeRayBackend
from playground.blueprints import get_blueprint
from playground.cluster import manifests as m
from playground.errors import JobNotFound, UserError
from playground.events import ClusterEvent, JobPhase, Log, Metric, Phase, Progress, Queued
from playground.facade import Playground

REPO = Path(__file__).resolve().parents[1]
NS = "ml"
GPU_BLUEPRINT = "qwen2.5-1.5b-dpo-kubectl"  # 1 GPU per node, a hub model the trainer downloads itself
MANIFEST_BLUEPRINTS = ["tiny-llama-cpu", DEFAULT_BLUEPRINT, GPU_BLUEPRINT]


SETTINGS = (
    "PLAYGROUND_KUEUE_QUEUE",
    "PLAYGROUND_K8S_TRAINER",
    "PLAYGROUND_E2E_RUN",
    "PLAYGROUND_TRAINER_IMAGE",
    "PLAYGROUND_DATA_PVC",
    "PLAYGROUND_HF_TOKEN_SECRET",
    "PLAYGROUND_HF_TOKEN_KEY",
    "KUBERNETES_SERVICE_HOST",
)


@pytest.fixture(autouse=True)
def default_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from the defaults (no queue, image, data claim... from the environment)."""
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)


def driver_log(steps: int = 20, *, fail: bool = False) -> list[str]:
    return ray_driver_log(synthetic_trainer_log(steps, fail=fail), fail=fail)


def rendered(blueprint_id: str, *, queue: str | None = "team-queue", owner: str | None = "alice"):
    """(plan, PVC, RayJob) for a blueprint, as ``--dry-run`` renders them."""
    blueprint = get_blueprint(blueprint_id)
    opts = dataclasses.replace(m.ClusterOptions.from_env(namespace=NS), queue=queue)  # env: PLAYGROUND_E2E_RUN
    request = make_request(blueprint_id, labels={"session": "s1"}, owner=owner)
    plan = rj.plan_rayjob(blueprint, request, opts, m.new_job_name(blueprint_id))
    docs = list(yaml.safe_load_all(rj.to_yaml(plan)))
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "RayJob"]
    return plan, docs[0], docs[1]


def as_raycluster(rayjob: dict) -> dict:
    """The RayCluster KubeRay makes of a RayJob's ``spec.rayClusterSpec``."""
    meta = {"name": rayjob["metadata"]["name"] + "-abcde", "namespace": NS}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta, "spec": rayjob["spec"]["rayClusterSpec"]}


def entrypoint_parts(rayjob: dict) -> tuple[dict[str, str], list[str]]:
    """(the driver's options, the trainer's arguments) of a RayJob's entrypoint."""
    tokens = rayjob["spec"]["entrypoint"].split(" ")
    split = tokens.index("--")
    assert tokens[:3] == ["python", "-m", "playground.train.on_ray"]
    options = tokens[3:split]
    return dict(zip(options[::2], options[1::2], strict=True)), tokens[split + 1 :]


def containers(rayjob: dict) -> dict[str, dict]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    pods.append(rayjob["spec"]["submitterPodTemplate"])
    return {c["name"]: c for pod in pods for c in pod["spec"]["containers"]}


# -- manifests, against the real CRDs (no cluster) ----------------------------------------------------------------
@functools.cache
def validator(crd_file: str, version: str):
    """The API server's check of one CRD (loaded once per module: the RayCluster CRD alone is ~1 MB of YAML)."""
    return crd_validator(SHARED / "crds" / crd_file, version)


@pytest.fixture(scope="module")
def schemas(shared_dir: Path):
    return {"RayJob": validator("ray.io_rayjobs.yaml", "v1"), "RayCluster": validator("ray.io_rayclusters.yaml", "v1")}


@pytest.mark.parametrize("blueprint_id", MANIFEST_BLUEPRINTS)
def test_rayjob_matches_the_kuberay_crds_and_runs_the_trainjobs_trainer(schemas, blueprint_id, monkeypatch):
    """Schema, unknown fields and CEL rules of the RayJob and of the RayCluster made from it; KubeRay's own
    validation; the entrypoint is the Ray Train driver around exactly the TrainJob's trainer arguments."""
    monkeypatch.setenv("HF_TOKEN", "hf_inline_would_leak")
    monkeypatch.setenv("PLAYGROUND_E2E_RUN", "nb-run-7")
    blueprint = get_blueprint(blueprint_id)
    plan, pvc, rayjob = rendered(blueprint_id)
    assert schemas["RayJob"](rayjob) == []
    assert schemas["RayCluster"](as_raycluster(rayjob)) == []
    assert kuberay_problems(rayjob) == []
    assert "hf_inline_would_leak" not in yaml.safe_dump([pvc, rayjob])

    # metadata: the TrainJob's labels and annotations (Kueue queue, owner, e2e run), suspended for Kueue
    meta, spec = rayjob["metadata"], rayjob["spec"]
    assert meta["labels"][m.QUEUE_LABEL] == "team-queue" and spec["suspend"] is True
    assert meta["labels"][m.LABEL_OWNER] != "alice" and meta["annotations"][m.ANN_OWNER] == "alice"
    assert meta["labels"][m.LABEL_E2E_RUN] == "nb-run-7" and meta["labels"][m.LABEL_PREFIX + "session"] == "s1"
    assert meta["annotations"][m.ANN_OUTPUT] == f"pvc://workspace-{plan.name}/output/model"
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == rj.CLUSTER_TTL_SECONDS
    assert spec["activeDeadlineSeconds"] == blueprint.kubernetes.active_deadline_seconds

    # the entrypoint: the driver, sized from the blueprint, then the TrainJob's trainer arguments
    options, trainer_args = entrypoint_parts(rayjob)
    res = blueprint.resources
    assert options["--workers"] == str(res.nodes * max(1, res.gpus_per_node))
    assert options["--gpus-per-worker"] == ("1" if res.gpus_per_node else "0")
    assert float(options["--cpus-per-worker"]) == float(res.cpu) / max(1, res.gpus_per_node)
    assert options["--storage"].startswith(m.WORKSPACE + "/")
    request = make_request(blueprint_id, labels={"session": "s1"}, owner="alice")
    trainjob = tj.build_trainjob(tj.plan_trainjob(blueprint, request, m.ClusterOptions(namespace=NS), plan.name))
    assert trainer_args == trainjob["spec"]["trainer"]["args"]
    assert trainer_args[trainer_args.index("--output") + 1] == m.OUTPUT_DIR

    # pods: the workspace PVC on head and workers, the image, the worker sized from the blueprint
    byname = containers(rayjob)
    assert {c["image"] for c in byname.values()} == {rj.DEFAULT_IMAGE}
    for name in (rj.HEAD_CONTAINER, rj.WORKER_CONTAINER):
        assert {"name": "workspace", "mountPath": m.WORKSPACE} in byname[name]["volumeMounts"]
    group = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == res.nodes
    limits = byname[rj.WORKER_CONTAINER]["resources"]["limits"]
    assert limits["cpu"] == res.cpu and limits["memory"] == res.memory
    assert limits.get("nvidia.com/gpu") == (str(res.gpus_per_node) if res.gpus_per_node else None)
    head_env = {e["name"]: e for e in byname[rj.HEAD_CONTAINER]["env"]}
    assert ("PLAYGROUND_GPU_COUNT" in head_env) == blueprint.needs_gpu  # the driver's fit check, for the workers
    assert spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
    assert pvc["metadata"]["name"] == plan.workspace_claim and pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == blueprint.kubernetes.storage
    token = head_env.get("HF_TOKEN")
    hub = blueprint.model.source.startswith("hf://")
    assert (token is not None) == hub, "the HF token reaches the Ray pods of a hub blueprint, and only those"
    if token:
        assert token["valueFrom"]["secretKeyRef"] == {"key": "token", "name": "hf-token", "optional": True}


def test_multi_node_gpu_blueprint_spreads_workers_over_replicas(schemas):
    """2 nodes x 4 GPUs: 8 Ray Train workers on 2 worker pods of 4 GPUs each, a ReadWriteMany workspace (no head
    affinity), no queue: not suspended."""
    blueprint = get_blueprint(GPU_BLUEPRINT)
    big = blueprint.model_copy(
        update={"resources": blueprint.resources.model_copy(update={"nodes": 2, "gpus_per_node": 4})}
    )
    plan, _, _ = rendered(GPU_BLUEPRINT, queue=None, owner=None)
    plan = dataclasses.replace(plan, blueprint=big, scaling=rj.Scaling.of(big))  # (not in the image's catalog)
    pvc, rayjob = rj.build_workspace_pvc(plan), rj.build_rayjob(plan)
    assert schemas["RayJob"](rayjob) == [] and schemas["RayCluster"](as_raycluster(rayjob)) == []
    options, _ = entrypoint_parts(rayjob)
    assert (options["--workers"], options["--gpus-per-worker"], options["--cpus-per-worker"]) == ("8", "1", "2")
    group = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 2
    assert containers(rayjob)[rj.WORKER_CONTAINER]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "affinity" not in rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert "suspend" not in rayjob["spec"] and m.QUEUE_LABEL not in rayjob["metadata"]["labels"]


def test_your_data_file_reaches_the_ray_pods_through_a_read_only_pvc(schemas, tmp_path):
    """--dataset-source FILE on a claim's mount: head (the driver checks the file) and workers mount the claim
    read-only, and the trainer's argument names the file where the pods see it."""
    import json

    from playground.cluster.datafiles import DATA_MOUNT, ClaimMount

    data = tmp_path / "jovyan" / "data" / "talks.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) + "\n" for i in range(12)))
    opts = m.ClusterOptions(namespace=NS, data_claims=(ClaimMount("workspace-alice", str(tmp_path / "jovyan")),))
    request = make_request("tiny-llama-cpu", dataset_source=str(data))
    plan = rj.plan_rayjob(get_blueprint("tiny-llama-cpu"), request, opts, "tiny-llama-cpu-x1")
    rayjob = rj.build_rayjob(plan)
    assert schemas["RayJob"](rayjob) == [] and "q3" not in yaml.safe_dump(rayjob)
    assert trainer_request(plan.env).overrides.dataset == f"{DATA_MOUNT}/data/talks.jsonl"
    cluster = rayjob["spec"]["rayClusterSpec"]
    for group in (cluster["headGroupSpec"], cluster["workerGroupSpecs"][0]):
        pod = group["template"]["spec"]
        claims = {v["persistentVolumeClaim"]["claimName"]: v["persistentVolumeClaim"] for v in pod["volumes"]}
        assert claims["workspace-alice"]["readOnly"] is True and "workspace-tiny-llama-cpu-x1" in claims
        mount = next(v for v in pod["containers"][0]["volumeMounts"] if v["mountPath"] == DATA_MOUNT)
        assert mount["readOnly"] is True


def test_the_schema_check_catches_mistakes(schemas):
    """The validators are not vacuous: a wrong type, an unknown field and a broken CEL rule are all reported."""
    _, _, rayjob = rendered("tiny-llama-cpu")
    rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "one"
    rayjob["spec"]["entrypointt"] = "typo"
    rayjob["spec"]["managedBy"] = "someone-else"
    problems = schemas["RayJob"](rayjob)
    fields = {f for f, _ in problems}
    assert {"spec.rayClusterSpec.workerGroupSpecs.0.replicas", "spec.entrypointt"} <= fields
    assert any("managedBy field value must be either" in message for _, message in problems)
    del rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["minReplicas"]
    assert any("must set both minReplicas and maxReplicas" in p for p in kuberay_problems(rayjob))


def test_the_trainer_image_carries_the_ray_the_rayjob_names():
    import ray

    dockerfile = (REPO / "deploy" / "images" / "trainer.Dockerfile").read_text()
    assert f'"ray[default,train]=={rj.RAY_VERSION}"' in dockerfile
    assert rj.RAY_VERSION == ray.__version__  # the version this repository tests with


def test_bad_input_is_one_line_naming_the_field(monkeypatch):
    """Refused before anything is rendered: the builtin-torchtune trainer, a token the entrypoint's shells would
    interpret, a blueprint of your own (its YAML cannot travel through them)."""
    with pytest.raises(UserError) as err:
        KubeRayBackend(namespace=NS, trainer="builtin-torchtune")
    assert err.value.field == "trainer" and "allowed: playground" in str(err.value)
    backend = KubeRayBackend(namespace=NS)
    with pytest.raises(UserError) as err:
        backend.render_train(make_request("tiny-llama-cpu", dataset_source="hf://org/data;rm"))
    assert err.value.field == "dataset" and "'hf://org/data;rm'" in str(err.value) and "\n" not in str(err.value)
    custom = get_blueprint("tiny-llama-cpu").model_copy(update={"id": "my-own"})
    with pytest.raises(UserError) as err:
        rj.plan_rayjob(custom, make_request("tiny-llama-cpu"), backend.opts, "my-own-abcde")
    assert err.value.field == "blueprint" and "--backend kubernetes" in str(err.value)


def test_cli_dry_run_prints_the_rayjob_without_a_cluster(tmp_path, monkeypatch, capsys):
    from playground.cli import main

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))  # nothing is contacted
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    code = main(["train", "tiny-llama-cpu", "--backend", "kuberay", "--namespace", "team-a", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "hf_secret_value" not in out
    pvc, rayjob = yaml.safe_load_all(out)
    assert rayjob["kind"] == "RayJob" and rayjob["metadata"]["namespace"] == "team-a"
    name = rayjob["metadata"]["name"]
    assert pvc["metadata"]["name"] == f"workspace-{name}"
    assert main(["serve", name, "--backend", "kuberay", "--dry-run"]) == 0
    isvc = yaml.safe_load(capsys.readouterr().out)
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == rayjob["metadata"]["annotations"][m.ANN_OUTPUT]

    monkeypatch.setenv("PLAYGROUND_K8S_TRAINER", "builtin-torchtune")
    assert main(["train", "tiny-llama-cpu", "--backend", "kuberay", "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("playground: error: PLAYGROUND_K8S_TRAINER 'builtin-torchtune'")
    monkeypatch.delenv("PLAYGROUND_K8S_TRAINER")
    monkeypatch.setenv("PLAYGROUND_KUEUE_QUEUE", "bad queue!!")
    assert main(["train", "tiny-llama-cpu", "--backend", "kuberay", "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith("playground: error: PLAYGROUND_KUEUE_QUEUE 'bad queue!!'")


# -- end to end over HTTP against the emulator ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    with Cluster(namespace=NS) as c:
        if (SHARED / "crds").is_dir():  # the API server's schema validation, from the real CRDs
            checks = {
                "rayjobs": validator("ray.io_rayjobs.yaml", "v1"),
                "rayclusters": validator("ray.io_rayclusters.yaml", "v1"),
                "inferenceservices": validator("serving.kserve.io_inferenceservices.yaml", "v1beta1"),
            }
            c.call(lambda: c.emu.validators.update(checks))
        yield c


@pytest.fixture
def kuberay(cluster: Cluster, tmp_path: Path) -> Playground:
    """The facade over a KubeRayBackend on the emulator through a kubeconfig file; the simulator reset to a short
    clean run."""
    cluster.clear_faults()

    def reset() -> None:
        cluster.ray.scenario = Scenario(node_log=driver_log(), line_delay=0.002)
        cluster.ray.scenarios.clear()
        cluster.ray.submitter_failures = 0
        cluster.emu.kueue_visibility = False

    cluster.call(reset)
    kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
    return Playground(KubeRayBackend(kubeconfig=str(kubeconfig), drain_timeout=5, serve_timeout=20))


def split(events: list) -> dict[str, list]:
    out: dict[str, list] = {"phase": [], "progress": [], "metric": [], "log": [], "cluster": [], "queued": []}
    kinds = {Phase: "phase", Progress: "progress", Metric: "metric", Log: "log", ClusterEvent: "cluster"}
    for e in events:
        out[kinds.get(type(e), "queued")].append(e)
    return out


def distinct_phases(events: list) -> list[JobPhase]:
    phases: list[JobPhase] = []
    for e in split(events)["phase"]:
        if not phases or phases[-1] != e.phase:
            phases.append(e.phase)
    return phases


def owned(cluster: Cluster, plural: str, job_id: str) -> list[dict]:
    uid = (cluster.get("rayjobs", job_id) or {}).get("metadata", {}).get("uid")
    return [
        o for o in cluster.items(plural) if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", []))
    ]


def suspended(cluster: Cluster, job_id: str) -> bool:
    return (cluster.get("rayjobs", job_id) or {}).get("status", {}).get("jobDeploymentStatus") == "Suspended"


def test_submit_follow_to_succeeded_then_reattach(cluster, kuberay):
    """The whole story live (a retried submitter replays the log: still each line once), then from a new backend:
    get, list (owner filtering as in booth mode) and the history."""
    # the cluster takes 2 s to start: the follow below begins well inside it, even on a loaded machine
    cluster.ray.scenario = Scenario(node_log=driver_log(), line_delay=0.005, start_delay=2.0)
    cluster.ray.submitter_failures = 1
    request = make_request("tiny-llama-cpu", labels={"session": "booth-7"}, owner="alice@example.com")
    job = kuberay.submit(request)
    assert (job.backend, job.blueprint_id, job.owner) == ("kuberay", "tiny-llama-cpu", "alice@example.com")
    created = cluster.get("rayjobs", job.id)
    assert created["spec"] == rj.build_rayjob(kuberay.backend._plan(request, name=job.id))["spec"]  # = --dry-run
    assert created["metadata"]["labels"][m.LABEL_PREFIX + "session"] == "booth-7"
    claim = cluster.get("persistentvolumeclaims", f"workspace-{job.id}")
    assert claim["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]

    events = list(kuberay.events(job.id, follow=True, owner="alice@example.com"))
    parts = split(events)
    assert distinct_phases(events) == [
        JobPhase.PENDING,
        JobPhase.INITIALIZING,
        JobPhase.TRAINING,
        JobPhase.EVALUATING,
        JobPhase.SAVING,
        JobPhase.SUCCEEDED,
    ]
    pending = [e.reason for e in parts["phase"] if e.phase == JobPhase.PENDING]
    assert any(r.startswith("creating Ray cluster ") for r in pending), pending
    assert [p.step for p in parts["progress"]] == [5, 10, 15, 20]
    assert [(x.name, x.value) for x in parts["metric"]] == [("eval_exact_match", 0.97)]
    lines = [e.line for e in parts["log"] if e.source == "trainer"]
    assert "tokenizer: 30 tokens" in lines and len(lines) == len(set(lines)) == 3  # Ray's 2 lines + the trainer's
    assert all("\x1b" not in line and "RayTrainWorker" not in line for line in lines)
    news = [e.line for e in parts["log"] if e.source == "submitter"]
    assert len(news) == 2 and news[0].endswith("submitted successfully") and news[1].endswith("succeeded")
    reasons = [(e.kind, e.reason) for e in parts["cluster"]]
    for expected in [("RayJob", "CreatedRayCluster"), ("RayJob", "CreatedRayJobSubmitter"), ("RayJob", "Running")]:
        assert expected in reasons
    assert reasons.index(("RayJob", "Initializing")) < reasons.index(("RayJob", "Running"))
    assert events[-1].reason == "RayJob completed: Job finished successfully."

    fresh = Playground(KubeRayBackend(kubeconfig=kuberay.backend.kubeconfig, drain_timeout=5))  # a new process
    done = fresh.get(job.id, owner="alice@example.com")
    assert done.phase == JobPhase.SUCCEEDED and done.model_dir == f"pvc://workspace-{job.id}/output/model"
    assert (done.progress.step, done.progress.total_steps) == (20, 20) and done.metrics == {"eval_exact_match": 0.97}
    assert done.started_at is not None and done.finished_at >= done.started_at
    assert job.id in [j.id for j in fresh.list(owner="alice@example.com")]
    assert job.id not in [j.id for j in fresh.list(owner="bob")]
    with pytest.raises(JobNotFound):
        fresh.get(job.id, owner="bob")  # someone else's job is reported like an unknown one
    again = split(list(fresh.events(job.id)))
    assert [p.step for p in again["progress"]] == [5, 10, 15, 20]
    assert [e.line for e in again["log"] if e.source == "trainer"] == lines
    assert again["phase"][-1].phase == JobPhase.SUCCEEDED
    assert cluster.sim.errors == []  # every status and RayCluster the simulator wrote passed the CRDs
    fresh.delete(job.id)


def test_failed_rayjob_ends_failed_with_its_last_log_lines(cluster, kuberay):
    cluster.ray.scenario = Scenario(node_log=driver_log(fail=True), exit_code=1, line_delay=0.002)
    cluster.ray.submitter_failures = 1  # `get` reads the tail of the submitter that streamed the whole log
    job = kuberay.submit(make_request("tiny-llama-cpu"))
    events = list(kuberay.events(job.id, follow=True))
    final = events[-1]
    assert isinstance(final, Phase) and final.phase == JobPhase.FAILED
    assert final.reason.startswith("AppFailed: Job entrypoint command failed with exit code 1; ")
    assert "trainer: RuntimeError: CUDA out of memory;" in final.reason  # the worker's cause, not the wrapper
    assert "last log lines: " in final.reason and "Tried to allocate 2.00 GiB" in final.reason
    lines = [e.line for e in split(events)["log"] if e.source == "trainer"]
    assert len(lines) == len(set(lines))  # `ray job logs` repeats the tail after a failure: not shown twice
    failed = kuberay.get(job.id)
    assert failed.phase == JobPhase.FAILED and "\n" not in failed.message
    assert failed.message.startswith("AppFailed: Job entrypoint command failed with exit code 1")
    assert any("CUDA out of memory. Tried to allocate" in line for line in failed.log_tail)
    assert failed.model_dir is None
    assert cluster.sim.errors == []
    kuberay.delete(job.id)


def test_cancel_suspends_the_rayjob_then_delete_removes_it(cluster, kuberay):
    cluster.ray.scenario = Scenario(node_log=driver_log(400), line_delay=0.02)
    job = kuberay.submit(make_request("tiny-llama-cpu"))
    stream = kuberay.events(job.id, follow=True)
    for event in stream:
        if isinstance(event, Progress):
            break
    stream.close()  # a closed stream stops its watches
    assert owned(cluster, "rayclusters", job.id)
    cancelled = kuberay.cancel(job.id)
    assert cancelled.phase == JobPhase.CANCELLED and cancelled.message == "cancelled by the user"
    assert cancelled.finished_at is not None and cancelled.finished_at >= cancelled.created_at - 1  # its TTL runs
    assert list(kuberay.events(job.id, follow=True))[-1].phase == JobPhase.CANCELLED
    rayjob = cluster.get("rayjobs", job.id)
    assert rayjob["spec"]["suspend"] is True and rayjob["metadata"]["annotations"][m.ANN_CANCELLED] == "true"
    wait_for(lambda: suspended(cluster, job.id), 10, "KubeRay to suspend the RayJob")
    assert owned(cluster, "rayclusters", job.id) == [] and owned(cluster, "jobs", job.id) == []  # KubeRay freed them
    assert kuberay.cancel(job.id).phase == JobPhase.CANCELLED  # a finished job is left as it is

    kuberay.delete(job.id)
    assert cluster.get("rayjobs", job.id) is None
    assert cluster.get("persistentvolumeclaims", f"workspace-{job.id}") is None
    with pytest.raises(JobNotFound, match=rf"no RayJob '{job.id}' in namespace '{NS}'"):
        kuberay.get(job.id)


def test_kueue_admission_then_cancel_deactivates_the_workload(cluster, kuberay):
    """Created suspended for Kueue: Pending with the queue (and its position) until admitted; cancelling then
    deactivates the Workload, so Kueue does not unsuspend the RayJob again."""
    cluster.ray.scenario = Scenario(node_log=driver_log(400), line_delay=0.02, hold_queue=True)
    cluster.call(lambda: setattr(cluster.emu, "kueue_visibility", True))
    backend = KubeRayBackend(kubeconfig=kuberay.backend.kubeconfig, queue="gpu-queue", drain_timeout=5)
    backend.queue_poll_seconds = 0.2
    job = backend.submit(make_request("tiny-llama-cpu"))
    assert cluster.get("rayjobs", job.id)["spec"]["suspend"] is True
    events: list = []
    queued, training = threading.Event(), threading.Event()

    def consume() -> None:
        for event in backend.events(job.id, follow=True):
            events.append(event)
            if isinstance(event, Queued):
                queued.set()
            if isinstance(event, Progress):
                training.set()

    thread = threading.Thread(target=consume)
    thread.start()
    assert queued.wait(30)
    pending = backend.get(job.id)
    assert pending.phase == JobPhase.PENDING and pending.queue_position == 1
    assert pending.message == "queued in Kueue queue 'gpu-queue': position 1"
    assert owned(cluster, "rayclusters", job.id) == []  # nothing runs before admission
    cluster.sim.admit("gpu-queue")
    assert training.wait(30)
    [workload] = owned(cluster, "workloads", job.id)
    assert backend.cancel(job.id).phase == JobPhase.CANCELLED
    thread.join(30)
    assert not thread.is_alive() and events[-1].phase == JobPhase.CANCELLED
    assert cluster.get("workloads", workload["metadata"]["name"])["spec"]["active"] is False
    reasons = [e.reason for e in split(events)["cluster"]]
    assert reasons.index("Pending") < reasons.index("Admitted") < reasons.index("CreatedRayCluster")
    phases = [e for e in split(events)["phase"] if e.phase == JobPhase.PENDING]
    assert phases[1].reason == "queued in Kueue queue 'gpu-queue': waiting for admission"
    wait_for(lambda: suspended(cluster, job.id), 10, "KubeRay to suspend the RayJob")
    assert cluster.get("rayjobs", job.id)["spec"]["suspend"] is True  # Kueue left it suspended
    assert cluster.sim.errors == []  # every status written on the way passed the CRD
    backend.delete(job.id)


class StandInModelServers:
    """What the simulated KServe starts for an InferenceService: it records the model directory it was handed (the
    job's PVC, as a local directory) and answers at a placeholder URL; nothing is loaded."""

    def __init__(self) -> None:
        self.started: dict[str, str] = {}

    def start(self, path: str, *, kind: str, name: str) -> SimpleNamespace:
        self.started[name] = path
        return SimpleNamespace(url="http://127.0.0.1:9/v1", model=name)

    def stop(self, name: str) -> None:
        self.started.pop(name, None)


def test_serving_the_finished_job_uses_its_storage_uri(cluster, kuberay, tmp_path):
    """The facade pairs kuberay with KServe: the InferenceService loads the job's model directory from its PVC."""
    servers = StandInModelServers()
    (tmp_path / "output" / "model").mkdir(parents=True)  # what /workspace/output holds once the job is done
    cluster.sim.output_dir, cluster.sim.servers = tmp_path / "output", servers
    try:
        job = kuberay.submit(make_request("tiny-llama-cpu"))
        assert list(kuberay.events(job.id, follow=True))[-1].phase == JobPhase.SUCCEEDED
        endpoint = kuberay.serve(job.id)
        isvc = cluster.get("inferenceservices", endpoint.name)
        assert isvc["spec"]["predictor"]["model"]["storageUri"] == f"pvc://workspace-{job.id}/output/model"
        assert isvc["metadata"]["labels"][m.LABEL_JOB] == job.id and endpoint.job_id == job.id
        assert servers.started == {endpoint.name: str(tmp_path / "output" / "model")}
        assert endpoint.url.endswith(f"/serving/{NS}/{endpoint.name}/openai/v1")
        kuberay.delete(job.id)  # its InferenceService first, then the RayJob
        assert cluster.items("inferenceservices") == [] and cluster.get("rayjobs", job.id) is None
    finally:
        cluster.sim.output_dir, cluster.sim.servers = None, None


def test_role_grants_every_request_the_backend_makes(cluster, kuberay):
    """deploy/rbac/role.yaml against the requests a whole kuberay session makes (submit, follow, get, list, a queued
    job's position and cancel, delete), counted by the emulator: each verb on each resource is granted."""
    cluster.call(cluster.emu.counts.clear)
    job = kuberay.submit(make_request("tiny-llama-cpu"))
    list(kuberay.events(job.id, follow=True))
    kuberay.get(job.id)
    kuberay.list()
    kuberay.delete(job.id)
    cluster.ray.scenario = Scenario(node_log=driver_log(), hold_queue=True)
    cluster.call(lambda: setattr(cluster.emu, "kueue_visibility", True))
    queued = KubeRayBackend(kubeconfig=kuberay.backend.kubeconfig, queue="rbac-queue")
    job = queued.submit(make_request("tiny-llama-cpu"))
    queued.get(job.id)
    queued.cancel(job.id)
    queued.delete(job.id)
    verbs = {"get": "get", "list": "list", "watch": "watch", "log": "get", "post": "create"}
    verbs |= {"patch": "patch", "delete": "delete"}
    groups = {"rayjobs": "ray.io", "workloads": "kueue.x-k8s.io", "localqueues": "visibility.kueue.x-k8s.io"}
    groups["inferenceservices"] = "serving.kserve.io"  # the facade's delete stops the job's servers first
    used = set()
    for key in cluster.call(lambda: list(cluster.emu.counts)):
        if not isinstance(key, tuple):
            continue
        _, plural, kind = key
        resource = {"localqueues": "localqueues/pendingworkloads"}.get(plural, plural)
        used.add((groups.get(plural, ""), resource + ("/log" if kind == "log" else ""), verbs[kind]))
    granted = set()
    for doc in yaml.safe_load_all((REPO / "deploy" / "rbac" / "role.yaml").read_text()):
        if doc["kind"] == "Role":
            for rule in doc["rules"]:
                granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert {("ray.io", "rayjobs", "patch"), ("kueue.x-k8s.io", "workloads", "patch")} <= used  # cancel was counted
    assert used - granted == set()
