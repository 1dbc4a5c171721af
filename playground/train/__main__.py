"""``python -m playground.train``: the training entrypoint, run locally or in a TrainJob pod.

    python -m playground.train --output DIR [--resume]                 # the run request in $PLAYGROUND_RUN_REQUEST
    python -m playground.train --request FILE --output DIR [--resume]  # ... or in a file
    python -m playground.train --blueprint tiny-llama-cpu --set max_steps=100 --output DIR [--resume]
        [--model-source SRC] [--dataset-source SRC]

The backends hand the trainer one JSON document, a :class:`playground.run_request.RunRequest` (in the job's
environment, ``PLAYGROUND_RUN_REQUEST``); ``--blueprint``/``--set`` build one here, for people at a terminal.
Either way the request is validated once, here, and its settings resolved once (``TrainSpec.settings``).

Writes into DIR: ``model/`` (servable, written atomically), ``base-model/`` (scratch blueprints:
the untrained weights), ``checkpoints/step-N/`` and ``metrics.json``. Prints event lines
(``playground.events``): Phase Initializing → Training → Saving → Succeeded, Progress every
``log_every`` steps, Metric for eval results. Bad input: one line, exit 2, nothing written.
A failure prints Phase Failed with the reason and the error as the last log line, exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from playground.blueprints import blueprint_from_yaml, parse_set_options
from playground.blueprints.fit import gpu_count_override, local_fit
from playground.diagnostics import explain_exception
from playground.errors import UserError, shown_path
from playground.events import JobPhase
from playground.paths import ensure_writable_dir
from playground.run_request import REQUEST_ENV, RunRequest

PROG = "playground.train"
DATASET_FORMS = "hf://ORG/NAME, synthetic://TASK, a local .jsonl/.json/.csv/.parquet file, or a directory"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too)
        raise UserError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=f"python -m {PROG}", description="Train a blueprint and write a servable model directory.")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--request", metavar="FILE", help=f"a run request (JSON); default: ${REQUEST_ENV}")
    which.add_argument("--blueprint", help="catalog id or path to a blueprint YAML file")
    which.add_argument("--blueprint-yaml", metavar="YAML", help="the blueprint itself (a blueprint of your own)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help="parameter")
    parser.add_argument("--output", required=True, help="output directory (model/, checkpoints/, metrics.json)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output")
    parser.add_argument("--model-source", default=None, help="replace the blueprint's model (hf://, scratch://, dir)")
    parser.add_argument("--dataset-source", default=None, help="replace the blueprint's dataset (hf://, file, dir)")
    return parser


def check_dataset_source(source: str) -> None:
    """A one-line UserError unless ``source`` is a form the trainer can load."""
    from playground.train.data import SYNTHETIC_TASKS

    if source.startswith("synthetic://"):
        task = source.removeprefix("synthetic://")
        if task not in SYNTHETIC_TASKS:
            raise UserError(
                f"dataset source {shown_path(source)}: unknown synthetic task; allowed: {', '.join(SYNTHETIC_TASKS)}",
                field="dataset",
            )
        return
    if source.startswith("hf://"):
        if source.removeprefix("hf://").strip("/").count("/") != 1:
            raise UserError(f"dataset source {shown_path(source)}: expected hf://ORG/NAME", field="dataset")
        return
    path = Path(source).expanduser()
    from playground.userdata import FILE_SUFFIXES

    if not (path.is_dir() or (path.is_file() and path.suffix.lower() in FILE_SUFFIXES)):
        raise UserError(
            f"dataset source {shown_path(source)}: no such data file or directory; allowed: {DATASET_FORMS}",
            field="dataset",
        )


def gpu_count() -> int:
    """The GPUs torch sees; ``PLAYGROUND_GPU_COUNT`` replaces them (:func:`gpu_count_override`)."""
    override = gpu_count_override()
    if override is not None:
        return override
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def read_request(args: argparse.Namespace) -> RunRequest:
    """The run request, validated (this process's one validation): built from ``--blueprint``/``--set``, else read
    from ``--request FILE``, else from ``$PLAYGROUND_RUN_REQUEST``. A one-line UserError when there is none."""
    if args.blueprint or args.blueprint_yaml:
        return RunRequest.build(
            args.blueprint or blueprint_from_yaml(args.blueprint_yaml),
            parse_set_options(args.sets),
            model_source=args.model_source,
            dataset_source=args.dataset_source,
        )
    given = [
        flag
        for flag, value in (
            ("--set", args.sets),
            ("--model-source", args.model_source),
            ("--dataset-source", args.dataset_source),
        )
        if value
    ]
    if given:
        raise UserError(f"{given[0]} goes with --blueprint; a run request carries its own", field=given[0])
    if args.request:
        try:
            text = Path(args.request).expanduser().read_text()
        except OSError as exc:
            raise UserError(f"--request {shown_path(args.request)}: {exc.strerror}", field="--request") from None
        return RunRequest.from_json(text, where=f"--request {shown_path(args.request)}")
    text = os.environ.get(REQUEST_ENV)
    if not text:
        raise UserError(
            f"no run request; allowed: --blueprint ID [--set KEY=VALUE ...], --request FILE or ${REQUEST_ENV}",
            field="--blueprint",
        )
    return RunRequest.from_json(text)


def prepare(argv: list[str] | None):
    """Parse and validate everything before writing anything; returns the TrainSpec."""
    from playground.train.model import parse_source
    from playground.train.settings import TrainSpec, check_resume

    args = build_parser().parse_args(argv)
    request = read_request(args)
    blueprint, params = request.blueprint, request.params
    model_source = request.model_source
    parse_source(model_source)
    dataset_source = request.dataset_source
    check_dataset_source(dataset_source)
    if blueprint.method.objective == "sft":
        from playground.userdata import check_dataset

        # A local file: the same one-line row/field errors as before launch, now in the job's log.
        check_dataset(blueprint, params.as_dict(), dataset_source, model_source=model_source)
    else:
        from playground.train.preferences import check_method_dataset

        check_method_dataset(blueprint.method.objective, dataset_source, blueprint.dataset.split)
    if blueprint.needs_gpu:
        local_fit(blueprint, gpu_count(), model_source=request.overrides.model).check()
    if not args.output.strip():
        raise UserError("--output is empty; allowed: a directory path (created if missing)", field="--output")
    output = Path(args.output).expanduser().resolve()
    spec = TrainSpec(blueprint, params, output, model_source, dataset_source, resume=args.resume)
    settings = spec.settings  # resolved once: the recipes read these
    settings.plan(int(os.environ.get("WORLD_SIZE", 1)))  # the global batch splits over the processes
    if args.resume:
        check_resume(spec, settings)  # the seed, global batch and schedule match the checkpoint's
    ensure_writable_dir(output, what="output directory")
    return spec


def recipe_for(objective: str):
    """The recipe that runs a method's objective: our own SFT loop, or DPO/GRPO on TRL (one file each)."""
    if objective == "dpo":
        from playground.train.dpo import run
    elif objective == "grpo":
        from playground.train.grpo import run
    else:
        from playground.train.recipe import run
    return run


def quiet_libraries() -> None:
    """Keep the log readable: library progress bars and advisory warnings off."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except Exception:  # cosmetic only
        pass


def _start_run(spec):
    """The job's MLflow run (playground/runs/tracking.py); None when tracking is off or cannot start."""
    from playground.runs.settings import scrub
    from playground.runs.tracking import CANCEL_CLOSE_TIMEOUT, start_run

    try:
        tracker = start_run(spec, spec.settings)
    except Exception as exc:  # tracking never fails training
        print(f"warning: MLflow run tracking is off ({type(exc).__name__}: {scrub(str(exc))})", flush=True)
        return None
    import threading

    # Ray Train runs the trainer in a worker thread, where no signal handler can be set (Ray ends the run).
    if tracker is not None and threading.current_thread() is threading.main_thread():
        import signal

        def cancelled(signum: int, frame: object) -> None:  # a cancel (SIGTERM): the run ends KILLED, then we die
            tracker.finish("KILLED")
            tracker.close(timeout=CANCEL_CLOSE_TIMEOUT)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, cancelled)
    return tracker


