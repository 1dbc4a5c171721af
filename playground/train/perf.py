"""Speed levers of the training loop, each a fixed training setting (a blueprint's ``training:`` block), off
unless set, and kept on a blueprint only where the GPU benchmark showed the loss curve unchanged
(``benchmarks/gpu_blueprints.py``, figures in benchmarks/README.md).

- ``packing``: a micro-batch of examples of different lengths becomes ONE row of their real tokens, with
  ``position_ids`` restarting at 0 for each example. Transformers reads the restarts as packed sequences
  and masks attention block-diagonally (``masking_utils.find_packed_sequence_indices``), so no token
  attends across examples; the first label of every example is ignored, so no token learns to predict
  the next example. The loss is the same function of the same examples as the padded batch (same
  targets, same mean), without computing the padding. Batches with no padding are left as they are.
  Slower on an H100 at the GPU blueprints' batches; 1.3× faster for the default SmolLM2 blueprint on 2 CPU
  cores (44 % of its padded positions were padding), where it is on. With ``cpu_bf16`` the row is rounded up.
- ``compile``: ``torch.compile`` of the training forward (and so backward): fused norms, RoPE,
  activations and the loss. The first steps pay the compilation (MFU and the benchmark leave the
  warm-up steps out); eval, generation and saving use the uncompiled module.
- ``cpu_bf16``: on a CPU, the training forward and backward under ``torch.autocast("cpu", bfloat16)``: matmuls in
  bf16 over float32 weights, LoRA adapters and optimizer state (as on a GPU for scratch models). Only where the
  CPU has bf16 instructions (AVX512-BF16 or AMX; emulated bf16 is slower than float32), else float32 with a log
  line. Evaluation, generation and the saved model stay float32, as the model is served. A micro-batch's width is
  rounded up to ``CPU_BF16_WIDTH_MULTIPLE`` tokens: oneDNN keeps a bf16 matmul (with its own copy of the weights)
  for every shape it meets, so batches of every width from 30 to 96 grew the trainer by ~25 MB a step (3.3 GB
  after 60 steps, 5.3 GB peak over 200); rounded, it stays flat below float32's. SmolLM2-135M LoRA on 2 cores of
  an AMD EPYC with AVX512-BF16: 1.83 → 0.95 s per step (benchmarks/README.md).

Always on:
- answer-only logits (``causal_lm_loss``): the loss reads the logits of the positions whose next token is an
  answer token, so only those go through ``lm_head`` and the cross-entropy (transformers' ``logits_to_keep``).
  Prompts and padding are most of a chat batch (two thirds of SmolLM2's kubectl batches) and the vocabulary
  projection is a fifth of a small model's forward: the entrypoint went from 0.90× to 1.13× PEFT + HF
  ``Trainer``'s steps/s for SmolLM2-135M LoRA on 2 CPU cores. The loss and gradients are the same (the other
  positions' logits never reached the loss). Not with ``compile``, whose graph wants fixed shapes.
- SDPA attention (flash / cuDNN kernels on the GPU), transformers' default, and fused AdamW on CUDA.
"""

from __future__ import annotations

import functools
from typing import Any

PERF_SETTINGS = ("packing", "compile", "cpu_bf16")
CPU_BF16_WIDTH_MULTIPLE = 16  # tokens: a bf16 micro-batch's width is a multiple of this (few shapes for oneDNN)


