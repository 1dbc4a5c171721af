"""How a local vLLM server is started, and how adapters are put on and taken off a running one.

The command is vLLM's public entrypoint, the one KServe's ``kserve-vllmserver`` runtime runs::

    <vLLM env>/bin/python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME
        [--enable-lora --max-loras N --max-cpu-loras N --max-lora-rank R]
        --middleware playground_vllm_guard.PlaygroundGuard

from the environment :mod:`playground.serving.vllm_env` builds. A LoRA job's adapter is loaded under the job's id at
run time (``POST /v1/load_lora_adapter``, vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``) and unloaded when unserved.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from playground.errors import UserError

GUARD_MODULE = "playground_vllm_guard"
MAX_LORA_RANK = 64  # the largest adapter rank a base server accepts (blueprints' lora_r is bounded below it)
MAX_LORAS_PER_BATCH = 4  # adapters answered in one batch; more wait for the next (vLLM's --max-loras)
KV_CACHE_GB = 1  # VLLM_CPU_KVCACHE_SPACE: SmolLM2-135M in float32 holds ~22k tokens in 1 GB


def guard_dir(state_dir: Path) -> Path:
    """A directory holding only the guard module, for vLLM's ``PYTHONPATH`` (never the playground package: its
    module names would shadow vLLM's imports)."""
    target = state_dir / "guard"
    target.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).with_name("vllm_guard.py")
    destination = target / f"{GUARD_MODULE}.py"
    if not destination.exists() or destination.read_bytes() != source.read_bytes():
        tmp = destination.with_suffix(f".tmp{os.getpid()}")
        shutil.copyfile(source, tmp)
        os.replace(tmp, destination)
    return target


def command(
    python: Path, model: str, port: int, host: str, *, served_name: str, lora: bool, max_adapters: int, gpu: bool
) -> list[str]:
    """The vLLM server command for ``model`` (a directory or hub id) on ``host:port``."""
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--served-model-name", served_name, "--host", host, "--port", str(port)]
    argv += ["--middleware", f"{GUARD_MODULE}.PlaygroundGuard", "--disable-uvicorn-access-log"]
    if not gpu:
        argv += ["--dtype", "float32"]  # the trainer evaluates in float32: the same answers (benchmarks/README.md)
    if lora:  # each adapter's chat requests carry its own template (the guard puts it there)
        argv += ["--enable-lora", "--max-lora-rank", str(MAX_LORA_RANK), "--trust-request-chat-template"]
        argv += ["--max-loras", str(min(MAX_LORAS_PER_BATCH, max_adapters)), "--max-cpu-loras", str(max_adapters)]
    return argv


def environment(
    base: dict[str, str], *, guard: Path, usage_dir: Path, max_body_bytes: int, templates_dir: Path | None = None
) -> dict[str, str]:
    """vLLM's environment: runtime LoRA loading on, the guard importable (with where the adapters' chat templates
    are), offline, a bounded CPU KV cache."""
    env = dict(base)
    for inherited in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # the project's, not vLLM's
        env.pop(inherited, None)
    env["PYTHONPATH"] = str(guard)
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GB))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env["PLAYGROUND_GUARD_USAGE_DIR"] = str(usage_dir)
    env["PLAYGROUND_GUARD_MAX_BODY_BYTES"] = str(max_body_bytes)
    if templates_dir is not None:
        env["PLAYGROUND_GUARD_TEMPLATES_DIR"] = str(templates_dir)
    return env


def load_adapter(url: str, name: str, path: str, *, timeout: float = 60.0) -> None:
    """Put the adapter at ``path`` on the server at ``url`` (…/v1) under ``name``; loading it again is fine."""
    _post(url, "/load_lora_adapter", {"lora_name": name, "lora_path": path}, timeout, ok_if="already been loaded")


def unload_adapter(url: str, name: str, *, timeout: float = 30.0) -> None:
    """Take adapter ``name`` off the server at ``url``; one that is not loaded is fine."""
    _post(url, "/unload_lora_adapter", {"lora_name": name}, timeout, ok_if="cannot be found")


def _post(url: str, path: str, body: dict[str, Any], timeout: float, *, ok_if: str) -> None:
    import httpx

    base = url.rstrip("/").removesuffix("/v1")
    try:
        response = httpx.post(base + "/v1" + path, json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        raise UserError(f"the model server at {url} did not answer {path}: {exc}", field="job") from exc
    if response.status_code == 200:
        return
    text = response.text
    if ok_if in text:
        return
    try:
        message = response.json().get("error", {}).get("message") or text
    except ValueError:
        message = text
    raise UserError(f"the model server at {url} refused {path} ({response.status_code}): {message}", field="job")
