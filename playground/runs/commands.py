"""``playground runs`` (list and compare the jobs' MLflow runs) and ``playground register JOB``."""

from __future__ import annotations

import argparse

from playground.cli import add_backend_options, backend_from_args, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``runs`` and ``register`` to the ``playground`` CLI."""
    runs = subparsers.add_parser(
        "runs",
        help="list and compare training runs (MLflow)",
        description="Every job's MLflow run, newest first: status, quality verdict, final metrics and the "
        "parameters that differ between runs of the same blueprint. Store: MLFLOW_TRACKING_URI, else "
        "sqlite:///$PLAYGROUND_HOME/mlflow.db.",
    )
    runs.add_argument("--blueprint", default=None, metavar="ID", help="only this blueprint's runs")
    runs.add_argument("--json", action="store_true", help="print the runs as JSON")
    runs.set_defaults(func=cmd_runs)

    reg = subparsers.add_parser(
        "register",
        help="register a finished job's model (MLflow model registry or Kubeflow Hub)",
        description="Record JOB's fine-tuned model as a new version of a registered model: in MLflow's model "
        "registry (default, the run store), or in Kubeflow Hub with --registry kubeflow-hub --registry-url URL. "
        "Serve it later with `playground serve models:/NAME/VERSION` (or NAME@VERSION).",
    )
    reg.add_argument("job", metavar="JOB", help="job id (see `playground jobs`)")
    reg.add_argument("--name", default=None, help="registered model name (default: the blueprint id)")
    reg.add_argument("--registry", default="mlflow", help="mlflow (default) or kubeflow-hub")
    reg.add_argument("--registry-url", default=None, metavar="URL", help="kubeflow-hub: http(s)://HOST[:PORT]")
    reg.add_argument("--version", default=None, help="kubeflow-hub: the version name (default: the job id)")
    reg.add_argument("--json", action="store_true", help="print the registered version as JSON")
    add_backend_options(reg)
    reg.set_defaults(func=cmd_register)


def _metric(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def cmd_runs(args: argparse.Namespace) -> int:
    from playground.runs.settings import store_uri
    from playground.runs.store import age, check_blueprint_filter, list_runs
    from playground.runs.ui import ui_link

    uri = store_uri()
    runs = list_runs(args.blueprint, uri=uri)
    check_blueprint_filter(args.blueprint, runs)
    if args.json:
        print_json([run.to_dict() for run in runs])
        return 0
    if not runs:
        print("no runs yet" + (f" of {args.blueprint}" if args.blueprint else "") + "; every training job logs one")
        return 0
    rows = [["JOB", "BLUEPRINT", "STATUS", "VERDICT", "LOSS", "EVAL", "DIFFERS", "STARTED"]]
    for run in runs:
        evals = " ".join(f"{k}={_metric(v)}" for k, v in sorted(run.metrics.items()) if k.startswith("eval_"))
        differs = " ".join(f"{k}={v}" for k, v in run.differing_params.items())
        rows.append(
            [
                run.job_id,
                run.blueprint,
                run.status,
                run.verdict,
                _metric(run.metrics.get("loss")),
                evals or "-",
                differs or "-",
                age(run.start_time),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print(f"browse: {ui_link(uri).text()}")
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    from playground.runs.registry import check_options, register

    check_options(args.registry, args.registry_url, args.name, args.version)  # before any backend call
    job = backend_from_args(args).get(args.job)
    version = register(
        job, name=args.name, registry=args.registry, registry_url=args.registry_url, version=args.version
    )
    if args.json:
        print_json(version.to_dict())
        return 0
    print(f"registered {version.name} version {version.version} in {version.registry} ({version.where})")
    print(f"  source: {version.source}")
    if version.registry == "mlflow":
        print(f"  serve it: playground serve models:/{version.name}/{version.version}")
    return 0
