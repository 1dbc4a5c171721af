"""The ``playground`` command line. Each command group lives in its own module and
registers itself here; heavy imports happen inside the command functions."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
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

COMMAND_ENTRY_POINTS = "playground.commands"  # commands of packages above the engine (voila_app's `app`)
COMMAND_MODULES = (
    "playground.commands.blueprints",  # blueprints, blueprints show
    "playground.commands.jobs",  # train, jobs, logs, cancel, delete
    "playground.commands.export",  # export
    "playground.commands.plan",  # plan
    "playground.commands.ray",  # ray status, ray stop
    "playground.commands.data",  # data check, custom
    "playground.commands.serving",  # serve, servers, chat, unserve
    "playground.e2e.commands",  # e2e
    "playground.models.commands",  # models prepare
    "playground.runs.commands",  # runs, register
    "playground.commands.doctor",  # doctor
    "playground.commands.setup",  # setup
)


def add_backend_options(parser: argparse.ArgumentParser, *, dry_run: bool = False) -> None:
    """``--backend``, the Kubernetes connection flags and the Ray scaling flags, shared by every job command."""
    group = parser.add_argument_group("backend")
    group.add_argument(
        "--backend", default=None, help="local (default), kubernetes, ray or kuberay; env PLAYGROUND_BACKEND"
    )
    group.add_argument("--namespace", default=None, help="kubernetes, kuberay: namespace (default: the context's)")
    group.add_argument("--context", default=None, help="kubernetes, kuberay: kubeconfig context")
    group.add_argument("--kubeconfig", default=None, help="kubernetes, kuberay: kubeconfig file")
    group.add_argument(
        "--trainer",
        default=None,
        help="kubernetes: playground (default: the project's trainer) or builtin-torchtune (opt-in upstream "
        "variant, no live progress); env PLAYGROUND_K8S_TRAINER",
    )
    group.add_argument(
        "--workers", type=int, default=None, help="ray: Ray Train workers (default: the blueprint's GPUs, else 1)"
    )
    group.add_argument(
        "--cpus-per-worker", type=float, default=None, help="ray: CPUs per worker (default: the blueprint's, split)"
    )
    if dry_run:
        group.add_argument(
            "--dry-run",
            action="store_true",
            help="kubernetes, kuberay, ray: print what would be created as YAML, start nothing",
        )


KUBERNETES_OPTIONS = ("namespace", "context", "kubeconfig")
BACKEND_OPTIONS = {
    "kubernetes": (*KUBERNETES_OPTIONS, "trainer"),
    "kuberay": KUBERNETES_OPTIONS,
    "ray": ("workers", "cpus_per_worker"),
}


def backend_from_args(args: argparse.Namespace):  # -> Backend (imported lazily)
    """The backend named by ``--backend``/``$PLAYGROUND_BACKEND`` with its options; an option of another backend
    is a one-line error naming it."""
    import os

    from playground.facade import connect

    name = args.backend or os.environ.get("PLAYGROUND_BACKEND", "local")
    mine = BACKEND_OPTIONS.get(name, ())
    for option in dict.fromkeys(o for names in BACKEND_OPTIONS.values() for o in names):
        if getattr(args, option, None) is not None and option not in mine:
            flag = f"--{option.replace('_', '-')}"
            users = " or ".join(f"--backend {b}" for b, names in BACKEND_OPTIONS.items() if option in names)
            raise UserError(f"{flag} only applies to {users}", field=flag)
    if name == "ray":
        workers, cpus = getattr(args, "workers", None), getattr(args, "cpus_per_worker", None)
        if workers is not None and not 1 <= workers <= 512:
            raise UserError(f"--workers {workers}: allowed: 1 to 512", field="--workers")
        if cpus is not None and not 0 < cpus <= 1024:
            raise UserError(
                f"--cpus-per-worker {cpus:g}: allowed: more than 0, at most 1024", field="--cpus-per-worker"
            )
    options = {k: getattr(args, k, None) for k in mine}
    return connect(name, **{k: v for k, v in options.items() if v is not None})


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
    for entry in importlib.metadata.entry_points(group=COMMAND_ENTRY_POINTS):  # `app` (voila_app): it imports
        entry.load().register(subparsers)  # the engine, never the reverse
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
            return _crashed(exc)
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
    except Exception as exc:
        return _crashed(exc)


def _crashed(exc: Exception) -> int:
    """A bug or a broken install (a torchvision built for another torch...): the frames, then the innermost
    cause in one line with the fix where one is known; exit 1."""
    import traceback

    from playground.diagnostics import explain_exception

    traceback.print_exc()
    print(f"playground: error: {explain_exception(exc)}", file=sys.stderr)
    return 1


def _reader_gone() -> int:
    """The reader closed the pipe: stop quietly, as a program stopped by SIGPIPE does (exit 141)."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # Python's final flush then has nowhere to fail
    os.close(devnull)
    return 128 + 13


if __name__ == "__main__":
    sys.exit(main())
