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
import secrets
import shutil
import signal
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import playground
from playground.backends.base import Backend
from playground.backends.local import state
from playground.backends.local.gpus import detect_gpus
from playground.backends.local.queue import WaitEstimator, jobs_queue
from playground.blueprints import Blueprint, get_blueprint
from playground.blueprints.fit import local_fit
from playground.booth import BoothPolicy, QuotaExceeded, deadline_grace, job_deadline, owns
from playground.errors import JobNotFound, UserError
from playground.events import Event, JobPhase, Phase, Progress, event_from_dict, parse_line
from playground.formatting import describe_event
from playground.paths import ensure_writable_dir, playground_home
from playground.processes import child_env, process_alive
from playground.requests import check_request
from playground.stopping import STOP_FILE, STOP_FILE_ENV
from playground.types import Job, TrainRequest

_JOB_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
_FOLLOW_INTERVAL = 0.2  # seconds between looks at a followed log
CLEANUP_INTERVAL = 30.0  # booth mode: seconds between the TTL cleanups the facade runs on the side of list/submit
_LAUNCHED: list[subprocess.Popen] = []  # supervisors this process started, reaped so they leave no zombies


def _reap() -> None:
    _LAUNCHED[:] = [p for p in _LAUNCHED if p.poll() is None]


def new_job_id(blueprint_id: str) -> str:
    """``<blueprint-id>-<5 random chars>``, a valid Kubernetes name (DNS-1035 label, ≤ 63 chars)."""
    prefix = re.sub(r"[^a-z0-9-]+", "-", blueprint_id.lower()).strip("-")
    if not prefix or not prefix[0].isalpha():
        prefix = f"job-{prefix}".rstrip("-")
    prefix = prefix[:57].rstrip("-")
    suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))
    return f"{prefix}-{suffix}"


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


TRAINER_PACKAGES = ("torch", "transformers", "peft")


def _check_trainer_installed() -> None:
    """The local trainer runs in this interpreter: refuse, before anything starts, where it cannot
    (the slim ``playground e2e`` install of requirements/e2e.txt has no torch)."""
    import importlib.util

    for name in TRAINER_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UserError(
                f"the local backend trains in this Python environment, which lacks {name} (the slim e2e install?); "
                "allowed: the full install (pip install blueprint-playground) or --backend kubernetes",
                field="backend",
            )


def _is_remote(source: str) -> bool:
    return "://" in source