def padded_width(longest: int, multiple: int, cap: int) -> int:
    """A micro-batch's width: its longest row rounded up to ``multiple`` tokens, at most ``cap`` (the trainer's
    :class:`~playground.train.data.Batches` and ``playground plan`` both ask this)."""
    return min(-(-longest // multiple) * multiple, cap)


def computed_positions(lengths: list[int], multiple: int, cap: int, *, packing: bool) -> int:
    """Positions the forward computes for a micro-batch of rows this long: the rows at their padded width
    (:func:`padded_width`), or with ``packing`` and some padding the one packed row, its tokens rounded up to
    ``multiple`` (what :func:`model_inputs` builds). The trainer and ``playground plan`` both ask this."""
    width = padded_width(max(lengths), multiple, cap)
    if packing and min(lengths) < width:
        return -(-sum(lengths) // multiple) * multiple
    return width * len(lengths)


def cpu_has_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (oneDNN's check: AVX512-BF16 or AMX)."""
    import torch

    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def model_inputs(ids: Any, labels: Any, lengths: Any, *, packing: bool, width_multiple: int = 1) -> dict[str, Any]:
    """The forward's keyword arguments for a micro-batch: the padded rows as they are, or (``packing``
    and some padding) one packed row with per-example ``position_ids``, its width rounded up to
    ``width_multiple`` (see :func:`pack_rows`). No KV cache in training: it is of no use there, and
    transformers only reads packed ``position_ids`` when there is none."""
    if not packing or int(lengths.min()) == ids.shape[1]:
        return {"input_ids": ids, "labels": labels, "use_cache": False}
    packed_ids, packed_labels, position_ids = pack_rows(ids, labels, lengths, width_multiple=width_multiple)
    return {"input_ids": packed_ids, "labels": packed_labels, "position_ids": position_ids, "use_cache": False}


def causal_lm_loss(
    model: Any, inputs: dict[str, Any], num_items_in_batch: int, *, answer_only: bool = True,
    boolean_mask: bool | None = None,
) -> Any:  # fmt: skip
    """The micro-batch's summed next-token loss over its answer tokens divided by ``num_items_in_batch`` (the
    step's answer tokens): transformers' causal-LM loss. ``answer_only`` computes logits only where the loss
    reads them: exactly those positions where transformers takes a boolean ``logits_to_keep``, else the
    positions any row needs (a 1D ``logits_to_keep``, transformers ≥ 4.50). ``boolean_mask``: force one form
    (None: the boolean one where supported)."""
    import torch

    if not answer_only:
        return model(**inputs, num_items_in_batch=num_items_in_batch).loss
    labels = inputs["labels"]
    targets = labels[:, 1:]  # the logit at position t predicts the token at t + 1
    needed = targets != -100
    rest = {name: value for name, value in inputs.items() if name != "labels"}
    if boolean_logits_mask() if boolean_mask is None else boolean_mask:
        keep = torch.nn.functional.pad(needed, (0, 1), value=False)
        logits, chosen = model(**rest, logits_to_keep=keep).logits, targets[needed]  # [N, V], [N]
    else:
        positions = needed.any(0).nonzero().squeeze(1)
        logits, chosen = model(**rest, logits_to_keep=positions).logits, targets[:, positions]  # [B, P, V]
    loss = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), chosen.reshape(-1), ignore_index=-100, reduction="sum"
    )
    return loss / num_items_in_batch


@functools.cache
def boolean_logits_mask() -> bool:
    """Whether this transformers keeps the logits of a ``[batch, seq]`` boolean ``logits_to_keep`` (newer 5.x)."""
    import torch

    try:
        from transformers.modeling_utils import slice_logits_to_keep

        kept = slice_logits_to_keep(torch.arange(4.0).reshape(1, 2, 2), torch.tensor([[False, True]]))
    except Exception:  # older releases: no such helper, or a 1D index only
        return False
    return kept.tolist() == [[2.0, 3.0]]


def pack_rows(ids: Any, labels: Any, lengths: Any, *, width_multiple: int = 1) -> tuple[Any, Any, Any]:
    """Concatenate the first ``lengths[i]`` tokens of every row into one row ``[1, sum(lengths)]``;
    positions restart at 0 per example and each example's first label is -100. With ``width_multiple``
    the row is rounded up by a filler of padding tokens: a sequence of its own (positions from 0, no
    labels), which no example attends to, so the loss and gradients are the same and the row takes few
    widths (oneDNN keeps a bf16 matmul for each width it meets)."""
    import torch

    lengths = lengths.to("cpu", torch.long)
    width = ids.shape[1]
    starts = torch.arange(len(lengths)) * width
    index = torch.cat([torch.arange(int(s), int(s) + int(n)) for s, n in zip(starts, lengths, strict=True)])
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    first = torch.cumsum(lengths, 0) - lengths  # where each example starts in the packed row
    index = index.to(ids.device, non_blocking=True)
    packed_ids = ids.reshape(-1).index_select(0, index)
    packed_labels = labels.reshape(-1).index_select(0, index).clone()
    packed_labels[first.to(ids.device)] = -100
    filler = -len(index) % max(1, width_multiple)
    if filler:
        pad_id = ids[int(lengths.argmin()), -1]  # the padding of the shortest row
        packed_ids = torch.cat([packed_ids, pad_id.expand(filler)])
        packed_labels = torch.cat([packed_labels, packed_labels.new_full((filler,), -100)])
        positions = torch.cat([positions, torch.arange(filler)])
    return packed_ids.unsqueeze(0), packed_labels.unsqueeze(0), positions.to(ids.device, non_blocking=True).unsqueeze(0)


def compile_model(model: Any, *, dynamic: bool) -> Any:
    """``torch.compile`` the module used for training steps (``dynamic``: shapes vary, e.g. packed rows)."""
    import torch

    return torch.compile(model, dynamic=dynamic)
