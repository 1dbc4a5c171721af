"""A model's chat template and tokenizer without torch or transformers: ``jinja2`` in a sandbox (as
transformers renders templates: trim_blocks, lstrip_blocks, ``raise_exception``) and the ``tokenizers``
library on the model directory's ``tokenizer.json``. Where no tokenizer is at hand (a hub model not in the
cache, a packaged model not converted yet), token counts are estimated and said to be."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHARS_PER_TOKEN = 4.0  # the BPE rule of thumb used where no tokenizer is at hand


class TemplateError(Exception):
    """The chat template could not render a conversation (its own ``raise_exception`` or a Jinja error)."""


@dataclass
class ChatRenderer:
    template_text: str
    count_tokens: Callable[[str], int]
    exact: bool  # token counts from the real tokenizer (else estimated)
    special: dict[str, str]
    origin: str  # where the template came from, for messages

    def __post_init__(self) -> None:
        from jinja2.exceptions import TemplateError as JinjaTemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(str(message))

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda value, **kw: json.dumps(value, ensure_ascii=False, **kw)
        try:
            self._template = env.from_string(self.template_text)
        except JinjaTemplateError as exc:
            raise TemplateError(f"the chat template does not parse ({exc})") from None

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = False) -> str:
        from jinja2.exceptions import TemplateError as JinjaTemplateError

        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **self.special)
        except TemplateError:
            raise
        except (JinjaTemplateError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise TemplateError(f"{type(exc).__name__}: {exc}") from None


def _model_directory(source: str) -> Path | None:
    """A local directory holding the model's tokenizer files, where one exists without downloading."""
    if source.startswith("pkg://"):
        from playground.models import packaged

        return packaged.find_converted(source)
    if source.startswith("hf://"):
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        found = try_to_load_from_cache(source.removeprefix("hf://").strip("/"), "tokenizer_config.json")
        return Path(found).parent if isinstance(found, str) else None
    if "://" in source:
        return None
    return Path(source).expanduser()


def renderer_for(blueprint: Any, source: str) -> ChatRenderer | None:
    """The renderer the trainer would use for ``blueprint`` on model ``source``; None where the template
    itself is not at hand (it is then checked when the job starts)."""
    from playground.train.tokenizer import CHAR_CHAT_TEMPLATE, CHAR_SPECIAL_TOKENS, DEFAULT_CHAT_TEMPLATE

    if source.startswith("scratch://") and blueprint.model.tokenizer in (None, "chars"):
        special = re.compile("|".join(re.escape(t) for t in CHAR_SPECIAL_TOKENS))
        return ChatRenderer(
            blueprint.model.chat_template or CHAR_CHAT_TEMPLATE,
            lambda text: len(special.sub("x", text)),  # one token per character, one per special token
            True,
            {},
            "the character tokenizer",
        )
    directory = _model_directory(source)
    config_file = directory / "tokenizer_config.json" if directory is not None else None
    config = json.loads(config_file.read_text()) if config_file is not None and config_file.is_file() else {}
    jinja_file = directory / "chat_template.jinja" if directory is not None else None
    text = blueprint.model.chat_template
    origin = "the blueprint's chat_template"
    if not text and jinja_file is not None and jinja_file.is_file():
        text, origin = jinja_file.read_text(), "the model's chat_template.jinja"
    if not text and isinstance(config.get("chat_template"), str):
        text, origin = config["chat_template"], "the model's tokenizer_config.json"
    if not text and directory is not None and config_file is not None and config_file.is_file():
        text, origin = DEFAULT_CHAT_TEMPLATE, "the trainer's default template (the model has none)"
    if not text:
        return None
    special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "pad_token")}
    special = {k: v for k, v in special.items() if v}
    tokenizer_file = directory / "tokenizer.json" if directory is not None else None
    if tokenizer_file is not None and tokenizer_file.is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        return ChatRenderer(
            text, lambda t: len(tokenizer.encode(t, add_special_tokens=False).ids), True, special, origin
        )
    return ChatRenderer(text, lambda t: max(1, round(len(t) / CHARS_PER_TOKEN)), False, special, origin)


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):  # AddedToken as saved by old versions
        return value["content"]
    return None
