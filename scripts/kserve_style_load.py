"""Load a model directory the way KServe's HuggingFace runtime does (its HF backend,
``huggingfaceserver/generative_model.py``) and answer chat prompts with it.

    python scripts/kserve_style_load.py MODEL_DIR [PROMPT ...]

The steps are KServe's: ``AutoConfig``, ``AutoTokenizer`` (left padding), the causal-LM class,
the tokenizer's chat template with ``add_generation_prompt=True``, ``tokenizer(prompts,
padding=True)`` and ``model.generate(**inputs, generation_config=...)``. Prints one JSON object
(transformers version, the tokenizer settings a server reads, each answer or its error) and exits
1 when loading fails or any answer is empty. Runs under any transformers version: the test suite
runs it with the installed 5.x, ``scripts/check_transformers4.sh`` with 4.57.6 (KServe's images).
"""

from __future__ import annotations

import json
import os
import sys

DEFAULT_PROMPTS = ["reverse: kube", "reverse: flow", "reverse: gpu", "reverse: serve"]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    model_dir, prompts = argv[0], argv[1:] or DEFAULT_PROMPTS
    report: dict = {"transformers": transformers.__version__, "model_dir": model_dir, "answers": []}
    try:
        config = AutoConfig.from_pretrained(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir, do_lower_case=False, padding_side="left")
        major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
        dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"  # 4.56 renamed torch_dtype
        model = AutoModelForCausalLM.from_pretrained(model_dir, **{dtype_arg: torch.float32})
        model.eval()
    except Exception as exc:
        report["error"] = f"load: {type(exc).__name__}: {exc}"
        print(json.dumps(report, indent=2))
        return 1
    report["tokenizer"] = {
        "class": type(tokenizer).__name__,
        "model_input_names": list(tokenizer.model_input_names),
        "model_max_length": tokenizer.model_max_length,
        "context": getattr(config, "max_position_embeddings", None),
    }
    max_new_tokens = int(getattr(model.generation_config, "max_new_tokens", None) or 16)
    for prompt in prompts:
        entry = {"prompt": prompt, "answer": ""}
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            inputs = tokenizer([text], padding=True, return_tensors="pt")
            entry["inputs"] = sorted(inputs.keys())
            generation = GenerationConfig(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
            generation.eos_token_id = model.generation_config.eos_token_id
            with torch.no_grad():
                out = model.generate(**inputs, generation_config=generation)
            new_tokens = out[:, inputs["input_ids"].shape[-1] :]
            entry["answer"] = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)[0]
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        report["answers"].append(entry)
    answered = sum(1 for a in report["answers"] if a["answer"].strip())
    report["answered"] = f"{answered}/{len(prompts)}"
    print(json.dumps(report, indent=2))
    return 0 if answered == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
