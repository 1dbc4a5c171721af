"""``playground ray status|stop``: the local Ray the ``ray`` backend starts for this playground home."""

from __future__ import annotations

import argparse

from playground.cli import print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ray`` to the ``playground`` CLI."""
    ray = subparsers.add_parser(
        "ray",
        help="the local Ray of the ray backend: status, stop",
        description="The ray backend starts a local Ray for this playground home on its first submit (unless "
        "RAY_ADDRESS names a cluster) and keeps it for later jobs and processes. `status` shows it and its jobs; "
        "`stop` ends it, and every job still running on it, without touching any other Ray on the machine.",
    )
    ray.add_argument("action", choices=("status", "stop"), help="status: show it; stop: stop it")
    ray.add_argument("--json", action="store_true", help="status as JSON")
    ray.set_defaults(func=cmd_ray)


def cmd_ray(args: argparse.Namespace) -> int:
    from playground.backends.ray.backend import RayBackend

    backend = RayBackend()
    if args.action == "stop":
        print("stopped the local Ray" if backend.stop_local_ray() else "no local Ray runs for this playground home")
        return 0
    if not backend.is_local:
        jobs = backend.list()
        status = {"address": backend.address, "local": False, "jobs": len(jobs)}
    else:
        local = backend.local_ray.read()
        jobs = backend.list() if local else []
        status = {"address": local.dashboard_url if local else None, "local": True, "jobs": len(jobs)}
        if local:
            status.update(cpus=local.cpus, gpus=local.gpus, started_at=local.started_at)
    status["running"] = sum(1 for job in jobs if not job.done)
    if args.json:
        print_json(status)
    elif status["address"] is None:
        print("no local Ray runs for this playground home (the ray backend starts one on its first submit)")
    else:
        where = "local Ray" if status["local"] else "Ray cluster"
        size = f", {status['cpus']:g} CPU, {status['gpus']:g} GPU" if status.get("cpus") is not None else ""
        print(f"{where} at {status['address']}{size}: {status['jobs']} job(s), {status['running']} running")
    return 0
