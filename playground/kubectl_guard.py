"""A guard between a kubectl model and the person reading its answer: a command that would change the cluster is
shown only when the request asked for that change.

A 135M model fine-tuned for three minutes on two cores answers most visitor requests right, but when it meets a
request it cannot do ("who deleted my deployment?", "add 10 nodes to the cluster") it still tends to answer with
some command, and some of those would change the cluster. The guard is an allow-list, not a classifier: a
cluster-changing answer passes only when

1. its verb is one the task supports, and the request says that verb (one of its cue words, typos of one letter
   allowed: "scael" is "scale");
2. every name, number and file the command carries appears in the request as typed (a model that invents a name
   is guessing);
3. the request is not a question about the past or a reason ("who…", "why…", "when…"), and a delete, drain or
   cordon does not come with "all", "every" or ``--all`` (bulk changes are not supported).

Anything else is replaced by :data:`REFUSAL`. Read-only answers (get, describe, logs, top, port-forward…) and
answers with no command always pass. Torch-free and pure: the chat panel and benchmarks/visitor_requests.py call
:func:`guard`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from playground.train.kubectl_reward import _KINDS, extract
from playground.train.kubectl_wide import REFUSAL  # what the model itself answers to an unsupported request

# The cue words a request must say for each supported cluster-changing verb (prefixes: "replica" for "replicas").
CUES: dict[str, tuple[str, ...]] = {
    "scale": ("scale", "replica", "bump", "resize", "instance", "copies", "run"),
    "delete": ("delete", "remove", "rm", "nuke", "kill", "destroy", "drop", "erase", "rid", "purge", "trash", "tear"),
    "rollout restart": ("restart", "bounce", "recycle", "kick", "reboot", "cycle"),
    "rollout undo": ("undo", "rollback", "back", "revert", "previous"),
    "create namespace": ("create", "make", "add", "new", "set", "namespace"),
    "expose": ("expose", "service", "publish", "reachable", "open", "port"),
    "set image": ("image", "tag", "version", "upgrade", "update", "deploy", "roll", "ship", "bump", "move", "set"),
    "cordon": ("cordon", "unschedulable", "schedul", "off"),
    "uncordon": ("uncordon", "schedulable", "schedul", "allow", "back"),
    "drain": ("drain", "evict", "empty", "off", "clear", "maintenance"),
    "label": ("label", "tag"),
    "apply": ("apply", "deploy", "create", "push", "install", "roll"),
}
_PAST_OR_REASON = re.compile(r"^\W*(who|why|when|where|what|which|whose|did|has|have|was|were)\b", re.IGNORECASE)
_BULK = re.compile(r"\b(all|every|everything|each|whole|entire)\b", re.IGNORECASE)
_BULK_VERBS = {"delete", "drain", "cordon", "scale", "rollout restart"}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str  # why it was held back ("" when allowed)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _close(word: str, cue: str) -> bool:
    """``word`` says ``cue``: it starts with it, or (5+ letters) is one edit away (a letter missing, extra,
    wrong, or two swapped)."""
    if word.startswith(cue):
        return True
    if len(cue) < 5 or abs(len(word) - len(cue)) > 1:
        return False
    return _one_edit(word[: len(cue) + 1], cue) or _one_edit(word, cue)


def _one_edit(a: str, b: str) -> bool:
    if a == b:
        return True
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        i, j = diff[0], diff[-1]
        return len(diff) == 2 and j == i + 1 and a[i] == b[j] and a[j] == b[i]
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def _names(command) -> list[str]:
    """The names, numbers and files a command carries (what the request must have said)."""
    names = [arg for arg in command.args if arg not in _KINDS and arg != "all"]
    names += [value for _, value in command.flags if value]
    parts: list[str] = []
    for name in names:
        parts += [p for p in re.split(r"[=:]", name) if p]  # api=api:v3.1 → api, v3.1; zone=eu → zone, eu
    return parts


def check(request: str, answer: str) -> Verdict:
    """Whether ``answer`` may be shown for ``request`` (see the module's rules)."""
    command, _ = extract(answer)
    if command is None or not command.changes_cluster:
        return Verdict(True, "")
    cues = CUES.get(command.verb)
    if cues is None:
        return Verdict(False, f"'{command.verb}' is not a change this model was taught")
    words = _words(request)
    if not any(_close(word, cue) for word in words for cue in cues):
        return Verdict(False, f"the request does not ask to {command.verb}")
    said = request.lower()
    missing = [name for name in _names(command) if name.lower() not in said]
    if missing:
        return Verdict(False, f"'{missing[0]}' is not in the request")
    if _PAST_OR_REASON.match(request):
        return Verdict(False, "the request asks a question, not for a change")
    if command.verb in _BULK_VERBS and (_BULK.search(request) or any(f == "--all" for f, _ in command.flags)):
        return Verdict(False, "changes to everything at once are not supported")
    return Verdict(True, "")


def guard(request: str, answer: str) -> str:
    """``answer``, or :data:`REFUSAL` when :func:`check` holds it back."""
    return answer if check(request, answer).allowed else REFUSAL
