"""How a local vLLM server is started, and how adapters are put on and taken off a running one.

The command is vLLM's public entrypoint, the one KServe's ``kserve-vllmserver`` runtime runs::

    <vLLM env>/bin/python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME
        [--enable-lora --max-loras N --max-cpu-loras N --max-lora-rank R --lora-target-modules q_proj …]
        --middleware playground_vllm_guard.PlaygroundGuard

from the environment :mod:`playground.serving.vllm_env` builds, with the guard and the CPU LoRA plugin
(:mod:`playground.serving.vllm_lora_cpu`) on its ``PYTHONPATH``. A LoRA job's adapter is loaded under the job's id at
run time (``POST /v1/load_lora_adapter``, vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``) and unloaded when unserved.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from playground.errors import UserError, shown

GUARD_MODULE = "playground_vllm_guard"
LORA_CPU_MODULE = "playground_vllm_lora_cpu"  # vLLM general plugin: the CPU LoRA operations mended (vllm_lora_cpu.py)
PLUGINS_DIST = "playground_vllm_plugins-1.0.dist-info"  # how vLLM finds it: an entry point on its PYTHONPATH
MAX_LORA_RANK = 64  # the largest adapter rank a base server accepts (blueprints' lora_r is bounded below it)
MAX_LORAS_PER_BATCH = 4  # adapters answered in one batch; more wait for the next (vLLM's --max-loras)
KV_CACHE_GB = 1  # VLLM_CPU_KVCACHE_SPACE: SmolLM2-135M in bfloat16 holds ~44k tokens in 1 GB
DTYPE_VARIABLE = "PLAYGROUND_VLLM_DTYPE"
DTYPES = ("auto", "bfloat16", "float16", "float32")  # vLLM's --dtype choices for these models


def guard_dir(state_dir: Path) -> Path:
    """A directory holding only the guard module and the CPU LoRA plugin (with the ``.dist-info`` that names it to
    vLLM's ``vllm.general_plugins``), for vLLM's ``PYTHONPATH`` (never the playground package: its module names would
    shadow vLLM's imports)."""
    target = state_dir / "guard"
    target.mkdir(parents=True, exist_ok=True)
    here = Path(__file__)
    _write_if_changed(target / f"{GUARD_MODULE}.py", here.with_name("vllm_guard.py").read_bytes())
    _write_if_changed(target / f"{LORA_CPU_MODULE}.py", here.with_name("vllm_lora_cpu.py").read_bytes())
    dist = target / PLUGINS_DIST
    dist.mkdir(exist_ok=True)
    name, version = PLUGINS_DIST.removesuffix(".dist-info").rsplit("-", 1)
    _write_if_changed(dist / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode())
    entry = f"[vllm.general_plugins]\nplayground_lora_cpu = {LORA_CPU_MODULE}:register\n"
    _write_if_changed(dist / "entry_points.txt", entry.encode())
    return target


def _write_if_changed(destination: Path, content: bytes) -> None:
    """Write ``content`` to ``destination`` atomically unless it holds it already (servers may be reading it)."""
    if destination.exists() and destination.read_bytes() == content:
        return
    tmp = destination.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(content)
    os.replace(tmp, destination)


def command(
    python: Path, model: str, port: int, host: str, *, served_name: str, lora: bool, max_adapters: int
) -> list[str]:
    """The vLLM server command for ``model`` (a directory or hub id) on ``host:port``."""
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--served-model-name", served_name, "--host", host, "--port", str(port)]
    argv += ["--middleware", f"{GUARD_MODULE}.PlaygroundGuard", "--disable-uvicorn-access-log"]
    if (dtype := serving_dtype()) != "auto":
        argv += ["--dtype", dtype]
    if lora:  # each adapter's chat requests carry its own template (the guard puts it there)
        argv += ["--enable-lora", "--max-lora-rank", str(MAX_LORA_RANK), "--trust-request-chat-template"]
        argv += ["--lora-target-modules", *lora_target_modules()]  # no LoRA on lm_head: see the function
        argv += ["--max-loras", str(min(MAX_LORAS_PER_BATCH, max_adapters)), "--max-cpu-loras", str(max_adapters)]
    return argv


def serving_dtype() -> str:
    """The weights' type on the server: ``PLAYGROUND_VLLM_DTYPE``, else ``auto``, vLLM's own choice (and KServe's
    runtime's): bfloat16 on a CPU with bfloat16 arithmetic, even for a float32 checkpoint. The trainer evaluates in
    float32; on the default blueprint's 300 held-out requests bfloat16 gave 293 answers token for token the same and
    the same verdict on 298 (99.3 %), 20 chats ~1.3× faster (benchmarks/README.md). ``float32`` serves exactly as the
    trainer evaluates (300 of 300), where a model needs it."""
    value = os.environ.get(DTYPE_VARIABLE, "").strip().lower() or "auto"
    if value not in DTYPES:
        raise UserError(
            f"{DTYPE_VARIABLE}={shown(os.environ[DTYPE_VARIABLE].strip())} is not valid (allowed: {', '.join(DTYPES)})",
            field=DTYPE_VARIABLE,
        )
    return value


def lora_target_modules() -> list[str]:
    """The layers a base server puts LoRA on: every linear layer the trainer's LoRA may target (the families in
    :data:`playground.blueprints.custom.LINEAR_MODULES`), so never ``lm_head``. Left to itself vLLM also wraps the
    output projection, and on CPU that wrapper multiplied every decoded token by a zero vocabulary-wide LoRA term:
    a third of the base model's decode time (benchmarks/README.md)."""
    from playground.blueprints.custom import LINEAR_MODULES

    return sorted({name for names in LINEAR_MODULES.values() for name in names})


def uncovered_targets(adapter_dir: str | Path) -> list[str]:
    """The modules an adapter's ``adapter_config.json`` targets that the base server puts no LoRA on (vLLM would
    load the adapter and silently leave those out)."""
    import json

    try:
        config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return []  # vLLM's own loading answers for a missing or broken adapter
    targets = config.get("target_modules") or []
    if isinstance(targets, str):  # "all-linear" or a regular expression: peft's forms this check cannot read
        return []
    allowed = set(lora_target_modules())
    return sorted(str(t) for t in targets if str(t).rsplit(".", 1)[-1] not in allowed)


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
    uncovered = uncovered_targets(path)
    if uncovered:
        allowed = ", ".join(lora_target_modules())
        raise UserError(
            f"method.target_modules {', '.join(uncovered)}: the base model server puts LoRA only on {allowed}",
            field="method.target_modules",
        )
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
