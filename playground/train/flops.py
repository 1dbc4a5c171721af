"""Training FLOPs and MFU (model FLOPs utilisation).

MFU = model FLOPs done per second per device / the device's dense bf16 peak FLOP/s. "Model FLOPs"
are the FLOPs the model needs for the tokens it trains on (the PaLM definition, appendix B), not
what the kernels happen to execute: padding, recomputation and the masked half of causal attention
are not counted, so MFU compares fairly across implementations and with published figures.

FLOPs per trained token, forward + backward:

* **Matmuls with weights** (every ``nn.Linear``: attention projections, MLP, the ``lm_head``, LoRA's
  ``A``/``B``). A weight of ``N`` parameters costs ``2N`` in the forward pass, ``2N`` for the
  gradient with respect to its input, and ``2N`` for the gradient with respect to the weight:
  ``6N`` when the weight trains, ``4N`` when it is frozen (LoRA's base weights still pass the
  gradient through to the adapters below them, but get no weight gradient). Autograd skips the
  input gradient below the lowest trainable weight (for LoRA on q/v: a few matmuls of the first
  layer); we ignore that sliver, as everyone does.
* **Embeddings** are a lookup, not a matmul: 0 (even when tied to the ``lm_head``, whose matmul counts).
* **Attention scores and values** (``QKᵀ`` and ``AV``, no weights): ``2·T·d`` each in the forward
  pass per token per layer, for a sequence of ``T`` tokens and ``d = heads × head_dim`` query
  width, and twice that backward (gradients for both operands): ``12·L·d·T`` per token over ``L``
  layers. Like PaLM, nanoGPT and torchtitan we count the full ``T`` (not the causal half), so the
  figure is comparable with theirs. A sequence of ``T`` tokens costs ``12·L·d·T²`` in total.
* Norms, activations, softmax, RoPE, the loss and the optimizer are ``O(d)`` per token: left out.

So a step over sequences of lengths ``t_i`` costs ``matmul_coeff · Σt_i + attention_coeff · Σt_i²``;
per token that is ``matmul_coeff + attention_coeff · Σt_i²/Σt_i``: the attention span ``Σt²/Σt`` is the
mean context a token attends over (its own example's length, whether examples are padded or packed with
attention kept within each example).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Dense bf16 peak FLOP/s per device (no 2:4 sparsity), by a substring of torch.cuda.get_device_name().
# Longest names first, so "H100" does not shadow "GH200" and "A10" does not shadow "A100".
PEAK_FLOPS: dict[str, float] = {
    "GH200": 989e12,
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
    "A10": 125e12,
    "L4": 121e12,
}
PEAK_FLOPS_ENV = "PLAYGROUND_PEAK_FLOPS"  # overrides the table (an unlisted GPU, or a CPU estimate)
# Steps at the start of a process (after a resume too) whose time MFU leaves out: CUDA context,
# cuBLAS/kernel selection and the allocator warming up would understate the steady rate.
MFU_WARMUP_STEPS = 3


@dataclass(frozen=True)
class FlopCounter:
    """FLOPs of one training pass, from the model's modules and config (see the module docstring)."""

    trainable_matmul_params: int  # weights of nn.Linear modules that train: 6 FLOPs per param per token
    frozen_matmul_params: int  # weights of frozen nn.Linear modules: 4 FLOPs per param per token
    layers: int
    attention_width: int  # heads × head_dim (query width)

    @property
    def matmul_coeff(self) -> int:
        """FLOPs per token of the weight matmuls, forward + backward."""
        return 6 * self.trainable_matmul_params + 4 * self.frozen_matmul_params

    @property
    def attention_coeff(self) -> int:
        """FLOPs per token per token of context of ``QKᵀ`` and ``AV``, forward + backward."""
        return 12 * self.layers * self.attention_width

    def per_token(self, seq_len: int) -> int:
        """FLOPs per token for sequences of ``seq_len`` tokens."""
        return self.matmul_coeff + self.attention_coeff * seq_len

    def batch(self, n_tokens: int, sum_sq_lengths: int) -> int:
        """FLOPs of a batch of sequences with ``Σt = n_tokens`` and ``Σt² = sum_sq_lengths``."""
        return self.matmul_coeff * n_tokens + self.attention_coeff * sum_sq_lengths

    def mean_per_token(self, lengths: Iterable[int]) -> float:
        """Mean FLOPs per token over examples of these lengths (variable-length data, padded or packed)."""
        return self.matmul_coeff + self.attention_coeff * attention_span(lengths)


def attention_span(lengths: Iterable[int]) -> float:
    """``Σt²/Σt``: the mean number of tokens a token attends over when its example has ``t`` tokens."""
    total = squares = 0
    for n in lengths:
        total, squares = total + n, squares + n * n
    return squares / total if total else 0.0


def count_flops(model: Any) -> FlopCounter:
    """The FlopCounter of a (possibly peft-wrapped) Hugging Face causal LM, as it will train."""
    import torch

    trainable = frozen = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            n = module.weight.numel()  # the bias is an addition, not a matmul
            if module.weight.requires_grad:
                trainable += n
            else:
                frozen += n
    config = _text_config(model)
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return FlopCounter(trainable, frozen, int(config.num_hidden_layers), heads * int(head_dim))


def _text_config(model: Any) -> Any:
    config = getattr(model, "config", None)
    if config is None:  # peft wrappers keep the HF model underneath
        config = model.get_base_model().config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def peak_flops(device_name: str | None) -> float | None:
    """Dense bf16 peak FLOP/s of one device (None when unknown: MFU is then not reported).
    ``PLAYGROUND_PEAK_FLOPS`` overrides the table."""
    override = os.environ.get(PEAK_FLOPS_ENV)
    if override:
        return float(override)
    if not device_name:
        return None
    return next((flops for name, flops in PEAK_FLOPS.items() if name in device_name), None)


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation of one device that did ``flops`` model FLOPs in ``seconds``."""
    if not peak or seconds <= 0 or flops <= 0:
        return None
    return flops / seconds / peak
