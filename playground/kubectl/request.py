"""A visitor's kubectl request as the model was taught to read it: kubectl words mistyped by one edit are spelt right
("sclae the web deployment" → "scale the web deployment", "list deploymnets" → "list deployments") and a namespace
typed as a flag is said in words ("configmaps -n dev" → "configmaps in the dev namespace").

A 135M model fine-tuned for a few minutes learns the typos its training rows carry, a quarter of them with one typo
somewhere, so a mistyped verb or kind is still the commonest miss on visitors' own words. Only words of the task's
own vocabulary (:data:`VOCABULARY`, 5+ letters) are corrected, and only where one of them is a single edit away (a
letter missing, extra or two swapped; a wrong one in words of 6+ letters, as the guard reads cue words): a name the
request gives (``web-7d9f8``, ``nginx``, ``checkout``) is never touched, nor a word that is a vocabulary word with an
ending ("scaled", "drains") or the start of one ("deploy"). The chat panel (``serving.normalize: kubectl``) sends the
model this reading and shows it under the question; the guard still judges the visitor's own words. Pure, torch-free.
"""

from __future__ import annotations

import re

from playground.kubectl.guard import NAMESPACE_FLAG, one_edit

# The task's words a visitor types (verbs, kinds, and the words around them); lower case.
VOCABULARY = frozenset({
    "scale", "restart", "rollout", "drain", "cordon", "uncordon", "describe", "delete", "remove", "forward",
    "apply", "expose", "label", "labels", "bounce", "revert", "rollback", "evict", "update", "image",
    "replicas", "replica", "create", "namespace", "namespaces", "schedulable", "unschedulable", "deployment",
    "deployments", "service", "services", "statefulset", "statefulsets", "daemonset", "daemonsets", "configmap",
    "configmaps", "secret", "secrets", "ingress", "ingresses", "nodes", "events", "replicaset", "replicasets",
    "cronjob", "cronjobs", "container", "containers", "resource", "resources", "usage", "memory", "manifest",
    "please", "restarts",
})  # fmt: skip
_ENDINGS = ("s", "es", "d", "ed", "ing", "ting", "ning")
_NAMESPACE_FLAG = re.compile(NAMESPACE_FLAG + r"(?!\S)", re.IGNORECASE)


def _spelt(word: str) -> str:
    """``word`` spelt right where it is one vocabulary word mistyped by one edit, else as it is."""
    lower = word.lower()
    if len(lower) < 5 or lower in VOCABULARY:
        return word
    if any(lower == known + ending for known in VOCABULARY for ending in _ENDINGS) or any(
        known.startswith(lower) for known in VOCABULARY
    ):
        return word  # "scaled", "drains", "deploy": words of their own
    near = {
        known
        for known in VOCABULARY
        if abs(len(known) - len(lower)) <= 1 and one_edit(lower, known, substitute=len(known) >= 6)
    }
    return near.pop() if len(near) == 1 else word


def normalize(request: str) -> str:
    """``request`` with its mistyped kubectl words spelt right and a typed ``-n NAME`` said as "in the NAME
    namespace"; unchanged where there is nothing to read otherwise."""
    words = re.sub(r"(?<![\w./:@=-])[A-Za-z]+(?![\w./:@=-])", lambda m: _spelt(m.group(0)), request)
    return _NAMESPACE_FLAG.sub(lambda m: f"in the {m.group(1)} namespace", words)
