"""``playground setup``: what a fresh install needs before its first serve, done once (the README's install command
runs it): vLLM's own environment (:mod:`playground.serving.vllm_env`, a few minutes the first time) and the default
blueprint's packaged model, converted. Run again, it checks both in seconds."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from playground.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "setup",
        help="build vLLM's environment and prepare the default model (once per machine; the install command runs it)",
    )
    parser.add_argument("--cpu", action="store_true", help="vLLM's CPU build even on a machine with a GPU")
    parser.add_argument("--skip-model", action="store_true", help="leave the default blueprint's model unconverted")
    parser.set_defaults(func=cmd_setup)


def cmd_setup(args: argparse.Namespace) -> int:
    from playground.serving.vllm_env import ENGINE_VARIABLE, FALLBACK, engine, ensure_environment

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.monotonic()
    if engine() == FALLBACK:
        say(f"{ENGINE_VARIABLE}={FALLBACK}: serving with `transformers serve`; vLLM's environment not built")
    else:
        try:
            python = ensure_environment(gpu=False if args.cpu else None, say=say)
        except RuntimeError as exc:  # a pip failure other than 'no wheel' (VllmUnavailable is a UserError)
            raise UserError(f"vLLM's environment could not be built: {exc}", field="setup") from None
        print(f"vLLM: {python}")
    if not args.skip_model:
        from playground.api import DEFAULT_BLUEPRINT

        path = prepare_model(DEFAULT_BLUEPRINT, say=say)
        if path is not None:
            print(f"{DEFAULT_BLUEPRINT}: {path}")
    say(f"ready in {time.monotonic() - started:.0f}s")
    return 0


def prepare_model(blueprint_id: str, say: Callable[[str], None] | None = None) -> Path | None:
    """Convert the preselected blueprint's packaged model (``pkg://``) now, before the page is served, so that no
    visitor's first Launch waits for it (~20 s for SmolLM2); converted already: a hash of the file, about a second.

    Returns the converted directory, or None (not a packaged model, its package missing, or the conversion failed:
    the app still starts, and the page says what the blueprint needs).
    """
    from playground.blueprints import get_blueprint
    from playground.models.packaged import SCHEME, find_converted, missing_package_note, prepare_in_subprocess

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))  # stdout says where the page is
    source = get_blueprint(blueprint_id).model.source
    if not source.startswith(SCHEME):
        return None
    note = missing_package_note(source)
    if note is not None:
        say(f"warning: {blueprint_id}: {note}")
        return None
    try:
        if find_converted(source) is None:
            say(f"preparing {source} for {blueprint_id} (once, ~20 s) so that no visitor's first Launch waits for it")
        path = prepare_in_subprocess(source)
    except UserError as exc:
        say(f"warning: {blueprint_id}: its model could not be prepared: {exc}")
        return None
    say(f"model ready: {source}")
    return path
