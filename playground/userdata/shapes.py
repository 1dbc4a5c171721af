"""The common dataset shapes, mapped to one conversation per row.

- ``messages``: a list of ``{role, content}`` (multi-turn; every assistant turn is trained on);
- ``prompt_completion``: ``prompt`` and ``completion`` (also ``response``/``answer``);
- ``alpaca``: ``instruction``, optional ``input``, ``output``.

``columns`` maps these canonical names to the file's own (``{"prompt": "question", "completion": "answer"}``).
A conversation is: an optional ``system`` message first, then ``user``/``assistant`` turns alternating,
starting with ``user`` and ending with ``assistant`` (what a chat template renders and the trainer learns).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from playground.userdata.rows import DatasetError, Row, where

SHAPES: dict[str, tuple[str, ...]] = {
    "messages": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    "alpaca": ("instruction", "input", "output"),
}
CANONICAL = sorted({name for names in SHAPES.values() for name in names})
# Column names accepted without a mapping, besides the canonical one.
ALIASES = {"completion": ("completion", "response", "answer"), "messages": ("messages", "conversations")}
ROLES = ("system", "user", "assistant")
ROLE_RULE = "an optional system message first, then user/assistant turns alternating, ending with assistant"
Conversation = list[dict[str, str]]


def check_columns(columns: Mapping[str, str] | None) -> dict[str, str]:
    """A column mapping with canonical keys only (one-line error naming the key otherwise)."""
    mapping = dict(columns or {})
    for key, value in mapping.items():
        if key not in CANONICAL:
            raise DatasetError(f"columns: unknown name {key!r}; allowed: {', '.join(CANONICAL)}", field="columns")
        if not isinstance(value, str) or not value:
            raise DatasetError(f"columns: {key!r} must name a column of the file", field="columns")
    return mapping


def parse_columns(text: str | None) -> dict[str, str]:
    """``"prompt=question,completion=answer"`` (the CLI's and notebooks' form) → a checked mapping."""
    mapping: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise DatasetError(f"columns: {item.strip()!r}: expected NAME=COLUMN", field="columns")
        mapping[key.strip()] = value.strip()
    return check_columns(mapping)


def _column(name: str, keys: set[str], mapping: Mapping[str, str]) -> str | None:
    if name in mapping:
        return mapping[name]
    return next((alias for alias in ALIASES.get(name, (name,)) if alias in keys), None)


def detect_shape(rows: Sequence[Row], mapping: Mapping[str, str], source: str | Path, fmt: str = "auto") -> str:
    """Which shape the file has (from the first row's columns, or ``fmt`` when the blueprint fixes it)."""
    keys = set(rows[0].data) if rows else set()
    candidates = {"alpaca": ["alpaca"], "chat": ["messages", "prompt_completion"]}.get(fmt, list(SHAPES))
    for shape in candidates:
        required = [n for n in SHAPES[shape] if n != "input"]
        if all(_column(n, keys, mapping) in keys for n in required):
            return shape
    wanted = "; ".join("/".join(SHAPES[s]) for s in candidates)
    raise DatasetError(
        f"{where(source)}: columns {', '.join(sorted(keys)) or '(none)'} match no dataset shape; allowed: {wanted} "
        "(or map yours with columns, e.g. prompt=question,completion=answer)",
        field="columns",
    )


def _text(row: Row, column: str, source: str | Path, *, required: bool = True) -> str:
    value = row.data.get(column)
    if value is None or (isinstance(value, float) and value != value):  # missing, or a CSV/parquet NaN
        if required:
            raise DatasetError(f"{where(source, row.number, column)}: missing", field=column, row=row.number)
        return ""
    if not isinstance(value, str | int | float):
        raise DatasetError(
            f"{where(source, row.number, column)}: expected text, got {type(value).__name__}",
            field=column,
            row=row.number,
        )
    return str(value).strip()


def to_conversation(row: Row, shape: str, mapping: Mapping[str, str], source: str | Path) -> Conversation:
    """One row → a conversation; a one-line DatasetError naming the row and field when it cannot be one."""
    keys = set(row.data)
    if shape == "alpaca":
        instruction = _text(row, _column("instruction", keys, mapping) or "instruction", source)
        extra = _text(row, _column("input", keys, mapping) or "input", source, required=False)
        output_col = _column("output", keys, mapping) or "output"
        conversation = [
            {"role": "user", "content": f"{instruction}\n\n{extra}" if extra else instruction},
            {"role": "assistant", "content": _text(row, output_col, source)},
        ]
        fields = {0: _column("instruction", keys, mapping) or "instruction", 1: output_col}
    elif shape == "prompt_completion":
        prompt_col = _column("prompt", keys, mapping) or "prompt"
        completion_col = _column("completion", keys, mapping) or "completion"
        conversation = [
            {"role": "user", "content": _text(row, prompt_col, source)},
            {"role": "assistant", "content": _text(row, completion_col, source)},
        ]
        fields = {0: prompt_col, 1: completion_col}
    else:
        column = _column("messages", keys, mapping) or "messages"
        conversation = _messages(row, column, source)
        fields = {i: f"{column}[{i}].content" for i in range(len(conversation))}
    for i, message in enumerate(conversation):
        if not message["content"]:
            what = "answer" if message["role"] == "assistant" else f"{message['role']} message"
            raise DatasetError(
                f"{where(source, row.number, fields.get(i, str(i)))}: empty {what}; allowed: non-empty text",
                field=fields.get(i, str(i)),
                row=row.number,
            )
    return conversation


def _messages(row: Row, column: str, source: str | Path) -> Conversation:
    value = row.data.get(column)
    if isinstance(value, str):  # a CSV cell holding JSON
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise DatasetError(
                f"{where(source, row.number, column)}: expected a list of {{role, content}} (JSON), got text",
                field=column,
                row=row.number,
            ) from None
    if value is None:
        raise DatasetError(f"{where(source, row.number, column)}: missing", field=column, row=row.number)
    if not isinstance(value, list) or not value:
        raise DatasetError(
            f"{where(source, row.number, column)}: expected a non-empty list of {{role, content}}",
            field=column,
            row=row.number,
        )
    conversation: Conversation = []
    for i, message in enumerate(value):
        field = f"{column}[{i}]"
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise DatasetError(
                f"{where(source, row.number, field)}: expected {{role, content}}", field=field, row=row.number
            )
        role = message["role"]
        role = {"human": "user", "gpt": "assistant", "bot": "assistant"}.get(role, role)
        if role not in ROLES:
            raise DatasetError(
                f"{where(source, row.number, field + '.role')}: {str(role)[:40]!r}; allowed: {', '.join(ROLES)}",
                field=field,
                row=row.number,
            )
        content = message["content"]
        if not isinstance(content, str):
            raise DatasetError(
                f"{where(source, row.number, field + '.content')}: expected text, got {type(content).__name__}",
                field=field,
                row=row.number,
            )
        conversation.append({"role": role, "content": content.strip()})
    roles = [m["role"] for m in conversation]
    body = roles[1:] if roles[0] == "system" else roles
    expected = ["user", "assistant"] * (len(body) // 2 + 1)
    if not body or body != expected[: len(body)] or body[-1] != "assistant":
        raise DatasetError(
            f"{where(source, row.number, column)}: role order {', '.join(roles)} cannot be trained; "
            f"allowed: {ROLE_RULE}",
            field=column,
            row=row.number,
        )
    return conversation


def to_conversations(
    rows: Sequence[Row], source: str | Path, *, columns: Mapping[str, str] | None = None, fmt: str = "auto"
) -> tuple[str, list[Conversation]]:
    """(the detected shape, one conversation per row); the first bad row raises."""
    mapping = check_columns(columns)
    shape = detect_shape(rows, mapping, source, fmt)
    return shape, [to_conversation(row, shape, mapping, source) for row in rows]


def read_conversations(
    source: str | Path, *, columns: Mapping[str, str] | None = None, fmt: str = "auto"
) -> tuple[str, list[Conversation]]:
    """A local file's rows as conversations (see :func:`to_conversations`)."""
    from playground.userdata.rows import read_rows

    return to_conversations(read_rows(source), source, columns=columns, fmt=fmt)


def rows_from_records(records: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Records from elsewhere (a hub dataset) numbered like a file's rows."""
    return [Row(i, dict(record)) for i, record in enumerate(records, start=1)]
