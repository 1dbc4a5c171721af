"""Regenerate ``playground/kubectl/general_answers.json``: SmolLM2-135M-Instruct's own answers to
general prompts, mixed into the ``kubectl`` task's training rows so that LoRA keeps the model's
general answers (self-distillation; without them the fine-tuned model answers "What is the capital
of France?" with ``kubectl get capital of France``).

    python scripts/general_answers.py [--max-new-tokens 48]

Greedy answers of the base model through the blueprint's chat template, cut to the first sentence
(two when the first is very short) and to at most 40 tokens, so the rows stay short to train on.
The answers are the base model's, mistakes included: the point is to keep the model as it was.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TARGET = REPO / "playground" / "kubectl" / "general_answers.json"
BLUEPRINT = "smollm2-135m-lora-kubectl"
MAX_ANSWER_TOKENS = 40


def first_sentences(text: str) -> str:
    """The first sentence of the first line (two when the first has fewer than 5 words)."""
    line = text.strip().split("\n")[0].strip()
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", line) if s]
    if not sentences:
        return ""
    answer = sentences[0]
    if len(answer.split()) < 5 and len(sentences) > 1:
        answer += " " + sentences[1]
    return answer.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from playground.blueprints import get_blueprint
    from playground.models.packaged import ensure_converted

    blueprint = get_blueprint(BLUEPRINT)
    base = ensure_converted(blueprint.model.source)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.chat_template = blueprint.model.chat_template
    rows = []
    for prompt in [row["prompt"] for row in json.loads(TARGET.read_text())]:
        inputs = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
        answer = first_sentences(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
        if answer and len(tokenizer(answer)["input_ids"]) <= MAX_ANSWER_TOKENS:
            rows.append({"prompt": prompt, "answer": answer})
            print(json.dumps(rows[-1]), flush=True)
    TARGET.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows to {TARGET}")


if __name__ == "__main__":
    main()
