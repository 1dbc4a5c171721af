"""Held-out answers: one generate() call per prompt length (before) vs prompts left-padded into batches (now).

    python benchmarks/held_out_answers.py [--num-eval 50] [--model DIR] [--batch 64 16]

The held-out exact match asks the model every held-out request by greedy generation
(``playground.train.evaluate.generate_answers``): the Evaluating phase a visitor waits through after the last
step. Prints the seconds of each way and how many answers are the same text (the padded batch is masked, so they
should all be). ``--model``: a model directory (default: the converted SmolLM2 base of the default blueprint).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def by_length(model: Any, tokenizer: Any, prompt_ids: list[list[int]], max_new_tokens: int) -> list[str]:
    """The former way: prompts grouped by length, one generate() per group (no padding)."""
    import torch

    groups: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(prompt_ids):
        groups[len(ids)].append(i)
    answers = [""] * len(prompt_ids)
    with torch.no_grad():
        for indices in groups.values():
            ids = torch.tensor([prompt_ids[i] for i in indices])
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                eos_token_id=model.generation_config.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
            for i, row in zip(indices, out[:, ids.shape[1] :].tolist(), strict=True):
                answers[i] = tokenizer.decode(row, skip_special_tokens=True)
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-eval", type=int, default=50, help="held-out requests (the blueprint's default: 50)")
    parser.add_argument("--model", default=None, help="model directory (default: the converted SmolLM2 base)")
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 16], help="batch sizes of the padded way")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from playground.blueprints import get_blueprint
    from playground.models.packaged import ensure_converted
    from playground.train import evaluate
    from playground.train.preferences import kubectl_requests

    model_dir = args.model or str(ensure_converted(get_blueprint("smollm2-135m-lora-kubectl").model.source))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    _, held = kubectl_requests({"held_out_phrasing": 0.5}, num_train=10, num_eval=args.num_eval, seed=0)
    prompt_ids = [
        list(tokenizer.apply_chat_template(s.prompt_messages(), add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])
        for s in held
    ]  # fmt: skip
    max_new = min(64, max(len(tokenizer(s.answer)["input_ids"]) for s in held) + 8)
    started = time.perf_counter()
    before = by_length(model, tokenizer, prompt_ids, max_new)
    report: dict[str, Any] = {
        "model": Path(model_dir).name, "prompts": len(prompt_ids), "prompt_lengths": len({len(p) for p in prompt_ids}),
        "max_new_tokens": max_new, "threads": torch.get_num_threads(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "by_length_seconds": round(time.perf_counter() - started, 2),
    }  # fmt: skip
    for batch in args.batch:
        started = time.perf_counter()
        now = evaluate.generate_answers(model, tokenizer, prompt_ids, max_new_tokens=max_new, device="cpu",
                                        batch_size=batch)  # fmt: skip
        report[f"padded_batch_{batch}_seconds"] = round(time.perf_counter() - started, 2)
        report[f"padded_batch_{batch}_same_answers"] = sum(a == b for a, b in zip(before, now, strict=True))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
