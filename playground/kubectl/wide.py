"""The kubectl task as visitors type it (dataset option ``operations: wide``): more operations, synonyms,
other word orders, typos, and requests no single kubectl command answers.

The core task (:mod:`playground.kubectl.core`: 11 operations, tidy phrasings) is what the DPO and
GRPO blueprints train and measure on. The embedded default blueprint trains on this wider one, because booth
visitors ask for ``port-forward``, ``label``, ``apply -f`` and ``top``, say "bounce" and "roll back", put the
namespace first and mistype words. A request outside the supported operations ("open a shell in pod web-1",
"delete everything in prod") is answered with :data:`REFUSAL`, never with a command that would change the
cluster.

The visitor-style set that measures this (benchmarks/data/visitor_requests.jsonl) was written separately from
these templates; tests/test_kubectl_wide.py checks that none of its requests is one this generator makes.
"""

from __future__ import annotations

import random
from typing import Any

from playground.kubectl.core import KINDS as CORE_KINDS

REFUSAL = "Sorry, I can't turn that into a single command."
# Visitors spell small counts out ("scale web to three"); the command takes the digit.
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve")  # fmt: skip

# Training phrasings added to the core operations (keyed by the core command): synonyms and word orders.
EXTRA_PHRASINGS: dict[str, list[str]] = {
    "kubectl scale deployment {app} --replicas={n}": [
        "bump {app} to {n} replicas", "resize the {app} deployment to {n}", "{app} should run {n} replicas",
        "make it {n} replicas for {app}", "set replicas of {app} to {n}", "{n} replicas for the {app} deployment",
        "shrink {app} to {n} replicas", "take {app} down to {n} replicas", "{app} needs {n} copies running",
        "make deployment {app} run {n} replicas", "bring the {app} deployment up to {n} replicas",
    ],
    "kubectl get {kinds}": [
        "what {kinds} are there", "which {kinds} exist", "what {kinds} do we have", "any {kinds}?",
        "{kinds} list", "gimme the {kinds}",
    ],
    "kubectl logs {pod}": [
        "what did pod {pod} log", "logs of {pod}", "check the logs of pod {pod}", "{pod} logs",
        "let me see the output of pod {pod}", "what is {pod} printing", "stdout of pod {pod}",
        "pull the logs off {pod}",
        "dump the logs of {pod}", "what is pod {pod} writing out", "output of {pod} please",
    ],
    "kubectl describe {kind} {app}": [
        "inspect the {kind} {app}", "what's going on with {kind} {app}", "info on the {app} {kind}",
        "tell me about {kind} {app}", "full details on {kind} {app}", "break down the {kind} {app} for me",
    ],
    "kubectl delete {kind} {app}": [
        "get rid of the {kind} {app}", "nuke {kind} {app}", "kill the {app} {kind}", "{kind} {app} must go, delete it",
        "trash the {kind} {app}", "the {kind} {app} is not needed anymore, remove it",
        "remove the {kind} {app}", "delete {kind} {app}", "{kind} {app} can go", "drop the {app} {kind}",
        "clean up {kind} {app}, it is done", "erase the {kind} {app}",
    ],
    "kubectl rollout restart deployment {app}": [
        "bounce the {app} deployment", "bounce {app}", "kick the {app} pods", "recycle the {app} deployment",
        "restart {app}", "cycle the {app} pods", "rolling restart for {app}",
        "restart the deployment {app}", "restart deployment {app}", "{app} is wedged, restart it",
        "give the {app} deployment a restart",
    ],
    "kubectl create namespace {new_ns}": [
        "set up a namespace {new_ns}", "new namespace {new_ns}", "I need a namespace called {new_ns}",
        "spin up a namespace {new_ns}", "we need an ns named {new_ns}",
    ],
    "kubectl expose deployment {app} --port={port}": [
        "make {app} reachable on port {port}", "put a service in front of {app} on port {port}",
        "publish deployment {app} on port {port}", "expose {app} on {port}", "a service for {app} on port {port}",
    ],
    "kubectl set image deployment/{app} {app}={app}:{tag}": [
        "roll {app} to tag {tag}", "deploy version {tag} of {app}", "ship {tag} to {app}", "{app} to image tag {tag}",
        "move {app} to {tag}", "switch {app} to image tag {tag}", "put {app} on version {tag}",
        "ship version {tag} of {app}", "roll out tag {tag} to the {app} deployment", "release {tag} of {app}",
        "{app} should run image tag {tag}",
    ],
    "kubectl cordon {node}": [
        "stop scheduling pods on node {node}", "no new pods on {node}", "keep new pods off node {node}",
        "make {node} unschedulable", "mark node {node} unschedulable", "take {node} out of scheduling",
        "stop new pods landing on {node}", "no more scheduling onto {node}, keep what runs there",
    ],
    "kubectl drain {node} --ignore-daemonsets": [
        "empty node {node}", "move all pods off {node}", "get every pod off node {node}", "clear out node {node}",
        "evacuate node {node}", "evacuate {node}", "empty out {node} for maintenance",
        "get {node} ready for maintenance",
    ],
}  # fmt: skip

