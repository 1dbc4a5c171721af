"""Process checks shared by the local job supervisor and the local model servers."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread


def process_alive(pid: int | None, *markers: str) -> bool:
    """Whether ``pid`` runs (not a zombie) and, where /proc tells, its command line contains every marker.

    A zombie child of this process counts as gone and is reaped. The markers guard against a
    recycled pid: a dead supervisor's or server's pid taken by another process. An empty command
    line is a process still inside ``exec`` (the kernel sets the arguments up after ``Popen``
    returns): it counts as alive, since it is becoming what was started.
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
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return False
        if markers:
            cmdline = (proc / "cmdline").read_bytes()
            if not cmdline:  # inside exec (Popen has returned, the arguments are not set up yet): starting
                return not int(fields[6]) & _PF_KTHREAD  # kernel threads have no command line either
            text = cmdline.replace(b"\0", b" ").decode(errors="replace")
            return all(marker in text for marker in markers)
    except (OSError, IndexError, ValueError):
        return False
    return True
