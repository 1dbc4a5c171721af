"""A vLLM general plugin (entry point group ``vllm.general_plugins``) that mends vLLM 0.32's LoRA arithmetic on CPU.

It runs inside vLLM's own environment (copied there as ``playground_vllm_lora_cpu.py`` beside the guard, with a
``.dist-info`` naming its entry point, by :mod:`playground.serving.vllm_server`); vLLM loads it in each of its
processes. On any platform other than CPU it does nothing.

vLLM's CPU LoRA path (``vllm.lora.punica_wrapper.punica_cpu`` on ``vllm.lora.ops.torch_ops``) computes each token's
LoRA product as ``einsum("bi,boi->bo", x, weights[indices])``:

* **wrong answers**: a token of a request without an adapter has the index ``-1``, and ``weights[-1]`` is the
  *last* adapter slot, so a base-model chat batched with adapters' chats gets the adapter in slot
  ``--max-loras - 1`` (the GPU kernels skip ``-1``);
* **slow**: ``weights[indices]`` copies a whole ``rank × width`` matrix per token, per projection, per layer
  (~78 MB per token for SmolLM2-135M at rank 64), several times the model's own weights per decode step.

The replacements group the rows by adapter slot and multiply each group by its slot's matrix once; rows with ``-1``
get no LoRA term. Same products, same output conventions (``add_inputs``, slices, ``scale``).
"""

from __future__ import annotations

from typing import Any

PATCHED = "_playground_lora_cpu"


def _products(inputs: Any, weights: Any, indices: Any, dtype: Any) -> Any:
    """Row ``b`` of the result is ``inputs[b] @ weights[indices[b]].T`` (zeros where ``indices[b]`` is -1)."""
    import torch

    stacked = weights.squeeze(1) if weights.dim() == 4 else weights
    rows = inputs.to(dtype)
    slots = torch.unique(indices)
    if slots.numel() == 1:
        slot = int(slots[0])
        if slot >= 0:
            return rows @ stacked[slot].to(dtype).T
        return rows.new_zeros((rows.shape[0], stacked.shape[1]))
    result = rows.new_zeros((rows.shape[0], stacked.shape[1]))
    for slot in slots.tolist():
        if slot >= 0:
            where = (indices == slot).nonzero().squeeze(1)
            result.index_copy_(0, where, rows.index_select(0, where) @ stacked[slot].to(dtype).T)
    return result


def bgmv_shrink(inputs: Any, lora_a_weights: Any, output_tensor: Any, lora_indices_tensor: Any, scaling: float = 1.0):
    outputs = _products(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any, add_inputs: bool = True
) -> None:
    outputs = _products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    common = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(
    inputs: Any,
    lora_b_weights: Any,
    output_tensor: Any,
    lora_indices_tensor: Any,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    outputs = _products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def _per_token(lora_indices_tensor: Any, seq_len_tensor: Any) -> Any:
    import torch

    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                batches, max_seq_length, token_nums, scaling):  # fmt: skip
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                batches, max_seq_length, token_nums, add_inputs=False):  # fmt: skip
    bgmv_expand(inputs, lora_b_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                      batches, max_seq_length, token_nums, slice_offset, slice_size, add_inputs=False):  # fmt: skip
    indices = _per_token(lora_indices_tensor, seq_len_tensor)
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, indices, slice_offset, slice_size, add_inputs)


_REPLACEMENTS = {
    "bgmv_shrink": bgmv_shrink,
    "bgmv_expand": bgmv_expand,
    "bgmv_expand_slice": bgmv_expand_slice,
    "sgmv_shrink": sgmv_shrink,
    "sgmv_expand": sgmv_expand,
    "sgmv_expand_slice": sgmv_expand_slice,
}


def register() -> None:
    """vLLM's plugin hook: on CPU, point the CPU punica wrapper at the grouped operations (once per process)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import vllm.lora.punica_wrapper.punica_cpu as punica_cpu

    if getattr(punica_cpu, PATCHED, False):
        return
    missing = [name for name in _REPLACEMENTS if not hasattr(punica_cpu, name)]
    if missing:  # another vLLM release: leave it as it is rather than half-patched
        import logging

        logging.getLogger(__name__).warning("playground LoRA CPU plugin not applied: %s not found", missing)
        return
    for name, function in _REPLACEMENTS.items():
        setattr(punica_cpu, name, function)
    setattr(punica_cpu, PATCHED, True)