# (command, training phrasings, held-out phrasings, takes a namespace): the operations beyond the core 11.
EXTRA_OPS: list[tuple[str, list[str], list[str], bool]] = [
    ("kubectl uncordon {node}",
     ["uncordon node {node}", "make {node} schedulable again", "allow pods on node {node} again",
      "let pods schedule on {node} again", "undo the cordon on {node}", "put {node} back in rotation",
      "let pods land on {node} again"],
     ["mark node {node} schedulable", "put {node} back into scheduling"], False),
    ("kubectl rollout undo deployment {app}",
     ["roll back the {app} deployment", "undo the last rollout of {app}", "revert {app} to the previous version",
      "rollback {app}", "go back to the previous {app} release", "put the previous version of {app} back"],
     ["roll {app} back one version", "revert the {app} deployment"], True),
    ("kubectl rollout status deployment {app}",
     ["is the {app} rollout done", "check the rollout status of {app}", "how is the {app} rollout going",
      "watch the {app} deployment roll out", "has {app} finished rolling out?"],
     ["status of the {app} rollout", "is deployment {app} fully rolled out"], True),
    ("kubectl port-forward pod/{pod} {port}",
     ["port-forward pod {pod} on port {port}", "forward port {port} to pod {pod}", "forward local {port} to {pod}",
      "tunnel port {port} of pod {pod} to my machine", "reach pod {pod} from my machine on port {port}",
      "connect my laptop to port {port} of pod {pod}", "local access to pod {pod} on {port}"],
     ["open a local port {port} to pod {pod}", "port forward {port} into pod {pod}"], True),
    ("kubectl port-forward service/{app} {port}",
     ["port-forward the {app} service on {port}", "forward port {port} to service {app}",
      "reach the {app} service locally on port {port}", "port-forward svc {app} {port}",
      "hit the {app} service from my laptop on {port}", "open the {app} service in my browser on port {port}",
      "access service {app} locally on {port}"],
     ["forward local port {port} to the {app} service", "tunnel to service {app} on port {port}"], True),
    ("kubectl port-forward service/{app} {lport}:{port}",
     ["forward local port {lport} to port {port} of service {app}", "port-forward svc {app} from {lport} to {port}",
      "map my port {lport} to the {app} service's port {port}", "map local {lport} onto the {app} svc port {port}",
      "open service {app} on my laptop, local {lport} to its {port}", "{lport} locally to {port} on the {app} service"],
     ["tunnel local {lport} to {app} service port {port}"], True),
    ("kubectl port-forward pod/{pod} {lport}:{port}",
     ["forward local port {lport} to port {port} of pod {pod}", "port-forward pod {pod} from {lport} to {port}",
      "map my port {lport} to port {port} on pod {pod}", "{lport} on my side to {port} in pod {pod}, port-forward",
      "reach pod {pod} locally, my {lport} to its {port}", "tunnel from my {lport} to {port} on pod {pod}"],
     ["tunnel local {lport} to pod {pod} port {port}"], True),
    ("kubectl set image deployment/{app} {app}={image}",
     ["set the image of {app} to {image}", "use image {image} for the {app} deployment",
      "run {image} on the {app} deployment", "swap the {app} image for {image}", "point {app} at image {image}",
      "change the image of deployment {app} to {image}", "deploy {image} to {app}"],
     ["switch deployment {app} to the image {image}", "update {app} so it runs {image}"], True),
    ("kubectl label {lkind} {lname} {key}={value}",
     ["label {lkind} {lname} with {key}={value}", "add the label {key}={value} to {lkind} {lname}",
      "tag {lkind} {lname} as {key}={value}", "put label {key}={value} on the {lname} {lkind}",
      "stick a {key}={value} label on the {lname} {lkind}", "{lkind} {lname} needs the label {key}={value}",
      "put {key}={value} on the {lkind} {lname}", "the {lname} {lkind} should carry {key}={value}",
      "mark {lkind} {lname} with label {key}={value}"],
     ["give {lkind} {lname} the label {key}={value}", "set label {key}={value} on {lkind} {lname}"], False),
    ("kubectl apply -f {file}",
     ["apply {file}", "apply the manifest {file}", "deploy the file {file}", "create the resources in {file}",
      "kubectl apply my {file}", "load {file} into the cluster", "get {file} onto the cluster"],
     ["apply the yaml in {file}", "push the manifest {file} to the cluster"], True),
    ("kubectl top pods",
     ["show pod cpu and memory usage", "which pods use the most cpu", "resource usage of the pods",
      "how much memory are the pods using", "which pods eat the most cpu", "cpu and mem numbers for the pods"],
     ["pod resource consumption", "cpu and memory of all pods"], True),
    ("kubectl top nodes",
     ["show node cpu and memory usage", "how loaded are the nodes", "resource usage of the nodes",
      "which node uses the most memory"],
     ["node resource consumption", "cpu and memory of every node"], False),
    ("kubectl top pod {pod}",
     ["how much cpu is pod {pod} using", "resource usage of pod {pod}", "memory used by {pod}",
      "how much ram is {pod} using"],
     ["cpu and memory of pod {pod}"], True),
    ("kubectl get events",
     ["show the events", "what happened recently in the cluster", "list recent events", "any events?",
      "dump the events"],
     ["show me the latest events", "list all cluster events"], True),
    ("kubectl get nodes",
     ["list the nodes", "which nodes do we have", "show all nodes", "how many nodes are there",
      "list the machines in the cluster"],
     ["display every node", "what nodes are in the cluster"], False),
    ("kubectl get namespaces",
     ["list the namespaces", "which namespaces exist", "show all namespaces"],
     ["what namespaces are there", "display every namespace"], False),
    ("kubectl describe node {node}",
     ["describe node {node}", "details of node {node}", "what's wrong with node {node}"],
     ["inspect the node {node}"], False),
    ("kubectl get secrets",
     ["list the secrets", "which secrets are there", "show me all secrets"],
     ["what secrets do we have"], True),
    ("kubectl describe secret {app}",
     ["describe the secret {app}", "details of secret {app}"],
     ["inspect secret {app}"], True),
    ("kubectl delete secret {app}",
     ["delete the secret {app}", "remove secret {app}"],
     ["get rid of secret {app}"], True),
]  # fmt: skip

