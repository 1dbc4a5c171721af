"""``playground data check`` (a dataset against a blueprint's model, before anything starts) and
``playground custom`` (a blueprint of your own: your model and/or data on another blueprint's recipe)."""

from __future__ import annotations

import argparse
import sys

from playground.cli import print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``data`` and ``custom`` to the ``playground`` CLI."""
    data = subparsers.add_parser("data", help="check your own dataset before training on it")
    verbs = data.add_subparsers(dest="data_command", metavar="COMMAND", required=True)
    check = verbs.add_parser(
        "check",
        help="check a .jsonl/.json/.csv/.parquet file against a blueprint's model (starts nothing)",
        description="Every row must map to a conversation (messages; prompt/completion; Alpaca "
        "instruction/input/output) that the model's chat template renders, with a non-empty answer; some "
        "example must fit max_seq_length. Prints the split, token-length percentiles, how many rows "
        "max_seq_length truncates and 3 rows with the trained tokens marked; a problem is one line naming the "
        "file, row and field (exit 2).",
    )
    check.add_argument("file", metavar="FILE", help="the dataset file")
    _data_options(check)
    check.add_argument(
        "--blueprint", default=None, metavar="ID", help="blueprint id or YAML (default: the app's default)"
    )
    check.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE", help="a parameter")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=cmd_check)

    custom = subparsers.add_parser(
        "custom",
        help="save a blueprint of your own: your model and/or data on another blueprint's recipe",
        description="Check the model (a causal LM the trainer can fine-tune; LoRA targets that exist in it) and "
        "the data, then write ID.yaml (default into $PLAYGROUND_HOME/blueprints, part of the catalog). "
        "`playground train ID` or `playground train FILE.yaml` then runs it.",
    )
    custom.add_argument("id", metavar="ID", help="the new blueprint's id (a-z, 0-9, '.', '-')")
    custom.add_argument(
        "--from",
        dest="base",
        default=None,
        metavar="BASE",
        help="the recipe to start from (default: the app's default)",
    )
    custom.add_argument(
        "--dataset", dest="file", default=None, metavar="FILE", help="your data (.jsonl/.json/.csv/.parquet or hf://)"
    )
    _data_options(custom)
    custom.add_argument(
        "--method", default=None, choices=("lora", "full"), help="LoRA or full fine-tuning (default: the base's)"
    )
    custom.add_argument("--title", default=None, help="the title shown in the app")
    custom.add_argument("--quality", default=None, metavar="BAR", help="e.g. eval_exact_match>=0.6 or eval_loss<=1.2")
    custom.add_argument("--output-dir", default=None, metavar="DIR", help="where to write ID.yaml")
    custom.add_argument("--overwrite", action="store_true", help="replace a saved blueprint with the same id")
    custom.add_argument("--json", action="store_true", help="print the result as JSON")
    custom.set_defaults(func=cmd_custom)


def _data_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--columns", default=None, metavar="MAP", help="your column names, e.g. prompt=question,completion=answer"
    )
    parser.add_argument("--eval-source", default=None, metavar="FILE", help="held-out rows (default: a share of FILE)")
    parser.add_argument(
        "--model-source", default=None, metavar="SRC", help="hf://ORG/NAME, a model directory, pkg://… or scratch://…"
    )


def cmd_check(args: argparse.Namespace) -> int:
    from playground.api import DEFAULT_BLUEPRINT, check_data
    from playground.blueprints import parse_set_options
    from playground.userdata.check import is_local_file
    from playground.userdata.rows import DatasetError, where
    from playground.userdata.shapes import parse_columns

    if not is_local_file(args.file):
        raise DatasetError(f"{where(args.file)}: allowed: a local .jsonl/.json/.csv/.parquet file", field="file")
    report = check_data(
        args.blueprint or DEFAULT_BLUEPRINT,
        parse_set_options(args.set),
        dataset_source=args.file,
        model_source=args.model_source,
        columns=parse_columns(args.columns),
        eval_source=args.eval_source,
    )
    if args.json:
        print_json(report.to_dict())
    else:
        sys.stdout.write(report.describe() + "\n")
    return 0


def cmd_custom(args: argparse.Namespace) -> int:
    from playground.api import DEFAULT_BLUEPRINT, custom_blueprint
    from playground.userdata.shapes import parse_columns

    blueprint, path, notes = custom_blueprint(
        args.id,
        base=args.base or DEFAULT_BLUEPRINT,
        title=args.title,
        model_source=args.model_source,
        dataset_source=args.file,
        columns=parse_columns(args.columns),
        eval_source=args.eval_source,
        method=args.method,
        quality=args.quality,
        directory=args.output_dir,
        overwrite=args.overwrite,
    )
    if args.json:
        print_json({"id": blueprint.id, "file": str(path), "notes": notes})
        return 0
    sys.stdout.write(f"saved {blueprint.id}: {path}\n")
    for note in notes:
        sys.stdout.write(f"note: {note}\n")
    from playground.blueprints.custom import custom_dir

    ref = blueprint.id if path is not None and path.parent == custom_dir() else str(path)
    sys.stdout.write(f"next: playground plan {ref}   then   playground train {ref} --follow\n")
    return 0
