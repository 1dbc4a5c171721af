"""Greedy answers of a model directory loaded the way KServe's HuggingFace runtime loads it, as JSON; and the
comparison of two such answer files, token by token.

    python scripts/kserve_style_load.py MODEL_DIR [PROMPT ...] [--max-new-tokens N] > answers.json
    python scripts/kserve_style_load.py --compare EXPECTED.json ACTUAL.json

The first form prints one JSON object: the transformers version, what the loader read (RoPE base, special
tokens, context) and, per prompt (default: every blueprint's example prompts), the prompt's and the
answer's token ids and the answer's text (``playground/models/kserve_load.py``). It runs under any
transformers version. The second exits 1 on the first token where the two files' answers differ, naming
the directory and the prompt, and 0 when every answer is token-identical.
``python -m playground.models.fidelity DIR`` (``scripts/check_transformers4.sh``) runs both forms under the
installed transformers 5.x and under 4.57.x (KServe's images) and compares them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's playground

from playground.models.fidelity import DEFAULT_MAX_NEW_TOKENS, first_difference, identical_count


def _as_reports(report: dict) -> dict:
    """A one-directory answer file (this script's) in the several-directory shape the comparer reads."""
    return report if "models" in report else {**report, "models": [report]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/kserve_style_load.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", nargs="?", metavar="MODEL_DIR")
    parser.add_argument("prompts", nargs="*", metavar="PROMPT", help="default: every blueprint's example prompts")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--compare", nargs=2, metavar=("EXPECTED", "ACTUAL"), help="compare two answer files")
    args = parser.parse_args(argv)
    if args.compare:
        expected, actual = (_as_reports(json.loads(Path(path).read_text())) for path in args.compare)
        same, total = identical_count(expected, actual)
        difference = first_difference(expected, actual)
        print(f"{same}/{total} answers token-identical" + (f"; first difference: {difference}" if difference else ""))
        return 1 if difference else 0
    if not args.model_dir:
        parser.error("give MODEL_DIR, or --compare EXPECTED ACTUAL")
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from playground.models.fidelity import example_prompts
    from playground.models.kserve_load import answer_all

    prompts = args.prompts or example_prompts()
    spec = {"models": [{"dir": str(Path(args.model_dir).resolve()), "prompts": prompts}]}
    try:
        report = answer_all({**spec, "max_new_tokens": args.max_new_tokens})
    except Exception as exc:
        print(json.dumps({"error": f"load: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}"}))
        return 1
    single = report["models"][0]
    print(json.dumps({"transformers": report["transformers"], "max_new_tokens": args.max_new_tokens, **single}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