def main(argv: list[str] | None = None) -> int:
    try:
        spec = prepare(argv)
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except Exception as exc:  # a broken install fails here already: the frames for the log, then the cause
        traceback.print_exc()
        print(f"{PROG}: error: {explain_exception(exc)}", file=sys.stderr, flush=True)
        return 1

    from playground.train.reporting import Reporter

    main_rank = int(os.environ.get("RANK", 0)) == 0
    reporter = Reporter(enabled=main_rank, tracker=_start_run(spec) if main_rank else None)
    reporter.phase(JobPhase.INITIALIZING)
    reporter.flush_tracker_warning()  # a tracking server that is down: one line now, training goes on
    for stale in spec.output.glob(".model.tmp-*"):  # a crashed save's leftovers; never a finished model
        import shutil

        shutil.rmtree(stale, ignore_errors=True)
    try:
        quiet_libraries()
        reporter.summary(recipe_for(spec.blueprint.method.objective)(spec, reporter))
    except BaseException as exc:  # every failure ends as Phase Failed + an exit code
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        # The innermost cause, with the fix where one is known (a torchvision built for another torch reaches us
        # as transformers' "Could not import module 'LlamaConfig'"); the traceback above keeps the frames.
        reason = explain_exception(exc) if not isinstance(exc, KeyboardInterrupt) else type(exc).__name__
        if not isinstance(exc, UserError | KeyboardInterrupt):
            traceback.print_exc()
            sys.stderr.flush()
        reporter.phase(JobPhase.FAILED, reason)
        reporter.log(f"{PROG}: error: {reason}")
        reporter.close()
        if isinstance(exc, KeyboardInterrupt):
            return 130
        return exc.exit_code if isinstance(exc, UserError) else 1
    reporter.phase(JobPhase.SUCCEEDED)
    reporter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
