"""Secrets handling for e2e runs: secrets come from the environment only, and their values
(plus anything shaped like a Hugging Face or GitHub token) are scrubbed from every artifact."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from playground.errors import UserError, shown

REDACTED = "***"

# Name parts (split on "_", "-" or ".") that mark a secret: HF_TOKEN, GITHUB_TOKEN, AWS_SECRET_ACCESS_KEY,
# OPENAI_API_KEY, DB_PASSWORD... "TOKENIZERS_PARALLELISM" is not one: the part is "TOKENIZERS".
_SECRET_PARTS = frozenset(
    {"token", "secret", "password", "passwd", "apikey", "credential", "credentials", "pat", "auth", "cookie"}
)
_SECRET_PAIRS = ("api_key", "access_key", "private_key", "secret_key", "client_secret", "session_key")
# Secrets that do not follow the naming rule but are well known.
_KNOWN_SECRET_ENV = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "GH_TOKEN", "GITHUB_TOKEN"})
# Token shapes scrubbed even when no env var holds them (a token pasted into a cell, a log line).
TOKEN_PATTERNS = (
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),  # Hugging Face user/org tokens
    re.compile(r"\bapi_org_[A-Za-z0-9]{20,}\b"),  # Hugging Face org API tokens
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"),  # GitHub tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{40,}\b"),
)
MIN_SECRET_LENGTH = 6  # shorter values ("1", "true") would shred every artifact and hide nothing


def looks_like_secret_name(name: str) -> bool:
    """True for names such as ``HF_TOKEN``, ``hf_token``, ``api_key``, ``DB_PASSWORD``."""
    lowered = name.lower()
    if name.upper() in _KNOWN_SECRET_ENV:
        return True
    parts = set(re.split(r"[_\-.]+", lowered))
    if parts & _SECRET_PARTS:
        return True
    squashed = lowered.replace("-", "_")
    return any(pair in squashed for pair in _SECRET_PAIRS)


def check_parameter_names(names: Iterable[str]) -> None:
    """Refuse notebook parameters that look like secrets (they would be written into the notebook)."""
    for name in names:
        if looks_like_secret_name(name):
            raise UserError(
                f"parameter {shown(name)} looks like a secret; secrets are never notebook parameters: "
                "set it in the environment (e.g. HF_TOKEN) and the notebook reads it from there",
                field=name,
            )


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of secret-looking environment variables, longest first."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if looks_like_secret_name(k) and v and len(v) >= MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


class Scrubber:
    """Replace secret values (raw and as they appear JSON-escaped) and token shapes with ``***``."""

    def __init__(self, secrets: Iterable[str] | None = None) -> None:
        values = set(secret_values() if secrets is None else secrets)
        forms: set[str] = set()
        for value in values:
            if len(value) < MIN_SECRET_LENGTH:
                continue
            # as printed, inside a JSON string (notebooks, result.json), as repr() shows it, and both
            for form in (value, repr(value)[1:-1]):
                forms.add(form)
                forms.add(json.dumps(form)[1:-1])
        self._forms = sorted(forms, key=len, reverse=True)
        self._bytes = [f.encode() for f in self._forms]

    def text(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED)
        for pattern in TOKEN_PATTERNS:
            text = pattern.sub(REDACTED, text)
        return text

    def data(self, data: bytes) -> bytes:
        for form in self._bytes:
            if form in data:
                data = data.replace(form, REDACTED.encode())
        try:
            decoded = data.decode()
        except UnicodeDecodeError:
            return data
        scrubbed = decoded
        for pattern in TOKEN_PATTERNS:
            scrubbed = pattern.sub(REDACTED, scrubbed)
        return scrubbed.encode() if scrubbed != decoded else data

    def file(self, path: Path) -> bool:
        """Scrub one file in place; True when something was replaced."""
        try:
            raw = path.read_bytes()
        except OSError:
            return False
        clean = self.data(raw)
        if clean != raw:
            path.write_bytes(clean)
            return True
        return False

    def tree(self, root: Path) -> list[Path]:
        """Scrub every regular file under ``root``; returns the files that changed."""
        changed = []
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink() and self.file(path):
                changed.append(path)
        return changed
