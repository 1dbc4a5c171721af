"""``playground e2e``: run the per-blueprint notebooks headlessly with papermill (the GPU e2e check)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from playground.errors import UserError, shown


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this group's commands to the ``playground`` CLI."""
    p = subparsers.add_parser(
        "e2e",
        help="run the per-blueprint notebooks headlessly (papermill): the CI end-to-end check",
        description=(
            "Run each per-blueprint notebook headlessly with papermill (one kernel per notebook) and write "
            "executed notebooks, result.json, junit.xml, metrics.json and summary.md into --out. "
            "Secrets (HF_TOKEN...) come from the environment only and are scrubbed from every artifact. "
            "Exit code 1 when any notebook fails."
        ),
    )
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="default: every notebook in notebooks/ but the app")
    p.add_argument(
        "--profile",
        default="smoke",
        help="smoke (CPU, stand-ins), gpu (real blueprints, bounded steps) or gpu-config (GPU, full-size "
        "architectures built from config, no hub)",
    )
    p.add_argument("--out", required=True, help="output folder for the run's artifacts (created; must be writable)")
    p.add_argument("--timeout-cell", type=int, default=None, metavar="S", help="seconds per cell (default: profile's)")
    p.add_argument("--timeout", type=int, default=None, metavar="S", help="seconds per whole notebook; then kill it")
    p.add_argument("--backend", default=None, help="local (default) or kubernetes: the backend the notebooks use")
    p.add_argument("--fail-fast", action="store_true", help="stop after the first failing notebook")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="notebooks run at once (default 1: sequential)")
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra notebook parameter (YAML value); names that look like secrets are refused",
    )
    p.add_argument("--keep-home", action="store_true", help="keep each notebook's PLAYGROUND_HOME for inspection")
    p.add_argument("--quiet", action="store_true", help="no live log output (artifacts are written all the same)")
    p.set_defaults(func=cmd_e2e)


def _parse_params(items: list[str]) -> dict[str, Any]:
    from playground.e2e.scrub import check_parameter_names

    params: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise UserError(
                f"--param {shown(item)}: expected NAME=VALUE with a Python identifier as NAME", field="--param"
            )
        check_parameter_names([name])
        params[name] = parse_value(value)
    return params


def parse_value(text: str) -> Any:
    """A ``-p`` value as YAML (``true``, ``[1, 2]``, ``3``), except that numbers follow the blueprint
    parameters' one parser: YAML's ``1_0`` or ``0x10`` stay text for the notebook to refuse."""
    import yaml

    from playground.blueprints.schema import parse_number

    if not text.strip():
        return ""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, int | float) and not isinstance(value, bool):
        for integer in (True, False):
            try:
                return parse_number(text, integer=integer)
            except ValueError:
                continue
        return text
    return value


def cmd_e2e(args: argparse.Namespace) -> int:
    import os
    import signal

    from playground.backends import BACKENDS
    from playground.e2e.profiles import get_profile
    from playground.e2e.runner import default_notebooks, run_e2e
    from playground.e2e.types import RunOptions

    profile = get_profile(args.profile)
    backend = args.backend or os.environ.get("PLAYGROUND_BACKEND", "local")
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {shown(backend)}; allowed: {', '.join(BACKENDS)}", field="--backend")
    for flag, value in (("--timeout-cell", args.timeout_cell), ("--timeout", args.timeout), ("--jobs", args.jobs)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be a positive integer, got {value}", field=flag)
    if not args.out.strip():
        raise UserError("--out is empty; allowed: a folder path (created if missing)", field="--out")
    params = _parse_params(args.param)
    notebooks = [Path(n) for n in args.notebooks] or default_notebooks()
    options = RunOptions(
        profile=profile,
        out=Path(args.out).expanduser(),
        backend=backend,
        cell_timeout=args.timeout_cell,
        run_timeout=args.timeout,
        fail_fast=args.fail_fast,
        jobs=args.jobs,
        extra_parameters=params,
        keep_home=args.keep_home,
        live=not args.quiet,
    )
    previous = signal.signal(signal.SIGTERM, _sigterm)  # CI cancellation: stop kernels and jobs, then exit
    try:
        report = run_e2e(notebooks, options)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if report.ok else 1


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
