"""The core kubectl task: a plain-English request → the exact kubectl command (11 operations, tidy phrasings).

What the DPO and GRPO blueprints train and measure on, and what :mod:`playground.kubectl.wide` widens. Names and
phrasings are keyed by ``held_out``: the held-out split draws from the ``True`` lists, which training never sees.
Stdlib-only data: the guard and the chat panel import it through :mod:`playground.kubectl.wide`.
"""

from __future__ import annotations

# (command, training phrasings, held-out phrasings, takes a namespace)
Operation = tuple[str, list[str], list[str], bool]

# Each operation: the command (a format string) and two sets of phrasings. Training uses the first
# set with the training names. The held-out split always uses names never seen in training (apps,
# namespaces, node pools) and, for ``held_out_phrasing`` of its rows (default 0.5), a phrasing and
# a politeness wrapper never seen in training either.

APPS = {
    False: ["web", "api", "frontend", "backend", "cache", "worker", "auth", "billing", "search", "payments",
            "gateway", "checkout", "catalog", "inventory", "orders", "users", "metrics", "scheduler", "mailer",
            "uploader", "proxy", "redis", "postgres", "nginx", "kafka", "grafana", "shop", "blog", "cart", "media"],
    True: ["ledger", "reports", "chat", "images", "ratings", "analytics", "profile", "invoices", "video", "notes"],
}  # fmt: skip
NAMESPACES = {
    False: ["prod", "staging", "dev", "team-a", "monitoring", "kube-system", "data", "ci"],
    True: ["qa", "sandbox", "team-b", "ml"],
}
NODE_POOLS = {False: ["worker", "cpu", "infra", "pool-a", "spot", "mem"], True: ["edge", "metal"]}
IN_NAMESPACE = {
    False: [" in the {ns} namespace", " in namespace {ns}", " in {ns}", " (namespace {ns})"],
    True: [" within the {ns} namespace", " for namespace {ns}"],
}
WRAPPERS = {
    False: ["{r}", "{r}", "please {r}", "{r} please", "can you {r}?"],
    True: ["could you {r}?", "I want you to {r}", "{r}, thanks", "hey, {r}"],
}
KINDS = ["pods", "deployments", "services", "configmaps", "secrets", "jobs", "ingresses", "statefulsets"]
KIND = ["pod", "deployment", "service", "configmap", "job"]
PORTS = [80, 443, 3000, 5000, 8000, 8080, 8443, 9090]
TAGS = ["v1", "v2", "v1.2", "v2.0.1", "1.4.0", "2.1", "3.0.0", "latest"]

OPERATIONS: list[Operation] = [
    ("kubectl scale deployment {app} --replicas={n}",
     ["scale the {app} deployment to {n} replicas", "set deployment {app} to {n} replicas",
      "I need {n} replicas of {app}", "change the number of {app} replicas to {n}", "scale {app} to {n}"],
     ["run {n} replicas of the {app} deployment", "scale deployment {app} so it has {n} replicas"], True),
    ("kubectl get {kinds}",
     ["list all {kinds}", "show me the {kinds}", "display the {kinds}", "list {kinds}", "get the {kinds}"],
     ["show all the {kinds}", "list every one of the {kinds}"], True),
    ("kubectl logs {pod}",
     ["show the logs of pod {pod}", "print the logs for {pod}", "fetch the logs of {pod}", "get logs from {pod}"],
     ["display the logs from pod {pod}", "show me what pod {pod} wrote to its logs"], True),
    ("kubectl describe {kind} {app}",
     ["describe the {kind} {app}", "give me details about {kind} {app}", "show details of the {app} {kind}"],
     ["describe {kind} {app} in detail", "show me the details for the {kind} named {app}"], True),
    ("kubectl delete {kind} {app}",
     ["delete the {kind} {app}", "remove {kind} {app}", "destroy the {app} {kind}"],
     ["delete {kind} {app} now", "remove the {kind} named {app}"], True),
    ("kubectl rollout restart deployment {app}",
     ["restart the {app} deployment", "do a rolling restart of {app}", "restart all {app} pods"],
     ["restart deployment {app} gracefully", "perform a rolling restart of the {app} deployment"], True),
    ("kubectl create namespace {new_ns}",
     ["create a namespace called {new_ns}", "make a new namespace {new_ns}", "add namespace {new_ns}"],
     ["create the namespace {new_ns}", "make a namespace named {new_ns}"], False),
    ("kubectl expose deployment {app} --port={port}",
     ["expose the {app} deployment on port {port}", "create a service for {app} on port {port}",
      "open port {port} for deployment {app}"],
     ["expose {app} to port {port}", "create a service exposing deployment {app} on port {port}"], True),
    ("kubectl set image deployment/{app} {app}={app}:{tag}",
     ["update the {app} image to {tag}", "set the image of {app} to {app}:{tag}", "upgrade {app} to version {tag}"],
     ["upgrade the {app} deployment to {tag}", "update {app} so it runs image {app}:{tag}"], True),
    ("kubectl cordon {node}",
     ["cordon node {node}", "mark {node} as unschedulable", "cordon the node {node}"],
     ["mark the node {node} as unschedulable", "cordon off {node}"], False),
    ("kubectl drain {node} --ignore-daemonsets",
     ["drain node {node}", "evict all pods from {node}", "drain the node {node} for maintenance"],
     ["drain {node} before maintenance", "evict every pod from node {node}"], False),
]  # fmt: skip
