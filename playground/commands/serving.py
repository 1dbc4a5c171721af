"""``playground serve``, ``servers``, ``chat`` and ``unserve``: model servers and talking to them."""

from __future__ import annotations

import argparse
import os
import sys

from playground.cli import add_backend_options, backend_from_args, print_json
from playground.errors import UserError, shown


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the serving commands to the ``playground`` CLI."""
    serve = subparsers.add_parser(
        "serve",
        help="serve a finished job's model behind an OpenAI-compatible endpoint",
        description="Start a model server for JOB's fine-tuned model (or, with --base, its base model), "
        "wait until it answers, and print the endpoint URL and model name.",
    )
    serve.add_argument(
        "job", metavar="JOB", help="job id (see `playground jobs`), or a registered model: models:/NAME/VERSION"
    )
    serve.add_argument("--base", action="store_true", help="serve the job's base model instead (to compare)")
    serve.add_argument("--json", action="store_true", help="print the endpoint as JSON")
    serve.add_argument(
        "--port", metavar="N", default=None, help="listen on this port (1-65535; local backend; default: a free one)"
    )
    add_backend_options(serve, dry_run=True)
    serve.set_defaults(func=cmd_serve)

    servers = subparsers.add_parser(
        "servers",
        help="list running model servers",
        description="Every model server with its owner (shortened; 'shared' for the booth's shared base servers), "
        "kind, time since its last chat request, resident memory (local servers), and the total.",
    )
    servers.add_argument("--json", action="store_true", help="print the servers as JSON")
    add_backend_options(servers)
    servers.set_defaults(func=cmd_servers)

    chat = subparsers.add_parser(
        "chat",
        help="send one prompt to an endpoint and print the answer",
        description="Chat with an OpenAI-compatible endpoint (a local server or a KServe InferenceService). "
        "URL is the base URL ending in /v1; a local server's name or job id works too.",
    )
    chat.add_argument("url", metavar="URL", help="endpoint base URL (…/v1), or a local server name or job id")
    chat.add_argument("prompt", help="the user message")
    chat.add_argument("--model", default=None, help="model name (default: the endpoint's)")
    chat.add_argument("--system", default=None, help="a system message before the prompt")
    chat.add_argument("--stream", action="store_true", help="print the answer as it is generated")
    chat.add_argument("--max-tokens", type=int, default=None, help="most tokens to generate")
    chat.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    chat.set_defaults(func=cmd_chat)

    unserve = subparsers.add_parser("unserve", help="stop model servers (by endpoint URL, server name or job id)")
    unserve.add_argument(
        "target", metavar="URL|JOB", nargs="?", help="endpoint URL, server name, or job id (all its servers)"
    )
    unserve.add_argument("--all", action="store_true", help="stop every model server, shared ones too")
    add_backend_options(unserve)
    unserve.set_defaults(func=cmd_unserve)


def cmd_serve(args: argparse.Namespace) -> int:
    from playground.runs.registry import resolve_job
    from playground.serving.local import parse_port

    port = parse_port(args.port) if args.port is not None else None  # before anything else: starts nothing
    if port is not None and (args.backend or os.environ.get("PLAYGROUND_BACKEND", "local")) != "local":
        from playground.serving.kserve import PORT_IS_LOCAL

        raise UserError(PORT_IS_LOCAL, field="--port")
    backend = backend_from_args(args)
    args.job = resolve_job(args.job)  # models:/NAME/VERSION or NAME@VERSION: the job that made it
    if args.dry_run:
        sys.stdout.write(backend.render_serve(args.job, base=args.base).rstrip("\n") + "\n")
        return 0
    endpoint = backend.serve(args.job, base=args.base, port=port)
    if args.json:
        print_json(endpoint.to_dict())
    else:
        print(endpoint.url)
        print(endpoint.model)
    return 0


OWNER_SHOWN = 8  # characters of a visitor id shown by `playground servers`


def _owner_cell(endpoint, users: int | None) -> str:
    if endpoint.shared:
        return f"shared({users})" if users is not None else "shared"
    return endpoint.owner[:OWNER_SHOWN] if endpoint.owner else "-"


def _idle_cell(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _memory_cell(size: int | None) -> str:
    return "-" if size is None else f"{size / 1e6:,.0f} MB"


def cmd_servers(args: argparse.Namespace) -> int:
    details = backend_from_args(args).server_details()
    if args.json:
        rows = [
            {**d.endpoint.to_dict(), "idle_seconds": d.idle_seconds, "memory_bytes": d.memory_bytes, "users": d.users}
            for d in details
        ]
        print_json(rows)
        return 0
    if not details:
        print("no model servers running (start one with `playground serve JOB`)")
        return 0
    rows = [("NAME", "JOB", "OWNER", "KIND", "IDLE", "MEMORY", "URL", "MODEL")]
    for d in details:
        e = d.endpoint
        cells = (e.name or "", e.job_id or "-", _owner_cell(e, d.users), e.kind, _idle_cell(d.idle_seconds))
        rows.append((*cells, _memory_cell(d.memory_bytes), e.url, e.model))
    widths = [max(len(r[i]) for r in rows) for i in range(7)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:7], widths, strict=True)) + "  " + row[7])
    known = [d.memory_bytes for d in details if d.memory_bytes is not None]
    total = f", {_memory_cell(sum(known))} resident" if known else ""
    print(f"total: {len(details)} server{'s' if len(details) != 1 else ''}{total}")
    return 0


def _local_endpoint(target: str):
    """A local server by name or job id (fine-tuned first), for ``chat NAME``."""
    from playground.backends.local import LocalBackend
    from playground.errors import JobNotFound
    from playground.paths import playground_home
    from playground.serving.local import LocalServers

    home = playground_home()
    matches = [e for e in LocalServers(home).list() if target in (e.name, e.job_id)]
    if matches:
        return sorted(matches, key=lambda e: e.kind != "fine-tuned")[0]
    try:
        job = LocalBackend(home=home).get(target)
    except JobNotFound:
        job = None
    if job is not None:
        raise UserError(
            f"job {job.id} has no running model server; start one with `playground serve {job.id}` "
            f"(add --base for its base model), then chat again",
            field="url",
        )
    raise UserError(
        f"{shown(target)} is neither an endpoint URL (http://HOST:PORT/v1) nor a local server name or job id "
        "(see `playground servers` and `playground jobs`)",
        field="url",
    )


def cmd_chat(args: argparse.Namespace) -> int:
    from playground.serving.client import chat

    if args.max_tokens is not None and args.max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {args.max_tokens}", field="--max-tokens")
    if not 0.0 <= args.temperature <= 2.0:
        raise UserError(f"--temperature must be between 0 and 2, got {args.temperature}", field="--temperature")
    endpoint = args.url if "://" in args.url else _local_endpoint(args.url)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.prompt})
    options = {"model": args.model, "max_tokens": args.max_tokens, "temperature": args.temperature}
    if args.stream:
        for chunk in chat(endpoint, messages, stream=True, **options):
            sys.stdout.write(chunk)
            sys.stdout.flush()
        sys.stdout.write("\n")
    else:
        print(chat(endpoint, messages, **options))
    return 0


def cmd_unserve(args: argparse.Namespace) -> int:
    if args.all == bool(args.target):
        raise UserError("unserve: give a URL, server name or job id, or --all (not both)", field="target")
    backend = backend_from_args(args)
    if args.all:
        stopped_all = backend.unserve_all()
        for endpoint in stopped_all:
            print(f"stopped {endpoint.kind} server {endpoint.name or endpoint.url} ({endpoint.url})")
        if not stopped_all:
            print("no model servers running")
        return 0
    before = backend.endpoints()
    backend.unserve(args.target)
    still = {(e.name, e.url) for e in backend.endpoints()}
    stopped = [e for e in before if (e.name, e.url) not in still]
    for endpoint in stopped:
        job = f" of job {endpoint.job_id}" if endpoint.job_id else ""
        print(f"stopped {endpoint.kind} server {endpoint.name or endpoint.url}{job} ({endpoint.url})")
    if not stopped:  # stopped between the two listings, or a backend that lists nothing
        print(f"stopped the servers matching {shown(args.target)}")
    return 0
