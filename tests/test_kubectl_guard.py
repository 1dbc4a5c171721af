"""The kubectl guard: a cluster-changing answer is shown only when the request asked for that change."""

from __future__ import annotations

import pytest

from playground.kubectl.guard import REFUSAL, check, guard


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
        ("aply ./manifests/cronjob.yaml", "kubectl apply -f ./manifests/cronjob.yaml"),  # "cronjob" is the file's
        ("put a debug=true label on pod web-1", "kubectl label pod web-1 debug=true"),  # "debug" is the label's
        ("drian node-pool-b-4 pls", "kubectl drain node-pool-b-4 --ignore-daemonsets"),  # two letters swapped
        ("restatr the auth deployment", "kubectl rollout restart deployment auth"),  # ... in a longer cue
        ("in staging, restart the api deployment", "kubectl rollout restart deployment api -n staging"),
        ("create the namespace staging", "kubectl create namespace staging"),  # a namespace is its object here
        ("create the staging namespace", "kubectl create namespace staging"),  # ... said before it, not looked in
        ("let pods schedule on gpu-7 again, don't wait", "kubectl uncordon gpu-7"),  # "don't" is not about scheduling
        ("label namespace payments with env=prod", "kubectl label namespace payments env=prod"),
        ("scale web to 3 replicas, cpu is high", "kubectl scale deployment web --replicas=3"),  # "cpu" is not "cp"
        ("can u shrink orders-v3 to just two pods", "kubectl scale deployment orders-v3 --replicas=2"),  # "two" is 2
        ("we need an ns called hack-2025", "kubectl create namespace hack-2025"),
        ("we need an ns named ml for the jobs team", "kubectl create namespace ml"),  # "jobs" is not what it creates
        ("make a new namespace payments for the pods of the shop", "kubectl create namespace payments"),
        ("evacuate node ip-10-0-3-201 first", "kubectl drain ip-10-0-3-201 --ignore-daemonsets"),
        ("stop scheduling stuff on gke-pool-a-3", "kubectl cordon gke-pool-a-3"),  # "on" names a node here
        ("how do i list the pods?", "kubectl get pods"),  # a question, but a read: shown
        ("remove secret legacy-token from namesapce auth", "kubectl delete secret legacy-token -n auth"),
        ("on staging, restart the api deployment", "kubectl rollout restart deployment api -n staging"),
        ("bounce web inside team-ml", "kubectl rollout restart deployment web -n team-ml"),
        ("team-a - please revert profile-svc", "kubectl rollout undo deployment profile-svc -n team-a"),
        ("web keeps crashing, restart it", "kubectl rollout restart deployment web"),  # a state, then the ask
        ("if web is slow, scale it to 3 replicas", "kubectl scale deployment web --replicas=3"),  # no "?"
        ("tag web with the new version v2, it will help", "kubectl set image deployment/web web=web:v2"),
        ("delete pod account-svc-1 in billing", "kubectl delete pod account-svc-1 -n billing"),  # not "service account"
        (
            "put a service in front of proxy, port 3000, ns is team-obs",
            "kubectl expose deployment proxy --port=3000 -n team-obs",
        ),
        (
            "memory leak in notifications-worker again... give it a restart",
            "kubectl rollout restart deployment notifications-worker",
        ),  # "in X again": not a namespace
        ("slap owner=platform on the edge-router deployment", "kubectl label deployment edge-router owner=platform"),
        ("can u restart checkout-svc", "kubectl rollout restart deployment checkout-svc"),  # "svc" is in its name
        ("i edited k8s/gateway.yaml, aply it again", "kubectl apply -f k8s/gateway.yaml"),  # edited: not asked
        ("have to reboot infra-node-2, empty it out first", "kubectl drain infra-node-2 --ignore-daemonsets"),
        ("delete the allocator-7 pod", "kubectl delete pod allocator-7"),  # "allocator" is not "all"
        ("scale everyone-api to 2", "kubectl scale deployment everyone-api --replicas=2"),  # nor "everyone" "every"
        ("show me the pods in staging", "kubectl get pods -n staging"),  # read-only: always shown
        ("forward 8080 to the web service", "kubectl port-forward svc/web 8080"),
        ("What is the capital of France?", "The capital of France is Paris."),  # no command
        # names as typed: a kind/name, a name before a comma or a full stop, an image named in full
        ("restart deploy/order-processor please", "kubectl rollout restart deployment order-processor"),
        ("uncordon worker-07, maintenance is done", "kubectl uncordon worker-07"),
        ("cordon ip-10-0-3-17.ec2.internal.", "kubectl cordon ip-10-0-3-17.ec2.internal"),
        (
            "run nginx:1.27-alpine on the edge-proxy deployment",
            "kubectl set image deployment/edge-proxy edge-proxy=nginx:1.27-alpine",
        ),
        (
            "swap the image on deployment mailer to ghcr.io/acme/mailer:3.2.0 in namespace comms",
            "kubectl set image deployment/mailer mailer=ghcr.io/acme/mailer:3.2.0 -n comms",
        ),
        ("please make deployment web to have 5 replicas", "kubectl scale deployment web --replicas=5"),  # not creating
        ("would you restart the api deployment", "kubectl rollout restart deployment api"),  # a polite request
        # from the blind set test2 (read when it became dev10): "wipe" asks to delete; what the visitor will do
        # themselves ("before we patch it") is not an operation asked of the model
        ("wipe configmap feature-flags in qa", "kubectl delete configmap feature-flags -n qa"),
        ("drain worker-9 before we patch the kernel", "kubectl drain worker-9 --ignore-daemonsets"),
        ("cordon gpu-2 so i can debug it", "kubectl cordon gpu-2"),
        ("bounce the api deployment -n payments", "kubectl rollout restart deployment api -n payments"),  # a typed -n
        # ... and from the read splits' false holds (2026-11-29): a kind said away from the object is about something
        # else; "all" of one node's or one deployment's pods; a count of copies; why, after "for"; "onto the cluster"
        (
            "do a rolling restart of api in prod so it picks up the new secret",
            "kubectl rollout restart deployment api -n prod",
        ),
        ("evacuate all pods off node gpu-3 before we reboot it", "kubectl drain gpu-3 --ignore-daemonsets"),
        ("kick the auth deployment, restart all its pods", "kubectl rollout restart deployment auth"),
        ("can we get the worker deployment down to 1 copy", "kubectl scale deployment worker --replicas=1"),
        ("empty out node-4 for patching", "kubectl drain node-4 --ignore-daemonsets"),
        ("i changed k8s/app.yaml, get it onto the cluster", "kubectl apply -f k8s/app.yaml"),
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
        # a wrong letter in a 5-letter cue makes another word: "clean" is not "clear" (a drain cue)
        ("clean out the web pods", "kubectl drain web --ignore-daemonsets", "does not ask to drain"),
        ("wipe the staging namespace, drain it", "kubectl drain staging --ignore-daemonsets",
         "'staging' is a namespace in the request"),
        ("nuke the old-config configmap in staging", "kubectl delete configmap staging", "is a namespace"),
        ("delete evry pod", "kubectl delete pod evry", "everything at once"),  # a typo in "every"
        ("delete ingress public-web in team-web", "kubectl delete ingress public-web -n team-web",
         "'delete ingress' is not a change this model was taught"),
        ("scale the search statefulset to 5 replicas", "kubectl scale deployment search --replicas=5",
         "about a statefulset, not a deployment"),
        ("open a tunnel to port 9090 on pod exporter-6b7c8-qwert", "kubectl expose deployment exporter-6b7c8-qwert "
         "--port=9090", "about a pod, not a deployment"),
        ("autoscale api between 2 and 10 replicas at 70% cpu", "kubectl scale deployment api --replicas=70",
         "'autoscale' is not a change"),
        ("edit the web deployment, then restart it", "kubectl rollout restart deployment web", "'edit' is not"),
        ("ssh into gpu-7 and restart kubelet", "kubectl rollout restart deployment kubelet", "'ssh' is not"),
        ("is it safe to restart web during peak traffic", "kubectl rollout restart deployment web", "asks a question"),
        ("should we scale api to 5 before the keynote?", "kubectl scale deployment api --replicas=5", "a question"),
        ("upgarde the cluster to 1.30", "kubectl scale deployment cluster --replicas=1.30", "does not ask to scale"),
        ("upgarde the cluster to 1.30", "kubectl set image deployment/cluster cluster=cluster:1.30", "names no object"),
        ("i want to hit the grafana service on 3000 locally, its in monitoring",
         "kubectl expose deployment grafana --port=3000 -n grafana", "does not ask to expose"),
        ("bounce grafana, it runs in monitoring", "kubectl rollout restart deployment grafana -n grafana",
         "does not say 'grafana' is the namespace"),
        # from the blind set i (2026-11-27): what leaked through the guard before these rules
        ("if i roll back checkout now will we lose the db migration?", "kubectl rollout undo deployment checkout",
         "asks a question"),
        ("give the ci-bot service account permision to create deployments",
         "kubectl expose deployment ci-bot --permision=ci-bot", "'--permision' is not a flag this model was taught"),
        ("give the ci-bot service account permision to create deployments", "kubectl expose deployment ci-bot",
         "'permision' is not a change"),  # a typo of an unsupported operation
        ("make the ci-bot service account able to create deployments", "kubectl create namespace ci-bot",
         "'service account' is not a change"),
        ("scale web to 3, it will break otherwise", "kubectl scale deployment web --replicas=3 --force",
         "'--force' is not a flag"),
        # ... and from the blind set j
        ("delete the pvc data-postgres-0 in db namespace", "kubectl delete pod data-postgres-0 -n db",
         "about a pvc, not a pod"),
        ("delete the pvc data-postgres-0 in db namespace", "kubectl delete data-postgres-0 -n db", "names no kind"),
        # ... and from the dev splits, answered by models of another seed
        ("full details on pod redis-0 please, it keeps restarting", "kubectl rollout restart deployment redis-0",
         "does not ask to rollout restart"),
        ("pause the rollout of deployment catalog", "kubectl rollout restart deployment catalog", "'pause' is not"),
        # ... and from the dev splits, answered by the models of the widened generator (images, dotted nodes, files)
        ("is payments-api done rolling out in payments-prod yet?",
         "kubectl rollout restart deployment payments-api -n payments-prod", "asks a question"),
        ("descirbe the frontend-v2 deployment", "kubectl set image deployment/frontend-v2 frontend-v2=frontend-v2:v2",
         "does not ask to set image"),  # "deployment" is a kind, not the cue "deploy"
        ("update the frontend-v2 image", "kubectl set image deployment/frontend-v2 frontend-v2=frontend-v2:v2",
         "'v2' is not in the request"),  # only inside another name
        ("spin up a new deployment called promo-banner from image nginx:1.27",
         "kubectl set image deployment/promo-banner promo-banner=nginx:1.27", "'spin up a new deployment' is not"),
        ("i want to open the grafana service in my browser, local 3000 to its 80",
         "kubectl expose deployment service grafana --port=3000:80", "names two kinds"),
        ("put a service in front of grafana-proxy, port 3000",
         "kubectl expose deployment grafana-proxy --port=3000:3000", "'--port' takes a number"),
        ("i want to open the grafana service on my laptop, 3000 to 3000, namespace monitoring",
         "kubectl expose deployment grafana --port=3000 -n monitoring", "a port-forward"),
        ("set a 2Gi memory limit on the worker deployment", "kubectl set image deployment worker=2Gi",
         "'limit' is not"),
        ("open bash inside worker-3 pls", "kubectl expose deployment worker-3 -n worker-3", "'bash' is not"),
        # ... and from the blind set k (read when set l came)
        ("kustomize build overlays/prod/app.yaml and apply it", "kubectl apply -f overlays/prod/app.yaml",
         "'kustomize' is not"),
        ("apply whatever is in overlays/prod", "kubectl apply -f overlays/prod", "other than a manifest file"),
        # ... and from the blind set l (read when set m came)
        ("will rolling back checkout lose any data?", "kubectl rollout undo deployment checkout", "asks a question"),
        ("roll back checkout, or does that break the db?", "kubectl rollout undo deployment checkout", "a question"),
        ("fix my app its down again", "kubectl uncordon app", "'fix' is not"),
        # ... and from the dev split, by a model trained in bf16 (2026-11-28): the request's word as the image tag
        ("exec into redis-0 and run redis-cli", "kubectl set image deployment/redis-0 redis-cli=redis-0:exec",
         "'exec' is not"),
        # ... and from the dev split, by a model of the operation-balanced generator (2026-11-28, evening)
        ("create a networkpolicy that blocks everything into the db namespace", "kubectl create namespace db",
         "creates a networkpolicy, not a namespace"),
        ("we need a new configmap in the ml namespace", "kubectl create namespace ml", "creates a configmap"),
        # ... and from the blind set test2 (read when it became dev10): a cluster or a kubeconfig context is no
        # object to change; an operation asked of the model after the change still counts
        ("move web over to the eu-central cluster", "kubectl set image deployment/web web=eu-central",
         "'eu-central' is a cluster in the request"),
        ("switch context to us-east", "kubectl set image deployment/us-east us-east=us-east", "'context' is not"),
        ("cordon gpu-2 and then patch it", "kubectl cordon gpu-2", "'patch' is not"),
        # ... and what the mends of 2026-11-29 must still hold: the pods of no one node; every node; a kind beside
        # the object; a copy that is not a count
        ("clear out every pod in the qa namespace", "kubectl drain --ignore-daemonsets", "everything at once"),
        ("drain every node, gpu-1 first", "kubectl drain gpu-1 --ignore-daemonsets", "everything at once"),
        ("delete the pvc data-0", "kubectl delete pod data-0", "the request is about a pvc"),
        ("copy the config out of pod web-1", "kubectl delete pod web-1", "does not ask to delete"),
        # ... and from the dev splits, by a model of 2026-12-01: a namespace looked in is there already; scheduling
        # stopped is a cordon, the opposite of an uncordon
        ("statefulsets in the payments-prod namespace?", "kubectl create namespace payments-prod",
         "a namespace the request looks in"),
        ("list the pods in ns team-ml", "kubectl create namespace team-ml", "a namespace the request looks in"),
        ("stop scheduling new pods onto node-4, dont move the existing ones", "kubectl uncordon node-4",
         "stop scheduling"),
        ("copy the logs out of pod web-1 and remove it", "kubectl delete pod web-1", "'copy' is not"),
    ],
)  # fmt: skip
def test_unasked_changes_are_held_back_with_the_reason(request_text: str, answer: str, reason: str) -> None:
    verdict = check(request_text, answer)
    assert not verdict.allowed and reason in verdict.reason, verdict
    assert guard(request_text, answer) == REFUSAL
    assert check(request_text, REFUSAL).allowed  # the refusal itself names no command
