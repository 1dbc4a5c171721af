"""Where the engine keeps its state: ``$PLAYGROUND_HOME`` or the user's data dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

from playground.errors import UserError, shown_path


def playground_home() -> Path:
    """The state directory (jobs, servers, caches). Not created here."""
    env = os.environ.get("PLAYGROUND_HOME")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("blueprint-playground", appauthor=False))


def ensure_writable_dir(
    path: Path, *, what: str, hint: str = "choose another with PLAYGROUND_HOME or --output"
) -> Path:
    """Create ``path`` if needed and check it is writable; raise a one-line UserError (ending in ``hint``) if not."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {shown_path(path)} is not a directory; {hint}", field=what)
    try:
        path.mkdir(parents=True, exist_ok=True)
        # A unique probe per call: threads of one process (serving base and fine-tuned at once)
        # must not remove each other's probe.
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise UserError(
            f"{what} {shown_path(path)} is not writable ({exc.strerror or exc}); {hint}",
            field=what,
        ) from None
    return path