# Requests no supported operation answers (the model says so: REFUSAL). Bulk and cluster-wide changes are here on
# purpose: no single command of the supported ones does them, and a guess would change the cluster.
UNSUPPORTED: dict[bool, list[str]] = {
    False: [
        "open a shell in pod {pod}", "ssh into node {node}", "upgrade the cluster to kubernetes 1.{minor}",
        "install the {app} helm chart", "open the {app} deployment in an editor",
        "autoscale {app} between 2 and {n} replicas", "copy the log folder out of pod {pod}", "taint node {node}",
        "delete everything in {ns}", "give {user} admin access", "make the {app} deployment faster",
        "fix the {app} deployment", "back up etcd", "create a cronjob that runs {app} every hour",
        "annotate the {app} deployment", "patch the {app} service", "delete all pods", "wipe the {ns} namespace",
        "reboot node {node}", "show me the kubeconfig", "create a deployment for {app}",
        "run a debug container in {pod}", "why is {app} slow", "what is the password of the {app} database",
        "remove every namespace", "scale everything to zero", "restart the whole cluster",
        "give me the cluster admin token", "delete all {kinds} in {ns}", "remove every {kind} in {ns}",
        "drain all the nodes", "cordon every node", "restart every deployment in {ns}",
        "who changed the {app} deployment",
        "rotate the cluster certificates", "add {n} nodes to the cluster", "install prometheus on the cluster",
        "run the {app} migrations in pod {pod}", "set up tls for {app}", "write a poem about {kinds}",
        "move {app} to another cluster", "clean up the old {kinds}", "kill all the {kinds} on {node}",
        "tell me a joke about kubernetes", "how much does the cluster cost", "when was {app} last deployed",
    ],
    True: [
        "exec into pod {pod}", "helm upgrade {app}", "grant {user} cluster-admin", "delete all the deployments in {ns}",
        "tune {app} for more speed", "set up an hpa for {app}", "shut down the cluster", "cp a file into pod {pod}",
        "erase every {kind} in {ns}", "who broke {app}",
    ],
}  # fmt: skip
_USERS = ["alice", "bob", "ci-bot", "dana", "sam"]

