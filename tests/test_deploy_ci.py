"""deploy/ci: the GPU runner pool, the Kueue queue, monitoring and the Grafana dashboard fit together and
name only metrics that ARC, Kueue, DCGM (and cAdvisor for container CPU) really export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from playground.cluster.manifests import QUEUE_LABEL

REPO = Path(__file__).resolve().parents[1]
CI = REPO / "deploy" / "ci"

# Metrics the dashboard may use, with where each exporter defines them (looked up in upstream sources).
# Histograms are listed by base name; their _sum/_count/_bucket series are accepted.
EXPORTED_METRICS = {
    # ARC listener, actions/actions-runner-controller cmd/ghalistener/metrics/metrics.go (subsystem "gha")
    "gha_assigned_jobs": "gauge",
    "gha_running_jobs": "gauge",
    "gha_registered_runners": "gauge",
    "gha_busy_runners": "gauge",
    "gha_min_runners": "gauge",
    "gha_max_runners": "gauge",
    "gha_desired_runners": "gauge",
    "gha_idle_runners": "gauge",
    "gha_started_jobs_total": "counter",
    "gha_completed_jobs_total": "counter",
    "gha_job_startup_duration_seconds": "histogram",
    "gha_job_execution_duration_seconds": "histogram",
    # Kueue, kubernetes-sigs/kueue pkg/metrics/metrics.go (subsystem "kueue")
    "kueue_admission_wait_time_seconds": "histogram",
    "kueue_local_queue_admission_wait_time_seconds": "histogram",
    "kueue_quota_reserved_wait_time_seconds": "histogram",
    "kueue_pending_workloads": "gauge",
    "kueue_admitted_workloads_total": "counter",
    "kueue_admitted_active_workloads": "gauge",
    "kueue_evicted_workloads_total": "counter",
    "kueue_cluster_queue_resource_usage": "gauge",
    # dcgm-exporter, NVIDIA/dcgm-exporter etc/default-counters.csv
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    # container CPU: the kubelet's cAdvisor (google/cadvisor metrics/prometheus.go)
    "container_cpu_usage_seconds_total": "counter",
}
KEP_METRICS = {
    "gha_job_startup_duration_seconds",
    "gha_job_execution_duration_seconds",
    "kueue_admission_wait_time_seconds",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "container_cpu_usage_seconds_total",
}
KEP_PANELS = ("Average CPU usage", "Average GPU usage", "Peak GPU usage", "Average queue time", "Average build time")
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless"}


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords or labels."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)  # label lists
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        word = match.group()
        if rest.startswith("(") or word in PROMQL_WORDS or re.fullmatch(r"e\d*", word):
            continue
        names.add(word)
    return names


def _known(name: str) -> bool:
    if name in EXPORTED_METRICS:
        return True
    for suffix in ("_sum", "_count", "_bucket"):
        base = name.removesuffix(suffix)
        if base != name and EXPORTED_METRICS.get(base) == "histogram":
            return True
    return False


def _panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return [p for p in out if p.get("type") != "row"]


def test_metric_name_parser() -> None:
    expr = 'sum(increase(gha_job_startup_duration_seconds_sum{job_name=~"GPU e2e.*"}[$__range])) / sum by (le) (x)'
    assert _metric_names(expr) == {"gha_job_startup_duration_seconds_sum", "x"}
    assert _metric_names("histogram_quantile(0.9, sum by (le) (rate(a_bucket[5m])))") == {"a_bucket"}


def test_dashboard_panels_name_exported_metrics() -> None:
    dashboard = json.loads((CI / "monitoring" / "grafana-dashboard.json").read_text())
    panels = _panels(dashboard)
    used: set[str] = set()
    for panel in panels:
        exprs = [t["expr"] for t in panel["targets"]]
        assert exprs, f"panel {panel['title']!r} has no query"
        for expr in exprs:
            names = _metric_names(expr)
            assert names, f"{panel['title']!r}: {expr!r} names no metric"
            unknown = [n for n in names if not _known(n)]
            assert not unknown, f"panel {panel['title']!r} uses {unknown}: not exported by ARC, Kueue, DCGM or cAdvisor"
            used |= {n.removesuffix("_sum").removesuffix("_count").removesuffix("_bucket") for n in names}
    titles = [p["title"] for p in panels]
    for wanted in KEP_PANELS:
        assert any(t.startswith(wanted) for t in titles), f"KEP panel {wanted!r} missing"
    assert used >= KEP_METRICS
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"]


def test_kueue_queue_matches_the_backend_label_and_runner_pool() -> None:
    docs = _docs(CI / "kueue" / "queues.yaml")
    by_kind: dict[str, list[dict]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    (flavor,) = by_kind["ResourceFlavor"]
    (cq,) = by_kind["ClusterQueue"]
    group = cq["spec"]["resourceGroups"][0]
    assert "nvidia.com/gpu" in group["coveredResources"]
    quotas = {r["name"]: r["nominalQuota"] for f in group["flavors"] for r in f["resources"]}
    assert quotas["nvidia.com/gpu"] >= 1
    assert {f["name"] for f in group["flavors"]} == {flavor["metadata"]["name"]}
    local_queues = by_kind["LocalQueue"]
    assert {q["spec"]["clusterQueue"] for q in local_queues} == {cq["metadata"]["name"]}
    queue_names = {q["metadata"]["name"] for q in local_queues}
    namespaces = {q["metadata"]["namespace"] for q in local_queues}
    assert namespaces == {"arc-runners", "blueprint-playground"}

    values = yaml.safe_load((CI / "arc" / "gpu-runner-scale-set-values.yaml").read_text())
    labels = values["template"]["metadata"]["labels"]
    assert QUEUE_LABEL == "kueue.x-k8s.io/queue-name" and labels[QUEUE_LABEL] in queue_names
    runner = next(c for c in values["template"]["spec"]["containers"] if c["name"] == "runner")
    env = {e["name"]: e["value"] for e in runner["env"]}
    assert env["PLAYGROUND_KUEUE_QUEUE"] in queue_names  # what the Kubernetes backend reads
    kueue_cfg = yaml.safe_load(
        yaml.safe_load((CI / "kueue" / "kueue-values.yaml").read_text())["managerConfig"]["controllerManagerConfigYaml"]
    )
    assert "pod" in kueue_cfg["integrations"]["frameworks"]
    assert "trainer.kubeflow.org/trainjob" in kueue_cfg["integrations"]["frameworks"]


def test_gpu_runner_pool_values() -> None:
    values = yaml.safe_load((CI / "arc" / "gpu-runner-scale-set-values.yaml").read_text())
    assert values["githubConfigUrl"].startswith("https://github.com/") and values["githubConfigSecret"]
    assert values["containerMode"]["type"] in ("dind", "kubernetes")
    assert 0 <= values["minRunners"] <= values["maxRunners"]
    spec = values["template"]["spec"]
    assert spec["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    runner = next(c for c in spec["containers"] if c["name"] == "runner")
    assert runner["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert runner["command"] == ["/home/runner/run.sh"]
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "gpu-e2e.yaml").read_text())
    assert workflow["jobs"]["gpu-e2e"]["runs-on"] == values["runnerScaleSetName"]
    controller = yaml.safe_load((CI / "arc" / "controller-values.yaml").read_text())
    assert controller["metrics"]["listenerEndpoint"] == "/metrics" and controller["metrics"]["listenerAddr"]


@pytest.mark.parametrize("name", ["dcgm-exporter.yaml"])
def test_core_manifests_validate(name: str) -> None:
    for doc in _docs(CI / "monitoring" / name):
        kubernetes_validate.validate(doc, "1.32.0", strict=True)


def test_scrape_objects() -> None:
    monitors = {d["metadata"]["name"]: d for d in _docs(CI / "monitoring" / "monitors.yaml")}
    listener = monitors["arc-listeners"]
    assert listener["kind"] == "PodMonitor"
    assert listener["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/component": "runner-scale-set-listener"}
    controller_port = yaml.safe_load((CI / "arc" / "controller-values.yaml").read_text())["metrics"]["listenerAddr"]
    assert listener["spec"]["podMetricsEndpoints"][0]["portNumber"] == int(controller_port.lstrip(":"))
    assert monitors["kueue-controller-manager"]["kind"] == "ServiceMonitor"
    dcgm = monitors["dcgm-exporter"]
    service = next(d for d in _docs(CI / "monitoring" / "dcgm-exporter.yaml") if d["kind"] == "Service")
    assert dcgm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    jobs = {j["job_name"] for j in yaml.safe_load((CI / "monitoring" / "prometheus-scrape-configs.yaml").read_text())}
    assert jobs >= {"arc-listeners", "kueue", "dcgm-exporter", "kubelet-cadvisor"}
    kustomization = yaml.safe_load((CI / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (CI / resource).is_file()
    assert (CI / kustomization["configMapGenerator"][0]["files"][0]).is_file()
