"""``playground e2e``: run notebooks headlessly with papermill: the per-blueprint notebooks (the GPU e2e
check) or any others, e.g. Kubeflow Trainer's examples from a run file (:mod:`playground.e2e.runfile`).

Parameters take papermill's own forms, each once per flag: ``-p NAME VALUE`` (the value read as YAML, as
``-p NAME=VALUE`` always was here), ``-r NAME VALUE`` (a raw string), ``-y YAML`` and ``-f FILE``; they
go to every notebook of the run, after the run file's. Applied in papermill's order: files, YAML, then
``-p``/``-r`` as given.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from playground.errors import UserError, shown


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this group's commands to the ``playground`` CLI."""
    p = subparsers.add_parser(
        "e2e",
        help="run the per-blueprint notebooks headlessly (papermill): the CI end-to-end check",
        description=(
            "Run notebooks headlessly with papermill (one kernel per notebook; default: the per-blueprint "
            "notebooks) and write the executed notebooks, junit.xml, metrics.json and summary.md into --out. "
            "Any notebook is a test case: papermill's outcome is its verdict (plus its result.json if it writes "
            "one). Secrets (HF_TOKEN...) come from the environment only and are scrubbed from every artifact. "
            "Exit code 1 when any notebook fails."
        ),
    )
    p.add_argument(
        "notebooks", nargs="*", metavar="NOTEBOOK", help="default: the run file's, else every notebook in notebooks/"
    )
    p.add_argument("--run-file", default=None, metavar="FILE", help="YAML: notebooks, parameters, timeouts, groups")
    p.add_argument("--group", default=None, metavar="NAME", help="only the run file's notebooks of this group")
    p.add_argument(
        "--prefix", default=None, metavar="TEXT", help="prefix for test names and output folders (a matrix entry)"
    )
    p.add_argument("--kernel", "-k", default=None, metavar="NAME", help="kernel for every notebook (papermill -k)")
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
    p.add_argument(
        "--namespace", default=None, help="kubernetes: the notebooks' namespace (default: the kubeconfig context's)"
    )
    p.add_argument(
        "--cleanup",
        action="store_true",
        help="kubernetes: delete the TrainJobs each notebook created while it ran (never older ones)",
    )
    p.add_argument("--fail-fast", action="store_true", help="stop after the first failing notebook")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="notebooks run at once (default 1: sequential)")
    p.add_argument(
        "-p",
        "--param",
        "--parameters",
        dest="param_items",
        action=_ParamAction,
        nargs="+",
        default=[],
        metavar="NAME VALUE",
        help="notebook parameter, `-p NAME VALUE` or `-p NAME=VALUE` (value read as YAML); names that look "
        "like secrets are refused",
    )
    p.add_argument(
        "-r",
        "--parameters_raw",
        "--raw",
        dest="param_items",
        action=_ParamAction,
        nargs="+",
        metavar="NAME VALUE",
        help="notebook parameter whose value is a raw string",
    )
    p.add_argument(
        "-y", "--parameters_yaml", action="append", default=[], metavar="YAML", help="parameters as a YAML mapping"
    )
    p.add_argument(
        "-f", "--parameters_file", action="append", default=[], metavar="FILE", help="parameters from a YAML file"
    )
    p.add_argument(
        "--isolated-env",
        action="store_true",
        help="run each foreign notebook in a throwaway venv (--system-site-packages): its pip installs go with it",
    )
    p.add_argument("--keep-home", action="store_true", help="keep each notebook's PLAYGROUND_HOME for inspection")
    p.add_argument("--quiet", action="store_true", help="no live log output (artifacts are written all the same)")
    p.set_defaults(func=cmd_e2e)