# Why a visitor asks, said after the request ("drain gpu-7 so we can reboot it", "restart api, config changed"): the
# why names other verbs (reboot, upgrade, crash) but never changes what is asked. The dataset option
# ``reason_fraction`` puts one after that share of the training rows (the held-out set stays the 3-minute bar's); keyed
# by the command, with reasons any request may carry. Off by default: at 0.2 four seeds gained nothing on the unread
# test split and lost 0.035 held-out (benchmarks/README.md, "Reasons after the request").
REASONS: dict[str, list[str]] = {
    "kubectl scale deployment {app} --replicas={n}": [
        ", traffic is spiking", " for the launch tonight", ", we're saving money", ", the load test starts soon",
        ", it's costing too much", " until the incident is over", ", marketing sends the newsletter at noon",
    ],
    "kubectl logs {pod}": [
        ", it keeps crashing", ", it keeps returning 500s", ", something broke at 3am", ", it restarted twice",
        " so I can see why it failed", ", users see errors",
    ],
    "kubectl describe {kind} {app}": [
        ", it's stuck pending", ", it keeps restarting", ", something looks off", ", it won't come up",
        " so I can see its events",
    ],
    "kubectl delete {kind} {app}": [
        ", nobody uses it anymore", ", the demo is over", ", it's finished", ", it's broken anyway",
        ", it was a test", " so we can start clean",
    ],
    "kubectl rollout restart deployment {app}": [
        ", the config changed", ", it's leaking memory", " so it picks up the new secret", ", it cached bad data",
        ", it's hanging", " so the pods reload their config",
    ],
    "kubectl create namespace {new_ns}": [" for the new team", " for the hackathon", ", it's for the pilot"],
    "kubectl expose deployment {app} --port={port}": [
        " so other pods can reach it", ", the frontend needs to call it", " so the team can test it",
    ],
    "kubectl set image deployment/{app} {app}={app}:{tag}": [
        ", the fix is in that tag", ", QA signed it off", ", it has the security patch", " before the release",
    ],
    "kubectl set image deployment/{app} {app}={image}": [", the old image has a CVE", ", that build is tested"],
    "kubectl cordon {node}": [
        " so we can reboot it later", ", its disk looks bad", ", we're replacing that vm", ", hardware issue",
        " before the kernel upgrade", ", the hardware team is looking at it", ", we want to upgrade it tomorrow",
    ],
    "kubectl drain {node} --ignore-daemonsets": [
        " so we can reboot it", " before we upgrade the kernel", ", it's getting recycled", ", we're replacing it",
        ", the firmware update starts soon", " before it gets terminated", ", maintenance starts in 5 minutes",
    ],
    "kubectl uncordon {node}": [", maintenance is done", ", the reboot finished", ", the disk was replaced"],
    "kubectl rollout undo deployment {app}": [
        ", the last deploy broke it", ", the new version is throwing errors", ", customers see 500s",
    ],
    "kubectl rollout status deployment {app}": [", my manager is asking", ", the release is waiting on it"],
    "kubectl port-forward pod/{pod} {port}": [" so I can debug it", ", I want to poke at it locally"],
    "kubectl port-forward service/{app} {port}": [" so I can open it in my browser", ", I want to test it locally"],
    "kubectl port-forward service/{app} {lport}:{port}": [", my {port} is taken locally", " so I can test it"],
    "kubectl port-forward pod/{pod} {lport}:{port}": [", my {port} is taken locally", " so I can debug it"],
    "kubectl label {lkind} {lname} {key}={value}": [
        " so the scheduler can pick it", ", the cost report needs it", " so the policy matches it",
    ],
    "kubectl apply -f {file}": [", I edited it", ", the team changed it", ", it has the new limits"],
    "kubectl top pods": [", something feels slow", ", the node is under pressure"],
    "kubectl top nodes": [", the cluster feels slow", ", we may need more machines"],
    "kubectl get events": [", something is off", ", pods keep failing"],
    "kubectl get nodes": [", want to see if the new ones joined", " after the upgrade"],
}  # fmt: skip
ANY_REASON = [", it's urgent", ", my boss is asking", " asap, we're in an incident", ", I'm on call",
              ", thanks in advance"]  # fmt: skip

