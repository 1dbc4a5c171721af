"""``playground plan``: will a run fit, and how long will it take? Nothing is started."""

from __future__ import annotations

import argparse
import os
import sys

from playground.cli import print_json
from playground.errors import UserError, shown

PLAN_BACKENDS = ("local", "kubernetes", "ray", "kuberay")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``plan`` to the ``playground`` CLI."""
    plan = subparsers.add_parser(
        "plan",
        help="predict memory per device, fit and training time of a blueprint run (starts nothing)",
        description="Parameters (total, trainable), memory per device (weights, gradients, optimizer state, "
        "activations), a verdict against the device or the blueprint's resources with the change that would "
        "make it fit, and the training time from this machine's earlier runs (else from FLOPs).",
    )
    plan.add_argument("blueprint", metavar="ID", help="blueprint id (see `playground blueprints`) or a YAML file")
    plan.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE", help="a parameter")
    plan.add_argument("--model-source", default=None, metavar="SRC", help="override the model (local dir or hf://)")
    plan.add_argument("--dataset-source", default=None, metavar="SRC", help="override the dataset (file or hf://)")
    plan.add_argument(
        "--backend",
        default=None,
        help="local or ray (this machine; default: local) or kubernetes, kuberay (the blueprint's resources)",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from playground.api import make_request
    from playground.blueprints import parse_set_options
    from playground.blueprints.plan import make_plan

    backend = args.backend or os.environ.get("PLAYGROUND_BACKEND", "local")
    if backend not in PLAN_BACKENDS:
        raise UserError(f"--backend {shown(backend)}: allowed: {', '.join(PLAN_BACKENDS)}", field="--backend")
    request = make_request(
        args.blueprint,
        parse_set_options(args.set),
        model_source=args.model_source,
        dataset_source=args.dataset_source,
    )
    blueprint, params = request.blueprint, request.params.as_dict()  # validated when the request was made
    plan = make_plan(
        blueprint,
        params,
        model_source=request.overrides.model,
        dataset_source=request.overrides.dataset,
        backend=backend,
    )
    if args.json:
        print_json(plan.to_dict())
    else:
        sys.stdout.write(plan.describe() + "\n")
    return 0
