"""A visitor's chat with a job's models, kept so that a reloaded page shows it again.

One small JSON file per (visitor, job) under ``home/chats/<owner key>/<job id>.json``, written whole (atomic
replace). Bounded: the last :data:`MAX_EXCHANGES` questions of a job, texts cut at :data:`MAX_TEXT_CHARS`, the
chats of a visitor's :data:`MAX_JOBS_PER_VISITOR` most recent jobs. An exchange is a plain mapping (the app's
question and each side's answer); only strings, numbers, booleans and None are kept.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from playground.booth import owner_key
from playground.owner import OPERATOR, Owner

MAX_EXCHANGES = 20
MAX_TEXT_CHARS = 4000
MAX_JOBS_PER_VISITOR = 10
MAX_KEYS = 32  # per mapping: anything a client sends is bounded
OPERATOR_KEY = "operator"  # the chats of the page with no visitor (outside booth mode)
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

Exchange = dict[str, Any]


def _clean(value: Any, depth: int = 0) -> Any:
    """``value`` with only bounded plain data left (mappings nested three deep: exchange, answers, one side)."""
    if isinstance(value, str):
        return value[:MAX_TEXT_CHARS]
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping) and depth < 3:
        items = [(str(k)[:64], _clean(v, depth + 1)) for k, v in list(value.items())[:MAX_KEYS]]
        return {k: v for k, v in items if v is not _DROP}
    return _DROP


_DROP = object()


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile (another thread of the visitor's kernel)
        return 0.0


class ChatStore:
    """The chats kept under ``home`` (the engine's state directory)."""

    def __init__(self, home: Path | str) -> None:
        self.root = Path(home) / "chats"

    def _path(self, job_id: str, owner: Owner) -> Path:
        if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
            raise ValueError(f"job id {str(job_id)[:40]!r} is not valid")
        return self.root / (owner_key(owner.id) if owner.id is not None else OPERATOR_KEY) / f"{job_id}.json"

    def load(self, job_id: str, owner: Owner) -> list[Exchange]:
        """``owner``'s kept exchanges with ``job_id`` (oldest first); [] when none (or unreadable)."""
        try:
            data = json.loads(self._path(job_id, owner).read_text())
        except (OSError, ValueError):
            return []
        if not isinstance(data, list):
            return []
        return [cleaned for item in data[-MAX_EXCHANGES:] if isinstance(cleaned := _clean(item), dict)]

    def save(self, job_id: str, owner: Owner, exchanges: Sequence[Mapping[str, Any]]) -> None:
        """Keep the last :data:`MAX_EXCHANGES` of ``exchanges``; the visitor's oldest job chats beyond
        :data:`MAX_JOBS_PER_VISITOR` are dropped."""
        path = self._path(job_id, owner)
        kept = [cleaned for item in list(exchanges)[-MAX_EXCHANGES:] if isinstance(cleaned := _clean(item), dict)]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(kept)}.tmp")
        tmp.write_text(json.dumps(kept))
        os.replace(tmp, path)
        chats = sorted(path.parent.glob("*.json"), key=_modified, reverse=True)
        for old in chats[MAX_JOBS_PER_VISITOR:]:
            old.unlink(missing_ok=True)

    def forget(self, job_id: str) -> None:
        """Remove every visitor's chat with ``job_id`` (the job was deleted)."""
        if not self.root.is_dir():
            return
        for path in self.root.glob(f"*/{self._path(job_id, OPERATOR).name}"):
            path.unlink(missing_ok=True)