_NS_FIRST = {False: ["in {ns}: {r}", "{ns} namespace: {r}", "in the {ns} namespace, {r}", "on {ns}, {r}",
                    "{ns} ns: {r}", "in {ns} {r}"],
             True: ["for the {ns} namespace: {r}", "namespace {ns}, {r}"]}  # fmt: skip
IN_NAMESPACE = {False: [" inside {ns}", " over in {ns}", " in the {ns} ns"], True: [" over in the {ns} namespace"]}
WIDE_WRAPPERS = {False: ["{r}", "{r}", "{r} pls", "{r}?", "{r} thx", "quick one: {r}"], True: ["{r} asap", "yo {r}"]}
_LABEL_KINDS = ["pod", "node", "deployment", "namespace"]
_LABEL_KEYS = {False: ["env", "team", "tier", "gpu", "owner", "app", "accelerator", "cost-center", "region",
                       "disktype", "version"],
               True: ["zone", "release", "purpose"]}  # fmt: skip
_LABEL_VALUES = {False: ["prod", "ml", "frontend", "true", "alice", "blue", "a10", "ssd", "v2", "growth", "eu-west",
                         "false"],
                 True: ["east", "canary", "batch"]}  # fmt: skip
_FILE_FORMS = {False: ["{app}.yaml", "k8s/{app}.yaml", "deploy/{app}-deployment.yaml", "manifests/{app}.yml",
                       "{app}-service.yaml", "k8s/{app}-{part}.yaml", "./manifests/{app}-{part}.yaml",
                       "overlays/{env}/{part}.yaml", "./k8s/{app}.yml", "{part}.yaml"],
               True: ["config/{app}.yaml", "./{app}-manifest.yaml", "./overlays/{env}/{app}-{part}.yaml"]}  # fmt: skip
_FILE_PARTS = ["deployment", "service", "configmap", "ingress", "statefulset", "cronjob", "secret", "job"]
_ENVS = ["prod", "staging", "dev", "qa"]
# Images named in full (a registry, another image): ``set image deployment/web web=ghcr.io/acme/web:v2``.
_IMAGE_FORMS = {False: ["{registry}/{org}/{app}:{tag}", "{registry}/{app}:{tag}", "{public}"],
                True: ["{registry}/{org}/{app}:{tag}", "{public}"]}  # fmt: skip
_REGISTRIES = {False: ["ghcr.io", "quay.io", "docker.io", "registry.example.com", "myregistry.io", "gcr.io"],
               True: ["registry.gitlab.com", "acr.example.net"]}  # fmt: skip
_ORGS = ["acme", "platform", "team-ml", "corp", "infra"]
_PUBLIC_IMAGES = {False: ["nginx:1.25-alpine", "nginx:1.27", "redis:7.2", "postgres:16.3", "busybox:1.36",
                          "python:3.12-slim", "node:20-alpine", "httpd:2.4", "traefik:v3.1",
                          "envoyproxy/envoy:v1.30.1"],
                  True: ["memcached:1.6-alpine", "haproxy:2.9", "rabbitmq:3.13-management"]}  # fmt: skip


# The kinds ``get`` lists on the wide task: the core ones and the other workload kinds visitors ask for.
_WIDE_KINDS = [*CORE_KINDS, "cronjobs", "daemonsets", "replicasets"]
_NAME_SUFFIXES = ["", "", "", "", "-api", "-svc", "-v2", "-worker", "-db", "-web", "-service", "-2", "-ui", "-job",
                  "-prod", "-app"]  # fmt: skip
