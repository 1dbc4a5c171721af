"""Held-out evaluation: token loss on the answers, and exact match by greedy generation.

Exact match prompts the model exactly as a server does for an OpenAI chat request: the chat
template with ``add_generation_prompt=True``, greedy decoding that stops at EOS, special tokens
skipped when decoding. Prompts are sorted by length and left-padded into batches (masked: the answers
matched the unpadded ones one by one, 62 of 62 on SmolLM2 in float32, and 50 answers took 9.6 s instead
of 41.5 s on 2 cores when each length was its own batch).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from playground.answers import exact_match  # the one rule, shared with result.json and the chat panel
from playground.train.data import TokenizedSet

__all__ = ["eval_loss", "exact_match", "generate_answers"]
# On CPU, at most this many logits per eval forward pass (float32: 128 MB; the loss makes ~2 more copies).
# A 49k-token vocabulary at batch 32 × 60 tokens would otherwise add ~0.8 GB to the trainer's peak RSS.
CPU_EVAL_LOGITS = 32 * 1024 * 1024
# Prompts per generate() call: SmolLM2's cache for 64 prompts of ~80 tokens is ~250 MB.
GENERATE_BATCH = 64


def eval_loss(model: Any, data: TokenizedSet, *, batch_size: int, device: Any, autocast: Any) -> float:
    """Mean cross-entropy per answer token over the held-out set (on CPU, batches capped at
    ``CPU_EVAL_LOGITS`` logits so a large vocabulary does not blow up the trainer's memory)."""
    import torch

    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if str(device).startswith("cpu") and vocab and len(data):
        width = int(data.lengths.max())
        batch_size = max(1, min(batch_size, CPU_EVAL_LOGITS // (width * vocab)))
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            rows = slice(start, start + batch_size)
            width = int(data.lengths[rows].max())
            ids = data.input_ids[rows, :width].to(device)
            labels = data.labels[rows, :width].to(device)
            n = int((labels[:, 1:] != -100).sum())
            if n == 0:
                continue
            with autocast():
                out = model(input_ids=ids, labels=labels)
            total += float(out.loss) * n
            count += n
    model.train(was_training)
    return total / count if count else float("nan")


def generate_answers(
    model: Any,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    device: Any,
    batch_size: int = GENERATE_BATCH,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Greedy answers for each prompt (token ids from the chat template), decoded like a server; ``on_progress(done,
    total)`` after each batch. Prompts of similar length share a batch, left-padded and masked."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.generation_config.eos_token_id
    if isinstance(pad, list):
        pad = pad[0]
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    answers: list[str] = [""] * len(prompt_ids)
    done = 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(prompt_ids[i]) for i in chunk)
            ids = torch.tensor([[pad] * (width - len(prompt_ids[i])) + prompt_ids[i] for i in chunk], device=device)
            mask = torch.tensor([[0] * (width - len(prompt_ids[i])) + [1] * len(prompt_ids[i]) for i in chunk],
                                device=device)  # fmt: skip
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=model.generation_config.eos_token_id,
                pad_token_id=pad,
            )
            for i, row in zip(chunk, out[:, width:].tolist(), strict=True):
                answers[i] = tokenizer.decode(row, skip_special_tokens=True)
            done += len(chunk)
            if on_progress is not None:
                on_progress(done, len(prompt_ids))
    model.train(was_training)
    return answers


def read_cached(path: Path | None) -> dict[str, float] | None:
    """Held-out figures kept by :func:`write_cached` (None: none, or unreadable)."""
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else None


def write_cached(path: Path | None, results: dict[str, float]) -> None:
    """Keep held-out figures at ``path``, written atomically; a cache that cannot be written is no error."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(results))
        tmp.replace(path)
    except OSError:
        pass
