"""Every object the Kubernetes backend emits or the project ships, checked against the real CRD schemas
and their CEL rules (../shared/crds), the SDK / KServe API models, and (core objects in deploy/)
kubernetes-validate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from _k8s_sim import crd_validator, trainer_request

from playground.api import make_request
from playground.backends.kubernetes import trainjob as tj
from playground.blueprints import get_blueprint, load_catalog
from playground.cluster import manifests as m
from playground.errors import UserError
from playground.runs.settings import JOB_BACKEND_ENV
from playground.serving import kserve as ks

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
RUNTIMES = sorted((DEPLOY / "runtimes").glob("*.yaml"))
BLUEPRINTS = sorted(load_catalog())
# hub blueprints whose model and dataset Kubeflow's initializers download (the Alpaca SFT ones)
HUB_BLUEPRINTS = [b for b in BLUEPRINTS if get_blueprint(b).kubernetes.initializers]
# hub models with the project's own data (DPO/GRPO on synthetic kubectl): the trainer downloads the model itself
HUB_MODEL_ONLY = [
    b for b in BLUEPRINTS if get_blueprint(b).model.source.startswith("hf://") and b not in HUB_BLUEPRINTS
]
DOCUMENTED_NAMESPACE = "blueprint-playground"  # deploy/kustomization.yaml


# LoRA blueprints on a model inside a Python package: KServe loads nothing from a package, so the trainer writes the
# base beside the adapter in the job's workspace (output/base-model) and the adapter is served on that copy
PACKAGED_LORA = [
    b
    for b in BLUEPRINTS
    if get_blueprint(b).method.kind == "lora" and get_blueprint(b).model.source.startswith("pkg://")
]


def rendered(blueprint_id: str, namespace: str = "ml", blueprint=None, **opts) -> tuple[dict, dict | None, dict | None]:
    """(TrainJob, fine-tuned InferenceService, base InferenceService) for a blueprint, the InferenceServices as
    ``serve`` creates them (``--dry-run``): a LoRA job's adapter, and its base-side chat, on the shared base
    server; a full fine-tune's on servers of their own."""
    blueprint = blueprint or get_blueprint(blueprint_id)
    options = m.ClusterOptions(namespace=namespace, queue="team-queue", **opts)
    request = make_request(blueprint_id, labels={"owner": "alice", "session": "s1"})
    name = m.new_job_name(blueprint_id)
    trainjob = tj.build_trainjob(tj.plan_trainjob(blueprint, request, options, name))
    servers = ks.KServeServers(None, options)  # render needs no cluster
    ft, base = (yaml.safe_load(servers.render(name, base=side)) for side in (False, True))
    return trainjob, ft, base


@pytest.fixture(scope="module")
def schemas(shared_dir: Path):
    crds = shared_dir / "crds"
    return {
        "TrainJob": crd_validator(crds / "trainer.kubeflow.org_trainjobs.yaml", "v1alpha1"),
        "ClusterTrainingRuntime": crd_validator(crds / "trainer.kubeflow.org_clustertrainingruntimes.yaml", "v1alpha1"),
        "InferenceService": crd_validator(crds / "serving.kserve.io_inferenceservices.yaml", "v1beta1"),
    }


@pytest.mark.parametrize("blueprint_id", BLUEPRINTS)
def test_trainjob_and_inferenceservices_match_the_crds(schemas, blueprint_id):
    """Schema, unknown fields and the CEL rules (name format and length, numProcPerNode >= 1, storageUri)."""
    trainjob, ft, base = rendered(blueprint_id)
    assert schemas["TrainJob"](trainjob) == []
    for isvc in (ft, base):
        assert isvc is None or schemas["InferenceService"](isvc) == []


