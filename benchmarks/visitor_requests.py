"""Visitors type their own requests (issue 20, item 5): the embedded default blueprint on a visitor-style set.

    python benchmarks/visitor_requests.py [--model-dir DIR] [--split SPLIT|all] [--show] [--keep DIR] [--answers FILE]

The set (benchmarks/data/visitor_requests.jsonl) was written apart from the training generator's templates
(playground/kubectl/generator.py, wide.py; tests/test_kubectl_wide.py checks no request is one the
generator makes): casual words, synonyms, other word orders, typos, and requests no supported operation
answers. Without ``--model-dir`` the blueprint is trained with its defaults through the real entrypoint (2 cores:
the ≥ 0.80-in-3-minutes bar on the synthetic held-out set is reported too, from the same run).

Scored per request, greedy, the chat template the server uses:

- **exact**: a supported request answered with a command equivalent to the expected one
  (playground/kubectl/reward.py ``score == 1``); goal ≥ 85 % over the supported requests;
- **mutating**: a read-only or unsupported request answered with a command that would change the cluster
  (``changes_unasked``); goal 0 in the whole set;
- **declined**: an unsupported request answered without any command (the refusal, or prose).

Each figure is given for the model's raw answers to the requests as typed (``fine_tuned``), to the requests as
the chat panel reads them (``fine_tuned_read``: the blueprint's ``serving.normalize: kubectl``,
playground/kubectl/request.py, spells mistyped kubectl words right and says a typed ``-n NAME`` in words; only the
requests it changes are asked again), and for what the chat panel shows (``fine_tuned_guarded``): those answers
with the namespace the request says added where the command has none (``serving.complete: kubectl``,
playground/kubectl/answer.py), through the blueprint's ``serving.guard: kubectl`` (playground/kubectl/guard.py), which
replaces a cluster-changing command the request as typed did not ask for with the refusal.

Splits: ``dev`` (40) and ``dev2`` (80: the test split until 2026-11-27) were read while tuning the generator and the
guard. ``dev3`` … ``dev10`` (ids ``f…`` to ``l…``, and ``n…``) and ``test`` (``m…``) were each written later by
someone who saw neither the generator, the guard nor the other sets; ``dev3`` … ``dev10`` were each the test split for
one or more measurements, then read (``dev10`` was ``test2`` from 2026-11-28 until its guard leaks were read on
2026-11-29). The test split's answers stay unread while tuning.

``--show`` prints the misses of every split but ``test``; ``--keep DIR`` trains into DIR and keeps its ``model/`` and
the answers (``answers.json``); ``--answers FILE`` scores such a file again through the guard as it is now, without a
model.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
VISITOR_SET = Path(__file__).with_name("data") / "visitor_requests.jsonl"


def _smollm2():
    spec = importlib.util.spec_from_file_location("smollm2_kubectl", Path(__file__).with_name("smollm2_kubectl.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_set(split: str = "all") -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in VISITOR_SET.read_text().splitlines() if line.strip()]
    return [r for r in rows if split == "all" or r["split"] == split]


def score_answers(rows: list[dict[str, Any]], answers: list[str]) -> dict[str, Any]:
    """The visitor-set figures of ``answers`` (one per row)."""
    from playground.kubectl.reward import changes_unasked, extract, score

    supported = [(r, a) for r, a in zip(rows, answers, strict=True) if r["expected"]]
    unsupported = [(r, a) for r, a in zip(rows, answers, strict=True) if not r["expected"]]
    exact = [r["id"] for r, a in supported if score(a, r["expected"]) == 1.0]
    mutating = [
        r["id"]
        for r, a in zip(rows, answers, strict=True)
        if r["read_only"] and changes_unasked(a, r["expected"] if r["expected"] else "kubectl get nothing")
    ]
    declined = [r["id"] for r, a in unsupported if extract(a)[0] is None]
    return {
        "requests": len(rows),
        "supported": len(supported),
        "exact": len(exact),
        "exact_share": round(len(exact) / len(supported), 3) if supported else None,
        "unsupported": len(unsupported),
        "declined": len(declined),
        "read_only": sum(bool(r["read_only"]) for r in rows),
        "mutating_unasked": len(mutating),
        "mutating_ids": mutating,
    }


def per_split(rows: list[dict[str, Any]], answers: list[str]) -> dict[str, Any]:
    """:func:`score_answers` for each split present, then for all of them."""
    figures = {}
    for split in sorted({r["split"] for r in rows}, reverse=True):
        chosen = [(r, a) for r, a in zip(rows, answers, strict=True) if r["split"] == split]
        figures[split] = score_answers([r for r, _ in chosen], [a for _, a in chosen])
    return figures


def asker(model_dir: Path) -> Callable[[list[str]], list[str]]:
    """The model in ``model_dir``, loaded once, as a function from requests to its greedy answers."""
    bench = _smollm2()
    model, tokenizer = bench._model(model_dir, None)
    return lambda prompts: bench._answers(model, tokenizer, prompts, 48)


def get_blueprint_serving():
    """The default blueprint's ``serving`` settings: what the chat panel does around the model."""
    from playground.blueprints import get_blueprint

    return get_blueprint(_smollm2().BLUEPRINT).serving


def readings(rows: list[dict[str, Any]]) -> list[str]:
    """Each request as the chat panel asks the models it (the blueprint's ``serving.normalize``)."""
    from playground.kubectl.request import normalize

    if get_blueprint_serving().normalize != "kubectl":
        return [r["request"] for r in rows]
    return [normalize(r["request"]) for r in rows]


