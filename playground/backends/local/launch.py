"""Starting a local job: its directory (a fresh job id), its state written (``spec.json`` last: until then it is
no job) and its supervisor started in a new session, holding the supervisor lock (:mod:`.state`) from before the
job exists; the supervisors this process started are reaped so that they leave no zombies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from playground.backends.common import new_job_id
from playground.backends.local import state
from playground.backends.local.queue import jobs_queue
from playground.blueprints import Blueprint
from playground.errors import UserError
from playground.events import JobPhase
from playground.processes import child_env

LAUNCHED: list[subprocess.Popen] = []  # supervisors this process started, reaped so they leave no zombies


def reap() -> None:
    """Forget (and so reap) the supervisors this process started that have exited."""
    LAUNCHED[:] = [p for p in LAUNCHED if p.poll() is None]


def new_job_dir(jobs_dir: Path, blueprint_id: str) -> Path:
    """A new, empty job directory under ``jobs_dir``, named by a fresh job id."""
    for _ in range(20):
        jobdir = jobs_dir / new_job_id(blueprint_id)
        try:
            jobdir.mkdir()
            return jobdir
        except FileExistsError:
            continue
    raise UserError(f"could not allocate a job id under {str(jobs_dir)!r}", field="state dir")  # 36**5 ids


def start(jobdir: Path, spec: dict[str, Any], blueprint: Blueprint, home: Path) -> subprocess.Popen:
    """Write the job's state (spec.json last: until then it is no job) and start its supervisor; in booth mode
    (``spec["queue_slots"]``) the job joins ``home``'s training queue first."""
    import yaml

    (jobdir / "blueprint").mkdir()
    (jobdir / "blueprint" / f"{blueprint.id}.yaml").write_text(
        yaml.safe_dump(blueprint.model_dump(mode="json"), sort_keys=False)
    )
    (jobdir / state.OUTPUT).mkdir()
    (jobdir / state.LOG).touch()
    status = {"phase": str(JobPhase.PENDING), "message": "", "created_at": spec["created_at"], "metrics": {}}
    state.write_json_atomic(jobdir / state.STATUS, status)
    reap()
    # Held from before spec.json exists; the supervisor inherits it and holds it until it exits.
    lock_fd = state.take_supervisor_lock(jobdir)
    try:
        state.write_json_atomic(jobdir / state.SPEC, spec)
        if spec.get("queue_slots"):  # in line by submit time, before its supervisor starts
            jobs_queue(home, spec["queue_slots"]).join(spec["id"], spec["created_at"])
        with open(jobdir / state.SUPERVISOR_LOG, "ab") as sup_log:
            proc = subprocess.Popen(
                [sys.executable, "-m", state.SUPERVISOR_MODULE, str(jobdir)],
                cwd=jobdir,
                env=child_env({"PYTHONPATH": spec["env"]["PYTHONPATH"]}),
                stdin=subprocess.DEVNULL,
                stdout=sup_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives the caller; not hit by the caller's Ctrl-C
                close_fds=True,
                pass_fds=(lock_fd,),
            )
    finally:
        os.close(lock_fd)  # the supervisor's copy keeps the lock
    pid_file = jobdir / state.SUPERVISOR_PID
    pid_tmp = pid_file.with_name(f".{pid_file.name}.tmp")
    pid_tmp.write_text(str(proc.pid))
    pid_tmp.replace(pid_file)
    LAUNCHED.append(proc)
    return proc
