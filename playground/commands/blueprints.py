"""``playground blueprints [--json]`` and ``playground blueprints show ID [--json]``."""

from __future__ import annotations

import argparse
import sys

from playground.cli import print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``blueprints`` (list) and ``blueprints show`` to the ``playground`` CLI."""
    parser = subparsers.add_parser("blueprints", help="list the blueprint catalog", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the catalog as JSON")
    parser.set_defaults(func=cmd_list)
    sub = parser.add_subparsers(dest="blueprints_command", metavar="SUBCOMMAND")
    show = sub.add_parser("show", help="everything about one blueprint: parameters with bounds, examples")
    show.add_argument("id", metavar="ID", help="blueprint id (see `playground blueprints`) or a YAML file")
    show.add_argument("--json", action="store_true", help="print the blueprint (examples included) as JSON")
    show.set_defaults(func=cmd_show)


def _method(blueprint) -> str:
    method = blueprint.method
    return f"lora r{method.rank}" if method.kind == "lora" else method.kind


def _table(rows: list[list[str]], out=None) -> None:
    out = out or sys.stdout
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")


def _fit(blueprint):
    from playground.backends.gpus import detect_gpus
    from playground.blueprints.fit import local_fit

    return local_fit(blueprint, detect_gpus())


def _warn_problems() -> None:
    """Catalog files that did not load: one line each on stderr; the rest of the catalog still lists."""
    from playground.blueprints import catalog_problems

    for problem in catalog_problems():
        print(f"playground: warning: skipped {problem}", file=sys.stderr)


def cmd_list(args: argparse.Namespace) -> int:
    from playground.api import blueprints

    catalog = blueprints()
    _warn_problems()
    if args.json:
        items = []
        for bp in catalog:
            fit = _fit(bp)
            items.append({**bp.model_dump(mode="json"), "runnable_here": fit.runnable, "note": fit.note})
        print_json(items)
        return 0
    rows = [["ID", "TITLE", "TASK", "MODEL", "METHOD", "GPUS", "HERE"]]
    for bp in catalog:
        rows.append(
            [
                bp.id,
                bp.title,
                bp.task,
                bp.model.source,
                _method(bp),
                str(bp.resources.nodes * bp.resources.gpus_per_node),
                _fit(bp).note,
            ]
        )
    _table(rows)
    return 0


def _allowed(spec) -> str:
    return spec.describe_allowed().replace("an integer from ", "int ").replace("a number from ", "")


def cmd_show(args: argparse.Namespace) -> int:
    from playground.blueprints import KNOWN_PARAMETERS, get_blueprint

    bp = get_blueprint(args.id)
    if args.json:
        print_json(bp.model_dump(mode="json"))
        return 0
    out = sys.stdout
    fit = _fit(bp)
    res = bp.resources
    out.write(f"{bp.id}: {bp.title}\n")
    if bp.description:
        out.write(f"  {bp.description.strip()}\n")
    out.write("\n")
    model = bp.model.source + (" (gated: needs HF_TOKEN)" if bp.model.gated else "")
    if bp.model.config:
        model += "  config: " + ", ".join(f"{k}={v}" for k, v in bp.model.config.items())
    dataset = f"{bp.dataset.source}  format {bp.dataset.format}, split {bp.dataset.split}"
    method = bp.method.kind
    if bp.method.kind == "lora":
        method += f" (rank {bp.method.rank}, alpha {bp.method.alpha}, modules {', '.join(bp.method.target_modules)})"
    gpus = f"{res.nodes} node(s) x {res.gpus_per_node} GPU(s)"
    extras = ", ".join(f"{k} {v}" for k, v in (("cpu", res.cpu), ("memory", res.memory)) if v)
    quality = f"{bp.quality.metric} {'>=' if bp.quality.higher_is_better else '<='} {bp.quality.threshold:g}"
    k8s = bp.kubernetes
    for key, value in [
        ("task", bp.task),
        ("model", model),
        ("dataset", dataset),
        ("method", method),
        ("resources", f"{gpus}" + (f", {extras}" if extras else "") + f"  [{fit.note}]"),
        ("kubernetes", f"trainer {k8s.trainer}, runtime {k8s.runtime}, deadline {k8s.active_deadline_seconds}s"),
        ("serving", f"{bp.serving.runtime}, max_new_tokens {bp.serving.max_new_tokens}"),
        ("quality bar", quality),
    ]:
        out.write(f"{key + ':':<12} {value}\n")
    out.write("\nparameters (--set NAME=VALUE):\n")
    rows = [["  NAME", "TYPE", "DEFAULT", "ALLOWED", "HELP"]]
    for name, spec in bp.parameters.items():
        default = spec.coerce(name, spec.default)
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        rows.append(["  " + name, spec.type, shown, _allowed(spec), spec.help or KNOWN_PARAMETERS.get(name, "")])
    _table(rows, out)
    out.write("\nexamples:\n")
    for example in bp.examples:
        out.write(f"  {example.prompt!r}" + (f" -> {example.expected!r}" if example.expected else "") + "\n")
    if not fit.runnable:
        out.write(f"\nnote: {fit.advice()}\n")
    return 0
