"""Data parallelism for the recipe: one process, DDP, or FSDP2 (``torch.distributed.fsdp.fully_shard``).

The training setting ``distributed`` picks it (``auto``, ``ddp`` or ``fsdp``; a blueprint's
``training`` block). With one process there is nothing to wrap. With several, ``auto`` chooses
**FSDP2** when the training state DDP would replicate on every device (weights, gradients and
AdamW's two moments of the trainable weights) would take more than half of one device's memory,
leaving too little for activations; otherwise **DDP**, which for what fits is the faster choice
(LoRA in particular: DDP all-reduces only the small adapter gradients, where FSDP2 would
all-gather every frozen weight in every step). CPU processes (gloo) know no device limit: DDP.

The same functions run on GPU (NCCL, bf16 mixed precision) and CPU (gloo, float32), so the CPU
tests exercise the logic of the GPU path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

STRATEGIES = ("auto", "ddp", "fsdp")
FSDP_MEMORY_FRACTION = 0.5  # auto: FSDP2 when the replicated training state exceeds this share of a device


def training_state_bytes(model: Any) -> int:
    """Bytes one DDP replica holds for training: every weight, plus a gradient and AdamW's two
    moments (in the weight's dtype) for each trainable one."""
    total = 0
    for param in model.parameters():
        size = param.numel() * param.element_size()
        total += size * (4 if param.requires_grad else 1)
    return total


def choose_strategy(setting: str, *, world_size: int, state_bytes: int, device_bytes: int | None) -> str:
    """``single`` (one process), ``ddp`` or ``fsdp`` (see the module docstring for the rule)."""
    if world_size == 1:
        return "single"
    if setting != "auto":
        return setting
    if device_bytes and state_bytes > FSDP_MEMORY_FRACTION * device_bytes:
        return "fsdp"
    return "ddp"


def wrap(model: Any, strategy: str, *, device_ids: list[int] | None, bf16_compute: bool) -> Any:
    """The module the loop trains: ``model`` itself (single; FSDP2 shards it in place: each decoder
    layer is one unit, the rest — embeddings, final norm, lm_head — the root unit) or a DDP wrapper.
    ``bf16_compute``: FSDP2 gathers float32 weights as bf16 and reduces gradients in float32."""
    import torch

    if strategy == "single":
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=device_ids)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    weights_fp32 = next(model.parameters()).dtype == torch.float32
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16_compute and weights_fp32
        else MixedPrecisionPolicy()
    )
    layer_names = set(getattr(_hf_model(model), "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_names]
    if not layers:
        raise RuntimeError(f"FSDP2: no decoder layers ({', '.join(layer_names) or 'none declared'}) found to shard")
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def _hf_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def gradient_sync(train_model: Any, strategy: str, sync: bool) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter on all but the last micro-batch of a step."""
    if sync or strategy == "single":
        yield
    elif strategy == "ddp":
        with train_model.no_sync():
            yield
    else:
        train_model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            train_model.set_requires_gradient_sync(True)


def full_state_dict(model: Any) -> dict[str, Any]:
    """The whole model's state dict on rank 0's CPU (gathered from the shards under FSDP2; other
    ranks get ``{}``). Every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