_NAME_PREFIXES = ["old", "new", "legacy", "internal", "public", "tmp"]
_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_NODE_SHAPES = {False: ["{pool}-{i}", "{pool}-{i}", "ip-10-0-{i}-{j}", "gpu-{i}", "node-{i}", "{pool}-node-{i}",
                        "ip-10-0-{i}-{j}.ec2.internal", "gke-{pool}-pool-{k}-{hex}-{tail}",
                        "aks-{pool}{k}-{digits}-vmss{serial}"],
                True: ["{pool}-{i}", "ip-172-31-{i}-{j}", "worker-{pool}-{i}",
                       "ip-192-168-{i}-{j}.us-west-2.compute.internal"]}  # fmt: skip
_NAMESPACE_SHAPES = ["{ns}", "{ns}", "{ns}", "team-{word}", "{ns}-{i}", "{word}-{ns}"]
_PORTS = [80, 443, 3000, 5000, 5432, 6379, 8000, 8080, 8081, 8443, 9000, 9090, 27017, 3306]


def _random(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_ALNUM) for _ in range(n))


def names(rng: random.Random, held_out: bool, words: list[str], namespaces: list[str], pools: list[str]) -> dict:
    """Names shaped like visitors' (``payments-api``, ``web-7d9f8-x2k4q``, ``ip-10-0-3-12``, ``team-ml``), drawn
    from the split's own words: the shapes are learnt, the held-out words are never seen."""
    app = rng.choice(words)
    if rng.random() < 0.15:
        app = f"{app}-{rng.choice(words)}"
    if rng.random() < 0.08:
        app = f"{rng.choice(_NAME_PREFIXES)}-{app}"
    app += rng.choice(_NAME_SUFFIXES)
    pod = rng.choice([f"{app}-{rng.randint(0, 9)}", f"{app}-{_random(rng, 5)}-{_random(rng, 5)}",
                      f"{app}-{_random(rng, 9)}-{_random(rng, 5)}", f"{app}-{rng.randint(0, 3)}"])  # fmt: skip
    node = rng.choice(_NODE_SHAPES[held_out]).format(
        pool=rng.choice(pools),
        i=rng.randint(1, 40),
        j=rng.randint(1, 254),
        k=rng.randint(1, 4),
        hex="".join(rng.choice("0123456789abcdef") for _ in range(8)),
        tail=_random(rng, 4),
        digits=rng.randint(10000, 99999),
        serial=f"{rng.randint(0, 30):06d}",
    )
    major, minor, patch = rng.randint(0, 9), rng.randint(0, 20), rng.randint(0, 9)
    tag = rng.choice([f"v{major}.{minor}", f"{major}.{minor}.{patch}", f"v{major}.{minor}.{patch}-rc{patch + 1}",
                      f"20{rng.randint(23, 26)}.{minor % 12 + 1:02d}.{patch}", "latest", f"v{major}"])  # fmt: skip
    return {
        "app": app,
        "kinds": rng.choice(_WIDE_KINDS),
        "pod": pod,
        "node": node,
        "tag": tag,
        "n": rng.choice([rng.randint(0, 12), rng.randint(0, 50)]),
        "port": rng.choice(_PORTS),
        "new_ns": namespace(rng, words, namespaces),
    }


def namespace(rng: random.Random, words: list[str], namespaces: list[str]) -> str:
    return rng.choice(_NAMESPACE_SHAPES).format(ns=rng.choice(namespaces), word=rng.choice(words), i=rng.randint(1, 99))


