"""A guard between a kubectl model and the person reading its answer: a command that would change the cluster is
shown only when the request asked for that change.

A 135M model fine-tuned for a few minutes on two cores answers most visitor requests right, but when it meets a
request it cannot do ("who deleted my deployment?", "add 10 nodes to the cluster") it still tends to answer with
some command, and some of those would change the cluster. The guard is an allow-list, not a classifier: a
cluster-changing answer passes only when

1. its verb is one the task supports, and the request says that verb (one of its cue words, not as a state it
   describes: "it keeps restarting" does not ask to restart; typos of one letter allowed: "scael" is "scale",
   "drian" is "drain"; a wrong letter only in cues of 6+ letters, because in shorter words it makes another word:
   "clean" is not "clear"; "stop scheduling pods on node-4" says cordon, not the uncordon "schedul" also cues);
2. every name, number and file the command carries appears in the request as typed, as a whole ("v2" is not said by
   "frontend-v2"; a model that invents a name is guessing); a kind word says only itself ("deployment" is not the cue
   "deploy"); the command is one of the shapes taught (one kind, a number for ``--replicas`` and ``--port``); a name the
   request gives as a namespace ("in staging", "the staging namespace") is not the object the command changes ("wipe the
   staging namespace" is not ``kubectl drain staging``), nor is one it gives as a cluster or a context ("the eu-west
   cluster"), a namespace it looks in ("statefulsets in the payments-prod namespace?") is not one to create, the
   command's namespace is one the request gives as such, its object is not a word like "cluster" or
   "everything", and it carries no flag the task does not teach that verb (``--replicas``, ``--port``,
   ``--ignore-daemonsets``, ``-f`` and ``-n`` are all there is);
3. the request is not a question about the past, a state or a reason ("who…", "why…", "is web done…?") nor asks for
   advice or about consequences ("should I…", "is it safe to…", "what happens if…", "if I roll back…, will we lose…?"),
   it does not name an operation the task does not support ("autoscale", "taint", "annotate", "patch", "edit", "exec",
   "helm", "bash", "a memory limit", "service account", "context", "spin up a new deployment"…, typos too: the nearest
   supported command would be a guess; not in what the visitor will do themselves, "cordon gpu-3 before we patch it",
   nor in why, "empty out node-4 for patching", nor "copies" as a count),
   an ``expose`` does not answer a request to reach something from the visitor's machine ("open grafana in my browser":
   a port-forward), and a delete, drain or cordon does not come with "all", "every" (typos too) or ``--all`` (bulk
   changes are not supported; "all the pods" of the one node a drain empties or the one deployment a restart restarts
   are not bulk).

Anything else is replaced by :data:`REFUSAL`. Read-only answers (get, describe, logs, top, port-forward…) and
answers with no command always pass. Torch-free and pure: the chat panel and benchmarks/visitor_requests.py call
:func:`guard`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from playground.kubectl.reward import KIND_ALIASES, KIND_OF, extract
from playground.kubectl.wide import NUMBER_WORDS, REFUSAL  # REFUSAL: what the model answers itself

# The cue words a request must say for each supported cluster-changing verb (prefixes: "replica" for "replicas").
CUES: dict[str, tuple[str, ...]] = {
    "scale": ("scale", "replica", "bump", "resize", "instance", "copies", "run", "shrink", "down", "up"),
    "delete": ("delete", "remove", "rm", "nuke", "kill", "destroy", "drop", "erase", "rid", "purge", "trash", "tear",
               "wipe"),
    "rollout restart": ("restart", "bounce", "recycle", "kick", "reboot", "cycle", "roll"),
    "rollout undo": ("undo", "rollback", "back", "revert", "previous"),
    "create namespace": ("create", "make", "add", "new", "set", "namespace", "ns"),
    "expose": ("expose", "publish", "reachable", "open", "front", "create"),  # not "service": port-forward says it
    "set image": ("image", "tag", "version", "upgrade", "update", "deploy", "roll", "ship", "bump", "move", "set",
                  "put", "switch", "run", "use", "swap", "point"),
    "cordon": ("cordon", "unschedulable", "schedul", "off"),
    "uncordon": ("uncordon", "schedulable", "schedul", "allow", "back", "again", "rotation"),
    "drain": ("drain", "evict", "evacuat", "empty", "off", "clear", "maintenance"),
    "label": ("label", "tag"),
    "apply": ("apply", "deploy", "create", "push", "install", "roll", "load", "onto"),
}  # fmt: skip
# Operations no supported command does: a request that names one gets no cluster-changing answer (word prefixes,
# then whole words), unless the word is part of a name the command carries (a file "cronjob.yaml").
UNSUPPORTED_OPERATIONS = ("autoscal", "taint", "annotat", "patch", "edit", "exec", "shell", "helm", "copy", "attach",
                          "debug", "admin", "grant", "rbac", "permission", "cronjob", "serviceaccount",
                          "rolebinding", "pause", "limit", "quota", "kustomiz", "context", "kubeconfig")  # fmt: skip
UNSUPPORTED_WORDS = ("hpa", "ssh", "cp", "bash", "sh", "zsh", "terminal", "console", "fix")  # "fixed": done
# ... and the same said in two words ("give the ci-bot service account …").
_UNSUPPORTED_PHRASES = re.compile(
    r"\b(service accounts?|role ?bindings?|cluster ?roles?|"
    r"(?:create|make|spin up|start|set up) (?:a|an) (?:new )?deployment)\b|\bnew deployment\b"
)  # ... and creating a deployment (``create deployment`` is not taught: ``set image`` on a name is a guess)
# What the visitor says they will do themselves is not asked of the model: "cordon gpu-3 before we patch it".
_OWN_CLAUSE = re.compile(r"\b(?:before|after|while|once|until|so(?:\s+that)?)\s+(?:we|i|they)\b[^,.;!?]*")
# A name the request gives as a cluster or a kubeconfig context ("the eu-west cluster") is no object a taught command
# changes: a command that carries it is a guess ("switch to the eu-west cluster" → ``set image deployment/eu-west``).
_CLUSTER_SAID = re.compile(r"\b([a-z0-9][a-z0-9-]*)\s+(?:cluster|context)s?\b")
_NOT_CLUSTER_NAMES = {"the", "this", "that", "my", "our", "your", "a", "whole", "entire", "same", "other", "current",
                      "k8s", "kubernetes", "kubectl", "in", "on", "to", "of"}  # fmt: skip
_BULK_WORDS = ("all", "every", "everything", "each", "whole", "entire")
# Where a request names a namespace: "in prod", "inside the staging namespace", "team-ml ns", "-n prod", and "on
# prod" (which names a node as often: not evidence that a name is a namespace, only that a namespace was said).
# A namespace typed as kubectl's flag ("-n web", "--namespace=web"): the guard reads it, playground/kubectl/request.py
# says it in words.
NAMESPACE_FLAG = r"(?<!\S)(?:-n|--namespace)(?:\s+|=)([a-z0-9][a-z0-9-]*)"
_NAMESPACE_SAID = (
    r"\b(?:namespace|ns)\s+(?:is|=)\s+([a-z0-9][a-z0-9-]*)|\b(?:{before})\s+(?:the\s+|namespace\s+|ns\s+)?"
    r"([a-z0-9][a-z0-9-]*){after}|\b([a-z0-9][a-z0-9-]*)\s+(?:namespace|ns)\b"
    r"|^\W*([a-z0-9][a-z0-9-]*)\s*(?::|\s-+|\s—)\s|" + NAMESPACE_FLAG
)  # ... and as a flag typed in the request ("restart nginx plz -n web")
# A namespace for sure: "in X" where a clause ends ("nuke the old-config configmap in staging"; not "a memory leak in
# web again"), "the X namespace", "ns is X", "X: …" opening the request.
_NAMESPACE_IS = re.compile(
    _NAMESPACE_SAID.format(before="in|inside|from|into", after=r"(?=\s*(?:$|[,.;:!?)]|\s(?:namespace|ns)\b))")
)
# ... or perhaps ("in team-ml can you scale…", "on staging, restart…"): where a command's namespace may come from.
_NAMESPACE_MAY_BE = re.compile(_NAMESPACE_SAID.format(before="in|inside|from|into|namespace|ns|on|to|for", after=""))
# A namespace the request looks in ("statefulsets in the payments-prod namespace?"): there already, not one to create.
_LOOKED_IN = re.compile(r"\b(?:in|inside|within|from)\s+(?:the\s+)?(?:(?:namespace|ns)\s+)?([a-z0-9][a-z0-9-]*)")
# Scheduling stopped is a cordon ("stop scheduling new pods onto node-4"), never the uncordon "schedul" also cues.
_STOP_SCHEDULING = re.compile(r"\b(?:stop|no\s+(?:more|new)|don'?t|do\s+not|prevent|block)\W+(?:\w+\W+){0,3}?schedul")
# Words that name no object: a command that changes "the cluster" or "everything" is a guess.
_GENERIC_WORDS = {"cluster", "kubernetes", "k8s", "everything", "all", "it", "them", "this", "that", "stuff"}
_NAMESPACE_OBJECTS = {"create namespace", "label"}  # verbs whose object may be a namespace
_NOT_NAMES = {"the", "namespace", "ns", "node", "port", "pod"}
_PAST_OR_REASON = re.compile(
    r"^\W*(who|why|when|where|what|which|whose|did|has|have|was|were|is|are|does)\b(?!\s+to\b)", re.IGNORECASE
)  # not "have to reboot gpu-7, drain it first"; "is web done rolling out?" asks about a state
# Reaching something from the visitor's own machine is a port-forward, not a service ("open grafana in my browser").
_LOCAL_ACCESS = re.compile(r"\b(locally|local|localhost|my (browser|laptop|machine|computer|side))\b")
# Advice and hypotheticals about a change are not a request for it ("should I scale web?", "is it safe to restart").
_ADVICE = re.compile(
    r"\b(should (i|we)|shall (i|we)|is it (safe|ok|okay|wise|fine|a good idea)|what (happens|if)|would it|"
    r"do (i|we) need to|how (do|can|should) (i|we)|how to|(will|would) (we|i|it|that|this) (lose|break|hurt|"
    r"affect|drop|kill|take down|cause))\b|^\W*if\b[^?]*\?|^\W*(will|would)\b(?!\s+(you|u)\b)|"
    r"\b(lose|losing|break|breaking|downtime)\b[^?]*\?\s*$",
    re.IGNORECASE,
)
# A state the request describes is not a change it asks for: "it keeps restarting" does not say "restart".
_DESCRIBING = re.compile(r"\b(keeps?|kept|is|are|was|were|been|still|stuck|constantly|always)\s+([a-z]+ing)\b")
_NUMBER_WORDS = {word: str(i) for i, word in enumerate(NUMBER_WORDS)}
# The kinds each change was taught for: "delete ingress web" or "scale the web statefulset" is not one.
_TAUGHT_KINDS = {"delete": {"pod", "deployment", "service", "configmap", "job", "secret"},
                 "label": {"pod", "node", "deployment", "namespace"}}  # fmt: skip
# Changes whose answer must be about the kind the request names; the kinds a request may also say for them
# ("scale web to 3 pods", "put a service in front of web", "restart the api pods").
_KIND_CHECKED = {"scale": {"pod"}, "rollout restart": {"pod"}, "rollout undo": {"pod"}, "set image": {"pod", "image"},
                 "expose": {"service"}, "delete": set()}  # fmt: skip
_BULK_VERBS = {"delete", "drain", "cordon", "scale", "rollout restart"}
# Kinds the task never taught, with the words a request may say them by (as the reward's KIND_ALIASES): "delete the
# pvc data-0" is not about a pod.
_UNTAUGHT_KINDS = {"pvc": ("pvcs", "persistentvolumeclaim", "persistentvolumeclaims"), "pv": ("pvs",),
                   "volume": ("volumes",), "networkpolicy": ("netpol",), "hpa": (), "crd": (), "endpoints": (),
                   "serviceaccount": (), "role": (), "rolebinding": ()}  # fmt: skip
_SAID_KINDS = {  # a word of the request → the kind it names
    **{alias: kind for kind, aliases in _UNTAUGHT_KINDS.items() for alias in (kind, *aliases)},
    **KIND_OF,
}
# The only flags the task teaches each change (and --namespace for all; --all is the bulk rule's): another one is the
# model guessing ("kubectl expose deployment ci-bot --permision=ci-bot").
_TAUGHT_FLAGS = {"scale": {"--replicas"}, "expose": {"--port"}, "drain": {"--ignore-daemonsets"},
                 "apply": {"--filename"}}  # fmt: skip
_NUMBER_FLAGS = {"--replicas", "--port"}  # "--port=3000:80" is no port
_MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")  # apply was taught files: a directory or a URL is a guess


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str  # why it was held back ("" when allowed)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _says_cue(word: str, cue: str) -> bool:
    """``word`` says ``cue`` (:func:`_close`); a kind says only itself ("deployment" is not "deploy")."""
    return word == cue if word in _SAID_KINDS else _close(word, cue)


def _tokens(text: str) -> set[str]:
    """The request's names as typed: split at spaces, punctuation, ``=`` and ``:`` (not ``-`` ``.`` ``/``), trailing
    dots and "'s" dropped, with the parts of a ``kind/name``. A name must be one of them, not part of another ("v2"
    is not said by "frontend-v2")."""
    tokens = set()
    for token in re.split(r"[\s,;!?()\[\]{}\"'`=:%]+|'s\b", text.lower()):
        token = token.strip(".")
        tokens |= {token, *token.split("/")} - {""}  # "deploy/web" says web; "k8s/web.yaml" the file
    return tokens


def _close(word: str, cue: str) -> bool:
    """``word`` says ``cue``: it is it (cues of 1–2 letters), starts with it, or (5+ letters) is one edit away (a
    letter missing, extra or two swapped; a wrong one in cues of 6+ letters)."""
    if len(cue) <= 2:  # "up", "ns": whole words only ("upgrade" does not say "up")
        return word == cue
    return word.startswith(cue) or _typo(word, cue)


def _typo(word: str, cue: str) -> bool:
    """``word`` is ``cue`` (5+ letters) mistyped by one edit: a letter missing, extra or two swapped; a wrong letter
    only in cues of 6+ letters (in shorter ones it makes another word: "clean" is not "clear")."""
    if len(cue) < 5 or abs(len(word) - len(cue)) > 1:
        return False
    substitute = len(cue) >= 6
    return one_edit(word[: len(cue) + 1], cue, substitute) or one_edit(word, cue, substitute)


def one_edit(a: str, b: str, substitute: bool = True) -> bool:
    """``a`` is ``b`` or one edit from it: a letter missing, extra, two swapped, or (``substitute``) one wrong."""
    if a == b:
        return True
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return substitute
        i, j = diff[0], diff[-1]
        return len(diff) == 2 and j == i + 1 and a[i] == b[j] and a[j] == b[i]
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def _names(command) -> list[str]:
    """The names, numbers and files a command carries (what the request must have said)."""
    names = [arg for arg in command.args if arg not in KIND_ALIASES and arg != "all"]
    names += [value for _, value in command.flags if value]
    parts: list[str] = []
    for name in names:
        parts += [p for p in re.split(r"[=:]", name) if p]  # api=api:v3.1 → api, v3.1; zone=eu → zone, eu
    return parts


def namespaces_said(request: str, pattern: re.Pattern[str] = _NAMESPACE_IS) -> set[str]:
    """The names the request gives as namespaces ("in prod", "inside the staging namespace", "team-ml ns")."""
    text = " ".join("namespace" if _close(word, "namespace") else word for word in request.lower().split())
    return {name for match in pattern.finditer(text) for name in match.groups() if name} - _NOT_NAMES


def _object(command) -> str | None:
    """The name of the object a command changes (its first positional argument that is not a kind)."""
    return next((arg for arg in command.args if arg not in KIND_ALIASES), None)


def _unsupported_operation(words: list[str], command, request: str) -> str | None:
    """The request's first word naming an operation the task does not teach, outside the names the request gives
    and the command carries ("cronjob" in ``cronjob.yaml``, "debug" in ``debug=true``), and not in the past tense ("i
    edited app.yaml, apply it": done, not asked for). A name counts only as typed in the request and as more than the
    word: the model copies the request's words into names of its own ("exec into redis-0 and run redis-cli" →
    ``set image deployment/redis-0 redis-cli=redis-0:exec``)."""
    values = [arg for arg in command.args if arg not in KIND_ALIASES] + [value for _, value in command.flags if value]
    lowered = request.lower()
    named = {part for value in values if value.lower() in lowered and len(_words(value)) > 1 for part in _words(value)}
    for i, word in enumerate(words):
        if word in named or word.endswith("ed"):
            continue
        before = words[i - 1] if i else ""
        if word in ("copy", "copies") and (before.isdigit() or before in _NUMBER_WORDS):  # "down to 1 copy": a count
            continue
        if word.endswith("ing") and before == "for":  # "empty out node-4 for patching": why, not what
            continue
        if word.startswith(UNSUPPORTED_OPERATIONS) or word in UNSUPPORTED_WORDS:
            return word
        if any(_typo(word, operation) for operation in UNSUPPORTED_OPERATIONS):  # "permision"
            return word
    phrase = _UNSUPPORTED_PHRASES.search(" ".join(words))
    return phrase.group(0) if phrase else None


def check(request: str, answer: str) -> Verdict:
    """Whether ``answer`` may be shown for ``request`` (see the module's rules)."""
    command, _ = extract(answer)
    if command is None or not command.changes_cluster:
        return Verdict(True, "")
    cues = CUES.get(command.verb)
    if cues is None:
        return Verdict(False, f"'{command.verb}' is not a change this model was taught")
    lowered, words = request.lower(), _words(request)
    labels = [arg for arg in command.args if "=" in arg]  # a label said as typed is the request for it
    said_label = command.verb == "label" and labels and all(label.lower() in lowered for label in labels)
    asked = _words(_DESCRIBING.sub(r"\1", lowered))
    if not said_label and not any(_says_cue(word, cue) for word in asked for cue in cues):
        return Verdict(False, f"the request does not ask to {command.verb}")
    said = _tokens(lowered) | {_NUMBER_WORDS[w] for w in words if w in _NUMBER_WORDS}  # "two" is 2
    missing = [name for name in _names(command) if name.lower().strip(".,;") not in said]
    if missing:
        return Verdict(False, f"'{missing[0]}' is not in the request")
    clusters = {match.group(1) for match in _CLUSTER_SAID.finditer(lowered)} - _NOT_CLUSTER_NAMES
    in_clusters = [name for name in _names(command) if name.lower() in clusters]
    if in_clusters:
        return Verdict(False, f"'{in_clusters[0]}' is a cluster in the request, not a name to {command.verb}")
    kinds = sorted({arg for arg in command.args if arg in KIND_ALIASES})
    if len(kinds) > 1:  # "kubectl expose deployment service grafana"
        return Verdict(
            False, f"the answer names two kinds ({kinds[0]}, {kinds[1]}): not a command this model was taught"
        )
    not_numbers = [flag for flag, value in command.flags if flag in _NUMBER_FLAGS and not (value or "").isdigit()]
    if not_numbers:
        return Verdict(False, f"'{not_numbers[0]}' takes a number")
    files = [value or "" for flag, value in command.flags if flag == "--filename"]
    if any(not file.lower().endswith(_MANIFEST_SUFFIXES) or "://" in file for file in files):
        return Verdict(False, "the answer applies something other than a manifest file (a directory, a URL)")
    taught_flags = {"--namespace", "--all", *_TAUGHT_FLAGS.get(command.verb, ())}
    guessed_flags = [flag for flag, _ in command.flags if flag not in taught_flags]
    if guessed_flags:
        return Verdict(False, f"'{guessed_flags[0]}' is not a flag this model was taught for {command.verb}")
    kind = command.resource
    if not kind and command.verb in _KIND_CHECKED.keys() | _TAUGHT_KINDS.keys():  # "kubectl delete data-0"
        return Verdict(False, f"the answer names no kind to {command.verb}")
    if kind and kind not in _TAUGHT_KINDS.get(command.verb, {kind}):
        return Verdict(False, f"'{command.verb} {kind}' is not a change this model was taught")
    if kind and command.verb in _KIND_CHECKED:  # "scale the search statefulset" answered for a deployment
        other_kinds = _kinds_near(lowered, _object(command)) - {kind, "namespace", *_KIND_CHECKED[command.verb]}
        if other_kinds:
            return Verdict(False, f"the request is about a {sorted(other_kinds)[0]}, not a {kind}")
    target = (_object(command) or "").lower()
    changes_a_namespace = command.verb in _NAMESPACE_OBJECTS or command.resource == "namespace"
    if target and not changes_a_namespace and target in namespaces_said(request):
        return Verdict(False, f"'{target}' is a namespace in the request, not what to {command.verb}")
    if target in _GENERIC_WORDS:
        return Verdict(False, f"'{target}' names no object to {command.verb}")
    namespace = dict(command.flags).get("--namespace")
    if namespace and namespace.lower() not in namespaces_said(request, _NAMESPACE_MAY_BE):
        return Verdict(False, f"the request does not say '{namespace}' is the namespace")
    if command.verb == "expose" and _LOCAL_ACCESS.search(lowered):
        return Verdict(
            False, "the request asks to reach it from the visitor's machine (a port-forward), not to expose it"
        )
    if _PAST_OR_REASON.match(request) or _ADVICE.search(request):
        return Verdict(False, "the request asks a question, not for a change")
    unsupported = _unsupported_operation(_words(_OWN_CLAUSE.sub(" ", lowered)), command, request)
    if unsupported:
        return Verdict(False, f"'{unsupported}' is not a change this model was taught")
    created = _kind_created(lowered) if command.verb == "create namespace" else None
    if created and created != "namespace":  # "create a networkpolicy … db namespace"; not "an ns for the jobs team"
        return Verdict(False, f"the request creates a {created}, not a namespace")
    if command.verb == "create namespace" and target in namespaces_said(request, _LOOKED_IN):
        return Verdict(False, f"'{target}' is a namespace the request looks in, not one to create")
    if command.verb == "uncordon" and _STOP_SCHEDULING.search(lowered):
        return Verdict(False, "the request asks to stop scheduling (a cordon), not to uncordon")
    # "all the pods" of the one node a drain empties, or of the one deployment a restart restarts, is not bulk; a
    # "kubectl drain --ignore-daemonsets" names no node
    pods_of_one = command.verb in _ALL_ITS_PODS and _object(command) is not None
    if command.verb in _BULK_VERBS and (_bulk_said(words, pods_of_one) or any(f == "--all" for f, _ in command.flags)):
        return Verdict(False, "changes to everything at once are not supported")
    return Verdict(True, "")


# Changes of one object whose request may say "all" of its pods: "evacuate all pods off node gpu-7" is the drain of
# gpu-7, "kick auth, restart all its pods" the restart of auth.
_ALL_ITS_PODS = {"drain", "rollout restart"}


def _bulk_said(words: list[str], pods_of_one: bool) -> bool:
    """The request says "all", "every"… (typos too: "evry"; not "allocator"); with ``pods_of_one``, other than of pods
    ("all pods off node gpu-7", "restart all its pods")."""
    for i, word in enumerate(words):
        if not any(word == cue or _typo(word, cue) for cue in _BULK_WORDS):
            continue
        if pods_of_one and {"pod", "pods", "off", "from"} & set(words[i + 1 : i + 4]):
            continue
        return True
    return False


def _kinds_near(lowered: str, name: str | None) -> set[str]:
    """The kinds the request says within two words of ``name`` ("the search statefulset", "pvc data-0"): what it says
    the object is. A kind further off is about something else ("restart web so it picks up the new secret"); without
    the name in the request, every kind it says."""
    words = re.findall(r"[a-z0-9][a-z0-9.-]*[a-z0-9]|[a-z0-9]", lowered)
    name = (name or "").lower()
    at = [i for i, word in enumerate(words) if word == name]
    near = {word for i in at for word in words[max(0, i - 2) : i + 3]} if at else set(words)
    return {_SAID_KINDS[word] for word in near if word in _SAID_KINDS}


_CREATING = re.compile(r"\b(?:create|make|add|new|set up|spin up|need)\b")


def _kind_created(lowered: str) -> str | None:
    """The first kind named in the four words after a creating word ("create a networkpolicy …" → networkpolicy)."""
    for cue in _CREATING.finditer(lowered):
        for word in re.findall(r"(?<![\w-])[a-z]+(?![\w-])", " ".join(lowered[cue.end() :].split()[:4])):
            if word in _SAID_KINDS:
                return _SAID_KINDS[word]
    return None


def guard(request: str, answer: str) -> str:
    """``answer``, or :data:`REFUSAL` when :func:`check` holds it back."""
    return answer if check(request, answer).allowed else REFUSAL
