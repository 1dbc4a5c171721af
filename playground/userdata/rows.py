"""Rows of a local dataset file, each with the number a person finds it by (line of a ``.jsonl``/``.csv``,
record of a ``.json`` list or a ``.parquet`` table). Every problem is one line naming the file and the row."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.errors import UserError, shown_path

FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


class DatasetError(UserError):
    """A dataset that cannot be trained on: names the file, the row and the field."""

    def __init__(self, message: str, *, field: str = "dataset", row: int | None = None) -> None:
        super().__init__(message, field=field)
        self.row = row


@dataclass(frozen=True)
class Row:
    number: int  # 1-based: the line of a .jsonl/.csv, the record of a .json list or .parquet table
    data: dict[str, Any]


def is_local_file(source: str) -> bool:
    """A path that is not a URL (hf://, synthetic://…) nor a directory: read as a data file here."""
    return "://" not in source and not Path(source).expanduser().is_dir()


def where(path: str | Path, row: int | None = None, field: str | None = None) -> str:
    """``FILE row N field 'x'``: the head of every message about a row."""
    head = shown_path(Path(path).name if row is not None else path, quoted=False)
    if row is not None:
        head += f" row {row}"
    if field is not None:
        head += f" field {field!r}"
    return head


def _not_utf8(path: Path, data: bytes, exc: UnicodeDecodeError) -> DatasetError:
    line = data.count(b"\n", 0, exc.start) + 1
    return DatasetError(
        f"{where(path, line)}: not UTF-8 (byte 0x{data[exc.start]:02x}); allowed: UTF-8 text (re-save the file so)",
        row=line,
    )


def read_rows(source: str | Path) -> list[Row]:
    """Every row of a local ``.jsonl``/``.json``/``.csv``/``.parquet`` file, as dicts."""
    path = Path(source).expanduser()
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise DatasetError(
            f"{where(path)}: unsupported file type {suffix or '(none)'!r}; allowed: {', '.join(FILE_SUFFIXES)}"
        )
    if not path.is_file():
        raise DatasetError(f"{where(path)}: no such file; allowed: a {'/'.join(FILE_SUFFIXES)} file")
    if suffix == ".parquet":
        return _parquet(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, data, exc) from None
    rows = {".jsonl": _jsonl, ".json": _json, ".csv": _csv}[suffix](path, text)
    if not rows:
        raise DatasetError(f"{where(path)}: no rows; allowed: a file with at least 2 rows")
    return rows


def _jsonl(path: Path, text: str) -> list[Row]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                f"{where(path, number)}: not valid JSON ({exc.msg} at column {exc.colno})", row=number
            ) from None
        if not isinstance(value, dict):
            raise DatasetError(f"{where(path, number)}: expected a JSON object, got {type(value).__name__}", row=number)
        rows.append(Row(number, value))
    return rows


def _json(path: Path, text: str) -> list[Row]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{where(path, exc.lineno)}: not valid JSON ({exc.msg})", row=exc.lineno) from None
    if isinstance(value, dict):  # {"train": [...]} or {"data": [...]}: the one list inside
        lists = [v for v in value.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DatasetError(f"{where(path)}: expected a list of objects (or one object holding exactly one list)")
        value = lists[0]
    if not isinstance(value, list):
        raise DatasetError(f"{where(path)}: expected a list of objects, got {type(value).__name__}")
    rows = []
    for number, item in enumerate(value, start=1):
        if not isinstance(item, dict):
            raise DatasetError(f"{where(path, number)}: expected an object, got {type(item).__name__}", row=number)
        rows.append(Row(number, item))
    return rows


def _csv(path: Path, text: str) -> list[Row]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = []
    try:
        for record in reader:
            number = reader.line_num  # the line the record ends on (1 = the header)
            if None in record:
                raise DatasetError(f"{where(path, number)}: more values than header columns", row=number)
            rows.append(Row(number, {k: v for k, v in record.items() if k is not None}))
    except csv.Error as exc:
        raise DatasetError(f"{where(path, reader.line_num)}: malformed CSV ({exc})", row=reader.line_num) from None
    return rows


def _parquet(path: Path) -> list[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{where(path)}: reading .parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise DatasetError(f"{where(path)}: not a readable parquet file ({type(exc).__name__})") from None
    return [Row(number, item) for number, item in enumerate(table.to_pylist(), start=1)]
