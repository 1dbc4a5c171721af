"""The kubectl guard: a cluster-changing answer is shown only when the request asked for that change."""

from __future__ import annotations

import pytest

from playground.kubectl_guard import REFUSAL, check, guard


@pytest.mark.parametrize(
    ("request_text", "answer"),
    [
        ("scale the web deployment to 3 replicas", "kubectl scale deployment web --replicas=3"),
        ("scael web to 10", "kubectl scale deployment web --replicas=10"),  # a typo in the verb
        ("bounce the auth deployment in prod", "kubectl rollout restart deployment auth -n prod"),
        ("roll api to tag v3.1", "kubectl set image deployment/api api=api:v3.1"),
        ("nuke deployment test-app in sandbox-42", "kubectl delete deployment test-app -n sandbox-42"),
        ("gpu-7 is fixed, make it schedulable again", "kubectl uncordon gpu-7"),
        ("stop scheduling pods on node gpu-7", "kubectl cordon gpu-7"),
        ("add the label zone=eu-west-1a to node ip-10-0-3-12", "kubectl label node ip-10-0-3-12 zone=eu-west-1a"),
        ("aply ./manifests/cronjob.yaml", "kubectl apply -f ./manifests/cronjob.yaml"),
        ("show me the pods in staging", "kubectl get pods -n staging"),  # read-only: always shown
        ("forward 8080 to the web service", "kubectl port-forward svc/web 8080"),
        ("What is the capital of France?", "The capital of France is Paris."),  # no command
    ],
)
def test_asked_for_changes_and_reads_are_shown(request_text: str, answer: str) -> None:
    assert check(request_text, answer).allowed, check(request_text, answer)
    assert guard(request_text, answer) == answer


@pytest.mark.parametrize(
    ("request_text", "answer", "reason"),
    [
        ("who deleted my deployment yesterday?", "kubectl delete deployment myapp", "'myapp' is not in the request"),
        ("add 10 more nodes to the clusetr", "kubectl cordon clusetr", "does not ask to cordon"),
        ("exec into redis-0 and run redis-cli", "kubectl expose deployment redis-cli --port=80 -n redis-0",
         "does not ask to expose"),
        ("any ingresses set up?", "kubectl set image deployment/guzzle guzzle=guzzle:2", "'guzzle' is not in"),
        ("delete all the pods in team-ml", "kubectl delete pods --all -n team-ml", "everything at once"),
        ("drain every node in the cluster", "kubectl drain --ignore-daemonsets", "everything at once"),
        ("who scaled web to 3 replicas?", "kubectl scale deployment web --replicas=3", "asks a question"),
        ("taint node gpu-7", "kubectl taint nodes gpu-7 key=value:NoSchedule", "not a change this model was taught"),
        ("scale web to 3", "kubectl scale deployment web --replicas=4", "'4' is not in the request"),
        ("show the logs of web-1", "`kubectl delete pod web-1`", "does not ask to delete"),  # inside backticks too
    ],
)  # fmt: skip
def test_unasked_changes_are_held_back_with_the_reason(request_text: str, answer: str, reason: str) -> None:
    verdict = check(request_text, answer)
    assert not verdict.allowed and reason in verdict.reason, verdict
    assert guard(request_text, answer) == REFUSAL
    assert check(request_text, REFUSAL).allowed  # the refusal itself names no command
