"""Check a dataset before anything starts: every row maps to a conversation the chat template renders,
the template opens the assistant's turn, some example fits ``max_seq_length``. A problem is one line naming
the file, the row and the field; a clean file gives a report: the split, token-length percentiles, how many
rows ``max_seq_length`` truncates, and a preview of 3 rows with the tokens the trainer learns marked."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from playground.userdata.rows import DatasetError, Row, is_local_file, read_rows, where
from playground.userdata.shapes import Conversation, to_conversations
from playground.userdata.template import ChatRenderer, TemplateError, renderer_for

PREVIEW_ROWS = 3
MAX_COUNTED = 5000  # rows whose tokens are counted (evenly spread); every row is rendered
EVAL_SEED = 1_000_003  # the trainer's held-out draw (playground.train.data.EVAL_SEED_OFFSET)


@dataclass
class Segment:
    text: str
    trained: bool


@dataclass
class DatasetReport:
    source: str
    shape: str
    rows: int
    multi_turn_rows: int
    train_rows: int
    eval_rows: int
    eval_from: str
    max_seq_length: int
    tokens: dict[str, int] | None = None  # p50, p90, p99, max of whole examples
    tokens_exact: bool = True
    truncated: int = 0  # examples longer than max_seq_length (their end is cut)
    dropped: int = 0  # examples whose prompt alone fills max_seq_length (nothing left to learn)
    template: str = ""
    preview: list[dict[str, Any]] = field(default_factory=list)  # {row, segments: [{text, trained}]}
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, *, mark: tuple[str, str] = ("⟦", "⟧")) -> str:
        """Lines for a terminal; the trained tokens of the preview between ``mark``."""
        name = Path(self.source).name
        multi = f", {self.multi_turn_rows} multi-turn" if self.multi_turn_rows else ""
        lines = [
            f"dataset {name}: {self.rows} rows ({self.shape}{multi}); {self.train_rows} to train, "
            f"{self.eval_rows} held out ({self.eval_from})"
        ]
        if self.tokens:
            how = "" if self.tokens_exact else " (estimated: no tokenizer at hand)"
            t = self.tokens
            lines.append(
                f"tokens per example{how}: p50 {t['p50']} · p90 {t['p90']} · p99 {t['p99']} · max {t['max']}; "
                f"max_seq_length {self.max_seq_length} truncates {self.truncated} of {self.rows} rows"
                + (f", drops {self.dropped} (prompt alone too long)" if self.dropped else "")
            )
        if self.preview:
            lines.append(f"preview through {self.template} (trained tokens in {mark[0]} {mark[1]}):")
            for item in self.preview:
                text = "".join(
                    f"{mark[0]}{s['text']}{mark[1]}" if s["trained"] else s["text"] for s in item["segments"]
                )
                lines.append(f"  row {item['row']}: " + text.replace("\n", "\\n"))
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def trained_spans(renderer: ChatRenderer, conversation: Conversation) -> tuple[str, list[tuple[int, int]], bool]:
    """(the rendered conversation, the character spans the trainer learns, every assistant turn trained?).

    A span runs from the end of the generation prompt before an assistant turn to the end of that turn.
    Templates that render earlier turns differently inside the whole conversation (some drop earlier
    reasoning) cannot mark those turns: then only the last answer is trained."""
    full = renderer.render(conversation)
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(conversation):
        if message["role"] != "assistant":
            continue
        before = renderer.render(conversation[:i], add_generation_prompt=True)
        upto = renderer.render(conversation[: i + 1]) if i + 1 < len(conversation) else full
        if not (full.startswith(upto) and upto.startswith(before)):
            last = renderer.render(conversation[:-1], add_generation_prompt=True)
            return full, ([(len(last), len(full))] if full.startswith(last) else []), False
        spans.append((len(before), len(upto)))
    return full, spans, True


def _check_generation_prompt(renderer: ChatRenderer, model: str) -> None:
    probe = [{"role": "user", "content": "hello"}]
    try:
        with_prompt = renderer.render(probe, add_generation_prompt=True)
        without = renderer.render(probe, add_generation_prompt=False)
    except TemplateError as exc:
        raise DatasetError(
            f"model {model}: its chat template fails on a single user message ({exc})", field="model"
        ) from None
    if with_prompt == without:
        raise DatasetError(
            f"model {model}: the chat template ({renderer.origin}) has no generation prompt "
            "(add_generation_prompt adds nothing), so the model would not know where its answer starts; "
            "allowed: a template that opens the assistant's turn — set model.chat_template in the blueprint",
            field="model.chat_template",
        )


def _percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def check_dataset(
    blueprint: Any,
    params: Mapping[str, Any] | None = None,
    source: str | None = None,
    *,
    model_source: str | None = None,
    columns: Mapping[str, str] | None = None,
    eval_source: str | None = None,
) -> DatasetReport | None:
    """Check a local dataset file for ``blueprint`` (its own source, or ``source``); None when the
    dataset is not a local file (synthetic tasks; hub ids and directories are read when the job starts)."""
    from playground.train.settings import resolve_setting

    dataset = blueprint.dataset
    source = source or dataset.source
    columns = dict(columns if columns is not None else dataset.columns)
    eval_source = eval_source if eval_source is not None else dataset.eval_source
    if not is_local_file(source):
        return None
    params = dict(params or {})
    fmt = dataset.format if dataset.format in ("alpaca", "chat") and source == dataset.source else "auto"
    rows = read_rows(source)
    shape, conversations = to_conversations(rows, source, columns=columns, fmt=fmt)
    eval_conversations: list[Conversation] | None = None
    if eval_source:
        eval_rows = read_rows(eval_source)
        _, eval_conversations = to_conversations(eval_rows, eval_source, columns=columns, fmt=fmt)
    elif len(rows) < 2:
        raise DatasetError(f"{where(source)}: 1 row; allowed: at least 2 (one is held out for evaluation)")
    max_seq_length = int(resolve_setting(blueprint, params, "max_seq_length"))
    train_rows, eval_count, eval_from = _split_counts(
        conversations, eval_conversations, dataset, eval_source, params, blueprint
    )
    report = DatasetReport(
        source=str(source),
        shape=shape,
        rows=len(rows),
        multi_turn_rows=sum(1 for c in conversations if sum(m["role"] == "assistant" for m in c) > 1),
        train_rows=train_rows,
        eval_rows=eval_count,
        eval_from=eval_from,
        max_seq_length=max_seq_length,
    )
    model = model_source or blueprint.model.source
    try:
        renderer = renderer_for(blueprint, model)
    except TemplateError as exc:
        raise DatasetError(f"model {model}: {exc}", field="model.chat_template") from None
    if renderer is None:
        report.notes.append(f"the chat template of {model} is not at hand here: it is checked when the job starts")
        return report
    _check_generation_prompt(renderer, model)
    report.template = renderer.origin
    report.tokens_exact = renderer.exact
    counted = set(range(len(rows)))
    if len(rows) > MAX_COUNTED:
        counted = set(random.Random(0).sample(range(len(rows)), MAX_COUNTED))
        report.notes.append(f"token lengths from {MAX_COUNTED} of {len(rows)} rows")
    lengths, prompt_lengths = _rendered_lengths(renderer, rows, conversations, shape, source, counted, report)
    if min(prompt_lengths) >= max_seq_length:
        raise DatasetError(
            f"{where(source)}: every example is longer than max_seq_length={max_seq_length} before its first answer "
            f"(shortest prompt: {min(prompt_lengths)} tokens); allowed: max_seq_length above {min(prompt_lengths)}",
            field="max_seq_length",
        )
    scale = len(rows) / len(lengths)
    report.tokens = {
        "p50": _percentile(lengths, 0.5),
        "p90": _percentile(lengths, 0.9),
        "p99": _percentile(lengths, 0.99),
        "max": max(lengths),
    }
    report.truncated = round(sum(n > max_seq_length for n in lengths) * scale)
    report.dropped = round(sum(n >= max_seq_length for n in prompt_lengths) * scale)
    return report


def _rendered_lengths(
    renderer: ChatRenderer,
    rows: list[Row],
    conversations: list[Conversation],
    shape: str,
    source: str,
    counted: set[int],
    report: DatasetReport,
) -> tuple[list[int], list[int]]:
    """Render every row (a row the template cannot render, or whose answer it cannot tell apart, is an error);
    the (whole, prompt) token lengths of the ``counted`` rows. Adds the preview rows and the multi-turn note."""
    lengths: list[int] = []
    prompt_lengths: list[int] = []
    partial = 0
    for index, (row, conversation) in enumerate(zip(rows, conversations, strict=True)):
        try:
            full, spans, every_turn = trained_spans(renderer, conversation)
        except TemplateError as exc:
            roles = ", ".join(m["role"] for m in conversation)
            raise DatasetError(
                f"{where(source, row.number, 'messages' if shape == 'messages' else None)}: the chat template "
                f"({renderer.origin}) cannot render roles {roles} ({exc})",
                field="messages",
                row=row.number,
            ) from None
        if not spans:
            raise DatasetError(
                f"{where(source, row.number)}: the chat template renders the prompt differently inside the whole "
                "conversation, so the answer's tokens cannot be told apart; allowed: a template whose generation "
                "prompt is a prefix of the rendered conversation",
                field="model.chat_template",
                row=row.number,
            )
        partial += not every_turn
        if index in counted:
            lengths.append(renderer.count_tokens(full))
            prompt_lengths.append(renderer.count_tokens(full[: spans[0][0]]))
        if len(report.preview) < PREVIEW_ROWS:
            report.preview.append({"row": row.number, "segments": _segments(full, spans)})
    if partial:
        report.notes.append(
            f"{partial} multi-turn rows: the template renders earlier turns differently in the whole conversation, "
            "so only their last answer is trained"
        )
    return lengths, prompt_lengths


def _segments(full: str, spans: list[tuple[int, int]]) -> list[dict[str, Any]]:
    segments: list[dict[str, Any]] = []
    position = 0
    for start, end in spans:
        if start > position:
            segments.append({"text": full[position:start], "trained": False})
        segments.append({"text": full[start:end], "trained": True})
        position = end
    if position < len(full):
        segments.append({"text": full[position:], "trained": False})
    return segments


def _split_counts(
    conversations: list[Conversation],
    eval_conversations: list[Conversation] | None,
    dataset: Any,
    eval_source: str | None,
    params: Mapping[str, Any],
    blueprint: Any,
) -> tuple[int, int, str]:
    """(training rows, held-out rows, where the held-out rows come from) exactly as the trainer splits."""
    from playground.train.data import conversation_sample, split_samples
    from playground.train.settings import resolve_setting

    samples = [conversation_sample(c) for c in conversations]
    held = [conversation_sample(c) for c in eval_conversations] if eval_conversations is not None else None
    train, held_out = split_samples(
        samples,
        held,
        eval_fraction=dataset.eval_fraction,
        num_train=resolve_setting(blueprint, dict(params), "num_train_examples"),
        num_eval=resolve_setting(blueprint, dict(params), "num_eval_examples"),
        where=where(eval_source) if eval_source else None,
    )
    how = f"from {Path(eval_source).name}" if eval_source else f"{dataset.eval_fraction:.0%} of the file"
    return len(train), len(held_out), how
