"""The namespace the request says, added to a bare kubectl answer that has none (playground/kubectl/answer.py)."""

from __future__ import annotations

import pytest

from playground.kubectl.answer import added_namespace, complete
from playground.kubectl.guard import check


@pytest.mark.parametrize(
    ("request_text", "answer", "completed"),
    [
        ("show me the pods in payments", "kubectl get pods", "kubectl get pods -n payments"),
        ("what pods are in the team-ml namespace?", "kubectl get pods", "kubectl get pods -n team-ml"),
        ("staging: scale api to 3", "kubectl scale deployment api --replicas=3",
         "kubectl scale deployment api --replicas=3 -n staging"),  # said first
        ("restart nginx plz -n web", "kubectl rollout restart deployment nginx",
         "kubectl rollout restart deployment nginx -n web"),  # typed as the flag
        ("logs of worker-7f9c8b-zt5qd, in the jobs namespace", "kubectl logs worker-7f9c8b-zt5qd",
         "kubectl logs worker-7f9c8b-zt5qd -n jobs"),  # a namespace named like a kind the command is not about
        ("apply k8s/billing.yml in billing", "kubectl apply -f k8s/billing.yml",
         "kubectl apply -f k8s/billing.yml -n billing"),
    ],
)  # fmt: skip
def test_a_bare_command_gets_the_namespace_the_request_says(request_text: str, answer: str, completed: str) -> None:
    assert complete(request_text, answer) == completed
    assert check(request_text, completed).allowed  # the guard reads the same namespace: a change asked stays shown


@pytest.mark.parametrize(
    ("request_text", "answer"),
    [
        ("show me the pods in payments", "kubectl get pods -n payments"),  # it has one
        ("show me the pods in payments", "kubectl get pods -n billing"),  # ... even a wrong one: not ours to change
        ("show me the pods in payments", "kubectl get pods -A"),  # every namespace, asked or not
        ("cordon gpu-7 in prod", "kubectl cordon gpu-7"),  # nodes live in no namespace
        ("list the nodes in the prod cluster", "kubectl get nodes"),
        ("describe the staging namespace", "kubectl describe namespace staging"),
        ("create a namespace called team-ml", "kubectl create namespace team-ml"),
        ("pod auth-6f7c-8hjkl is stuck in pending, describe it", "kubectl describe pod auth-6f7c-8hjkl"),  # a state
        ("whats going on in the cluster? show me events", "kubectl get events"),  # a place, not a namespace
        ("list deployments namespace payments", "kubectl get deployments"),  # "deployments namespace": a kind
        ("copy pods from prod to staging", "kubectl get pods"),  # no namespace said for sure
        ("pods in prod, or in staging", "kubectl get pods"),  # two: which one is a guess
        ("show me the pods in payments", "Run `kubectl get pods` to see them."),  # prose: not a bare command
        ("show me the pods in payments", "Sorry, I can't turn that into a single command."),
        ("scale the prod deployment in prod to 2", "kubectl scale deployment prod --replicas=2"),  # its own object
    ],
)
def test_anything_else_is_left_as_given(request_text: str, answer: str) -> None:
    assert added_namespace(request_text, answer) is None
    assert complete(request_text, answer) == answer
