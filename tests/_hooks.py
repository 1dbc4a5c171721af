"""Control hooks for the processes a test starts: a ``sitecustomize.py`` every new Python process imports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def install_sitecustomize(directory: Path, code: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make ``code`` the ``sitecustomize`` of every Python process started from now on (via PYTHONPATH)."""
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(code)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(directory), os.environ.get("PYTHONPATH")) if p))
    return directory
