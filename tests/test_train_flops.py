"""The FLOP counter behind MFU, against a hand computation for one small config."""

from __future__ import annotations

import pytest

from playground.train.flops import FlopCounter, attention_span, count_flops, mfu, peak_flops

# A small Llama: vocabulary 100, width 64, MLP 128, 2 layers, 4 query heads of 16, 2 KV heads (GQA),
# lm_head tied to the embeddings.
CONFIG = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
# By hand, weights of the matmuls per layer: q 64·64 = 4096, k 64·32 = 2048, v 2048, o 4096,
# gate/up/down 64·128 = 8192 each → 36864; two layers 73728; lm_head 64·100 = 6400 (counted although
# tied: its matmul runs; the embedding lookup is not a matmul) → 80128.
MATMUL_PARAMS = 80128
# QKᵀ and AV: 12 · layers · (heads · head_dim) = 12 · 2 · 64 FLOPs per token per token of context.
ATTENTION_COEFF = 1536
# LoRA rank 4 on q_proj and v_proj, per layer: q A 64·4 + B 4·64 = 512, v A 64·4 + B 4·32 = 384 → 896; two layers.
LORA_PARAMS = 1792


def _model(lora: bool):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return model


def test_full_fine_tune_counts_six_flops_per_matmul_weight_plus_attention() -> None:
    counter = count_flops(_model(lora=False))
    assert counter == FlopCounter(MATMUL_PARAMS, 0, layers=2, attention_width=64)
    assert counter.per_token(10) == 6 * 80128 + 1536 * 10 == 496128
    # two sequences of 3 and 5 tokens: matmuls per token, attention per token per token of its own sequence
    assert counter.batch(n_tokens=8, sum_sq_lengths=3 * 3 + 5 * 5) == 6 * 80128 * 8 + 1536 * 34


def test_variable_lengths_average_attention_over_each_examples_own_span() -> None:
    counter = FlopCounter(MATMUL_PARAMS, 0, layers=2, attention_width=64)
    # a token of the 3-token example attends over 3, one of the 5-token example over 5: (3·3 + 5·5) / 8
    assert attention_span([3, 5]) == 34 / 8 and attention_span([]) == 0.0
    assert counter.mean_per_token([3, 5]) == pytest.approx(counter.batch(8, 34) / 8)
    assert counter.mean_per_token(n for n in [10, 10, 10]) == counter.per_token(10)  # equal lengths: one span


def test_lora_frozen_weights_do_forward_and_input_gradient_work_only() -> None:
    counter = count_flops(_model(lora=True))
    assert counter.trainable_matmul_params == LORA_PARAMS and counter.frozen_matmul_params == MATMUL_PARAMS
    assert counter.matmul_coeff == 4 * 80128 + 6 * 1792 == 331264
    assert counter.attention_coeff == ATTENTION_COEFF  # activations still need both gradients


def test_peak_table_matches_the_right_device_and_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLAYGROUND_PEAK_FLOPS", raising=False)
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA GH200 480GB") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12  # not the A10's figure
    assert peak_flops("NVIDIA A10G") == 70e12
    assert peak_flops("NVIDIA GeForce GTX 1080") is None and peak_flops(None) is None
    monkeypatch.setenv("PLAYGROUND_PEAK_FLOPS", "2e12")
    assert peak_flops(None) == 2e12


def test_mfu_is_per_device_flops_per_second_over_peak() -> None:
    assert mfu(4e14, 2.0, 989e12) == pytest.approx(4e14 / 2 / 989e12)
    assert mfu(1e12, 1.0, None) is None and mfu(0, 1.0, 1e12) is None and mfu(1e12, 0.0, 1e12) is None
