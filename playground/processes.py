"""Process checks shared by the local job supervisor and the local model servers."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def process_alive(pid: int | None, *markers: str) -> bool:
    """Whether ``pid`` runs (not a zombie) and, where /proc tells, its command line contains every marker.

    A zombie child of this process counts as gone and is reaped. The markers guard against a
    recycled pid: a dead supervisor's or server's pid taken by another process.
    """
    if not pid or pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return not markers  # someone else's process: not ours when we expect markers
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():  # no /proc (macOS): the signal check is all we have
        return True
    try:
        stat = (proc / "stat").read_text()
        if stat[stat.rfind(")") + 2 :].startswith(("Z", "X")):
            return False
        if markers:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            return all(marker in cmdline for marker in markers)
    except OSError:
        return False
    return True