def extra_values(rng: random.Random, held_out: bool, values: dict[str, Any]) -> dict[str, Any]:
    """The values the extra operations and unsupported requests take, beyond the core ones."""
    lkind = rng.choice(_LABEL_KINDS)
    lname = {"pod": values["pod"], "node": values["node"], "deployment": values["app"], "namespace": values["new_ns"]}
    lport = rng.choice([p for p in (3000, 5000, 8000, 8080, 9000, 9090) if p != values["port"]])
    return {
        "lkind": lkind,
        "lname": lname[lkind],
        "key": rng.choice(_LABEL_KEYS[held_out]),
        "value": rng.choice(_LABEL_VALUES[held_out]),
        "file": rng.choice(_FILE_FORMS[held_out]).format(
            app=values["app"], part=rng.choice(_FILE_PARTS), env=rng.choice(_ENVS)
        ),
        "image": rng.choice(_IMAGE_FORMS[held_out]).format(
            registry=rng.choice(_REGISTRIES[held_out]),
            org=rng.choice(_ORGS),
            app=values["app"],
            tag=values["tag"],
            public=rng.choice(_PUBLIC_IMAGES[held_out]),
        ),
        "lport": lport,
        "minor": rng.randint(26, 33),
        "user": rng.choice(_USERS),
        "ns": values["new_ns"],
    }


def wide_ops(core: list[tuple[str, list[str], list[str], bool]]) -> list[tuple[str, list[str], list[str], bool]]:
    """The core operations with their extra training phrasings, then the extra operations."""
    widened = [(cmd, [*train, *EXTRA_PHRASINGS.get(cmd, [])], held, ns) for cmd, train, held, ns in core]
    return widened + EXTRA_OPS


def namespace_first(rng: random.Random, request: str, namespace: str, unseen: bool) -> str:
    """The request with its namespace said first ("in prod: scale web to 3")."""
    return rng.choice(_NS_FIRST[unseen]).format(ns=namespace, r=request)


def typo(rng: random.Random, text: str, protected: set[str]) -> str:
    """``text`` with one realistic typo (two letters swapped, one dropped or doubled) in a word of at least 4
    letters that is not a name (names must stay as the command needs them)."""
    words = text.split(" ")
    candidates = [i for i, w in enumerate(words) if len(w) >= 4 and w.isalpha() and w.lower() not in protected]
    if not candidates:
        return text
    i = rng.choice(candidates)
    word = words[i]
    at = rng.randrange(1, len(word) - 2)
    kind = rng.randrange(3)
    if kind == 0:
        word = word[:at] + word[at + 1] + word[at] + word[at + 2 :]
    elif kind == 1:
        word = word[:at] + word[at + 1 :]
    else:
        word = word[:at] + word[at] + word[at:]
    words[i] = word
    return " ".join(words)


def unsupported_request(rng: random.Random, held_out: bool, values: dict[str, Any]) -> tuple[str, bool]:
    """An unsupported request, and whether a namespace may be said with it: it names a namespaced object and no
    namespace, node or cluster of its own ("open a shell in pod web-1 in prod" is still refused). Said as often as
    with a supported request, a namespace is no sign that a request is supported: without refusals that say one,
    models refused plain requests that said none ("restart the api deployment"; benchmarks/README.md, "Plain
    requests refused")."""
    template = rng.choice(UNSUPPORTED[held_out])
    return template.format(**values), _takes_namespace(template)


def _takes_namespace(template: str) -> bool:
    named = any(part in template for part in ("{app}", "{pod}", "{kind}", "{kinds}", " pods", "everything to"))
    return named and not any(part in template for part in ("{ns}", "node", "cluster", "namespace"))  # "{node}" too


def fit_values(rng: random.Random, command: str, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values for one request and for its command: a pod a command deletes or describes is named like a pod
    (``web-7d9f8-x2k4q``, as ``logs`` names it), and a quarter of small replica counts are spelt out in the request
    ("scale web to three") while the command keeps the digit."""
    values = dict(values)
    if "{kind}" in command and values["kind"] == "pod" and rng.random() < 0.7:
        values["app"] = values["pod"]
    spoken = dict(values)
    if "{n}" in command and values["n"] < len(NUMBER_WORDS) and rng.random() < 0.25:
        spoken["n"] = NUMBER_WORDS[values["n"]]
    return spoken, values


def with_reason(rng: random.Random, request: str, command: str | None, values: dict[str, Any]) -> str:
    """``request`` with a reason after it ("drain gpu-7 so we can reboot it"): the operation's own reasons, or one any
    request may carry. ``command`` is None for a request no command answers (the reason does not make it one)."""
    own = REASONS.get(command or "", [])
    reason = rng.choice(own if own and rng.random() < 0.8 else ANY_REASON)
    return request + reason.format(**values)
