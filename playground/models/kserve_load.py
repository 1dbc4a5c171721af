"""Greedy answers from model directories, loaded the way KServe's HuggingFace runtime loads them.

    python -m playground.models.kserve_load SPEC.json > ANSWERS.json

``SPEC.json``: ``{"models": [{"dir": DIR, "prompts": [PROMPT, ...]}, ...], "max_new_tokens": N}``.
The steps are KServe's (``huggingfaceserver``'s HF backend): ``AutoConfig``, ``AutoTokenizer`` (left
padding), the causal-LM class in float32, the tokenizer's chat template with ``add_generation_prompt``,
``model.generate`` with the directory's own ``generation_config.json`` (EOS, pad), greedy. One prompt at a
time (no padding: what a server answering one request computes). Prints one JSON object:
the transformers version and, per directory, what the loader read (RoPE base, special tokens) and each
answer's new token ids and text; exits 1 when a directory does not load.

Needs only torch and transformers (stdlib otherwise) and imports nothing else of the project, so it runs
unchanged under any transformers version: :mod:`playground.models.fidelity` runs it under the installed
5.x and under 4.57.x (the 4.x line KServe's images still ship) and compares the token ids.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _rope(config: Any) -> dict[str, Any]:
    """The RoPE settings the loaded model uses: transformers 5 reads ``rope_parameters``, 4.x ``rope_theta``
    and ``rope_scaling`` (None: the default RoPE)."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        params = dict(getattr(config, "rope_parameters", None) or {})
        theta = params.pop("rope_theta", None)
        params.pop("partial_rotary_factor", None)
    else:
        theta = getattr(config, "rope_theta", None)
        params = dict(getattr(config, "rope_scaling", None) or {"rope_type": "default"})
        params.pop("type", None)
    return {"rope_theta": float(theta) if theta is not None else None, "rope_scaling": params}


def answer_model(model_dir: str, prompts: list[str], max_new_tokens: int) -> dict[str, Any]:
    """Load ``model_dir`` as KServe does and answer each prompt greedily (new token ids and text)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32)
    model.eval()
    generation = model.generation_config
    report: dict[str, Any] = {
        "dir": model_dir,
        "read": {
            **_rope(model.config),
            "eos_token_id": generation.eos_token_id,
            "pad_token_id": generation.pad_token_id,
            "bos_token_id": generation.bos_token_id,
            "tokenizer_eos": tokenizer.eos_token,
            "tokenizer_pad": tokenizer.pad_token,
            "model_input_names": list(tokenizer.model_input_names),
            "model_max_length": tokenizer.model_max_length,
            "context": getattr(config, "max_position_embeddings", None),
        },
        "answers": [],
    }
    for prompt in prompts:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        inputs = tokenizer([text], return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        new = out[0, inputs["input_ids"].shape[-1] :].tolist()
        report["answers"].append(
            {
                "prompt": prompt,
                "inputs": sorted(inputs.keys()),  # what generate gets (no token_type_ids)
                "prompt_ids": inputs["input_ids"][0].tolist(),
                "token_ids": new,
                "text": tokenizer.decode(new, skip_special_tokens=True),
            }
        )
    return report


def answer_all(spec: dict[str, Any]) -> dict[str, Any]:
    """Every directory of ``spec`` answered (see the module docstring for the shape)."""
    import torch
    import transformers

    torch.manual_seed(0)
    max_new_tokens = int(spec.get("max_new_tokens", 24))
    return {
        "transformers": transformers.__version__,
        "max_new_tokens": max_new_tokens,
        "models": [answer_model(m["dir"], list(m["prompts"]), max_new_tokens) for m in spec["models"]],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with open(argv[0]) as fh:
        spec = json.load(fh)
    try:
        report = answer_all(spec)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"}))
        return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
