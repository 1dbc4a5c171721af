"""``playground export JOB [--merged] [--output DIR]``: a finished job's model as a directory of its own.

A LoRA job's model is its PEFT adapter; ``--merged`` merges it into the job's base model and writes a plain
Hugging Face directory (default: ``merged-model/`` beside the job's ``model/``). Prints the directory written.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from playground.cli import add_backend_options, backend_from_args
from playground.errors import UserError, shown_path

MERGED_DIRNAME = "merged-model"
_MODEL_FILES = ("config.json", "adapter_config.json")  # what makes a directory an earlier export


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``playground export`` to the CLI."""
    export = subparsers.add_parser(
        "export",
        help="a finished job's model as a directory (--merged: LoRA merged into its base)",
        description="Print the directory of finished job JOB's model, or copy it to --output. A LoRA job's model "
        "is its PEFT adapter (a few MB, served on its base model); --merged merges it into the base and writes a "
        f"plain Hugging Face directory (default: {MERGED_DIRNAME}/ beside the job's model/).",
    )
    export.add_argument("job", metavar="JOB", help="job id (see `playground jobs`) or models:/NAME/VERSION")
    export.add_argument("--merged", action="store_true", help="merge a LoRA adapter into its base model")
    export.add_argument("--output", default=None, metavar="DIR", help="where to write (a new or earlier export's)")
    add_backend_options(export)
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from playground.runs.registry import resolve_job

    output = check_output(args.output) if args.output else None  # before anything else: starts nothing
    job = backend_from_args(args).get(resolve_job(args.job))
    print(export_job(job, merged=args.merged, output=output), flush=True)
    return 0


def check_output(text: str) -> Path:
    """``--output``: a path that is not there yet, an empty directory or an earlier export (replaced)."""
    path = Path(text).expanduser().resolve()
    reusable = path.is_dir() and (not any(path.iterdir()) or any((path / n).is_file() for n in _MODEL_FILES))
    if path.exists() and not reusable:
        raise UserError(
            f"--output {shown_path(text)} exists; allowed: a new path, an empty directory or an earlier export",
            field="--output",
        )
    return path


def export_job(job, *, merged: bool, output: Path | None) -> Path:  # job: playground.types.Job
    """Write (or name) ``job``'s model directory: merged into its base with ``merged`` for a LoRA job."""
    from playground.models.adapters import is_adapter_dir, merge_adapter
    from playground.runs.registry import storage_uri

    model = Path(storage_uri(job))
    if not model.is_dir():
        raise UserError(
            f"job {job.id}'s model is at {shown_path(str(model))}, not on this machine; allowed: a job whose model "
            "directory is local (the local backend's)",
            field="job",
        )
    if output is not None and output.resolve() == model.resolve():
        raise UserError(
            f"--output {shown_path(str(output))} is the job's own model; allowed: another path", field="--output"
        )
    if merged and is_adapter_dir(model):
        if not job.base_model:
            raise UserError(f"job {job.id} names no base model to merge its adapter into", field="job")
        target = output or model.with_name(MERGED_DIRNAME)
        with quiet_loaders():
            return merge_adapter(
                model, job.base_model, target, say=lambda line: print(line, file=sys.stderr, flush=True)
            )
    if output is None:
        if is_adapter_dir(model):
            print(f"job {job.id}'s model is a LoRA adapter; --merged writes it merged", file=sys.stderr)
        return model
    return copy_model_dir(model, output)


@contextlib.contextmanager
def quiet_loaders() -> Iterator[None]:
    """No loading/writing bars or deprecation notices from transformers between the progress line and the path
    (restored afterwards)."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def copy_model_dir(source: Path, target: Path) -> Path:
    """Copy a model directory to ``target`` atomically (replacing an earlier export there)."""
    from playground.models.portable import publish, temporary_sibling

    tmp = temporary_sibling(target)
    shutil.copytree(source, tmp, dirs_exist_ok=True)
    return publish(tmp, target)
