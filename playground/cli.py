"""The ``playground`` command line. Each command group lives in its own module and
registers itself here; heavy imports happen inside the command functions."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from playground.errors import UserError

# Top-level packages of the full install that the slim `playground e2e` install (requirements/e2e.txt) leaves
# out: a command that needs one says so in one line instead of a traceback.
FULL_INSTALL_PACKAGES = frozenset(
    {"torch", "transformers", "peft", "accelerate", "datasets", "safetensors", "gguf", "tokenizers", "voila"}
    | {"ipywidgets", "plotly", "anywidget", "jupyterlab", "kubeflow", "kubeflow_trainer_api", "openai", "httpx"}
    | {"mlflow", "sqlalchemy", "alembic", "model_registry"}
)

COMMAND_MODULES = (
    "playground.commands.blueprints",  # blueprints, blueprints show
    "playground.commands.jobs",  # train, jobs, logs, cancel, delete
    "playground.commands.plan",  # plan
    "playground.commands.data",  # data check, custom
    "playground.serving.commands",  # serve, servers, chat, unserve
    "playground.e2e.commands",  # e2e
    "playground.commands.app",  # app
    "playground.models.commands",  # models prepare
    "playground.runs.commands",  # runs, register
)


def add_backend_options(parser: argparse.ArgumentParser, *, dry_run: bool = False) -> None:
    """``--backend`` and the Kubernetes connection flags, shared by every job command."""
    group = parser.add_argument_group("backend")
    group.add_argument("--backend", default=None, help="local (default) or kubernetes; env PLAYGROUND_BACKEND")
    group.add_argument("--namespace", default=None, help="kubernetes: namespace (default: the context's)")
    group.add_argument("--context", default=None, help="kubernetes: kubeconfig context")
    group.add_argument("--kubeconfig", default=None, help="kubernetes: kubeconfig file")
    group.add_argument(
        "--trainer",
        default=None,
        help="kubernetes: playground (default: the project's trainer) or builtin-torchtune (opt-in upstream "
        "variant, no live progress); env PLAYGROUND_K8S_TRAINER",
    )
    if dry_run:
        group.add_argument(
            "--dry-run", action="store_true", help="kubernetes: print the manifest as YAML, contact nothing"
        )


def backend_from_args(args: argparse.Namespace):  # -> Backend (imported lazily)
    """The backend named by ``--backend``/``$PLAYGROUND_BACKEND`` with its options."""
    import os

    from playground.facade import connect

    name = args.backend or os.environ.get("PLAYGROUND_BACKEND", "local")
    options: dict[str, Any] = {}
    kubernetes_only = ("namespace", "context", "kubeconfig", "trainer")
    if name == "kubernetes":
        options = {k: getattr(args, k, None) for k in kubernetes_only}
        options = {k: v for k, v in options.items() if v is not None}
    else:
        used = [f"--{k}" for k in kubernetes_only if getattr(args, k, None)]
        if used:
            raise UserError(f"{used[0]} only applies to --backend kubernetes", field=used[0])
    return connect(name, **options)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="playground",
        description="Blueprint Playground: pick an LLM fine-tuning blueprint, train it, watch it, serve it, chat.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away (`| head`) shows up here, not at interpreter exit
        return code
    except UserError as exc:
        print(f"playground: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        top_level = (exc.name or "").partition(".")[0]
        if top_level not in FULL_INSTALL_PACKAGES:
            raise
        print(
            f"playground: error: `playground {args.command}` needs the full install ({top_level} is missing; "
            "this looks like the slim `playground e2e` install): pip install blueprint-playground",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader closed the pipe: stop quietly, as a program stopped by SIGPIPE does (exit 141)."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # Python's final flush then has nowhere to fail
    os.close(devnull)
    return 128 + 13


if __name__ == "__main__":
    sys.exit(main())
