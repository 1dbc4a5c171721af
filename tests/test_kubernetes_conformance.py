"""Every object the Kubernetes backend emits or the project ships, checked against the real CRD schemas
(../shared/crds), the SDK / KServe API models, and (core objects in deploy/) kubernetes-validate."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from _k8s_sim import crd_validator

from playground.api import make_request
from playground.backends.kubernetes import manifests as m
from playground.blueprints import get_blueprint, load_catalog

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
RUNTIME = DEPLOY / "runtimes" / "playground-torch.yaml"
BLUEPRINTS = sorted(load_catalog())


def rendered(blueprint_id: str, **opts) -> tuple[dict, dict, dict]:
    """(TrainJob, fine-tuned InferenceService, base InferenceService) for a blueprint."""
    blueprint = get_blueprint(blueprint_id)
    options = m.ClusterOptions(namespace="ml", queue="team-queue", **opts)
    request = make_request(blueprint_id, labels={"owner": "alice", "session": "s1"})
    name = m.new_job_name(blueprint_id)
    trainjob = m.build_trainjob(m.plan_trainjob(blueprint, request, options, name), m.sdk_backend("ml"))
    ft = m.build_inferenceservice(name, blueprint, m.output_uri(name, blueprint), options, base=False)
    base = m.build_inferenceservice(name, blueprint, m.base_model_uri(name, blueprint), options, base=True)
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
    trainjob, ft, base = rendered(blueprint_id)
    assert schemas["TrainJob"](trainjob) == []
    assert schemas["InferenceService"](ft) == []
    assert schemas["InferenceService"](base) == []


def test_the_schema_check_catches_mistakes(schemas):
    """The validator is not vacuous: a bad value and an unknown field are both reported."""
    trainjob, ft, _ = rendered("tiny-llama-cpu")
    trainjob["spec"]["trainer"]["numNodes"] = "two"
    trainjob["spec"]["trainer"]["gpus"] = 1
    problems = dict(schemas["TrainJob"](trainjob))
    assert "spec.trainer.numNodes" in problems and problems["spec.trainer.gpus"] == "unknown field"
    ft["spec"]["predictor"]["model"]["storageURI"] = "typo"
    assert ("spec.predictor.model.storageURI", "unknown field") in schemas["InferenceService"](ft)


def test_shipped_runtime_matches_the_crd_and_the_sdk(schemas):
    from kubeflow.trainer.backends.kubernetes import utils
    from kubeflow.trainer.types import types
    from kubeflow_trainer_api import models

    runtime = yaml.safe_load(RUNTIME.read_text())
    assert schemas["ClusterTrainingRuntime"](runtime) == []
    model = models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(runtime)
    trainer = utils.get_runtime_trainer(
        model.metadata.labels["trainer.kubeflow.org/framework"],
        model.spec.template.spec.replicated_jobs,
        model.spec.ml_policy,
    )
    # The SDK accepts CustomTrainerContainer on it, and the TrainJob's PVC is the one we serve from.
    assert trainer.trainer_type == types.TrainerType.CUSTOM_TRAINER and trainer.framework == "torch"
    claims = runtime["spec"]["template"]["spec"]["volumeClaimPolicies"][0]["templates"]
    assert [c["metadata"]["name"] for c in claims] == [m.WORKSPACE_CLAIM["playground"]]
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    mounts = {v["mountPath"] for v in node["containers"][0]["volumeMounts"]}
    assert m.WORKSPACE in mounts


def kserve_model(isvc: dict):
    """The same InferenceService built with the KServe SDK's models (as KServeClient.create takes it)."""
    from kserve import models as k
    from kubernetes import client as c

    model = isvc["spec"]["predictor"]["model"]
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
                    storage_uri=model["storageUri"],
                    args=model.get("args"),
                    env=env or None,
                    resources=c.V1ResourceRequirements(**model["resources"]),
                )
            )
        ),
    )


@pytest.mark.parametrize("blueprint_id", BLUEPRINTS)
def test_objects_round_trip_through_the_sdk_and_kserve_models(blueprint_id):
    from kserve.api_client import ApiClient
    from kubeflow_trainer_api import models

    trainjob, ft, base = rendered(blueprint_id)
    assert m._clean(models.TrainerV1alpha1TrainJob.from_dict(trainjob).to_dict()) == trainjob
    for isvc in (ft, base):
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
    assert token_envs, "the HF token must reach the pods"
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
    assert set(rules) == {"trainjobs", "trainingruntimes", "inferenceservices", "pods", "pods/log", "events"}
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
