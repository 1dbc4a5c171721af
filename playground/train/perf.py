"""Speed levers of the training loop, each a fixed training setting (a blueprint's ``training:`` block), off
unless set, and kept on a blueprint only where the GPU benchmark showed the loss curve unchanged
(``benchmarks/gpu_blueprints.py``, figures in benchmarks/README.md).

- ``packing``: a micro-batch of examples of different lengths becomes ONE row of their real tokens, with
  ``position_ids`` restarting at 0 for each example. Transformers reads the restarts as packed sequences
  and masks attention block-diagonally (``masking_utils.find_packed_sequence_indices``), so no token
  attends across examples; the first label of every example is ignored, so no token learns to predict
  the next example. The loss is the same function of the same examples as the padded batch (same
  targets, same mean), without computing the padding. Batches with no padding are left as they are.
- ``compile``: ``torch.compile`` of the training forward (and so backward): fused norms, RoPE,
  activations and the loss. The first steps pay the compilation (MFU and the benchmark leave the
  warm-up steps out); eval, generation and saving use the uncompiled module.

SDPA attention (flash / cuDNN kernels on the GPU) is transformers' default and fused AdamW is the
optimizer's default on CUDA: both are always on.
"""

from __future__ import annotations

from typing import Any

PERF_SETTINGS = ("packing", "compile")


def model_inputs(ids: Any, labels: Any, lengths: Any, *, packing: bool) -> dict[str, Any]:
    """The forward's keyword arguments for a micro-batch: the padded rows as they are, or (``packing``
    and some padding) one packed row with per-example ``position_ids``. No KV cache in training: it is
    of no use there, and transformers only reads packed ``position_ids`` when there is none."""
    if not packing or int(lengths.min()) == ids.shape[1]:
        return {"input_ids": ids, "labels": labels, "use_cache": False}
    packed_ids, packed_labels, position_ids = pack_rows(ids, labels, lengths)
    return {"input_ids": packed_ids, "labels": packed_labels, "position_ids": position_ids, "use_cache": False}


def pack_rows(ids: Any, labels: Any, lengths: Any) -> tuple[Any, Any, Any]:
    """Concatenate the first ``lengths[i]`` tokens of every row into one row ``[1, sum(lengths)]``;
    positions restart at 0 per example and each example's first label is -100."""
    import torch

    lengths = lengths.to("cpu", torch.long)
    width = ids.shape[1]
    starts = torch.arange(len(lengths)) * width
    index = torch.cat([torch.arange(int(s), int(s) + int(n)) for s, n in zip(starts, lengths, strict=True)])
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    first = torch.cumsum(lengths, 0) - lengths  # where each example starts in the packed row
    index = index.to(ids.device, non_blocking=True)
    packed_ids = ids.reshape(-1).index_select(0, index).unsqueeze(0)
    packed_labels = labels.reshape(-1).index_select(0, index).clone()
    packed_labels[first.to(ids.device)] = -100
    return packed_ids, packed_labels.unsqueeze(0), positions.to(ids.device, non_blocking=True).unsqueeze(0)


def compile_model(model: Any, *, dynamic: bool) -> Any:
    """``torch.compile`` the module used for training steps (``dynamic``: shapes vary, e.g. packed rows)."""
    import torch

    return torch.compile(model, dynamic=dynamic)
