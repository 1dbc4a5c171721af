"""A kubectl answer completed from the request: the namespace the visitor said, where the model left it out
("show me the pods in payments" answered ``kubectl get pods`` → ``kubectl get pods -n payments``).

A 135M model fine-tuned for three minutes drops the ``-n`` now and then, and some training runs drop it often: one
seed of three measured on 2026-12-01 gave 45 answers without the namespace the request said, a third of its misses
on the read visitor splits (benchmarks/README.md, "The namespace from the request"). The request says it in words the
guard already reads for sure (:mod:`playground.kubectl.guard`: "in prod" where a clause ends, "the team-ml
namespace", "ns is X", "X: …" first, a typed ``-n X``), so the chat panel (``serving.complete: kubectl``) adds it,
and says so under the answer. Only where all of this holds: the answer is one bare command (no prose), it has no
namespace of its own, its verb and kind live in a namespace (not a node, a namespace, cordon, uncordon or drain), and
the request says exactly one namespace that is not the command's own object or kind, nor a state or place word
("stuck in pending", "in the cluster").
The guard then judges the completed answer. Pure, torch-free.
"""

from __future__ import annotations

from playground.kubectl.guard import namespaces_said
from playground.kubectl.reward import KIND_OF, extract

# Verbs and kinds that live outside any namespace: a ``-n`` on them would be a guess.
_CLUSTER_VERBS = {"cordon", "uncordon", "drain", "create namespace"}
_CLUSTER_KINDS = {"node", "namespace"}
# Words "in X" says that are no namespace: a state, a place, a connective ("in namespace trading" says "in" before
# "namespace").
_NOT_NAMESPACES = {"pending", "running", "progress", "trouble", "cluster", "kubernetes", "k8s",
                   "in", "on", "to", "of", "a", "new", "this", "that", "my", "our", "your", "which", "what", "same",
                   "other", "all", "every", "it", "them"}  # fmt: skip


def added_namespace(request: str, answer: str) -> str | None:
    """The namespace to add to ``answer`` for ``request`` (see the module), or None."""
    command, wrapped = extract(answer)
    if command is None or wrapped or "\n" in answer.strip():
        return None
    flags = dict(command.flags)
    if flags.get("--namespace") or "--all-namespaces" in flags or "-A" in flags:
        return None
    if command.verb in _CLUSTER_VERBS or command.resource in _CLUSTER_KINDS:
        return None
    objects = {arg.lower() for arg in command.args}
    said = {
        name
        for name in namespaces_said(request) - objects - _NOT_NAMESPACES
        if KIND_OF.get(name, name) != command.resource  # "list deployments namespace X": no "deployments" namespace
    }
    return said.pop() if len(said) == 1 else None


def with_namespace(answer: str, namespace: str | None) -> str:
    """``answer`` with ``-n namespace`` after it (as it is where ``namespace`` is None)."""
    return answer if namespace is None else f"{answer.strip()} -n {namespace}"


def complete(request: str, answer: str) -> str:
    """``answer`` with ``-n NAMESPACE`` added where :func:`added_namespace` finds one; else as it is."""
    return with_namespace(answer, added_namespace(request, answer))
