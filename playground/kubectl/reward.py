"""The verifiable reward of the kubectl task: how right is a generated answer, checked by parsing it.

Torch-free and pure: GRPO's reward function (playground/train/grpo.py), the held-out mean reward and its
unit tests call the same :func:`score`.

The scale (every figure a constant below):

- ``1.0``: the answer is one kubectl command equivalent to the expected one: flag order, ``-n X`` /
  ``--namespace X`` / ``--namespace=X``, ``--flag V`` / ``--flag=V``, ``deployment/web`` / ``deployment web``
  and the kinds' short and plural names (``deploy``, ``po``, ``svc``…) do not matter.
- ``0.5``: the right verb on the right kind of resource, but a wrong name, number, namespace or flag.
- ``0.0``: anything else: prose with no command, something that is not a kubectl command, another command
  (above all one that would change the cluster, ``delete``, ``drain``, ``scale``…, when the request did not
  ask for that verb). An earlier scale gave 0.1 to any other read-only command; GRPO learned to answer
  ``kubectl get …`` to every request it was unsure of (benchmarks/README.md), so a wrong command earns nothing.
- A command wrapped in prose (``To scale it, run `kubectl …`.``) scores half of what the bare command would:
  the answer is there, but it is not the answer.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

EQUIVALENT = 1.0
RIGHT_VERB_AND_RESOURCE = 0.5
WRAPPED_IN_PROSE = 0.5  # the factor for a command found inside prose

# Verbs of two words: the second word is part of the verb.
_TWO_WORD_VERBS = {"rollout", "set", "create", "config", "auth", "certificate"}
READ_ONLY_VERBS = frozenset(
    {"get", "describe", "logs", "top", "port-forward", "explain", "version", "api-resources", "cluster-info",
     "config view", "auth can-i", "rollout status", "rollout history", "events", "diff"}
)  # fmt: skip
DESTRUCTIVE_VERBS = frozenset({"delete", "drain", "cordon", "taint", "replace", "rollout undo"})
KIND_ALIASES = {  # each kind → kubectl's short and plural names for it
    "pod": ("po", "pods"), "deployment": ("deploy", "deployments"), "service": ("svc", "services"),
    "configmap": ("cm", "configmaps"), "secret": ("secrets",), "job": ("jobs",), "ingress": ("ing", "ingresses"),
    "statefulset": ("sts", "statefulsets"), "namespace": ("ns", "namespaces"), "node": ("no", "nodes"),
    "daemonset": ("ds", "daemonsets"), "replicaset": ("rs", "replicasets"), "cronjob": ("cj", "cronjobs"),
}  # fmt: skip
# any name of a kind (short, plural) → the kind
KIND_OF = {alias: kind for kind, aliases in KIND_ALIASES.items() for alias in (kind, *aliases)}
_FLAG_ALIASES = {"-n": "--namespace", "-l": "--selector", "-o": "--output", "-f": "--filename", "-c": "--container"}
_BOOLEAN_FLAGS = {"--ignore-daemonsets", "--all-namespaces", "-A", "--force", "--all", "--delete-emptydir-data",
                  "--follow", "-f", "--previous", "-p", "--watch", "-w", "--overwrite", "--record"}  # fmt: skip
_COMMAND = re.compile(r"(?:^|[`$>\s])(kubectl\s[^`\n]*)")


@dataclass(frozen=True)
class Command:
    """A parsed kubectl command: the verb (one or two words), its positional arguments (a ``kind/name``
    split into two, kinds in their canonical singular) and its flags (long names, sorted)."""

    verb: str
    args: tuple[str, ...]
    flags: tuple[tuple[str, str], ...]

    @property
    def resource(self) -> str | None:
        """The kind of resource the command acts on (its first positional argument that is a kind)."""
        return next((arg for arg in self.args if arg in KIND_ALIASES), None)

    @property
    def changes_cluster(self) -> bool:
        return self.verb not in READ_ONLY_VERBS


def parse(text: str) -> Command | None:
    """The kubectl command ``text`` is (None: not one, or unparseable)."""
    try:
        words = shlex.split(text.strip().rstrip(".;"))
    except ValueError:
        return None
    if len(words) < 2 or words[0] != "kubectl":
        return None
    words = words[1:]
    flags: dict[str, str] = {}
    positional: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("-") and len(word) > 1:
            name, _, value = word.partition("=")
            if not value and name.startswith("-n") and len(name) > 2 and not name.startswith("--"):
                name, value = "-n", name[2:]  # -nstaging
            name = _FLAG_ALIASES.get(name, name)
            if not value and name not in _BOOLEAN_FLAGS and i + 1 < len(words) and not words[i + 1].startswith("-"):
                value = words[i + 1]
                i += 1
            flags[name] = value
        else:
            positional.append(word)
        i += 1
    if not positional:
        return None
    verb = positional.pop(0)
    if verb in _TWO_WORD_VERBS and positional:
        verb = f"{verb} {positional.pop(0)}"
    args: list[str] = []
    for arg in positional:
        kind, slash, name = arg.partition("/")
        if slash and kind in KIND_OF:
            args += [KIND_OF[kind], name]
        else:
            args.append(KIND_OF.get(arg, arg))
    if verb == "port-forward" and args:
        if args[0] not in KIND_ALIASES:
            args.insert(0, "pod")  # kubectl's own default: a bare name is a pod
        args = [_same_port(arg) for arg in args]
    if flags.get("--namespace") == "default":
        flags.pop("--namespace")  # the default namespace, said or not
    return Command(verb, tuple(args), tuple(sorted(flags.items())))


def _same_port(arg: str) -> str:
    """``8080:8080`` → ``8080`` (the same local and remote port, said twice)."""
    local, colon, remote = arg.partition(":")
    return local if colon and local == remote and local.isdigit() else arg


def extract(answer: str) -> tuple[Command | None, bool]:
    """The command an answer gives and whether it is wrapped in prose: the whole answer (code fences,
    backticks and a ``$`` prompt stripped), else the first ``kubectl …`` inside it."""
    bare = answer.strip()
    bare = re.sub(r"^```\w*\s*|\s*```$", "", bare).strip().strip("`").strip()
    bare = bare.removeprefix("$ ").strip()
    if "\n" not in bare:
        command = parse(bare)
        if command is not None:
            return command, False
    found = _COMMAND.search(answer)
    return (parse(found.group(1)), True) if found else (None, False)


def score(answer: str, expected: str) -> float:
    """The reward of ``answer`` for a request whose exact command is ``expected`` (the scale above)."""
    want = parse(expected)
    got, wrapped = extract(answer)
    if want is None or got is None:
        return 0.0
    if got == want:
        value = EQUIVALENT
    elif got.verb == want.verb and got.resource == want.resource:
        value = RIGHT_VERB_AND_RESOURCE
    else:
        value = 0.0  # another command: never a reward for an unasked change, nor for a safe-looking read
    return value * WRAPPED_IN_PROSE if wrapped else value


def is_destructive(answer: str) -> bool:
    """Whether the answer's command deletes, drains, cordons or taints (a cluster-changing risk)."""
    command, _ = extract(answer)
    return command is not None and command.verb in DESTRUCTIVE_VERBS


def changes_unasked(answer: str, expected: str) -> bool:
    """Whether the answer's command would change the cluster with a verb the request did not ask for (the
    answers an operator must never run; the reward gives them 0)."""
    got, _ = extract(answer)
    want = parse(expected)
    return got is not None and got.changes_cluster and (want is None or got.verb != want.verb)