@pytest.mark.parametrize("blueprint_id", HUB_BLUEPRINTS)
def test_hub_blueprints_run_the_project_trainer_fed_by_initializers(schemas, blueprint_id, monkeypatch):
    """Llama/Qwen: the project's entrypoint on playground-torch-hf; Kubeflow's initializers download the
    model and dataset (token from the Secret) into the workspace the trainer reads; multi-GPU picks torchrun."""
    monkeypatch.setenv("HF_TOKEN", "hf_inline_would_leak")
    blueprint = get_blueprint(blueprint_id)
    trainjob, _, base = rendered(blueprint_id)
    spec = trainjob["spec"]
    assert spec["runtimeRef"] == {"name": "playground-torch-hf", "kind": "ClusterTrainingRuntime"}
    trainer = spec["trainer"]
    assert trainer["command"] == ["python", "-m", "playground.train"]
    assert trainer["args"] == ["--output", m.OUTPUT_DIR]
    # the run request: one JSON document in the pod's environment, the sources where the initializers put them
    request = trainer_request(trainer["env"])
    assert request.blueprint_id == blueprint_id and request.params == make_request(blueprint_id).params
    assert (request.overrides.model, request.overrides.dataset) == (m.MODEL_DIR, m.DATASET_DIR)
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (1, 1)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "1"
    init = spec["initializer"]
    assert init["model"]["storageUri"] == blueprint.model.source
    assert init["dataset"]["storageUri"] == blueprint.dataset.source
    token = init["model"]["env"][0]
    assert (
        token["name"] == "ACCESS_TOKEN" and token["valueFrom"]["secretKeyRef"]["optional"] is not blueprint.model.gated
    )
    assert "hf_inline_would_leak" not in yaml.safe_dump(trainjob)
    assert trainjob["metadata"]["annotations"][m.ANN_TRAINER] == "playground"
    # side by side: the base-side chat is on the shared server of the base model (one hub download per base,
    # not one per job), which the job's adapter joins
    assert base["spec"]["predictor"]["storageUris"] == [{"uri": blueprint.model.source, "mountPath": ks.MODEL_MOUNT}]
    assert base["metadata"]["name"] == ks.shared_base_name(blueprint.model.source, "ml")

    # the same blueprint on 2 nodes x 4 GPUs: torchrun with the counts the Trainer hands it (PET_*)
    big = blueprint.model_copy(
        update={"resources": blueprint.resources.model_copy(update={"nodes": 2, "gpus_per_node": 4})}
    )
    trainjob, _, _ = rendered(blueprint_id, blueprint=big)
    trainer = trainjob["spec"]["trainer"]
    assert trainer["command"] == ["torchrun", "-m", "playground.train"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "4"
    assert schemas["TrainJob"](trainjob) == []


@pytest.mark.parametrize("blueprint_id", HUB_MODEL_ONLY)
def test_dpo_and_grpo_gpu_blueprints_run_the_project_trainer_on_a_gpu(schemas, blueprint_id, monkeypatch):
    """DPO/GRPO at GPU size: the same entrypoint (the blueprint's objective picks the TRL recipe), one GPU,
    the hub token from the Secret (never inline), no initializer (the data is generated in the pod)."""
    monkeypatch.setenv("HF_TOKEN", "hf_inline_would_leak")
    blueprint = get_blueprint(blueprint_id)
    assert blueprint.method.objective in ("dpo", "grpo") and blueprint.needs_gpu
    trainjob, ft, base = rendered(blueprint_id)
    assert schemas["TrainJob"](trainjob) == [] and schemas["InferenceService"](ft) == []
    assert schemas["InferenceService"](base) == []
    spec = trainjob["spec"]
    assert "initializer" not in spec
    trainer = spec["trainer"]
    assert trainer["command"] == ["python", "-m", "playground.train"]
    assert (
        trainer["args"] == ["--output", m.OUTPUT_DIR] and trainer_request(trainer["env"]).blueprint_id == blueprint_id
    )
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "1"
    token = next(e for e in trainer["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["optional"] is not blueprint.model.gated
    assert "hf_inline_would_leak" not in yaml.safe_dump([trainjob, ft, base])
    # the shared base model is served from the hub, with the same Secret
    predictor = base["spec"]["predictor"]
    assert predictor["storageUris"][0] == {"uri": blueprint.model.source, "mountPath": ks.MODEL_MOUNT}
    secret = predictor["model"]["env"][0]["valueFrom"]["secretKeyRef"]
    assert secret["name"] == token["valueFrom"]["secretKeyRef"]["name"]


@pytest.mark.parametrize("blueprint_id", HUB_BLUEPRINTS)
def test_builtin_torchtune_is_an_opt_in_variant(schemas, blueprint_id):
    blueprint = get_blueprint(blueprint_id)
    trainjob, ft, _ = rendered(blueprint_id, trainer=m.TORCHTUNE)
    assert schemas["TrainJob"](trainjob) == []
    spec = trainjob["spec"]
    assert spec["runtimeRef"]["name"] == blueprint.kubernetes.torchtune_runtime
    assert spec["trainer"]["command"] == ["tune", "run"]
    assert {"max_steps_per_epoch=200", "model.lora_rank=8"} <= set(spec["trainer"]["args"])
    assert ft["spec"]["predictor"]["model"]["storageUri"].endswith("/output/epoch_0")
    with pytest.raises(UserError, match=r"'tiny-llama-cpu' has no builtin-torchtune variant"):
        rendered("tiny-llama-cpu", trainer=m.TORCHTUNE)


def test_the_schema_check_catches_mistakes(schemas):
    """The validator is not vacuous: a bad value, an unknown field and broken CEL rules are all reported."""
    trainjob, ft, _ = rendered("tiny-llama-cpu")
    trainjob["spec"]["trainer"]["numNodes"] = "two"
    trainjob["spec"]["trainer"]["gpus"] = 1
    problems = dict(schemas["TrainJob"](trainjob))
    assert "spec.trainer.numNodes" in problems and problems["spec.trainer.gpus"] == "unknown field"
    ft["spec"]["predictor"]["model"]["storageURI"] = "typo"
    assert ("spec.predictor.model.storageURI", "unknown field") in schemas["InferenceService"](ft)
    trainjob, _, _ = rendered("qwen2.5-1.5b-lora-alpaca")
    trainjob["metadata"]["name"] = "Qwen_" + "x" * 60
    trainjob["spec"]["trainer"]["numProcPerNode"] = 0
    trainjob["spec"]["initializer"]["model"]["storageUri"] = "Qwen/Qwen2.5-1.5B-Instruct"
    assert set(schemas["TrainJob"](trainjob)) == {
        ("(root)", "metadata.name must match RFC 1035 DNS label format"),
        ("(root)", "metadata.name must be no more than 63 characters"),
        ("spec.trainer.numProcPerNode", "numProcPerNode must be greater than or equal to 1"),
        ("spec.initializer.model.storageUri", "storageUri may be empty, or it must be a valid URI (scheme://...)"),
    }
    status = {"trainerStatus": {"progressPercentage": 50}}  # what a trainer must not post: no lastUpdatedTime
    trainjob["metadata"]["name"], trainjob["spec"]["trainer"]["numProcPerNode"] = "ok", 1
    trainjob["spec"]["initializer"]["model"]["storageUri"] = "hf://Qwen/Qwen2.5-1.5B-Instruct"
    assert schemas["TrainJob"]({**trainjob, "status": status}) == [
        ("status.trainerStatus", "lastUpdatedTime is required when trainerStatus is present")
    ]


@pytest.mark.parametrize("path", RUNTIMES, ids=lambda p: p.stem)
def test_shipped_runtimes_match_the_crd_and_the_sdk(schemas, path):
    from kubeflow.trainer.backends.kubernetes import utils
    from kubeflow.trainer.types import types
    from kubeflow_trainer_api import models

    runtime = yaml.safe_load(path.read_text())
    assert schemas["ClusterTrainingRuntime"](runtime) == []
    model = models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(runtime)
    trainer = utils.get_runtime_trainer(
        model.metadata.labels["trainer.kubeflow.org/framework"],
        model.spec.template.spec.replicated_jobs,
        model.spec.ml_policy,
    )
    # The SDK reads it as a custom-trainer torch runtime, and the TrainJob's PVC is the one we serve from.
    assert trainer.trainer_type == types.TrainerType.CUSTOM_TRAINER and trainer.framework == "torch"
    claims = runtime["spec"]["template"]["spec"]["volumeClaimPolicies"][0]["templates"]
    assert [c["metadata"]["name"] for c in claims] == [m.WORKSPACE_CLAIM["playground"]]
    jobs = {j["name"]: j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    for job in jobs.values():
        pod = job["template"]["spec"]["template"]["spec"]
        mounts = {v["mountPath"] for c in pod["containers"] for v in c["volumeMounts"]}
        assert m.WORKSPACE in mounts and pod["securityContext"]["runAsNonRoot"] is True
    uses = {get_blueprint(b).kubernetes.runtime: get_blueprint(b).kubernetes.initializers for b in BLUEPRINTS}
    if uses.get(runtime["metadata"]["name"]):  # initializers first, then the trainer
        assert set(jobs) == {"dataset-initializer", "model-initializer", "node"}
        assert {d["name"] for d in jobs["node"]["dependsOn"]} == {"dataset-initializer", "model-initializer"}
    else:
        assert set(jobs) == {"node"}


def test_every_catalog_runtime_is_shipped():
    shipped = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in RUNTIMES}
    assert {get_blueprint(b).kubernetes.runtime for b in BLUEPRINTS} <= shipped
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert {f"runtimes/{p.name}" for p in RUNTIMES} <= set(kustomization["resources"])


@pytest.mark.parametrize("blueprint_id", BLUEPRINTS)
def test_kserve_host_label_fits_the_documented_namespace(blueprint_id):
    """KServe's ``{{ .Name }}-{{ .Namespace }}`` on ``<isvc>-predictor`` must stay a DNS label (<= 63)."""
    for kind in ("fine-tuned", "base"):
        _, ft, base = rendered(blueprint_id, namespace=DOCUMENTED_NAMESPACE)
        isvc = ft if kind == "fine-tuned" else base
        if isvc is None:
            continue
        host = f"{isvc['metadata']['name']}{ks.KSERVE_HOST_INFIX}{DOCUMENTED_NAMESPACE}"
        assert len(host) <= m.DNS_LABEL_MAX, host
        if not ks.is_shared(isvc):
            assert isvc["metadata"]["name"].startswith(isvc["metadata"]["labels"][m.LABEL_JOB])  # not shortened


def test_inferenceservice_names_shorten_in_long_namespaces():
    job = m.new_job_name("qwen2.5-1.5b-lora-alpaca")
    assert len(job) == m.JOB_NAME_MAX
    namespace = "team-" + "n" * 30
    names = {ks.isvc_name(job, base, namespace) for base in (True, False)}
    assert len(names) == 2
    assert all(len(f"{n}{ks.KSERVE_HOST_INFIX}{namespace}") <= m.DNS_LABEL_MAX for n in names)
    assert ks.isvc_name(job, True, namespace) != ks.isvc_name(
        m.new_job_name("qwen2.5-1.5b-lora-alpaca"), True, namespace
    )
    with pytest.raises(UserError, match=r"namespace 'n{50}' is too long to serve from"):
        ks.isvc_name(job, True, "n" * 50)


# -- serving on KServe's vLLM runtime ----------------------------------------------------------------
SERVED_LORA = [b for b in BLUEPRINTS if get_blueprint(b).method.kind == "lora" and b not in PACKAGED_LORA]


def vllm_args(argv: list[str]):
    """``argv`` read the way vLLM's parser reads these flags (each one must be one vLLM knows)."""
    import argparse

    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)
    for flag in ("--port", "--served-model-name", "--model", "--dtype", "--max-lora-rank", "--max-loras"):
        parser.add_argument(flag)
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--lora-modules", nargs="+", default=[])  # name=path ...
    return parser.parse_args(argv)


@pytest.mark.parametrize("blueprint_id", SERVED_LORA)
def test_lora_adapters_on_the_shared_base_fit_the_crd_and_the_vllm_runtime(schemas, shared_dir, blueprint_id):
    """Two jobs' adapters and a base-side chat on one InferenceService: the real schema, KServe's webhook rules
    for ``storageUris``, and the args as the ``kserve-vllmserver`` runtime runs them (its args, then ours)."""
    runtime = yaml.safe_load((shared_dir / "runtimes" / "kserve-vllmserver.yaml").read_text())
    blueprint = get_blueprint(blueprint_id)
    jobs = sorted(m.new_job_name(blueprint_id) for _ in range(2))
    ranks = dict(zip(jobs, (8, 12), strict=True))
    adapters = {j: {"uri": m.output_uri(j, blueprint), "rank": ranks[j], "owner": None} for j in jobs}
    options = m.ClusterOptions(namespace=DOCUMENTED_NAMESPACE)
    base_uri = blueprint.model.source
    isvc = ks.build_shared_base(base_uri, blueprint, options, adapters=adapters, base_users={jobs[0]: "alice"})
    assert schemas["InferenceService"](isvc) == []
    name = isvc["metadata"]["name"]
    assert len(f"{name}{ks.KSERVE_HOST_INFIX}{DOCUMENTED_NAMESPACE}") <= m.DNS_LABEL_MAX
    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    # the runtime KServe picks: by name, and the model format it declares
    assert runtime["metadata"]["name"] == model["runtime"] == "kserve-vllmserver"
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    container = runtime["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    # KServe's webhook (inference_service_validation.go): storageUri or storageUris, never both; mount paths
    # absolute without "..", unique for pvc://, a common parent (not /) for the rest; a volume per mount path
    assert "storageUri" not in model
    paths = [e["mountPath"] for e in predictor["storageUris"]]
    assert all(p.startswith("/") and ".." not in p and p != "/" for p in paths) and len(set(paths)) == len(paths)
    assert [e["uri"] for e in predictor["storageUris"] if not e["uri"].startswith("pvc://")] == [base_uri]
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", p.strip("/").replace("/", "-")) for p in paths)
    # what vLLM runs: the base from the runtime's --model, each adapter under its job id from its mounted claim
    args = vllm_args([a.replace("{{.Name}}", name) for a in container["args"]] + model["args"])
    assert (args.model, args.served_model_name, args.dtype) == (ks.MODEL_MOUNT, name, blueprint.model.dtype)
    assert predictor["storageUris"][0] == {"uri": base_uri, "mountPath": args.model}
    # on CPU one slot more than adapters, left empty (vLLM's CPU LoRA reads a base token's slot -1 as the last one)
    slots = 2 if blueprint.resources.gpus_per_node else 3
    assert args.enable_lora and int(args.max_loras) == slots and int(args.max_lora_rank) == 16  # 12 -> vLLM's 16
    mounts = {e["uri"]: e["mountPath"] for e in predictor["storageUris"][1:]}
    modules = dict(entry.split("=", 1) for entry in args.lora_modules)
    assert sorted(modules) == jobs
    for job in jobs:  # KServe mounts a pvc:// entry's whole claim: the adapter is at <mount>/<path in the claim>
        claim_path = m.output_uri(job, blueprint).split("/", 3)[3]
        assert modules[job] == f"{mounts[m.output_uri(job, blueprint)]}/{claim_path}"
    # the base model's Secret for a hub download, never a value
    if base_uri.startswith("hf://"):
        assert model["env"][0]["valueFrom"]["secretKeyRef"]["name"] == options.hf_token_secret


def test_full_fine_tunes_get_a_vllm_server_of_their_own(schemas, shared_dir):
    """tiny-llama-cpu (a full fine-tune): its own InferenceService on the vLLM runtime, CPU only (the controller
    then runs the runtime's -cpu image), its model directory as ``storageUri``."""
    _, ft, base = rendered("tiny-llama-cpu")
    for isvc, kind in ((ft, "fine-tuned"), (base, "base")):
        model = isvc["spec"]["predictor"]["model"]
        assert (model["runtime"], model["modelFormat"], isvc["metadata"]["labels"][m.LABEL_KIND]) == (
            "kserve-vllmserver",
            {"name": "vLLM"},
            kind,
        )
        assert "nvidia.com/gpu" not in model["resources"]["limits"] and "args" not in model  # dtype auto
        assert "storageUris" not in isvc["spec"]["predictor"]
    assert ft["spec"]["predictor"]["model"]["storageUri"].endswith("/output/model")
    assert base["spec"]["predictor"]["model"]["storageUri"].endswith("/output/base-model")


@pytest.mark.parametrize("blueprint_id", PACKAGED_LORA)
def test_lora_on_a_packaged_model_is_served_on_the_base_its_trainer_wrote(schemas, blueprint_id):
    """KServe loads nothing from a Python package: the TrainJob tells the trainer it runs on the cluster (so it writes
    the converted base to output/base-model) and the adapter is served on that copy, base chat on the same server."""
    servers = ks.KServeServers(None, m.ClusterOptions(namespace="ml"))
    name = m.new_job_name(blueprint_id)
    isvc, base = (yaml.safe_load(servers.render(name, base=side)) for side in (False, True))
    assert schemas["InferenceService"](isvc) == [] and base["metadata"]["name"] == isvc["metadata"]["name"]
    assert isvc["spec"]["predictor"]["storageUris"] == [
        {"uri": f"pvc://workspace-{name}/output/base-model", "mountPath": "/mnt/models"},
        {"uri": f"pvc://workspace-{name}/output/model", "mountPath": f"/mnt/adapters/{name}"},
    ]
    trainjob = tj.build_trainjob(
        tj.plan_trainjob(
            get_blueprint(blueprint_id), make_request(blueprint_id), m.ClusterOptions(namespace="ml"), name
        )
    )
    env = {e["name"]: e.get("value") for e in trainjob["spec"]["trainer"]["env"]}
    assert env[JOB_BACKEND_ENV] == "kubernetes"  # the trainer's cue to write output/base-model (saves_base_model)


def test_kueue_queue_setting_is_validated(monkeypatch):
    monkeypatch.setenv("PLAYGROUND_KUEUE_QUEUE", "bad queue!!")
    with pytest.raises(UserError) as err:
        m.ClusterOptions.from_env()
    text = str(err.value)
    assert text.startswith("PLAYGROUND_KUEUE_QUEUE 'bad queue!!' is not valid; allowed: a Kueue LocalQueue name")
    assert err.value.field == "PLAYGROUND_KUEUE_QUEUE" and "\n" not in text
    monkeypatch.setenv("PLAYGROUND_KUEUE_QUEUE", "x" * 5000)
    with pytest.raises(UserError) as err:
        m.ClusterOptions.from_env()
    assert len(str(err.value)) < 300  # the echo is capped
    monkeypatch.setenv("PLAYGROUND_KUEUE_QUEUE", "gpu-queue.team-a")
    assert m.ClusterOptions.from_env().queue == "gpu-queue.team-a"
    with pytest.raises(UserError, match=r"^queue 'Team' is not valid"):
        m.ClusterOptions.from_env(queue="Team")


def test_initializer_data_layout_loads_in_the_trainer(tmp_path):
    """What Kubeflow's dataset initializer leaves (a hub repo snapshot, parquet under data/) is what
    the trainer's ``--dataset-source /workspace/dataset`` reads, with the blueprint's split."""
    import datasets

    from playground.train.data import load_rows

    rows = [{"instruction": f"say {i}", "input": "", "output": str(i)} for i in range(12)]
    (tmp_path / "data").mkdir()
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"))
    (tmp_path / "README.md").write_text("---\nlicense: cc-by-nc-4.0\n---\n")
    assert load_rows(str(tmp_path), "train[:5]") == rows[:5]


def kserve_model(isvc: dict):
    """The same InferenceService built with the KServe SDK's models (as KServeClient.create takes it)."""
    from kserve import models as k
    from kubernetes import client as c

    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    env = [
        c.V1EnvVar(
            name=e["name"],
            value_from=c.V1EnvVarSource(secret_key_ref=c.V1SecretKeySelector(**e["valueFrom"]["secretKeyRef"])),
        )
        for e in model.get("env", [])
    ]
    return k.V1beta1InferenceService(
        api_version=isvc["apiVersion"],
        kind=isvc["kind"],
        metadata=c.V1ObjectMeta(**isvc["metadata"]),
        spec=k.V1beta1InferenceServiceSpec(
            predictor=k.V1beta1PredictorSpec(
                model=k.V1beta1ModelSpec(
                    model_format=k.V1beta1ModelFormat(**model["modelFormat"]),
                    runtime=model["runtime"],
                    storage_uri=model.get("storageUri"),
                    args=model.get("args"),
                    env=env or None,
                    resources=c.V1ResourceRequirements(**model["resources"]),
                ),
                storage_uris=[
                    k.V1beta1StorageUri(uri=e["uri"], mount_path=e["mountPath"]) for e in predictor["storageUris"]
                ]
                if "storageUris" in predictor
                else None,
            )
        ),
    )


@pytest.mark.parametrize("blueprint_id", BLUEPRINTS)
def test_objects_round_trip_through_the_sdk_and_kserve_models(blueprint_id):
    from kserve.api_client import ApiClient
    from kubeflow_trainer_api import models

    trainjob, ft, base = rendered(blueprint_id)
    assert tj._clean(models.TrainerV1alpha1TrainJob.from_dict(trainjob).to_dict()) == trainjob
    for isvc in (i for i in (ft, base) if i is not None):
        serialized = ApiClient().sanitize_for_serialization(kserve_model(isvc))
        assert serialized["spec"]["predictor"]["model"].pop("name") == ""  # the SDK model's default
        assert serialized == isvc


@pytest.mark.parametrize("blueprint_id", BLUEPRINTS)
def test_secrets_never_inline_and_kueue_label(blueprint_id, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_inline_would_leak")
    trainjob, ft, base = rendered(blueprint_id)
    text = yaml.safe_dump([trainjob, ft, base])
    assert "hf_inline_would_leak" not in text
    assert trainjob["metadata"]["labels"][m.QUEUE_LABEL] == "team-queue"

    def envs(obj):
        if isinstance(obj, dict):
            if "env" in obj and isinstance(obj["env"], list):
                yield from obj["env"]
            for value in obj.values():
                yield from envs(value)
        elif isinstance(obj, list):
            for value in obj:
                yield from envs(value)

    token_envs = [e for e in envs([trainjob, ft, base]) if "TOKEN" in e["name"]]
    hub = blueprint_id in HUB_BLUEPRINTS + HUB_MODEL_ONLY
    assert bool(token_envs) == hub, "the HF token reaches the pods that download from the hub, and only those"
    assert all("value" not in e and e["valueFrom"]["secretKeyRef"]["name"] == "hf-token" for e in token_envs)


def test_core_manifests_validate_with_kubernetes_validate():
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    kinds = []
    paths = [
        DEPLOY / "namespace.yaml",
        *sorted((DEPLOY / "rbac").glob("*.yaml")),
        *sorted((DEPLOY / "app").glob("*.yaml")),
    ]
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or str(doc.get("apiVersion", "")).split("/")[0] not in (
                "v1",
                "apps",
                "rbac.authorization.k8s.io",
                "batch",
                "networking.k8s.io",
                "policy",
            ):
                continue
            kubernetes_validate.validate(doc, version, strict=True)
            kinds.append(doc["kind"])
    assert {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ClusterRole"} <= set(kinds)


def test_kustomization_lists_existing_files_and_least_privilege_rbac():
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (DEPLOY / resource).exists(), resource
    rules = {}
    for doc in yaml.safe_load_all((DEPLOY / "rbac" / "role.yaml").read_text()):
        if doc["kind"] == "Role":
            for rule in doc["rules"]:
                for resource in rule["resources"]:
                    rules[resource] = set(rule["verbs"])
    assert set(rules) == {
        "trainjobs",
        "trainingruntimes",
        "inferenceservices",
        "pods",
        "pods/log",
        "events",
        "localqueues/pendingworkloads",
        # the kuberay backend (tests/test_kuberay.py checks these against the requests it makes)
        "rayjobs",
        "rayjobs/status",
        "rayclusters",
        "rayclusters/status",
        "persistentvolumeclaims",
        "workloads",
    }
    assert rules["rayclusters"] == {"get", "list", "watch"}  # KubeRay's: the playground only reads them
    assert rules["localqueues/pendingworkloads"] == {"get"}
    # patch: a LoRA job's adapter joins (and leaves) its base model's shared InferenceService
    assert rules["inferenceservices"] == {"get", "list", "watch", "create", "patch", "delete"}
    assert all("*" not in verbs for verbs in rules.values())
    assert rules["pods"] == {"get", "list", "watch"} and rules["pods/log"] == {"get"}
    cluster_role = next(yaml.safe_load_all((DEPLOY / "rbac" / "clusterrole.yaml").read_text()))
    assert cluster_role["rules"] == [
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["clustertrainingruntimes"], "verbs": ["get", "list"]}
    ]
    deployment = yaml.safe_load((DEPLOY / "app" / "deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["playground", "app", "--booth"]  # public booth: owners, quotas, kernel cap
    assert container["command"][-4:] == ["--ip", "0.0.0.0", "--port", "8866"]
    assert container["readinessProbe"]["httpGet"]["path"].endswith("/healthz.txt")  # never starts a kernel
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "blueprint-playground"


# -- your own data file on Kubernetes: through a PVC, never inline ---------------------------------------------------
def _data_rows(path: Path, n: int = 12) -> Path:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"prompt": f"secret-row-{i}", "completion": f"answer-{i}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_own_data_file_reaches_the_trainer_through_a_read_only_pvc(schemas, tmp_path, isolated_home):
    """A custom blueprint (your file + held-out file) and a --dataset-source override: the TrainJob mounts the
    claim read-only at /mnt/playground-data via runtimePatches (valid against the CRD), the trainer reads the files
    there, the blueprint travels as YAML with the paths renamed, and no row of the file is in the spec."""
    from playground.blueprints import blueprint_from_yaml
    from playground.blueprints.custom import make_custom, save_blueprint
    from playground.cluster.datafiles import DATA_MOUNT, ClaimMount

    workspace = tmp_path / "jovyan"
    train = _data_rows(workspace / "data" / "train.jsonl")
    held = _data_rows(workspace / "data" / "held.jsonl", 4)
    blueprint, _ = make_custom(
        get_blueprint("tiny-llama-cpu"), "my-data", dataset_source=str(train), eval_source=str(held)
    )
    path = save_blueprint(blueprint)
    options = m.ClusterOptions(namespace="ml", data_claims=(ClaimMount("workspace-alice", str(workspace)),))
    trainjob = tj.build_trainjob(tj.plan_trainjob(blueprint, make_request(str(path)), options, "my-data-abcde"))
    assert schemas["TrainJob"](trainjob) == []
    assert "secret-row" not in yaml.safe_dump(trainjob)
    patch = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = patch["template"]["spec"]["template"]["spec"]
    assert patch["name"] == "node" and pod["containers"][0]["name"] == "node"
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "workspace-alice", "readOnly": True}
    assert pod["containers"][0]["volumeMounts"][0] == {
        "name": "playground-data",
        "mountPath": DATA_MOUNT,
        "readOnly": True,
    }
    sent_request = trainer_request(trainjob["spec"]["trainer"]["env"])
    assert sent_request.blueprint_yaml is not None  # a blueprint of your own travels as its YAML
    sent = blueprint_from_yaml(sent_request.blueprint_yaml)
    assert sent.dataset.source == f"{DATA_MOUNT}/data/train.jsonl"
    assert sent.dataset.eval_source == f"{DATA_MOUNT}/data/held.jsonl"
    assert sent.model_copy(update={"dataset": blueprint.dataset, "examples": blueprint.examples}) == blueprint

    # A shipped blueprint with --dataset-source: its id, and the override renamed to the mount.
    request = make_request("tiny-llama-cpu", dataset_source=str(train))
    trainjob = tj.build_trainjob(tj.plan_trainjob(get_blueprint("tiny-llama-cpu"), request, options, "tiny-llama-x1"))
    assert schemas["TrainJob"](trainjob) == []
    sent_request = trainer_request(trainjob["spec"]["trainer"]["env"])
    assert sent_request.blueprint_id == "tiny-llama-cpu" and sent_request.blueprint_yaml is None
    assert sent_request.overrides.dataset == f"{DATA_MOUNT}/data/train.jsonl"


def test_own_data_file_on_no_claim_is_one_line_naming_the_setting(tmp_path, monkeypatch):
    from playground.cluster.datafiles import ClaimMount

    train = _data_rows(tmp_path / "train.jsonl")
    request = make_request("tiny-llama-cpu", dataset_source=str(train))
    for claims, needle in (((), "no claim is known: PLAYGROUND_DATA_PVC is not set"),
                           ((ClaimMount("ws", "/home/jovyan"),), "known: ws at /home/jovyan")):  # fmt: skip
        options = m.ClusterOptions(namespace="ml", data_claims=claims)
        with pytest.raises(UserError) as err:
            tj.plan_trainjob(get_blueprint("tiny-llama-cpu"), request, options, "tiny-llama-x1")
        message = str(err.value)
        assert "\n" not in message and "train.jsonl" in message and needle in message
        assert (
            "allowed: a file under a PersistentVolumeClaim's mount (set PLAYGROUND_DATA_PVC=CLAIM:MOUNT_PATH" in message
        )
    monkeypatch.setenv("PLAYGROUND_DATA_PVC", "not a claim")
    with pytest.raises(UserError, match=r"PLAYGROUND_DATA_PVC 'not a claim' is not valid; allowed: CLAIM:MOUNT_PATH"):
        m.ClusterOptions.from_env()
    monkeypatch.setenv("PLAYGROUND_DATA_PVC", f"ws:{tmp_path}, other:/data")
    assert m.ClusterOptions.from_env().data_claims == (ClaimMount("ws", str(tmp_path)), ClaimMount("other", "/data"))
