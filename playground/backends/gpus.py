"""How many NVIDIA GPUs this machine offers (the local backend, the local Ray, plans), found without importing torch.

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


def detect_gpus() -> int:
    """The number of GPUs a trainer started from this process could use (0 when none); ``PLAYGROUND_GPU_COUNT``
    replaces it (:func:`playground.blueprints.fit.gpu_count_override`)."""
    from playground.blueprints.fit import gpu_count_override

    override = gpu_count_override()
    return _found_gpus() if override is None else override


@lru_cache(maxsize=1)
def _found_gpus() -> int:
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