class _ParamAction(argparse.Action):
    """``-p``/``-r``: one parameter per flag, ``NAME VALUE`` (papermill's form) or ``NAME=VALUE``. The flag
    takes one or more words so that both forms parse; :func:`split_parameter` reads them later (a bad
    one is then a one-line UserError, not argparse's usage text)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option=None):
        items = list(getattr(namespace, self.dest, None) or [])
        items.append((option or "-p", list(values)))
        setattr(namespace, self.dest, items)


RAW_FLAGS = ("-r", "--parameters_raw", "--raw")


def split_parameter(flag: str, words: list[str]) -> tuple[str, str, list[str]]:
    """(name, value, the words after the parameter: notebooks, as in ``-p num_gpu 2 a.ipynb``)."""
    head = words[0]
    name, sep, value = head.partition("=")
    if sep and name.isidentifier():
        return name, value, words[1:]
    if len(words) >= 2 and head.isidentifier():
        return head, words[1], words[2:]
    raise UserError(
        f"{flag} {shown(head)}: expected NAME VALUE (or NAME=VALUE) with a Python identifier as NAME", field=flag
    )


def collect_parameters(args: argparse.Namespace) -> dict[str, Any]:
    """The run's parameters in papermill's order: ``-f`` files, ``-y`` YAML, then ``-p``/``-r`` as given."""
    import yaml

    from playground.e2e.scrub import check_parameter_names

    params: dict[str, Any] = {}
    for path in args.parameters_file:
        try:
            loaded = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
        except OSError as exc:
            raise UserError(
                f"-f {shown(path)}: cannot be read ({exc.strerror or type(exc).__name__})", field="-f"
            ) from None
        except yaml.YAMLError:
            raise UserError(f"-f {shown(path)}: not valid YAML", field="-f") from None
        params.update(_mapping(loaded, f"-f {shown(path)}", "-f"))
    for text in args.parameters_yaml:
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError:
            raise UserError(f"-y {shown(text)}: not valid YAML", field="-y") from None
        params.update(_mapping(loaded, f"-y {shown(text)}", "-y"))
    for flag, words in args.param_items:
        name, value, _notebooks = split_parameter(flag, words)
        params[name] = value if flag in RAW_FLAGS else parse_value(value)
    check_parameter_names(params)
    return params


def trailing_notebooks(args: argparse.Namespace) -> list[str]:
    """Notebooks written after a ``-p NAME VALUE`` (the flag's extra words)."""
    return [nb for flag, words in args.param_items for nb in split_parameter(flag, words)[2]]


def _mapping(value: Any, where: str, flag: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a YAML mapping of NAME: VALUE", field=flag)
    bad = next((k for k in value if not str(k).isidentifier()), None)
    if bad is not None:
        raise UserError(f"{where}: parameter name {shown(str(bad))} is not a Python identifier", field=flag)
    return {str(k): v for k, v in value.items()}


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
    for flag, value in (("--namespace", args.namespace), ("--cleanup", args.cleanup)):
        if value and backend != "kubernetes":
            raise UserError(f"{flag} only applies to --backend kubernetes", field=flag)
    if args.prefix is not None and not _PREFIX.fullmatch(args.prefix):
        raise UserError(
            f"--prefix {shown(args.prefix)}: allowed: 1-63 letters, digits, '.', '_' or '-'", field="--prefix"
        )
    if args.kernel is not None and not args.kernel.strip():
        raise UserError("--kernel is empty; allowed: a Jupyter kernel name (jupyter kernelspec list)", field="--kernel")
    params = collect_parameters(args)
    given = [Path(n) for n in [*args.notebooks, *trailing_notebooks(args)]]
    title = None
    if args.run_file:
        if given:
            raise UserError("give notebooks either on the command line or in --run-file, not both", field="NOTEBOOK")
        from playground.e2e.runfile import load_run_file

        run_file = load_run_file(Path(args.run_file).expanduser(), group=args.group, prefix=args.prefix)
        notebooks: list[Any] = list(run_file.notebooks)
        title = run_file.title
    else:
        if args.group is not None:
            raise UserError("--group selects notebooks of a --run-file; none given", field="--group")
        from playground.e2e.runner import specs_for

        notebooks = specs_for(given or default_notebooks())
        if args.prefix:
            for spec in notebooks:
                spec.name = f"{args.prefix}/{spec.name}"
    options = RunOptions(
        profile=profile,
        out=Path(args.out).expanduser(),
        backend=backend,
        cell_timeout=args.timeout_cell,
        run_timeout=args.timeout,
        fail_fast=args.fail_fast,
        jobs=args.jobs,
        extra_parameters=params,
        kernel=args.kernel,
        keep_home=args.keep_home,
        live=not args.quiet,
        title=title,
        namespace=args.namespace,
        cleanup=args.cleanup,
        isolated_env=args.isolated_env,
    )
    previous = signal.signal(signal.SIGTERM, _sigterm)  # CI cancellation: stop kernels and jobs, then exit
    try:
        report = run_e2e(notebooks, options)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if report.ok else 1


_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,63}")


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
