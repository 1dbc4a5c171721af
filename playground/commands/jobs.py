"""``playground train``, ``jobs``, ``logs``, ``cancel`` and ``delete``: jobs on any backend."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import IO, Any

from playground.cli import add_backend_options, backend_from_args, print_json
from playground.owner import as_owner


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the job commands to the ``playground`` CLI."""
    train = subparsers.add_parser(
        "train",
        help="train a blueprint (prints the job id)",
        description="Start a training job for blueprint ID and print its id. "
        "Parameters are validated against the blueprint before anything starts.",
    )
    train.add_argument("blueprint", metavar="ID", help="blueprint id (see `playground blueprints`) or a YAML file")
    train.add_argument(
        "--set", dest="set", action="append", default=[], metavar="KEY=VALUE", help="set a blueprint parameter"
    )
    train.add_argument("--follow", "-f", action="store_true", help="watch the job to the end (progress bar)")
    train.add_argument("--json", action="store_true", help="print the job as JSON (with --follow: JSON lines)")
    train.add_argument("--model-source", default=None, metavar="SRC", help="override the model (local dir or hf://)")
    train.add_argument("--dataset-source", default=None, metavar="SRC", help="override the dataset (file or hf://)")
    add_backend_options(train, dry_run=True)
    train.set_defaults(func=cmd_train)

    jobs = subparsers.add_parser(
        "jobs",
        help="list jobs, newest first (every visitor's: the operator view)",
        description="List jobs, newest first: every job on the backend, with its owner (booth visitors).",
    )
    jobs.add_argument("--json", action="store_true", help="print the jobs as JSON")
    jobs.add_argument("--owner", default=None, metavar="VISITOR", help="only this visitor's jobs")
    jobs.add_argument(
        "--cleanup",
        action="store_true",
        help="first remove finished jobs (and their servers) older than PLAYGROUND_BOOTH_FINISHED_TTL_SECONDS",
    )
    add_backend_options(jobs)
    jobs.set_defaults(func=cmd_jobs)

    logs = subparsers.add_parser("logs", help="a job's log and events, from the beginning")
    logs.add_argument("job", metavar="JOB", help="job id (see `playground jobs`)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep following until the job ends")
    add_backend_options(logs)
    logs.set_defaults(func=cmd_logs)

    cancel = subparsers.add_parser("cancel", help="stop a running job (it ends Cancelled)")
    cancel.add_argument("job", metavar="JOB", help="job id")
    add_backend_options(cancel)
    cancel.set_defaults(func=cmd_cancel)

    delete = subparsers.add_parser("delete", help="stop a job and its model servers, and remove its state")
    delete.add_argument("job", metavar="JOB", help="job id")
    add_backend_options(delete)
    delete.set_defaults(func=cmd_delete)


# -- train ------------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from playground.api import make_request
    from playground.blueprints import parse_set_options

    request = make_request(
        args.blueprint,
        parse_set_options(args.set),
        model_source=args.model_source,
        dataset_source=args.dataset_source,
    )
    backend = backend_from_args(args)
    if args.dry_run:
        sys.stdout.write(backend.render_train(request).rstrip("\n") + "\n")
        return 0
    job = backend.submit(request)
    if not args.follow:
        if args.json:
            print_json(job.to_dict())
        else:
            print(job.id)
        return 0
    return follow_job(backend, job, as_json=args.json)


def _json_line(data: dict[str, Any], out: IO[str]) -> None:
    out.write(json.dumps(data, default=str, separators=(",", ":")) + "\n")
    out.flush()


def follow_job(backend, job, *, as_json: bool = False, out: IO[str] | None = None) -> int:
    """Follow ``job`` to its end; exit code 0 when it Succeeded, 1 otherwise."""
    from playground.events import JobPhase, event_to_dict

    out = out or sys.stdout
    if as_json:
        _json_line({"type": "job", **job.to_dict()}, out)
    else:
        out.write(f"{job.id}\n")
        out.flush()
    printer = None if as_json else ProgressPrinter(out)
    try:
        for event in backend.events(job.id, follow=True):
            if as_json:
                _json_line(event_to_dict(event), out)
            else:
                assert printer is not None
                printer.event(event)
    except KeyboardInterrupt:
        if printer:
            printer.close()
        print(f"detached; the job keeps running: playground logs -f {job.id}", file=sys.stderr)
        return 130
    final = backend.get(job.id)
    if as_json:
        _json_line({"type": "job", **final.to_dict()}, out)
    else:
        assert printer is not None
        printer.close()
        summarize(final, out)
    return 0 if final.phase == JobPhase.SUCCEEDED else 1


def summarize(job, out: IO[str]) -> None:
    """The final lines of ``train --follow``: phase, duration, metrics, model directory or log tail."""
    from playground.events import JobPhase
    from playground.formatting import format_duration

    took = ""
    if job.finished_at and (job.started_at or job.created_at):
        took = f" in {format_duration(job.finished_at - (job.started_at or job.created_at))}"
    line = f"job {job.id} {job.phase}{took}" + (f": {job.message}" if job.message else "")
    out.write(line + "\n")
    for name, value in sorted(job.metrics.items()):
        if name.startswith(("eval_", "train_")):
            out.write(f"  {name} = {value:.4g}\n")
    if job.phase == JobPhase.SUCCEEDED:
        if job.model_dir:
            out.write(f"  model: {job.model_dir}\n")
        out.write(f"  serve it: playground serve {job.id}\n")
    elif job.log_tail:
        out.write("last log lines:\n")
        for tail_line in job.log_tail[-15:]:
            out.write(f"  | {tail_line}\n")
    out.flush()


