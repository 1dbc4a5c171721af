"""Tokenizers: the character-level tokenizer of the scratch blueprints, and chat templates.

The prompt format of every blueprint lives in the tokenizer's chat template, so the trainer,
``transformers serve`` and KServe's HuggingFace runtime all format prompts the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PAD, EOS, USER, ASSISTANT, SYSTEM, UNK = "<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<|unk|>"
CHAR_SPECIAL_TOKENS = [PAD, EOS, USER, ASSISTANT, SYSTEM, UNK]
# What a causal LM's forward takes; written into tokenizer_config.json so no loader adds token_type_ids.
MODEL_INPUT_NAMES = ("input_ids", "attention_mask")
# Printable ASCII plus newline: enough for the synthetic tasks and for anything a visitor types
# (other characters become <|unk|>).
CHAR_ALPHABET = [chr(i) for i in range(32, 127)] + ["\n"]

# Short on purpose: every template token is a training token on the tiny CPU blueprint.
CHAR_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}<|user|>{{ message['content'] }}"
    "{% else %}<|assistant|>{{ message['content'] }}<|end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# For hub tokenizers that ship without a chat template (base models): a ChatML-style format
# built from the tokenizer's own EOS token, so generation stops where training ended.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '### ' + message['role'] | capitalize + ':\\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant:\\n' }}{% endif %}"
)


def build_char_tokenizer(chat_template: str | None = None) -> Any:
    """A character-level tokenizer (about 100 tokens) made locally with the ``tokenizers`` library.

    Saved with ``save_pretrained`` it is a plain ``tokenizer.json`` + ``tokenizer_config.json``
    + ``chat_template.jinja`` that ``AutoTokenizer`` loads with no remote code.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIAL_TOKENS + CHAR_ALPHABET)}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    raw.decoder = decoders.Fuse()  # join characters back without spaces
    raw.add_special_tokens(CHAR_SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tokenizer.chat_template = chat_template or CHAR_CHAT_TEMPLATE
    return tokenizer


def ensure_chat_template(tokenizer: Any, template: str | None = None) -> None:
    """Install ``template`` (the blueprint's), or a default when the tokenizer has none; set a pad token."""
    if template:
        tokenizer.chat_template = template
    elif not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def render(tokenizer: Any, messages: list[dict[str, str]], *, add_generation_prompt: bool = False) -> list[int]:
    """Token ids of ``messages`` through the chat template, exactly as ``apply_chat_template``
    tokenizes them for a server (no extra special tokens added)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def save_tokenizer(tokenizer: Any, directory: Path, *, context: int | None = None) -> None:
    """``save_pretrained``, then ``tokenizer_config.json`` made explicit for loaders of every
    transformers version (KServe images still run 4.x): the chat template inlined (4.x predates
    ``chat_template.jinja``), ``model_input_names`` without ``token_type_ids`` (4.x's fast tokenizer
    returns them by default and ``generate`` rejects them) and ``model_max_length`` no longer than
    the model's ``context`` (its ``max_position_embeddings``)."""
    import json

    tokenizer.save_pretrained(str(directory))
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if tokenizer.chat_template and "chat_template" not in config:
        config["chat_template"] = tokenizer.chat_template
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"  # the name every transformers version knows
    config["model_input_names"] = list(MODEL_INPUT_NAMES)
    if context:
        stated = config.get("model_max_length")
        config["model_max_length"] = min(int(stated), int(context)) if isinstance(stated, int | float) else int(context)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
