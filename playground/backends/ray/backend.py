"""The ``ray`` backend: blueprint jobs as Ray jobs running the project's trainer under Ray Train.

``submit`` checks the request as the local backend does, then submits ``python -m playground.train.on_ray``
through Ray's Job API (:mod:`.cluster`: ``RAY_ADDRESS``, or a local Ray started for the playground). The Ray
job's ``submission_id`` is the playground job id and its metadata carries the rest (blueprint, parameters,
owner, output), so Ray is the one record: any process that reaches the cluster lists, follows, cancels and
deletes the same jobs (a reloaded notebook reattaches). Events come from the job's log (the driver's output,
which Ray Train fills with the workers'): :mod:`.logs` turns its lines into the trainer's events and
:mod:`.jobinfo` into the job's phase: Ray's PENDING (with Ray's message) and a driver waiting for the workers'
resources are Pending; RUNNING is the trainer's own phase (Initializing → Training → Saving); SUCCEEDED, FAILED
(with the reason and the last log lines) and STOPPED (Cancelled) end it. Submitting: :mod:`.submission`.

Output: ``<storage>/<job id>/output`` (``model/``, ``checkpoints/``, ``metrics.json``), where ``storage`` is
``PLAYGROUND_RAY_STORAGE`` (a path every Ray node sees) or, for the local Ray, ``<home>/ray/jobs``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playground.backends.base import Backend
from playground.backends.common import absolute_source, check_trainer_installed, cpu_cores, new_job_id
from playground.backends.ray import cluster as rc
from playground.backends.ray.jobinfo import LogSummary, ended, log_events, phase_of, status_of
from playground.backends.ray.logs import split_lines
from playground.backends.ray.submission import AGENT_NOT_READY, AGENT_WAIT, job_env, submit_when_agent_ready
from playground.blueprints import Blueprint
from playground.booth import BoothPolicy
from playground.errors import BackendError, JobNotFound, UserError, shown
from playground.events import Event, JobPhase, Phase
from playground.owner import OPERATOR, Owner
from playground.paths import ensure_writable_dir, playground_home
from playground.run_request import REQUEST_ENV
from playground.types import Job, RunRequest

DRIVER_MODULE = "playground.train.on_ray"
STORAGE_ENV = "PLAYGROUND_RAY_STORAGE"
WORKERS_ENV = "PLAYGROUND_RAY_WORKERS"
CPUS_PER_WORKER_ENV = "PLAYGROUND_RAY_CPUS_PER_WORKER"
MAX_FAILURES_ENV = "PLAYGROUND_RAY_MAX_FAILURES"
MARK = "playground"  # metadata key marking the playground's Ray jobs
FOLLOW_INTERVAL = 0.5  # seconds between looks at a followed job


def _env_number(name: str, kind: type, low: float, high: float) -> Any:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise UserError(f"{name} {shown(value)}: allowed: {low:g} to {high:g}", field=name)
    return number


class RayBackend(Backend):
    """Blueprint jobs on a Ray cluster through Ray's Job API, trained by Ray Train's ``TorchTrainer``."""

    name = "ray"

    def __init__(
        self,
        home: Path | str | None = None,
        *,
        address: str | None = None,
        workers: int | None = None,
        cpus_per_worker: float | None = None,
        max_failures: int | None = None,
        storage: str | None = None,
        cancel_grace: float = 20.0,
        agent_wait: float = AGENT_WAIT,
        policy: BoothPolicy | None = None,
    ) -> None:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise UserError(
                "the ray backend needs Ray, which is not installed; allowed: pip install 'blueprint-playground[ray]'",
                field="backend",
            )
        self.home = (Path(home) if home is not None else playground_home()).expanduser().resolve()
        self.address = address or rc.remote_address()  # None: the local Ray (started on first submit)
        self.workers = workers if workers is not None else _env_number(WORKERS_ENV, int, 1, 512)
        self.cpus_per_worker = (
            cpus_per_worker if cpus_per_worker is not None else _env_number(CPUS_PER_WORKER_ENV, float, 0.01, 1024)
        )
        self.max_failures = max_failures if max_failures is not None else _env_number(MAX_FAILURES_ENV, int, 0, 100)
        self.storage = Path(storage or os.environ.get(STORAGE_ENV) or self.home / "ray" / "jobs").expanduser()
        self.cancel_grace = cancel_grace
        self.agent_wait = agent_wait  # seconds a submission waits for the head's job agent (AGENT_WAIT says why)
        self.policy = policy if policy is not None else BoothPolicy.from_settings()
        self.local_ray = rc.LocalRayHome(self.home)
        self._client: Any = None
        self._finished: dict[str, Job] = {}  # terminal jobs never change: read their log once

    # -- the cluster ----------------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return self.address is None

    def client(self, *, start: bool = False) -> Any:
        """Ray's ``JobSubmissionClient`` for the cluster (``start``: the local Ray is started if need be)."""
        if self._client is not None:
            return self._client
        from ray.job_submission import JobSubmissionClient

        if self.is_local:
            local = self.local_ray.ensure() if start else self.local_ray.read()
            if local is None:
                return None  # no local Ray runs: there are no jobs to see
            url = local.dashboard_url
        else:
            url = self.address
        try:
            self._client = JobSubmissionClient(url)
        except Exception as exc:  # ConnectionError, RuntimeError: Ray's own words
            raise BackendError(f"cannot reach the Ray cluster at {url}: {type(exc).__name__}: {exc}") from None
        return self._client

    def stop_local_ray(self) -> bool:
        """Stop the local Ray this home started (its jobs end with it); whether one ran."""
        self._client = None
        return self.local_ray.stop()

    def cluster_resources(self) -> dict[str, float] | None:
        """The local Ray's CPUs and GPUs (running, or as it would start); None for a remote cluster."""
        if not self.is_local:
            return None
        local = self.local_ray.read()
        return local.resources() if local else {"CPU": rc.local_cpus(), "GPU": rc.local_gpus()}

    # -- submit ---------------------------------------------------------------------------------------
    def scaling(self, blueprint: Blueprint) -> tuple[int, float, float]:
        """(workers, CPUs per worker, GPUs per worker): the options, else the blueprint's resources (GPU: one
        worker per GPU; CPU: one worker with the blueprint's CPUs)."""
        res = blueprint.resources
        gpus_per_worker = 1.0 if res.needs_gpu else 0.0
        workers = self.workers or (res.nodes * res.gpus_per_node if res.needs_gpu else res.nodes)
        if self.cpus_per_worker is not None:
            cpus = self.cpus_per_worker
        else:
            total = cpu_cores(res.cpu) or float(workers)
            cpus = max(1.0, total / workers) if res.needs_gpu else max(1.0, float(int(total / workers)) or 1.0)
            available = self.cluster_resources()
            if available and not res.needs_gpu:  # a small laptop: what the local Ray has, split over the workers
                cpus = min(cpus, max(1.0, float(int(available["CPU"] / workers))))
        return workers, cpus, gpus_per_worker

    def _plan(self, request: RunRequest) -> tuple[Blueprint, dict[str, Any], tuple[int, float, float]]:
        blueprint, params = request.blueprint, request.params.as_dict()  # validated when the request was made
        if self.is_local:
            check_trainer_installed()
        source = request.overrides.model or blueprint.model.source
        if source.startswith("pkg://") and self.is_local:  # converted before anything starts, as locally
            from playground.models.packaged import check

            check(source)
        workers, cpus, gpus = self.scaling(blueprint)
        available = self.cluster_resources()
        if available is not None:
            need = {"CPU": workers * cpus, "GPU": workers * gpus}
            short = [key for key in ("GPU", "CPU") if need[key] > available[key]]
            if short:
                key = short[0]
                hint = "a GPU machine or RAY_ADDRESS of a cluster with GPUs" if key == "GPU" else "fewer --workers"
                raise UserError(
                    f"blueprint {blueprint.id!r} on {workers} Ray worker(s) needs {need[key]:g} {key}; the local Ray "
                    f"has {available[key]:g}; allowed: {hint}",
                    field="workers" if key == "CPU" else "backend",
                )
        return blueprint, params, (workers, cpus, gpus)

    def prepare(self, request: RunRequest) -> Any:
        plan = self._plan(request)
        if self.is_local:
            ensure_writable_dir(self.storage, what="Ray job storage", hint=f"choose another with {STORAGE_ENV}")
        return plan

    def entrypoint(self, job_id: str, scaling: tuple[int, float, float]) -> list[str]:
        """The Ray job's command: the driver, its scaling, then the trainer's own arguments (its run request is in
        the job's environment: :meth:`trainer_request`)."""
        workers, cpus, gpus = scaling
        output = self.storage / job_id / "output"
        command = ["python", "-m", DRIVER_MODULE, f"--workers={workers}", f"--cpus-per-worker={cpus:g}"]
        command += [f"--gpus-per-worker={gpus:g}"]
        if self.max_failures:
            command.append(f"--max-failures={self.max_failures}")
        command += ["--", "--output", str(output)]
        return command

    def trainer_request(self, request: RunRequest, blueprint: Blueprint) -> RunRequest:
        """The run request as the trainer reads it: the blueprint by catalog id (else its YAML), the sources as
        absolute paths."""
        from playground.cluster.manifests import trainer_blueprint_yaml

        overrides = {
            "model": absolute_source(request.overrides.model),
            "dataset": absolute_source(request.overrides.dataset),
        }
        return request.for_trainer(
            blueprint_id=blueprint.id,
            blueprint_yaml=trainer_blueprint_yaml(blueprint, None),
            overrides=overrides,
        )

    def _runtime_env(self, job_id: str, owner: Owner, run_request: RunRequest | None = None) -> dict[str, Any]:
        env = job_env(job_id, self.name, owner, self.home if self.is_local else None)
        if run_request is not None:
            env[REQUEST_ENV] = run_request.to_json()
        return {"env_vars": env}

    def _metadata(self, job_id: str, request: RunRequest, blueprint: Blueprint, params: dict, scaling: tuple) -> dict:
        output = self.storage / job_id / "output"
        model = request.overrides.model
        if blueprint.model.source.startswith("scratch://") and not model:
            base_model = str(output / "base-model")
        else:
            base_model = absolute_source(model) or blueprint.model.source
        labels = dict(request.labels)
        run = os.environ.get("PLAYGROUND_E2E_RUN")  # set by `playground e2e` per notebook: its cleanup finds the jobs
        if run:
            from playground.cluster.manifests import LABEL_E2E_RUN, LABEL_PREFIX, label_value

            labels.setdefault(LABEL_E2E_RUN.removeprefix(LABEL_PREFIX), label_value(run))
        data = {
            MARK: "1",
            "blueprint_id": blueprint.id,
            "params": json.dumps(params),
            "labels": json.dumps(labels),
            "created_at": repr(time.time()),
            "output": str(output),
            "base_model": base_model,
            "scaling": json.dumps(list(scaling)),
        }
        if request.owner_id is not None:
            data["owner"] = request.owner_id
        return data

    def create(self, request: RunRequest, prepared: Any) -> Job:
        import shlex

        blueprint, params, scaling = prepared
        client = self.client(start=True)
        job_id = new_job_id(blueprint.id)
        if self.is_local:
            (self.storage / job_id / "output").mkdir(parents=True, exist_ok=True)
        command = self.entrypoint(job_id, scaling)
        job = {
            "entrypoint": shlex.join(command),
            "submission_id": job_id,
            "runtime_env": self._runtime_env(job_id, request.owner, self.trainer_request(request, blueprint)),
            "metadata": self._metadata(job_id, request, blueprint, params, scaling),
        }
        try:
            submit_when_agent_ready(client, job, wait=self.agent_wait)
        except Exception as exc:
            shutil.rmtree(self.storage / job_id, ignore_errors=True)
            if self.is_local and self.local_ray.read() is None:  # it died under the submission: say Ray's reason
                self._client = None  # the next submission starts a new one
                why = self.local_ray.exit_reason() or "it was stopped"
                raise BackendError(
                    f"the local Ray stopped while job {job_id} was submitted: {why}; the next submission starts it "
                    f"again (Ray's log: {self.local_ray.dir / 'ray-start.log'})"
                ) from None
            waited = (
                f" (its job agent did not come up within {self.agent_wait:g}s)" if AGENT_NOT_READY in str(exc) else ""
            )
            raise BackendError(f"Ray refused job {job_id}{waited}: {type(exc).__name__}: {exc}") from None
        return self.get(job_id)

    def render_train(self, request: RunRequest) -> str:
        """The Ray job ``submit`` would create (entrypoint, metadata; no runtime env), as YAML."""
        import shlex

        import yaml

        from playground.requests import check_request

        check_request(request)
        blueprint, params, scaling = self._plan(request)
        job_id = new_job_id(blueprint.id)
        job = {
            "submission_id": job_id,
            "entrypoint": shlex.join(self.entrypoint(job_id, scaling)),
            "run_request": json.loads(self.trainer_request(request, blueprint).to_json()),  # in its env_vars
            "metadata": self._metadata(job_id, request, blueprint, params, scaling),
            "address": self.address or "the local Ray (started on submit)",
        }
        job["metadata"].pop("created_at")
        return yaml.safe_dump(job, sort_keys=False)

    # -- state ----------------------------------------------------------------------------------------
    def _info(self, job_id: str, owner: Owner) -> Any:
        """Ray's JobDetails of a playground job; JobNotFound when unknown or not ``owner``'s to see."""
        client = self.client()
        info = None
        if client is not None:
            try:
                info = client.get_job_info(job_id)
            except RuntimeError:  # Ray: "Request failed with status code 404"
                info = None
            except Exception as exc:
                raise BackendError(f"cannot read Ray job {job_id!r}: {type(exc).__name__}: {exc}") from None
        metadata = (info.metadata or {}) if info is not None else {}
        if info is None or metadata.get(MARK) != "1" or not owner.sees(metadata.get("owner")):
            known = [job.id for job in self.list(owner=owner)][:5]
            hint = f"known: {', '.join(known)}" if known else "there are no Ray jobs"
            raise JobNotFound(f"unknown job {job_id!r} on the ray backend; {hint}", field="job")
        return info

    def _log(self, job_id: str) -> str:
        try:
            return self.client().get_job_logs(job_id)
        except Exception:  # a job whose driver has not started has no log yet
            return ""

    def _job(self, info: Any, log: str | None = None) -> Job:
        job_id = info.submission_id
        if job_id in self._finished:
            return self._finished[job_id]
        metadata = info.metadata or {}
        summary = LogSummary.read(self._log(job_id) if log is None else log)
        phase, message = phase_of(info, summary)
        output = Path(metadata.get("output", ""))
        model = output / "model"
        model_dir = str(model) if phase == JobPhase.SUCCEEDED and (not self.is_local or model.is_dir()) else None
        base_model = metadata.get("base_model") or None
        if base_model and base_model.startswith(str(output)) and self.is_local and not Path(base_model).is_dir():
            base_model = None  # scratch weights not written yet
        finished_at = info.end_time / 1000 if info.end_time else None
        job = Job(
            id=job_id,
            blueprint_id=metadata.get("blueprint_id", ""),
            backend=self.name,
            phase=phase,
            params=json.loads(metadata.get("params") or "{}"),
            created_at=float(metadata.get("created_at") or (info.start_time or 0) / 1000),
            started_at=info.start_time / 1000 if info.start_time else None,
            finished_at=finished_at if phase.terminal else None,
            message=message,
            progress=summary.progress,
            metrics=summary.metrics,
            model_dir=model_dir,
            base_model=base_model,
            log_tail=summary.tail if phase.terminal else [],
            labels=json.loads(metadata.get("labels") or "{}"),
            owner=metadata.get("owner"),
            expires_at=self._expires_at(phase, finished_at),
        )
        if phase.terminal:
            self._finished[job_id] = job
        return job

    def _expires_at(self, phase: JobPhase, finished_at: float | None) -> float | None:
        if self.policy is None or not phase.terminal or finished_at is None:
            return None
        return finished_at + self.policy.finished_ttl_seconds

    def get(self, job_id: str, *, owner: Owner = OPERATOR) -> Job:
        if job_id in self._finished and owner.sees(self._finished[job_id].owner):
            return self._finished[job_id]
        return self._job(self._info(job_id, owner))

    def list(self, *, owner: Owner = OPERATOR) -> list[Job]:
        client = self.client()
        if client is None:
            return []
        try:
            infos = client.list_jobs()
        except Exception as exc:
            raise BackendError(f"cannot list the Ray cluster's jobs: {type(exc).__name__}: {exc}") from None
        jobs = []
        for info in infos:
            metadata = info.metadata or {}
            if metadata.get(MARK) == "1" and info.submission_id and owner.sees(metadata.get("owner")):
                jobs.append(self._job(info))
        return sorted(jobs, key=lambda job: job.created_at, reverse=True)

    # -- events ---------------------------------------------------------------------------------------
    def events(self, job_id: str, follow: bool = False, *, owner: Owner = OPERATOR) -> Iterator[Event]:
        info = self._info(job_id, owner)
        metadata = info.metadata or {}
        yield Phase(JobPhase.PENDING, info.message or "", time=float(metadata.get("created_at") or time.time()))
        sent, said_pending = 0, bool(info.message)
        while True:
            text = self._log(job_id)
            lines, _ = split_lines(text[sent:])
            sent += sum(len(line) + 1 for line in lines)
            yield from log_events(lines)
            info = self._info(job_id, owner)
            if ended(info):
                rest = self._log(job_id)[sent:]
                yield from log_events(line for line in rest.split("\n") if line.strip())
                job = self._job(info)
                yield Phase(job.phase, job.message, time=job.finished_at or time.time())
                return
            if status_of(info) == "PENDING" and info.message and not said_pending:
                yield Phase(JobPhase.PENDING, info.message)
                said_pending = True
            if not follow:
                return
            time.sleep(FOLLOW_INTERVAL)

    # -- control --------------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, owner: Owner = OPERATOR) -> Job:
        info = self._info(job_id, owner)
        if ended(info):
            return self._job(info)
        try:
            self.client().stop_job(job_id)
        except Exception as exc:
            raise BackendError(f"Ray could not stop job {job_id}: {type(exc).__name__}: {exc}") from None
        deadline = time.monotonic() + self.cancel_grace
        while time.monotonic() < deadline:
            info = self._info(job_id, owner)
            if ended(info):
                break
            time.sleep(0.3)
        return self._job(info)

    def delete(self, job_id: str, *, owner: Owner = OPERATOR) -> None:
        info = self._info(job_id, owner)
        if not ended(info):
            info = self._info(self.cancel(job_id, owner=owner).id, owner)
        output = Path((info.metadata or {}).get("output", ""))
        try:
            self.client().delete_job(job_id)
        except Exception as exc:
            raise BackendError(f"Ray could not delete job {job_id}: {type(exc).__name__}: {exc}") from None
        self._finished.pop(job_id, None)
        if self.is_local and output.name == "output" and output.parent.parent == self.storage:
            shutil.rmtree(output.parent, ignore_errors=True)
