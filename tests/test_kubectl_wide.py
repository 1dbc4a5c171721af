"""The kubectl task as visitors type it (``operations: wide``), and the visitor-style set that measures it.

The set (benchmarks/data/visitor_requests.jsonl) must stay apart from the generator: none of its requests is
one the generator makes. The generated rows must stay learnable: every command parses and scores itself 1.0,
a typo never touches a name the command needs, unsupported requests are answered with the refusal only.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from playground.blueprints import get_blueprint
from playground.kubectl import core
from playground.kubectl import wide as kubectl_wide
from playground.kubectl.guard import _object  # the object a command changes
from playground.kubectl.reward import KIND_ALIASES as KINDS
from playground.kubectl.reward import changes_unasked, parse, score
from playground.train.data import synthetic_splits

REPO = Path(__file__).resolve().parents[1]
VISITOR_SET = REPO / "benchmarks" / "data" / "visitor_requests.jsonl"
WIDE = {"operations": "wide", "held_out_phrasing": 0.5, "namespace_fraction": 0.5}


def _visitor_rows() -> list[dict]:
    return [json.loads(line) for line in VISITOR_SET.read_text().splitlines() if line.strip()]


def _normal(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


@pytest.fixture(scope="module")
def generated():
    train, held = synthetic_splits("kubectl", {**WIDE, "general_fraction": 0.0}, num_train=5000, num_eval=300, seed=3)
    return train + held


def test_the_default_blueprint_trains_on_the_wide_task() -> None:
    assert get_blueprint("smollm2-135m-lora-kubectl").dataset.options["operations"] == "wide"
    for method in ("smollm2-135m-dpo-kubectl", "smollm2-135m-grpo-kubectl"):  # measured on the core task
        assert get_blueprint(method).dataset.options.get("operations", "core") == "core"


def test_no_visitor_request_is_one_the_generator_makes(generated) -> None:
    made = {_normal(sample.prompt) for sample in generated}
    visitors = {_normal(row["request"]) for row in _visitor_rows()}
    assert len(made) > 4000
    assert visitors & made == set()


def test_the_visitor_set_is_well_formed() -> None:
    rows = _visitor_rows()
    # sets written apart from the generator, each by someone who saw no other: v (dev; dev2, the test split until
    # 2026-11-27), then f, g, h, i, j, k, l and n (dev3…dev10), each the test split for one or more measurements and
    # read afterwards (n, written 2026-11-28 as "test2", on 2026-11-29), and m (the test split, unread). From i on, a
    # request that repeats an earlier set's is dropped and the others keep their ids (the kept answers of
    # benchmarks/visitor_requests.py --keep are keyed by them).
    sets = {prefix: [r for r in rows if r["id"].startswith(prefix)] for prefix in "vfghijklmn"}
    for prefix, chosen in sets.items():
        numbers = [int(r["id"][1:]) for r in chosen]
        assert numbers == sorted(set(numbers)) and numbers[0] == 1, prefix
        if prefix in "vfgh":  # renumbered when a request was dropped
            assert numbers[-1] == len(chosen), prefix
        else:  # ids kept, at most 3 dropped
            assert len(chosen) >= 77 and numbers[-1] <= 80, prefix
    assert sum(map(len, sets.values())) == len(rows) and len({_normal(r["request"]) for r in rows}) == len(rows)
    splits = [{r["split"] for r in chosen} for chosen in sets.values()]
    assert splits == [
        {"dev", "dev2"},
        {"dev3"},
        {"dev4"},
        {"dev5"},
        {"dev6"},
        {"dev7"},
        {"dev8"},
        {"dev9"},
        {"test"},
        {"dev10"},
    ]
    for prefix in "fghijklmn":
        fresh = sets[prefix]
        assert sum(bool(r["expected"]) for r in fresh) >= 55 and sum(not r["expected"] for r in fresh) >= 15, prefix
    for row in rows:
        if row["expected"] is None:
            assert row["read_only"] is True, row["id"]  # an unsupported request must never change the cluster
            continue
        command = parse(row["expected"])
        assert command is not None, row["id"]
        assert command.changes_cluster is not row["read_only"], row["id"]
        assert score(row["expected"], row["expected"]) == 1.0


def test_every_generated_command_parses_and_keeps_its_names(generated) -> None:
    ops_seen = set()
    for sample in generated:
        if sample.answer == kubectl_wide.REFUSAL:
            assert "kubectl" not in sample.prompt.lower()
            continue
        command = parse(sample.answer)
        assert command is not None, sample.answer
        assert score(sample.answer, sample.answer) == 1.0
        ops_seen.add(command.verb)
        request = sample.prompt.lower()
        names = [a for a in command.args if "=" not in a and ":" not in a and a not in KINDS]
        names += [value for _, value in command.flags if value]
        for name in names:  # typos and wrappers never change a name the command needs
            if name.isdigit() or name in {"pods", "nodes", "events", "namespaces", "secrets"}:
                continue
            assert name.lower() in request or name.rstrip("s") in request, (sample.prompt, sample.answer, name)
    assert {"uncordon", "rollout undo", "rollout status", "port-forward", "label", "apply", "top"} <= ops_seen


def test_the_wide_task_mixes_typos_word_orders_and_refusals(generated) -> None:
    prompts = [s.prompt for s in generated]
    refusals = [s for s in generated if s.answer == kubectl_wide.REFUSAL]
    assert 0.10 < len(refusals) / len(generated) < 0.20  # unsupported_fraction 0.15
    assert any((p.lower().startswith(("in ", "on ")) and ":" in p) or ", " in p for p in prompts)
    words = {w for p in prompts for w in _normal(p).split()}
    assert {"deploymnet", "deplyment", "deployent"} & words or any(len(w) > 4 and w[:3] == "res" for w in words)
    known = _known_words() | _names()
    typoed = sum(1 for p in prompts if set(_normal(p).split()) - known)
    assert typoed / len(prompts) > 0.05


def _known_words() -> set[str]:
    text = json.dumps([kubectl_wide.EXTRA_PHRASINGS, kubectl_wide.EXTRA_OPS, kubectl_wide.UNSUPPORTED,
                       kubectl_wide.REASONS, kubectl_wide.ANY_REASON])  # fmt: skip
    text += json.dumps([core.OPERATIONS, core.IN_NAMESPACE, core.WRAPPERS, kubectl_wide.WIDE_WRAPPERS,
                        kubectl_wide._NS_FIRST])  # fmt: skip
    return set(_normal(re.sub(r"\{\w+\}", " ", text)).split())


def _names() -> set[str]:
    values = [*core.APPS[False], *core.APPS[True], *core.NAMESPACES[False], *core.NAMESPACES[True],
              *core.NODE_POOLS[False], *core.NODE_POOLS[True], *core.KINDS, *core.KIND, *map(str, core.TAGS),
              *kubectl_wide._USERS, *kubectl_wide._LABEL_KEYS[False], *kubectl_wide._LABEL_KEYS[True],
              *kubectl_wide._LABEL_VALUES[False], *kubectl_wide._LABEL_VALUES[True], "yaml", "yml", "manifest",
              "deployment", "service", "k8s", "deploy", "manifests", "config", "secret"]  # fmt: skip
    return set(_normal(" ".join(values)).split())


def test_refusals_say_a_namespace_where_supported_requests_would_and_never_answer_with_one(generated) -> None:
    """A namespace said is no sign that a request is supported: an unsupported request that names a namespaced object
    (and no node, cluster or namespace of its own) says one as often as a supported request may (models trained
    without such refusals refused "restart the api deployment"); the answer stays the refusal, without ``-n``."""
    namespaces = {*core.NAMESPACES[False], *core.NAMESPACES[True]}

    def says_namespace(prompt: str) -> bool:
        return bool(namespaces & set(re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", prompt.lower())))

    refusals = [s for s in generated if s.answer == kubectl_wide.REFUSAL]
    assert not [s for s in generated if s.answer.startswith(kubectl_wide.REFUSAL) and s.answer != kubectl_wide.REFUSAL]
    # beside the bulk ones ("delete everything in prod"), which said a namespace before
    one_object = [
        s for s in refusals if says_namespace(s.prompt) and not re.search(r"\b(every|all|wipe)", s.prompt.lower())
    ]
    assert len(one_object) / len(refusals) > 0.08
    for template in (*kubectl_wide.UNSUPPORTED[False], *kubectl_wide.UNSUPPORTED[True]):
        if kubectl_wide._takes_namespace(template):
            assert not re.search(r"\{(ns|node)\}|cluster|node|namespace", template), template
    assert kubectl_wide._takes_namespace("open a shell in pod {pod}")
    assert not kubectl_wide._takes_namespace("restart every deployment in {ns}")
    assert not kubectl_wide._takes_namespace("ssh into node {node}")


def test_pods_are_named_like_pods_and_small_counts_are_sometimes_spelt_out(generated) -> None:
    """A pod that ``delete`` or ``describe`` names looks like one (``web-7d9f8-x2k4q``, ``web-3``), as ``logs``
    names it; "scale web to three" keeps the digit in the command."""
    pods = [parse(s.answer) for s in generated if s.answer.startswith(("kubectl delete pod ", "kubectl describe pod "))]
    pod_shaped = [c for c in pods if re.search(r"-([a-z0-9]{5}|\d)$", _object(c) or "")]
    assert len(pods) > 50 and len(pod_shaped) / len(pods) > 0.5
    scales = [(s, parse(s.answer)) for s in generated if s.answer.startswith("kubectl scale ")]
    small = [(s, dict(c.flags)["--replicas"]) for s, c in scales if int(dict(c.flags)["--replicas"]) <= 12]
    spelt = [s for s, n in small if kubectl_wide.NUMBER_WORDS[int(n)] in _normal(s.prompt).split()]
    assert 0.1 < len(spelt) / len(small) < 0.4


def _reason_pattern(reason: str) -> re.Pattern:
    return re.compile(re.escape(reason).replace(r"\{port\}", r"\d+"), re.IGNORECASE)


def test_a_reason_fraction_says_why_and_the_why_never_changes_the_command() -> None:
    """With ``reason_fraction``, a request "drain gpu-7 so we can reboot it" is a drain: a reason names other verbs
    (reboot, upgrade, crash) but the command is the request's. The held-out set (the 3-minute bar's) has none."""
    templates = {command for command, *_ in kubectl_wide.wide_ops(core.OPERATIONS)}
    assert set(kubectl_wide.REASONS) <= templates  # a misspelt key would never be used
    options = {**WIDE, "general_fraction": 0.0, "reason_fraction": 0.2}
    train, held = synthetic_splits("kubectl", options, num_train=4000, num_eval=300, seed=3)
    verb_of = {t: parse(t.format_map(_Placeholder())).verb for t in kubectl_wide.REASONS}
    own = [(_reason_pattern(r), t) for t, reasons in kubectl_wide.REASONS.items() for r in reasons]
    anyone = [_reason_pattern(r) for r in kubectl_wide.ANY_REASON]
    with_own, with_any = [], []
    for sample in train:
        verbs = {verb_of[t] for pattern, t in own if pattern.search(sample.prompt)}
        if verbs:
            with_own.append(sample)
            assert parse(sample.answer).verb in verbs, (sample.prompt, sample.answer)
        elif any(p.search(sample.prompt) for p in anyone):
            with_any.append(sample)
    assert 0.08 < (len(with_own) + len(with_any)) / len(train) < 0.3  # some carry a typo in the reason
    assert len({parse(s.answer).verb for s in with_own}) >= 10
    assert any(s.answer == kubectl_wide.REFUSAL for s in with_any)  # a reason does not make a request supported
    assert not [s for s in held if any(p.search(s.prompt) for p, _ in own) or any(p.search(s.prompt) for p in anyone)]
    # off by default (measured: no gain on the unread test split, 0.035 less held-out): the rows are the same as
    # without the option
    default, _ = synthetic_splits("kubectl", {**WIDE, "general_fraction": 0.0}, num_train=4000, num_eval=300, seed=3)
    unchanged = synthetic_splits("kubectl", {**options, "reason_fraction": 0.0}, num_train=4000, num_eval=300, seed=3)
    assert default == unchanged[0] and not [s for s in default if any(p.search(s.prompt) for p in anyone)]


class _Placeholder(dict):
    def __missing__(self, key: str) -> str:
        return {"n": "1", "port": "80", "lport": "8080", "kind": "pod", "kinds": "pods"}.get(key, f"x-{key}")


def test_the_core_task_has_only_the_core_operations() -> None:
    train, held = synthetic_splits("kubectl", {"general_fraction": 0.0}, num_train=3000, num_eval=100, seed=0)
    verbs = {parse(s.answer).verb for s in train + held}
    assert verbs == {"scale", "get", "logs", "describe", "delete", "rollout restart", "create namespace", "expose",
                     "set image", "cordon", "drain"}  # fmt: skip
    assert all(s.answer != kubectl_wide.REFUSAL for s in train + held)


def test_typo_changes_one_word_and_never_a_name() -> None:
    import random

    rng = random.Random(0)
    for _ in range(200):
        text = kubectl_wide.typo(rng, "please restart the billing deployment in staging", {"billing", "staging"})
        before, after = text.split(" "), ["please", "restart", "the", "billing", "deployment", "in", "staging"]
        assert len(before) == len(after)
        assert sum(a != b for a, b in zip(before, after, strict=True)) == 1
        assert "billing" in before and "staging" in before


def test_port_forward_answers_are_equivalent_and_read_only() -> None:
    assert score("kubectl port-forward web-1 8080:8080", "kubectl port-forward pod/web-1 8080") == 1.0
    assert score("kubectl port-forward svc/web 8080 -n prod", "kubectl port-forward service/web 8080 -n prod") == 1.0
    assert score("kubectl port-forward svc/web 9000:80", "kubectl port-forward service/web 80") == 0.5
    assert not changes_unasked("kubectl port-forward svc/web 80", "kubectl get services")
    assert changes_unasked("kubectl uncordon gpu-7", "kubectl get nodes")


def _benchmark():
    """benchmarks/visitor_requests.py as a module."""
    spec = importlib.util.spec_from_file_location("visitor_requests", REPO / "benchmarks" / "visitor_requests.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_benchmark_counts_a_mutating_answer_to_an_unsupported_request() -> None:
    bench = _benchmark()
    rows = [
        {"id": "a", "request": "bounce web", "expected": "kubectl rollout restart deployment web", "read_only": False},
        {"id": "b", "request": "what pods run?", "expected": "kubectl get pods", "read_only": True},
        {"id": "c", "request": "nuke prod", "expected": None, "read_only": True},
        {"id": "d", "request": "exec into web-1", "expected": None, "read_only": True},
    ]
    answers = ["kubectl rollout restart deploy web", "kubectl delete pods --all", "kubectl delete ns prod",
               kubectl_wide.REFUSAL]  # fmt: skip
    figures = bench.score_answers(rows, answers)
    assert figures["exact"] == 1 and figures["exact_share"] == 0.5
    assert figures["mutating_unasked"] == 2 and figures["mutating_ids"] == ["b", "c"]
    assert figures["declined"] == 1


def test_the_benchmark_rescores_kept_answers_through_the_guard(tmp_path) -> None:
    bench = _benchmark()
    read_only = next(r for r in _visitor_rows() if r["split"] == "dev" and r["expected"] is None)
    asked = next(r for r in _visitor_rows() if r["split"] == "dev" and r["expected"] and not r["read_only"])
    kept = [{"id": read_only["id"], "answer": "kubectl delete namespace prod"},
            {"id": asked["id"], "answer": asked["expected"]}]  # fmt: skip
    (tmp_path / "answers.json").write_text(json.dumps(kept))
    figures = bench.rescore(tmp_path / "answers.json", "dev")
    raw, guarded = figures["fine_tuned"]["dev"], figures["fine_tuned_guarded"]["dev"]
    assert raw["requests"] == 2 and raw["mutating_ids"] == [read_only["id"]] and raw["exact"] == 1
    assert guarded["mutating_unasked"] == 0 and guarded["exact"] == 1  # held back; the asked-for change shown
    kept[1] = {"id": asked["id"], "answer": "kubectl get pods", "answer_read": asked["expected"]}  # a typo read
    (tmp_path / "answers.json").write_text(json.dumps(kept))
    figures = bench.rescore(tmp_path / "answers.json", "dev")
    assert figures["fine_tuned"]["dev"]["exact"] == 0 and figures["fine_tuned_read"]["dev"]["exact"] == 1
    assert figures["fine_tuned_guarded"]["dev"]["exact"] == 1  # the panel shows the answer to the reading