def answers_read(ask: Callable[[list[str]], list[str]], rows: list[dict[str, Any]], typed: list[str]) -> list[str]:
    """The model's answers (``ask``) to the requests as read (:func:`readings`): ``typed``'s where the reading is the
    request."""
    read = readings(rows)
    changed = [i for i, r in enumerate(rows) if read[i] != r["request"]]
    answers = list(typed)
    for i, a in zip(changed, ask([read[i] for i in changed]) if changed else [], strict=True):
        answers[i] = a
    return answers


def fine_tuned_figures(rows: list[dict[str, Any]], typed: list[str], read: list[str] | None = None) -> dict[str, Any]:
    """:func:`per_split` of the model's answers to the requests as typed (``fine_tuned``), as read
    (``fine_tuned_read``: mistyped kubectl words spelt right, playground/kubectl/request.py) and those with the
    namespace the request says added where they have none (playground/kubectl/answer.py) through the guard, which
    judges the request as typed (``fine_tuned_guarded``: what the chat panel shows)."""
    from playground.kubectl.answer import complete
    from playground.kubectl.guard import guard

    read = typed if read is None else read
    if get_blueprint_serving().complete == "kubectl":  # the namespace the request says, where the answer has none
        read_shown = [complete(r["request"], a) for r, a in zip(rows, read, strict=True)]
    else:
        read_shown = read
    guarded = [guard(r["request"], a) for r, a in zip(rows, read_shown, strict=True)]
    return {
        "fine_tuned": per_split(rows, typed),
        "fine_tuned_read": per_split(rows, read),
        "fine_tuned_guarded": per_split(rows, guarded),
    }


def rescore(answers_file: Path, split: str) -> dict[str, Any]:
    """The figures of kept answers (``--keep``'s answers.json) on ``split``, raw and through the guard as it is now:
    a guard change measured without a model. Rows the file has no answer for are left out."""
    kept = {a["id"]: a for a in json.loads(answers_file.read_text())}
    rows = [r for r in load_set(split) if r["id"] in kept]
    typed = [kept[r["id"]]["answer"] for r in rows]
    return fine_tuned_figures(rows, typed, [kept[r["id"]].get("answer_read", kept[r["id"]]["answer"]) for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="a trained model/ directory (default: train one now)")
    parser.add_argument("--split", default="all", choices=[*sorted({r["split"] for r in load_set()}), "all"])
    parser.add_argument("--show", action="store_true", help="print the dev splits' misses")
    parser.add_argument("--skip-base", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a training parameter")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="the training run's seed (another draw of the same recipe)")
    parser.add_argument("--keep", type=Path, help="train into this directory and keep it (model/ and answers.json)")
    parser.add_argument("--answers", type=Path, help="score a kept answers.json through the current guard (no model)")
    args = parser.parse_args()
    if args.answers:
        print(json.dumps(rescore(args.answers, args.split), indent=1))
        return
    from playground.blueprints import get_blueprint
    from playground.kubectl.reward import score
    from playground.models.packaged import ensure_converted

    bench = _smollm2()
    blueprint = get_blueprint(bench.BLUEPRINT)
    rows = load_set(args.split)
    results: dict[str, Any] = {"split": args.split, "load_start": bench._load_avg()}
    with tempfile.TemporaryDirectory(prefix="visitor-bench-") as tmp_dir:
        tmp = str(args.keep) if args.keep else tmp_dir
        if not args.skip_base:
            base_dir = ensure_converted(blueprint.model.source)
            results["base"] = per_split(rows, asker(base_dir)([r["request"] for r in rows]))
            print(json.dumps({"base": results["base"]}), flush=True)
        model_dir = args.model_dir
        if model_dir is None:
            overrides = dict(item.split("=", 1) for item in args.set)
            training = bench.train(
                Path(tmp) / "train", eval_every=args.eval_every, num_eval=100, seed=args.seed, **overrides
            )
            kept = ("bar_step", "bar_train_seconds", "final_exact_match", "train_seconds", "peak_rss_gb", "history")
            results["training"] = {k: training[k] for k in kept}
            print(json.dumps({"training": results["training"]}), flush=True)
            model_dir = Path(tmp) / "train" / "model"
        started = time.perf_counter()
        ask = asker(model_dir)  # loaded once for both the typed and the read requests
        answers = ask([r["request"] for r in rows])
        read = answers_read(ask, rows, answers)
        results.update(fine_tuned_figures(rows, answers, read))
        print(json.dumps({"fine_tuned": results["fine_tuned"], "guarded": results["fine_tuned_guarded"]}), flush=True)
        results["answer_seconds"] = round(time.perf_counter() - started, 1)
        if args.keep:
            kept_answers = [
                {"id": r["id"], "answer": a, **({"answer_read": b} if b != a else {})}
                for r, a, b in zip(rows, answers, read, strict=True)
            ]
            args.keep.mkdir(parents=True, exist_ok=True)  # also with --model-dir, where nothing was trained into it
            (args.keep / "answers.json").write_text(json.dumps(kept_answers, indent=1))
        if args.show:
            misses = [
                (r["request"], r["expected"], a)
                for r, a in zip(rows, answers, strict=True)
                if not r["split"].startswith("test")
                and (score(a, r["expected"]) < 1.0 if r["expected"] else "kubectl" in a)
            ]
            results["dev_misses"] = misses
    results["load_end"] = bench._load_avg()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
