"""Same answers (issue 59 item 4): a LoRA job's adapter on the vLLM base server against the trainer's own evaluation.

    python benchmarks/answers_agree.py JOB [--home DIR] [--limit N] [--out benchmarks/results]

The trainer answers its held-out requests greedily with the model it just trained and writes them to
``output/eval_answers.jsonl`` (prompt messages, answer, expected, verdict). This serves the job the way the chat panel
does (``Playground.serve``: the adapter loaded onto its base model's vLLM server), asks every one of those prompts
greedily (8 at a time, ``max_tokens`` = the trainer's answer budget), and counts token-identical answers and agreeing
exact-match verdicts (the trainer's own rule, :func:`playground.train.evaluate.exact_match`). Prints the figures and
writes them as JSON. Goal: identical answers, or the same verdict on >= 99 %.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job")
    parser.add_argument("--home", default=os.environ.get("PLAYGROUND_HOME"))
    parser.add_argument("--limit", type=int, default=0, help="only the first N requests (0: all)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--tag", default="", help="added to the result file's name")
    args = parser.parse_args(argv)
    if args.home:
        os.environ["PLAYGROUND_HOME"] = args.home

    from playground.backends.local import LocalBackend
    from playground.blueprints import get_blueprint
    from playground.facade import Playground
    from playground.serving.client import chat
    from playground.serving.vllm_server import serving_dtype
    from playground.train.evaluate import exact_match

    backend = Playground(LocalBackend())
    job = backend.get(args.job)
    rows = [json.loads(line) for line in (Path(job.model_dir).parent / "eval_answers.jsonl").read_text().splitlines()]
    rows = rows[: args.limit] if args.limit else rows
    blueprint = get_blueprint(job.blueprint_id)
    budget = max(len(row["expected"]) for row in rows)  # characters: an upper bound on tokens, cut to the serving cap
    max_tokens = min(blueprint.serving.max_new_tokens, budget + 2)
    started = time.monotonic()
    endpoint = backend.serve(job.id)
    serve_seconds = time.monotonic() - started

    def ask(row: dict) -> str:
        return chat(endpoint, row["messages"], max_tokens=max_tokens, temperature=0.0)

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        served = list(pool.map(ask, rows))
    ask_seconds = time.monotonic() - started
    identical = sum(row["answer"].strip() == answer.strip() for row, answer in zip(rows, served, strict=True))
    verdicts = [exact_match([answer], [row["expected"]]) == 1.0 for row, answer in zip(rows, served, strict=True)]
    agree = sum(v == row["correct"] for v, row in zip(verdicts, rows, strict=True))
    differing = [
        {"expected": row["expected"], "trainer": row["answer"], "served": answer}
        for row, answer in zip(rows, served, strict=True)
        if row["answer"].strip() != answer.strip()
    ]
    result = {
        "job": job.id,
        "blueprint": job.blueprint_id,
        "dtype": serving_dtype(),  # PLAYGROUND_VLLM_DTYPE; auto: vLLM's choice (bfloat16 on this CPU)
        "requests": len(rows),
        "identical": identical,
        "verdicts_agree": agree,
        "trainer_exact_match": sum(row["correct"] for row in rows) / len(rows),
        "served_exact_match": sum(verdicts) / len(rows),
        "serve_seconds": round(serve_seconds, 2),
        "ask_seconds": round(ask_seconds, 1),
        "load_average": os.getloadavg()[0],
        "differing": differing[:20],
    }
    print(
        f"{len(rows)} held-out requests: {identical} token-identical ({identical / len(rows):.1%}), verdicts agree on "
        f"{agree} ({agree / len(rows):.1%}); exact match trainer {result['trainer_exact_match']:.3f}, served "
        f"{result['served_exact_match']:.3f}; served in {serve_seconds:.1f}s, answered in {ask_seconds:.0f}s"
    )
    for row in differing[:5]:
        print(f"  differs: expected {row['expected']!r}: trainer {row['trainer']!r}, served {row['served']!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"-{args.tag}" if args.tag else ""
    name = f"answers_agree-{job.blueprint_id}{tag}-{time.strftime('%Y%m%d')}.json"
    (out / name).write_text(json.dumps(result, indent=2))
    backend.unserve(job.id)
    return 0 if agree / len(rows) >= 0.99 else 1


if __name__ == "__main__":
    sys.exit(main())