def _absolute(source: str | None) -> str | None:
    """Local paths made absolute (the trainer runs in the job dir); URIs unchanged."""
    if not source or _is_remote(source):
        return source
    return str(Path(source).expanduser().resolve())


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

    def _jobdir(self, job_id: str, owner: str | None = None) -> Path:
        """The job's directory; JobNotFound when unknown or (with ``owner``) someone else's, alike."""
        jobdir = self.jobs_dir / job_id
        if not _JOB_ID.match(job_id or "") or not (jobdir / state.SPEC).is_file() or not self._owned(jobdir, owner):
            known = [p.name for p in self._job_dirs() if self._owned(p, owner)][:5]
            hint = f"known: {', '.join(known)}" if known else "there are no local jobs"
            raise JobNotFound(f"unknown job {job_id!r} on the local backend; {hint}", field="job")
        return jobdir

    @staticmethod
    def _owned(jobdir: Path, owner: str | None) -> bool:
        """Whether a caller acting as ``owner`` may see the job (the operator, ``owner=None``, sees all)."""
        if owner is None:
            return True
        try:
            return owns(state.read_json(jobdir / state.SPEC).get("owner"), owner)
        except (OSError, ValueError):
            return False

    def _job_dirs(self) -> list[Path]:
        """Job directories, newest first."""
        if not self.jobs_dir.is_dir():
            return []
        dirs = [p for p in self.jobs_dir.iterdir() if (p / state.SPEC).is_file() and (p / state.STATUS).is_file()]
        return sorted(dirs, key=lambda p: (p / state.SPEC).stat().st_mtime, reverse=True)

    # -- submit -------------------------------------------------------------------------------
    def _plan(self, request: TrainRequest, *, check_gpus: bool = True) -> tuple[Blueprint, dict[str, Any], int, bool]:
        """Validate a request: (blueprint, params, trainer processes, stand-in mode). Starts nothing."""
        blueprint = get_blueprint(request.blueprint_id)
        params = blueprint.resolve_params(dict(request.params))
        _check_trainer_installed()
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
        self, job_id: str, jobdir: Path, request: TrainRequest, blueprint: Blueprint, params: dict, nproc: int
    ) -> dict[str, Any]:
        output = jobdir / state.OUTPUT
        blueprint_file = jobdir / "blueprint" / f"{blueprint.id}.yaml"
        if nproc > 1:
            head = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
            head += ["-m", state.TRAINER_MODULE]
        else:
            head = [sys.executable, "-m", state.TRAINER_MODULE]
        command = [*head, "--blueprint", str(blueprint_file), "--output", str(output)]
        for key, value in params.items():
            command += ["--set", f"{key}={_format_value(value)}"]
        model, dataset = _absolute(request.overrides.model), _absolute(request.overrides.dataset)
        if model:
            command += ["--model-source", model]
        if dataset:
            command += ["--dataset-source", dataset]
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
                **self._run_env(job_id, request.owner),
            },
            "cancel_grace_seconds": self.cancel_grace,
            "owner": request.owner,
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

    def _run_env(self, job_id: str, owner: str | None) -> dict[str, str]:
        """What the trainer's MLflow run records (playground/runs): the job, this backend, the owner, and
        this home's SQLite store unless MLFLOW_TRACKING_URI names one (inherited, never written here)."""
        from playground.runs import settings as rs

        env = {rs.JOB_ID_ENV: job_id, rs.JOB_BACKEND_ENV: self.name}
        if owner is not None:
            env[rs.JOB_OWNER_ENV] = owner
        if not os.environ.get(rs.TRACKING_ENV):
            env[rs.TRACKING_ENV] = rs.default_tracking_uri(self.home)
        return env

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

    def prepare(self, request: TrainRequest) -> Any:
        blueprint, params, nproc, _ = self._plan(request)
        ensure_writable_dir(self.jobs_dir, what="state dir")
        return blueprint, params, nproc

    def create(self, request: TrainRequest, prepared: Any) -> Job:
        blueprint, params, nproc = prepared
        jobs_dir = self.jobs_dir
        for _ in range(20):
            job_id = new_job_id(blueprint.id)
            jobdir = jobs_dir / job_id
            try:
                jobdir.mkdir()
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover - 36**5 ids
            raise UserError(f"could not allocate a job id under {str(jobs_dir)!r}", field="state dir")
        try:
            proc = self._start(jobdir, self._spec(job_id, jobdir, request, blueprint, params, nproc), blueprint)
        except OSError as exc:  # disk full, fork failure: leave no half-made job behind
            shutil.rmtree(jobdir, ignore_errors=True)
            raise UserError(f"could not start job {job_id} in {str(jobdir)!r}: {exc}", field="state dir") from None
        _LAUNCHED.append(proc)
        return self.get(job_id)

    def _start(self, jobdir: Path, spec: dict[str, Any], blueprint: Blueprint) -> subprocess.Popen:
        """Write the job's state (spec.json last: until then it is no job) and start its supervisor."""
        import yaml

        (jobdir / "blueprint").mkdir()
        (jobdir / "blueprint" / f"{blueprint.id}.yaml").write_text(
            yaml.safe_dump(blueprint.model_dump(mode="json"), sort_keys=False)
        )
        (jobdir / state.OUTPUT).mkdir()
        (jobdir / state.LOG).touch()
        status = {"phase": str(JobPhase.PENDING), "message": "", "created_at": spec["created_at"], "metrics": {}}
        state.write_json_atomic(jobdir / state.STATUS, status)
        _reap()
        # Held from before spec.json exists; the supervisor inherits it and holds it until it exits.
        lock_fd = state.take_supervisor_lock(jobdir)
        try:
            state.write_json_atomic(jobdir / state.SPEC, spec)
            if spec.get("queue_slots"):  # in line by submit time, before its supervisor starts
                jobs_queue(self.home, spec["queue_slots"]).join(spec["id"], spec["created_at"])
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
        return proc

    def render_train(self, request: TrainRequest) -> str:
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
        """``status.json``, reconciled: a non-terminal job whose supervisor is gone becomes Failed.

        The supervisor is the only writer of a live job's status; this writes only while holding the
        supervisor lock, which proves the supervisor has exited (it cannot come back).
        """
        _reap()
        status = state.read_json(jobdir / state.STATUS)
        if JobPhase(status["phase"]).terminal:
            return status
        with state.supervisor_gone(jobdir) as gone:
            if gone is False:
                return status
            if gone is None and state.supervisor_alive(jobdir):  # a job made before the lock
                return status
            status = state.read_json(jobdir / state.STATUS)  # it may have finished just now
            if JobPhase(status["phase"]).terminal:
                return status
            trainer = status.get("trainer_pid")
            if trainer and process_alive(trainer, *state.trainer_markers(jobdir)):
                state.kill_group(status.get("trainer_pgid") or trainer, signal.SIGKILL)
            tail = self._log_tail(jobdir)
            supervisor_tail = self._supervisor_log_tail(jobdir)
            tail = tail + [f"[supervisor] {line}" for line in supervisor_tail]
            if (jobdir / state.CANCEL_REQUESTED).exists():  # signalled before it could answer
                phase, message = JobPhase.CANCELLED, "cancelled by user"
            else:
                phase = JobPhase.FAILED
                message = "supervisor exited unexpectedly" + (f": {supervisor_tail[-1]}" if supervisor_tail else "")
            status.update(
                phase=str(phase), message=message, finished_at=time.time(), log_tail=tail or status.get("log_tail", [])
            )
            state.write_json_atomic(jobdir / state.STATUS, status)
        return status

    def _supervisor_log_tail(self, jobdir: Path, lines: int = 20) -> list[str]:
        """The supervisor's own output (a crash of the supervisor itself shows only here)."""
        try:
            text = (jobdir / state.SUPERVISOR_LOG).read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def _log_tail(self, jobdir: Path, lines: int = state.LOG_TAIL_LINES) -> list[str]:
        try:
            with open(jobdir / state.LOG, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 256 * 1024))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError:
            return []
        return [describe_event(parse_line(line)) for line in text.splitlines()[-lines:]]

    def _job(self, jobdir: Path) -> Job:
        spec = state.read_json(jobdir / state.SPEC)
        status = self._status(jobdir)
        phase = JobPhase(status["phase"])
        progress = None
        if status.get("progress"):
            progress = event_from_dict({"type": "progress", **status["progress"]})
            assert isinstance(progress, Progress)
        model = jobdir / state.OUTPUT / "model"
        model_dir = str(model) if phase == JobPhase.SUCCEEDED and model.is_dir() else None
        base_model = spec.get("base_model")
        if base_model and base_model.startswith(str(jobdir)) and not Path(base_model).is_dir():
            base_model = None  # scratch:// base weights are not written yet (or the job failed first)
        return Job(
            id=spec["id"],
            blueprint_id=spec["blueprint_id"],
            backend=self.name,
            phase=phase,
            params=spec["params"],
            created_at=spec["created_at"],
            started_at=status.get("started_at"),
            finished_at=status.get("finished_at"),
            message=status.get("message", ""),
            progress=progress,
            metrics=dict(status.get("metrics") or {}),
            model_dir=model_dir,
            base_model=base_model,
            log_tail=list(status.get("log_tail") or []),
            labels=dict(spec.get("labels") or {}),
            owner=spec.get("owner"),
            queue_position=status.get("queue_position") if phase == JobPhase.PENDING else None,
            estimated_wait_seconds=status.get("estimated_wait_seconds") if phase == JobPhase.PENDING else None,
            expires_at=self._expires_at(phase, status.get("finished_at")),
        )

    def _expires_at(self, phase: JobPhase, finished_at: float | None) -> float | None:
        """Booth mode: a finished job's end, the policy's ``finished_ttl_seconds`` after it ended."""
        if self.policy is None or not phase.terminal or finished_at is None:
            return None
        return float(finished_at) + self.policy.finished_ttl_seconds

    def get(self, job_id: str, *, owner: str | None = None) -> Job:
        return self._job(self._jobdir(job_id, owner))

    def _jobs(self, owner: str | None = None) -> list[Job]:
        jobs = []
        for jobdir in self._job_dirs():
            if not self._owned(jobdir, owner):
                continue
            try:
                jobs.append(self._job(jobdir))
            except (OSError, ValueError, KeyError):
                continue  # being deleted or half-created by another process
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)

    def list(self, *, owner: str | None = None) -> list[Job]:
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
    def events(self, job_id: str, follow: bool = False, *, owner: str | None = None) -> Iterator[Event]:
        jobdir = self._jobdir(job_id, owner)
        spec = state.read_json(jobdir / state.SPEC)
        yield Phase(JobPhase.PENDING, time=spec["created_at"])
        try:
            fh = open(jobdir / state.LOG, "rb")  # noqa: SIM115 - closed in finally; a generator
        except FileNotFoundError:
            return
        try:
            pending = b""
            while True:
                chunk = fh.read(1 << 16)
                if chunk:
                    lines = (pending + chunk).split(b"\n")
                    pending = lines.pop()
                    for raw in lines:
                        event = parse_line(raw.decode("utf-8", errors="replace"))
                        if isinstance(event, Phase) and event.phase.terminal:
                            continue  # the supervisor's verdict (status.json) is the terminal phase
                        yield event
                    continue
                try:
                    status = self._status(jobdir)
                except FileNotFoundError:
                    return  # deleted meanwhile
                phase = JobPhase(status["phase"])
                if phase.terminal:
                    rest = pending + fh.read()  # the log is complete before the terminal status is written
                    for raw in rest.split(b"\n"):
                        if raw.strip():
                            event = parse_line(raw.decode("utf-8", errors="replace"))
                            if not (isinstance(event, Phase) and event.phase.terminal):
                                yield event
                    yield Phase(phase, status.get("message", ""), time=status.get("finished_at") or time.time())
                    return
                if not follow:
                    return
                time.sleep(_FOLLOW_INTERVAL)
        finally:
            fh.close()

    # -- control ------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, owner: str | None = None) -> Job:
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

    def delete(self, job_id: str, *, owner: str | None = None) -> None:
        jobdir = self._jobdir(job_id, owner)
        if not JobPhase(self._status(jobdir)["phase"]).terminal:
            self.cancel(job_id)
        shutil.rmtree(jobdir, ignore_errors=True)
        if jobdir.exists():
            raise UserError(f"could not remove {str(jobdir)!r}", field="job")
