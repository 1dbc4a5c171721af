"""Resource figures for e2e runs: CPU average (psutil), GPU utilisation average/peak and peak GPU
memory (NVML via ``pynvml`` from nvidia-ml-py, only when a GPU is present), sampled in a thread."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil


@dataclass
class GpuInfo:
    present: bool
    count: int = 0
    names: list[str] = field(default_factory=list)
    driver: str | None = None
    error: str | None = None  # why NVML is unavailable (no driver, no device)


def _nvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def gpu_info() -> GpuInfo:
    """What NVML sees on this machine; ``present=False`` with the reason when it sees nothing."""
    try:
        nvml = _nvml()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError...
        return GpuInfo(present=False, error=f"NVML unavailable: {exc}")
    try:
        count = nvml.nvmlDeviceGetCount()
        names = [_str(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
        driver = _str(nvml.nvmlSystemGetDriverVersion())
        return GpuInfo(present=count > 0, count=count, names=names, driver=driver)
    except Exception as exc:
        return GpuInfo(present=False, error=f"NVML query failed: {exc}")
    finally:
        nvml.nvmlShutdown()


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class ResourceSummary:
    """What a :class:`Sampler` saw between start and stop."""

    seconds: float = 0.0
    samples: int = 0
    cpu_avg_percent: float | None = None
    cpu_peak_percent: float | None = None
    gpu_util_avg_percent: float | None = None
    gpu_util_peak_percent: float | None = None
    gpu_memory_peak_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sampler:
    """Sample system CPU and (when present) every GPU's utilisation and used memory every ``interval`` s.

    GPU utilisation averages the per-sample mean over devices; the peak is the highest single device.
    """

    def __init__(self, interval: float = 1.0, *, gpu: bool | None = None) -> None:
        self.interval = interval
        self._gpu_wanted = gpu
        self._cpu: list[float] = []
        self._gpu_util: list[float] = []
        self._gpu_peak_util: float | None = None
        self._gpu_mem_peak: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._seconds = 0.0
        self.error: str | None = None

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._started = time.monotonic()
        psutil.cpu_percent(None)  # prime: the next call measures from here
        self._thread = threading.Thread(target=self._run, name="e2e-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> ResourceSummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._seconds = time.monotonic() - self._started
        return self.summary()

    def _run(self) -> None:
        nvml = None
        handles: list[Any] = []
        if self._gpu_wanted is not False:
            try:
                nvml = _nvml()
                handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            except Exception as exc:
                nvml, handles = None, []
                if self._gpu_wanted:
                    self.error = f"NVML unavailable: {exc}"
        try:
            while not self._stop.wait(self.interval):
                self._sample(nvml, handles)
            self._sample(nvml, handles)  # a short run still gets one point
        finally:
            if nvml is not None:
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()

    def _sample(self, nvml: Any, handles: list[Any]) -> None:
        self._cpu.append(psutil.cpu_percent(None))
        if not handles:
            return
        utils = []
        for handle in handles:
            try:
                utils.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                used = memory_used(nvml, handle)
            except Exception as exc:
                self.error = f"NVML sample failed: {exc}"
                continue
            self._gpu_mem_peak = max(self._gpu_mem_peak or 0, used)
        if utils:
            self._gpu_util.append(sum(utils) / len(utils))
            self._gpu_peak_util = max(self._gpu_peak_util or 0.0, max(utils))

    def summary(self) -> ResourceSummary:
        return ResourceSummary(
            seconds=round(self._seconds, 3),
            samples=len(self._cpu),
            cpu_avg_percent=_avg(self._cpu),
            cpu_peak_percent=max(self._cpu) if self._cpu else None,
            gpu_util_avg_percent=_avg(self._gpu_util),
            gpu_util_peak_percent=self._gpu_peak_util,
            gpu_memory_peak_bytes=self._gpu_mem_peak,
        )


def memory_used(nvml: Any, handle: Any) -> int:
    """Bytes of GPU memory in use, as ``nvidia-smi`` counts them: NVML's v2 memory info, whose ``used``
    leaves out the driver's reserved memory. The v1 call's ``used`` (total - free) includes it: on an
    H100 that read ~480 MiB above nvidia-smi on an idle GPU. Drivers without v2 fall back to v1."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return int(nvml.nvmlDeviceGetMemoryInfo(handle, version=version).used)
        except Exception:  # NVMLError_FunctionNotFound on old drivers
            pass
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)


def _avg(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None


def job_timings(job: dict[str, Any] | None, result: dict[str, Any] | None) -> dict[str, float | None]:
    """Queue wait and train time, from result.json first, else from the job's timestamps.

    ``result.json`` may carry ``queue_seconds``/``queue_wait_seconds`` and ``train_seconds``; a job
    (``Job.to_dict()``) carries ``created_at``, ``started_at`` and ``finished_at``.
    """
    result = result or {}
    job = job or result.get("job") or {}
    queue = _first_number(result, "queue_wait_seconds", "queue_seconds")
    train = _first_number(result, "train_seconds", "training_seconds", "train_time_seconds")
    created, started, finished = (job.get(k) for k in ("created_at", "started_at", "finished_at"))
    if queue is None and isinstance(created, int | float) and isinstance(started, int | float):
        queue = max(0.0, started - created)
    if train is None and isinstance(started, int | float) and isinstance(finished, int | float):
        train = max(0.0, finished - started)
    return {
        "queue_wait_seconds": None if queue is None else round(queue, 3),
        "train_seconds": None if train is None else round(train, 3),
    }


def _first_number(data: dict[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None
