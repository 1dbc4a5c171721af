"""The local backend: each job is a detached supervisor process plus a state directory.

``submit`` validates everything it can (blueprint, parameters, sources, GPUs, a writable state
dir), writes ``spec.json``/``status.json`` and starts ``python -m playground.backends.local.supervisor
JOBDIR`` in a new session, so the job outlives the caller (a notebook kernel, a CLI call). Any
later process reads the same directory: ``list``/``get`` read ``status.json``, ``events`` replays
``train.log`` and then tails it. A job whose supervisor died while it was running is marked
``Failed`` by whoever notices (reconcile). Whether the supervisor lives is told by its lock
(``supervisor.lock``, see :mod:`.state`), held from before the job exists until the supervisor
exits, never by its command line: ``/proc/PID/cmdline`` reads empty while the new process is still
inside ``exec``, after ``Popen`` has returned.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import playground
from playground.backends.base import Backend
from playground.backends.common import absolute_source, check_trainer_installed, new_job_id, run_env
from playground.backends.gpus import detect_gpus
from playground.backends.local import launch, records, state
from playground.backends.local.queue import WaitEstimator, jobs_queue
from playground.blueprints import Blueprint
from playground.blueprints.fit import local_fit
from playground.booth import BoothPolicy, QuotaExceeded, deadline_grace, job_deadline
from playground.errors import JobNotFound, UserError
from playground.events import Event, JobPhase, Phase
from playground.owner import OPERATOR, Owner
from playground.paths import ensure_writable_dir, playground_home
from playground.requests import check_request
from playground.run_request import REQUEST_ENV
from playground.stopping import STOP_FILE, STOP_FILE_ENV
from playground.types import Job, RunRequest

_JOB_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
CLEANUP_INTERVAL = 30.0  # booth mode: seconds between the TTL cleanups the facade runs on the side of list/submit


class LocalBackend(Backend):
    """Jobs as detached processes on this machine, state under ``home/jobs/`` (``$PLAYGROUND_HOME``)."""

    name = "local"

    def __init__(
        self, home: Path | str | None = None, *, cancel_grace: float = 10.0, policy: BoothPolicy | None = None
    ) -> None:
        # Absolute and symlink-free: the job dir is in the supervisor's command line and its cwd.
        self.home = (Path(home) if home is not None else playground_home()).expanduser().resolve()
        self.cancel_grace = cancel_grace
        # Booth mode (given, or PLAYGROUND_BOOTH=1): quotas per owner, a FIFO queue of bounded
        # concurrent trainings, a deadline per job and a TTL for finished ones.
        self.policy = policy if policy is not None else BoothPolicy.from_settings()

    # -- paths --------------------------------------------------------------------------------
    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    def _jobdir(self, job_id: str, owner: Owner = OPERATOR) -> Path:
        """The job's directory; JobNotFound when unknown or (with ``owner``) someone else's, alike."""
        jobdir = self.jobs_dir / job_id
        if not _JOB_ID.match(job_id or "") or not (jobdir / state.SPEC).is_file() or not self._owned(jobdir, owner):
            known = [p.name for p in self._job_dirs() if self._owned(p, owner)][:5]
            hint = f"known: {', '.join(known)}" if known else "there are no local jobs"
            raise JobNotFound(f"unknown job {job_id!r} on the local backend; {hint}", field="job")
        return jobdir

    @staticmethod
    def _owned(jobdir: Path, owner: Owner) -> bool:
        """Whether a caller acting as ``owner`` may see the job (the operator sees all)."""
        if owner.is_operator:
            return True
        try:
            return owner.sees(state.read_json(jobdir / state.SPEC).get("owner"))
        except (OSError, ValueError):
            return False

    def _job_dirs(self) -> list[Path]:
        """Job directories, newest first."""
        if not self.jobs_dir.is_dir():
            return []
        dirs = [p for p in self.jobs_dir.iterdir() if (p / state.SPEC).is_file() and (p / state.STATUS).is_file()]
        return sorted(dirs, key=lambda p: (p / state.SPEC).stat().st_mtime, reverse=True)

    # -- submit -------------------------------------------------------------------------------
    def _plan(self, request: RunRequest, *, check_gpus: bool = True) -> tuple[Blueprint, dict[str, Any], int, bool]:
        """Plan a request (validated when it was made): (blueprint, its params for the job's record, trainer
        processes, stand-in mode). Starts nothing."""
        blueprint = request.blueprint
        params = request.params.as_dict()
        check_trainer_installed()
        model = request.overrides.model
        source = model or blueprint.model.source
        if source.startswith("pkg://"):  # installed, intact, convertible, cache writable: before anything starts
            from playground.models.packaged import check

            check(source)
        have = detect_gpus() if check_gpus else blueprint.resources.gpus_per_node
        fit = local_fit(blueprint, have, model_source=model)
        fit.check()
        return blueprint, params, fit.processes, fit.stand_in

    def _spec(
        self, job_id: str, jobdir: Path, request: RunRequest, blueprint: Blueprint, params: dict, nproc: int
    ) -> dict[str, Any]:
        output = jobdir / state.OUTPUT
        blueprint_file = jobdir / "blueprint" / f"{blueprint.id}.yaml"
        if nproc > 1:
            head = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
            head += ["-m", state.TRAINER_MODULE]
        else:
            head = [sys.executable, "-m", state.TRAINER_MODULE]
        command = [*head, "--output", str(output)]  # the run request: REQUEST_ENV (one JSON document)
        model, dataset = absolute_source(request.overrides.model), absolute_source(request.overrides.dataset)
        trainer_request = request.for_trainer(
            blueprint_id=str(blueprint_file), overrides={"model": model, "dataset": dataset}
        )
        if blueprint.model.source.startswith("scratch://") and not model:
            base_model = str(output / "base-model")
        else:
            base_model = model or blueprint.model.source
        package_root = str(Path(playground.__file__).resolve().parents[1])
        pythonpath = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
        return {
            "id": job_id,
            "backend": self.name,
            "blueprint_id": blueprint.id,
            "blueprint_file": str(blueprint_file),
            "params": params,
            "overrides": {"model": model, "dataset": dataset},
            "labels": dict(request.labels),
            "created_at": time.time(),
            "processes": nproc,
            "base_model": base_model,
            "quality": blueprint.quality.model_dump(),
            "command": command,
            "env": {
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": pythonpath,
                STOP_FILE_ENV: str(jobdir / STOP_FILE),  # the supervisor's stop request (a deadline) goes here
                REQUEST_ENV: trainer_request.to_json(),
                **self._run_env(job_id, request.owner),
            },
            "cancel_grace_seconds": self.cancel_grace,
            "owner": request.owner_id,
            # booth mode: wait for one of this many training slots; stop training after this long (then evaluate and
            # save), kill a trainer still running this much later
            "queue_slots": self.policy.max_concurrent_trainings if self.policy else None,
            **self._deadline(blueprint, params, model, dataset),
            # a queued job of a visitor gone this long leaves the queue (their kernel stopped showing presence)
            "visitor_gone_seconds": self.policy.visitor_gone_seconds if self.policy else None,
        }

    def _deadline(
        self, blueprint: Blueprint, params: dict, model: str | None, dataset: str | None
    ) -> dict[str, float | int | None]:
        """Booth mode: the job's deadline from its plan for this machine (:func:`playground.booth.job_deadline`:
        the plan's time × slack, capped by the policy) and the grace after it for the evaluation and save
        (:func:`playground.booth.deadline_grace`, from this blueprint's last measured finish)."""
        if self.policy is None:
            return {"deadline_seconds": None, "deadline_grace_seconds": None, "planned_seconds": None}
        from playground.blueprints.plan import make_plan, measured_runs

        try:
            planned: float | None = make_plan(
                blueprint, params, model_source=model, dataset_source=dataset, backend=self.name, home=self.home
            ).seconds
        except Exception:  # an estimate that cannot be made leaves the policy's cap; it never refuses a job
            planned = None
        try:
            runs = measured_runs(self.home)  # newest first
            finish = next((r.finish_seconds for r in runs if r.blueprint_id == blueprint.id and r.finish_seconds), None)
        except Exception:
            finish = None
        return {
            "deadline_seconds": job_deadline(planned, self.policy.job_deadline_seconds),
            "deadline_grace_seconds": deadline_grace(finish, self.policy.deadline_grace_seconds),
            "planned_seconds": planned,
        }

    def _run_env(self, job_id: str, owner: Owner) -> dict[str, str]:
        """What the trainer's MLflow run records (playground/runs): the job, this backend, the owner, and
        this home's SQLite store unless MLFLOW_TRACKING_URI names one (inherited, never written here)."""
        return run_env(job_id, self.name, owner, self.home)

    @property
    def quota_home(self) -> Path:
        return self.home

    def check_capacity(self) -> None:
        """Booth mode: a visitor's submit is refused while ``max_queued`` jobs wait for a training slot."""
        if self.policy is None:
            return
        queue = jobs_queue(self.home, self.policy.max_concurrent_trainings)
        waiting = [entry.job for entry in queue.waiting()]
        cap = self.policy.max_queued
        if len(waiting) < cap:
            return
        try:  # when the last job in line would start: about when one place is free
            wait = WaitEstimator(self.jobs_dir, queue.slots).estimate(queue.running(), waiting)
        except (OSError, ValueError, KeyError, TypeError):
            wait = None
        if wait is None:
            when = "a few minutes"
        else:
            minutes = max(1, math.ceil(wait / 60))
            when = f"about {minutes} minute{'s' if minutes != 1 else ''}"
        raise QuotaExceeded(
            f"the training queue is full ({len(waiting)} jobs waiting, the limit); try again in {when}",
            retry_after_seconds=wait,
        )

    def prepare(self, request: RunRequest) -> Any:
        blueprint, params, nproc, _ = self._plan(request)
        ensure_writable_dir(self.jobs_dir, what="state dir")
        return blueprint, params, nproc

    def create(self, request: RunRequest, prepared: Any) -> Job:
        blueprint, params, nproc = prepared
        jobdir = launch.new_job_dir(self.jobs_dir, blueprint.id)
        job_id = jobdir.name
        try:
            launch.start(jobdir, self._spec(job_id, jobdir, request, blueprint, params, nproc), blueprint, self.home)
        except OSError as exc:  # disk full, fork failure: leave no half-made job behind
            shutil.rmtree(jobdir, ignore_errors=True)
            raise UserError(f"could not start job {job_id} in {str(jobdir)!r}: {exc}", field="state dir") from None
        return self.get(job_id)

    def render_train(self, request: RunRequest) -> str:
        """What ``submit`` would run for ``request``, as YAML (the local backend has no manifest)."""
        import yaml

        check_request(request)  # submit checks it in Backend.submit; a dry run does not go through there
        blueprint, params, nproc, _ = self._plan(request, check_gpus=False)
        jobdir = self.jobs_dir / new_job_id(blueprint.id)
        spec = self._spec(jobdir.name, jobdir, request, blueprint, params, nproc)
        spec.pop("created_at")
        return yaml.safe_dump(spec, sort_keys=False)

    # -- state --------------------------------------------------------------------------------
    def _status(self, jobdir: Path) -> dict[str, Any]:
        """``status.json``, reconciled with the job's supervisor (:func:`.records.reconciled_status`)."""
        launch.reap()
        return records.reconciled_status(jobdir)

    def _job(self, jobdir: Path) -> Job:
        ttl = self.policy.finished_ttl_seconds if self.policy is not None else None
        return records.to_job(jobdir, self._status(jobdir), backend=self.name, ttl_seconds=ttl)

    def get(self, job_id: str, *, owner: Owner = OPERATOR) -> Job:
        return self._job(self._jobdir(job_id, owner))

    def _jobs(self, owner: Owner = OPERATOR) -> list[Job]:
        jobs = []
        for jobdir in self._job_dirs():
            if not self._owned(jobdir, owner):
                continue
            try:
                jobs.append(self._job(jobdir))
            except (OSError, ValueError, KeyError):
                continue  # being deleted or half-created by another process
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)

    def list(self, *, owner: Owner = OPERATOR) -> list[Job]:
        return self._jobs(owner)

    # -- TTL ------------------------------------------------------------------------------------
    def expired(self, *, now: float | None = None) -> list[str]:
        """Finished jobs whose end is older than the TTL: the policy's ``finished_ttl_seconds`` (else
        ``PLAYGROUND_BOOTH_FINISHED_TTL_SECONDS`` or its default), so the operator's ``playground jobs --cleanup``
        works on any machine."""
        ttl = (self.policy or BoothPolicy.from_env()).finished_ttl_seconds
        now = time.time() if now is None else now
        found = []
        for jobdir in self._job_dirs():
            try:
                status = state.read_json(jobdir / state.STATUS)
                if JobPhase(status["phase"]).terminal and now >= float(status["finished_at"]) + ttl:
                    found.append(jobdir.name)
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return found

    @property
    def cleanup_interval(self) -> float | None:
        """Booth mode: the facade's TTL cleanup on the side of list/submit, at most every 30 s; else on request."""
        return CLEANUP_INTERVAL if self.policy is not None else None

    def job_dir(self, job_id: str) -> Path:
        """The job's state directory (``spec.json``, ``status.json``, ``train.log``, ``output/``)."""
        return self._jobdir(job_id)

    # -- events -------------------------------------------------------------------------------
    def events(self, job_id: str, follow: bool = False, *, owner: Owner = OPERATOR) -> Iterator[Event]:
        jobdir = self._jobdir(job_id, owner)
        spec = state.read_json(jobdir / state.SPEC)
        yield Phase(JobPhase.PENDING, time=spec["created_at"])
        yield from records.log_events(jobdir, lambda: self._status(jobdir), follow)

    # -- control ------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, owner: Owner = OPERATOR) -> Job:
        jobdir = self._jobdir(job_id, owner)
        status = self._status(jobdir)
        if JobPhase(status["phase"]).terminal:
            return self._job(jobdir)
        (jobdir / state.CANCEL_REQUESTED).touch()  # seen by a supervisor too young to have its handler

        def finished() -> bool:
            return JobPhase(self._status(jobdir)["phase"]).terminal

        # The pid file is written just after the supervisor starts (maybe by another process).
        state.wait_until(lambda: state.read_supervisor_pid(jobdir) or finished(), timeout=10)
        pid = state.read_supervisor_pid(jobdir)
        if pid and state.supervisor_alive(jobdir):
            os.kill(pid, signal.SIGTERM)
            state.wait_until(finished, timeout=self.cancel_grace + 15, interval=0.1)
        if not finished():  # the supervisor did not answer: stop it, then do its job
            if pid and state.supervisor_alive(jobdir):
                os.kill(pid, signal.SIGKILL)
            state.kill_group(state.read_json(jobdir / state.STATUS).get("trainer_pgid"), signal.SIGKILL)
            state.wait_until(finished, timeout=10)  # reconciled (to Cancelled) once the supervisor is gone
        # Let the supervisor finish its last write before anyone removes the directory.
        state.wait_until(lambda: not state.supervisor_alive(jobdir), timeout=10)
        return self._job(jobdir)

    def delete(self, job_id: str, *, owner: Owner = OPERATOR) -> None:
        jobdir = self._jobdir(job_id, owner)
        if not JobPhase(self._status(jobdir)["phase"]).terminal:
            self.cancel(job_id)
        shutil.rmtree(jobdir, ignore_errors=True)
        if jobdir.exists():
            raise UserError(f"could not remove {str(jobdir)!r}", field="job")
