"""How many NVIDIA GPUs this machine offers, found without importing torch.

NVML (``nvidia-ml-py``) first, then ``nvidia-smi -L``, then ``/proc/driver/nvidia/gpus``;
``CUDA_VISIBLE_DEVICES`` narrows the count the way CUDA would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path


def _nvml_count() -> int | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded: no usable GPU driver
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _nvidia_smi_count() -> int | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _procfs_count() -> int | None:
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else None


@lru_cache(maxsize=1)
def detect_gpus() -> int:
    """The number of GPUs a trainer started from this process could use (0 when none)."""
    count = _nvml_count()
    if count is None:
        count = _nvidia_smi_count()
    if count is None:
        count = _procfs_count() or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip()]
        if not ids or ids[0].strip() == "-1":
            return 0
        count = min(count, len(ids))
    return count


def runnable_here(blueprint) -> tuple[bool, str]:
    """Whether ``blueprint`` can train on this machine, and a short note saying why (for tables and cards)."""
    if blueprint.model.source.startswith("pkg://"):
        from playground.models.packaged import missing_package_note

        missing = missing_package_note(blueprint.model.source)
        if missing:
            return False, missing
    need = blueprint.resources.gpus_per_node
    if need <= 0:
        return True, "runs here (CPU)"
    have = detect_gpus()
    if have >= need:
        return True, f"runs here ({have} GPU{'s' if have != 1 else ''})"
    if have == 0:
        return False, f"needs {need} GPU{'s' if need != 1 else ''}; none here"
    return False, f"needs {need} GPUs; {have} here"