class ProgressPrinter:
    """Renders the event stream for a person: a live bar on a terminal, periodic lines otherwise."""

    WIDTH = 24
    TTY_INTERVAL = 0.1  # ≤ 10 redraws per second
    LINE_INTERVAL = 15.0  # seconds between progress lines when not a terminal (plus every 10%)

    def __init__(self, out: IO[str], tty: bool | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.phase = "Pending"
        self.last_draw = 0.0
        self.last_bucket = -1
        self.bar_shown = False
        self.latest = None

    def _clear(self) -> None:
        if self.tty and self.bar_shown:
            self.out.write("\r\033[K")
            self.bar_shown = False

    def line(self, text: str) -> None:
        self._clear()
        self.out.write(text + "\n")
        self.out.flush()
        if self.tty and self.latest is not None:
            self._draw(force=True)

    def render(self, progress) -> str:
        from playground.formatting import format_duration

        frac = progress.fraction
        filled = round(frac * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        parts = [f"{self.phase:<12}[{bar}] {frac * 100:3.0f}%", f"step {progress.step}/{progress.total_steps}"]
        if progress.loss is not None:
            parts.append(f"loss {progress.loss:.4f}")
        if progress.tokens_per_second is not None:
            parts.append(f"{progress.tokens_per_second:,.0f} tok/s")
        parts.append(f"ETA {format_duration(progress.eta_seconds)}")
        return "  ".join(parts)

    def _draw(self, force: bool = False) -> None:
        progress = self.latest
        now = time.monotonic()
        if self.tty:
            if force or now - self.last_draw >= self.TTY_INTERVAL or progress.step >= progress.total_steps:
                self.out.write("\r\033[K" + self.render(progress))
                self.out.flush()
                self.bar_shown = True
                self.last_draw = now
            return
        bucket = int(progress.fraction * 10)
        if force or bucket > self.last_bucket or now - self.last_draw >= self.LINE_INTERVAL:
            self.out.write(self.render(progress) + "\n")
            self.out.flush()
            self.last_bucket = bucket
            self.last_draw = now

    def event(self, event) -> None:
        from playground.events import ClusterEvent, Metric, Phase, Progress, Queued
        from playground.formatting import describe_event

        if isinstance(event, Queued):
            if event.position > 0:
                self.line(describe_event(event).removeprefix("[queue] "))
        elif isinstance(event, Progress):
            self.latest = event
            self._draw()
        elif isinstance(event, Phase):
            if event.phase.terminal:
                if self.latest is not None and not self.tty:
                    self._draw(force=True)  # the last point, whatever the throttle said
                self._clear()
                return
            self.phase = str(event.phase)
            self.line(f"phase: {event.phase}" + (f" ({event.reason})" if event.reason else ""))
        elif isinstance(event, Metric):
            self.line(f"metric: {event.name} = {event.value:.4g}")
        elif isinstance(event, ClusterEvent):
            self.line(f"[{event.kind}] {event.reason}: {event.message}")

    def close(self) -> None:
        if self.tty and self.bar_shown:
            self.out.write("\n")
            self.out.flush()
            self.bar_shown = False


# -- jobs, logs, cancel, delete ---------------------------------------------------------------
def _age(created: float) -> str:
    seconds = max(0, time.time() - created)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def _owner_cell(owner: str | None) -> str:
    if owner is None:
        return "-"
    return owner if len(owner) <= 14 else owner[:13] + "…"


def _phase_cell(job) -> str:
    if job.queue_position:
        return f"{job.phase} (queued #{job.queue_position})"
    return str(job.phase)


def cmd_jobs(args: argparse.Namespace) -> int:
    backend = backend_from_args(args)
    if args.cleanup:
        removed = backend.cleanup()
        print(f"removed {len(removed)} finished job(s) past their TTL" + (f": {', '.join(removed)}" if removed else ""))
    jobs = backend.list(owner=as_owner(args.owner))  # the CLI's --owner: made an Owner once, here
    if args.json:
        print_json([job.to_dict() for job in jobs])
        return 0
    if not jobs:
        if args.owner is not None:
            print(f"no jobs of {args.owner!r}")
        else:
            print("no jobs yet; start one with: playground train tiny-llama-cpu --follow")
        return 0
    rows = [["ID", "BLUEPRINT", "OWNER", "PHASE", "PROGRESS", "LOSS", "METRICS", "CREATED"]]
    for job in jobs:
        p = job.progress
        progress = f"{p.step}/{p.total_steps} ({p.fraction * 100:.0f}%)" if p else "-"
        loss = f"{p.loss:.4f}" if p and p.loss is not None else "-"
        evals = sorted((k, v) for k, v in job.metrics.items() if k.startswith("eval_"))
        metrics = " ".join(f"{k}={v:.3g}" for k, v in evals[:3]) or "-"
        owner = _owner_cell(job.owner)
        rows.append([job.id, job.blueprint_id, owner, _phase_cell(job), progress, loss, metrics, _age(job.created_at)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from playground.formatting import describe_event

    backend = backend_from_args(args)
    backend.get(args.job)  # unknown job: one line, exit 2
    try:
        for event in backend.events(args.job, follow=args.follow):
            sys.stdout.write(describe_event(event) + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 130
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    backend = backend_from_args(args)
    job = backend.cancel(args.job)
    print(f"job {job.id} {job.phase}" + (f": {job.message}" if job.message else ""))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    backend = backend_from_args(args)
    backend.delete(args.job)
    print(f"deleted {args.job}")
    return 0
