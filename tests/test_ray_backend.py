"""The ``ray`` backend on a real local Ray (the session's: 4 logical CPUs): the trainer under Ray Train with
2 workers against one process on the same global batch, a job waiting for resources (Pending, with Ray's
reason) and cancelled, a killed worker (Failed, with its last log lines), reattaching from new backend
instances, and the CLI. Ray's fixed default ports are held all along, as another Ray on the machine holds them.

One sequence on one Ray (the session's), so the runs need no second start-up (~15 s each):
a long run holds all CPUs → a second job waits (Pending) → it is cancelled → a worker of the long run is
killed → the comparison run trains on the freed CPUs. Tolerance as tests/test_train_distributed.py (``REL``):
Ray Train's 2 workers are the same DDP over gloo as torchrun's 2 processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from _train_helpers import TrainRun, describe, processes_mentioning, run_trainer
from _waiting import wait_for

from playground.api import make_request
from playground.backends.ray.backend import RayBackend
from playground.backends.ray.cluster import PORT_CANDIDATES, RAY_WORKER_PORTS, ephemeral_ports
from playground.cli import main as cli_main
from playground.errors import BackendError
from playground.events import Event, JobPhase, Log, Phase, Progress
from playground.facade import Playground
from playground.owner import Owner
from playground.types import Job

pytestmark = pytest.mark.slow
STEPS = 8
PARAMS = {"max_steps": STEPS, "log_every": 1, "batch_size": 8, "checkpoint_every": 4, "num_eval_examples": 10}
# runs until its workers are killed; a checkpoint every 10 steps to resume from once
EVERY = 10
LONG = {"max_steps": 5000, "log_every": EVERY, "checkpoint_every": EVERY, "num_eval_examples": 10}
REL = 1e-5  # tests/test_train_distributed.py: the same global batch on 2 ranks vs 1, within the warm-up


RAY_CPUS = 4


RAYS_DEFAULT_PORTS = (52365, 10001)  # the job agent's, the client server's
STOPPED_ON_PURPOSE = "ray-stopped-by-a-test"  # in the module's home: its Ray was stopped by the last test


def _hold_rays_default_ports(stack: contextlib.ExitStack) -> None:
    """Listen on Ray's fixed default ports, as another Ray on this machine would (a port already taken is held
    by someone else already): a local Ray on them never registers its job agent ("No available agent")."""
    import socket

    for port in RAYS_DEFAULT_PORTS:
        sock = stack.enter_context(socket.socket())
        with contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            sock.listen()


@pytest.fixture(scope="module")
def ray_home(tmp_path_factory: pytest.TempPathFactory):
    """A playground home whose local Ray is started once for this module and stopped at its end (its idle
    daemons cost ~10 % of a core: not for the rest of the suite). It has 4 logical CPUs whatever the machine has
    (Ray only counts them): the jobs of 2 workers × 2 CPUs hold all of them."""
    from playground.backends.ray.backend import RayBackend

    home = tmp_path_factory.mktemp("ray-home")
    backend = RayBackend(home)
    saved = os.environ.get("PLAYGROUND_RAY_CPUS")
    os.environ["PLAYGROUND_RAY_CPUS"] = str(RAY_CPUS)
    with contextlib.ExitStack() as held:
        _hold_rays_default_ports(held)  # as another Ray on the machine holds them, for the module's whole life
        try:
            started = backend.local_ray.ensure()
        finally:
            if saved is None:
                os.environ.pop("PLAYGROUND_RAY_CPUS")
            else:
                os.environ["PLAYGROUND_RAY_CPUS"] = saved
        yield home
    stopped_on_purpose = (home / STOPPED_ON_PURPOSE).exists()  # the module's last test stops it under a submission
    assert backend.stop_local_ray() or stopped_on_purpose, "the local Ray died during the session"
    left = processes_mentioning(str(started.temp_dir))
    assert left == [], f"processes of the stopped local Ray are left: {left}"


@dataclass
class RaySequence:
    home: Path
    reference: TrainRun  # one process, no Ray
    compared: Job  # 2 Ray Train workers, the reference's settings
    compared_events: list[Event]  # followed from a backend instance that did not submit it
    waiting: Job  # the second job while the first held the CPUs
    cancelled: Job
    resumed_from: int  # the checkpoint Ray Train's restarted worker group resumed from after the first kill
    resumed_steps: list[int]  # the progress points after that resume
    killed: Job  # the long run after a worker was SIGKILLed a second time (its one restart used)
    killed_progress_seen: int
    listed: list[str]


def _ray_workers() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if cmdline.startswith("ray::RayTrainWorker"):
            found.append(proc)
    return found


def _first_progress(backend: RayBackend, job_id: str, after: int = 0) -> int:
    for event in backend.events(job_id, follow=True):
        if isinstance(event, Progress) and event.step > after:
            return event.step
    raise AssertionError(f"{job_id} ended before any progress: {backend.get(job_id).message}")


def _kill_a_worker() -> None:
    workers = wait_for(lambda: _ray_workers(), timeout=60, what="the long run's Ray Train workers")
    workers[-1].send_signal(signal.SIGKILL)


def _resumed(backend: RayBackend, job_id: str) -> tuple[int, list[int]]:
    """Follow the restarted run to its resume line and 2 progress points after it."""
    resumed_from, steps = -1, []
    for event in backend.events(job_id, follow=True):
        if isinstance(event, Log) and "resume: continuing from checkpoints/step-" in event.line:
            resumed_from, steps = int(event.line.split("(step ")[1].rstrip(")")), []
        elif isinstance(event, Progress) and resumed_from >= 0:
            steps.append(event.step)
            if len(steps) == 2:
                break
    return resumed_from, steps


@pytest.fixture(scope="module")
def sequence(ray_home: Path, tmp_path_factory: pytest.TempPathFactory) -> RaySequence:
    root = tmp_path_factory.mktemp("ray-reference")
    args = [arg for key, value in PARAMS.items() for arg in ("--set", f"{key}={value}")]
    backend = RayBackend(ray_home, workers=2, cpus_per_worker=2)  # all 4 CPUs of the session's Ray
    restarting = RayBackend(ray_home, workers=2, cpus_per_worker=2, max_failures=1)
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(run_trainer, "--blueprint", "tiny-llama-cpu", *args, "--output", str(root / "single"))
        long_job = restarting.submit(make_request("tiny-llama-cpu", LONG))
        wait_for(  # its workers hold all 4 CPUs: a job submitted now must wait (its driver starts meanwhile)
            lambda: _ray_workers(), timeout=120, what="the long run's Ray Train workers", interval=0.5
        )
        second = backend.submit(make_request("tiny-llama-cpu", PARAMS))
        _first_progress(backend, long_job.id, after=EVERY)  # the step-EVERY checkpoint is written
        waiting = wait_for(
            lambda: (
                (job := backend.get(second.id)).phase == JobPhase.PENDING
                and "waiting for resources" in job.message
                and job
            ),
            timeout=120,
            what="the second job to wait for the CPUs the first holds",
            interval=0.5,
        )
        cancelled = backend.cancel(second.id)
        _kill_a_worker()  # Ray Train restarts the worker group once, the trainer resumes from its checkpoint
        resumed_from, resumed_steps = _resumed(backend, long_job.id)
        seen = resumed_steps[-1]
        _kill_a_worker()  # no restart left: Failed
        killed = wait_for(
            lambda: (job := RayBackend(ray_home).get(long_job.id)).done and job, timeout=120, what="the killed run"
        )
        compared = backend.submit(make_request("tiny-llama-cpu", PARAMS))
        events = list(RayBackend(ray_home).events(compared.id, follow=True))  # reattached: another instance
        reference_run = reference.result()
    assert reference_run.returncode == 0, describe(reference_run)
    listed = [job.id for job in RayBackend(ray_home).list()]
    compared_job = RayBackend(ray_home).get(compared.id)
    return RaySequence(
        ray_home, reference_run, compared_job, events, waiting, cancelled, resumed_from, resumed_steps, killed, seen,
        listed,
    )  # fmt: skip


def test_ray_jobs_sleep_in_openmp_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray Train's workers load torch before the trainer runs: the job's environment asks OpenMP to sleep in its
    waits (spinning threads starve each other on a shared CPU); an operator's own setting is kept."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)  # as in a notebook's kernel, which never loads the trainer
    backend = RayBackend(tmp_path, address="http://127.0.0.1:1")
    assert backend._runtime_env("job-1", Owner.operator())["env_vars"]["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert backend._runtime_env("job-1", Owner.operator())["env_vars"]["OMP_WAIT_POLICY"] == "ACTIVE"


def test_two_ray_train_workers_match_one_process(sequence: RaySequence) -> None:
    job, events = sequence.compared, sequence.compared_events
    assert job.phase == JobPhase.SUCCEEDED, f"{job.message}\n" + "\n".join(job.log_tail)
    phases = [str(e.phase) for e in events if isinstance(e, Phase)]
    assert phases[0] == "Pending" and phases[-1] == "Succeeded"
    trainer_phases = ("Initializing", "Training", "Evaluating", "Saving")
    assert list(dict.fromkeys(p for p in phases if p in trainer_phases)) == list(trainer_phases)
    logs = "\n".join(e.line for e in events if isinstance(e, Log))
    assert "2 process(es) × 1 threads, DDP" in logs and "global batch 8 = 2 process(es)" in logs
    assert "(RayTrainWorker" not in logs and "\x1b[" not in logs  # Ray's decorations are gone
    losses = {e.step: e.loss for e in events if isinstance(e, Progress)}
    reference = {p.step: p.loss for p in sequence.reference.progress}
    assert list(losses) == list(range(1, STEPS + 1))
    assert losses == pytest.approx(reference, rel=REL)
    assert job.metrics["eval_loss"] == pytest.approx(sequence.reference.metrics["eval_loss"], rel=REL)
    output = Path(job.model_dir).parent
    metrics = json.loads((output / "metrics.json").read_text())
    assert (metrics["world_size"], metrics["strategy"], metrics["global_batch_size"]) == (2, "ddp", 8)
    assert (output / "model" / "config.json").is_file() and list((output / "checkpoints").glob("step-*"))
    assert job.base_model and Path(job.base_model).is_dir()  # scratch weights for the side-by-side chat


def test_a_job_waits_for_resources_with_rays_reason_and_is_cancelled(sequence: RaySequence) -> None:
    waiting = sequence.waiting
    assert waiting.phase == JobPhase.PENDING
    assert "2 worker(s) need CPU 4; free now CPU 0" in waiting.message
    assert "NO_RESOURCES" in waiting.message or "INFEASIBLE" in waiting.message  # Ray's own scheduling state
    assert sequence.cancelled.phase == JobPhase.CANCELLED and sequence.cancelled.message == "cancelled by user"
    assert sequence.cancelled.progress is None  # it never trained


def test_a_restarted_worker_group_resumes_from_the_checkpoint(sequence: RaySequence) -> None:
    """With PLAYGROUND_RAY_MAX_FAILURES=1 (``max_failures``), Ray Train restarts the group after a killed worker
    and the trainer continues from its latest checkpoint: the step count goes on from there."""
    assert sequence.resumed_from >= EVERY and sequence.resumed_from % EVERY == 0
    assert sequence.resumed_steps == [sequence.resumed_from + EVERY, sequence.resumed_from + 2 * EVERY]


def test_a_killed_worker_ends_the_job_failed_with_its_last_lines(sequence: RaySequence) -> None:
    job = sequence.killed
    assert sequence.killed_progress_seen >= 3 * EVERY
    assert job.phase == JobPhase.FAILED, job.phase
    assert "died" in job.message or "exited" in job.message, job.message
    assert job.progress is not None and job.progress.step >= sequence.killed_progress_seen
    assert job.log_tail and any("step" in line for line in job.log_tail), job.log_tail
    assert job.model_dir is None


def test_jobs_are_listed_and_followed_from_any_process(sequence: RaySequence) -> None:
    assert {sequence.compared.id, sequence.cancelled.id, sequence.killed.id} <= set(sequence.listed)
    assert sequence.listed == sorted(  # newest first
        sequence.listed, key=lambda i: RayBackend(sequence.home).get(i).created_at, reverse=True
    )
    replay = list(RayBackend(sequence.home).events(sequence.compared.id))  # no follow: the history, then the end
    assert [e.step for e in replay if isinstance(e, Progress)] == list(range(1, STEPS + 1))
    assert isinstance(replay[-1], Phase) and replay[-1].phase == JobPhase.SUCCEEDED


def test_someone_elses_job_is_unknown_and_delete_removes_it(sequence: RaySequence) -> None:
    from playground.errors import JobNotFound

    backend = RayBackend(sequence.home)
    with pytest.raises(JobNotFound, match="unknown job"):
        backend.get(sequence.cancelled.id, owner=Owner.visitor("visitor-b"))
    output = sequence.home / "ray" / "jobs" / sequence.cancelled.id
    assert output.is_dir()
    Playground(backend).delete(sequence.cancelled.id)
    assert not output.exists()
    with pytest.raises(JobNotFound):
        RayBackend(sequence.home).get(sequence.cancelled.id)


def test_cli_trains_on_ray_with_workers_and_refuses_bad_values(
    sequence: RaySequence, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAYGROUND_HOME", str(sequence.home))
    code = cli_main(["train", "tiny-llama-cpu", "--backend", "ray", "--workers", "5", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 2 and "needs 5 CPU; the local Ray has 4" in err and "--workers" in err, err
    code = cli_main(
        ["train", "tiny-llama-cpu", "--backend", "ray", "--workers", "2", "--set", "max_steps=3", "--dry-run"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "python -m playground.train.on_ray --workers=2 --cpus-per-worker=1" in out and "max_steps: 3" in out
    code = cli_main(["train", "tiny-llama-cpu", "--backend", "ray", "--workers", "0"])
    _, err = capsys.readouterr()
    assert code == 2 and "--workers" in err and "allowed" in err
    code = cli_main(["train", "tiny-llama-cpu", "--workers", "2"])  # a Ray option on the local backend
    _, err = capsys.readouterr()
    assert code == 2 and "--workers only applies to --backend ray" in err


def test_the_local_ray_is_found_again_and_stops_cleanly(
    tmp_path: Path, sequence: RaySequence, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's Ray is reused by every backend instance (one cluster.json) and shown by `playground ray
    status`; stopping one that never started says so; a stale record (a dead pid) counts as no Ray."""
    running = RayBackend(sequence.home).local_ray.read()
    assert running is not None and running.cpus == 4
    # this machine only: every socket of the local Ray's processes listens on and talks to loopback, never the
    # machine's own network address (Ray's default for a head node)
    import ipaddress

    import psutil

    head = psutil.Process(running.pid)
    sockets = list(head.connections("inet"))  # psutil 6: net_connections
    for child in head.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker of an ended job may exit meanwhile
            sockets += child.connections("inet")
    addresses = {c.laddr.ip for c in sockets if c.status == psutil.CONN_LISTEN}
    addresses |= {c.raddr.ip for c in sockets if c.raddr}
    parsed = [ipaddress.ip_address(a) for a in addresses]
    plain = [getattr(a, "ipv4_mapped", None) or a for a in parsed]  # ::ffff:127.0.0.1 is 127.0.0.1
    assert plain and all(a.is_loopback for a in plain), addresses
    assert RayBackend(sequence.home).local_ray.read() == running
    monkeypatch.setenv("PLAYGROUND_HOME", str(sequence.home))
    assert cli_main(["ray", "status"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"local Ray at {running.dashboard_url}, 4 CPU, 0 GPU: {len(RayBackend(sequence.home).list())} job(s), 0 running"
    )
    monkeypatch.setenv("PLAYGROUND_HOME", str(tmp_path))
    assert cli_main(["ray", "stop"]) == 0
    assert capsys.readouterr().out.startswith("no local Ray runs")
    idle = RayBackend(tmp_path)
    assert idle.list() == [] and idle.stop_local_ray() is False
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "cluster.json").write_text(json.dumps({**running.__dict__, "pid": 2**22 + os.getpid()}))
    assert idle.local_ray.read() is None
    started = time.monotonic()
    assert idle.list() == [] and time.monotonic() - started < 5  # no Ray is started to list nothing


E2E_NOTEBOOK_BODY = """
import json, os, pathlib
from playground.api import make_request
from playground.facade import connect
playground = connect(backend)
job = playground.submit(make_request("tiny-llama-cpu", {"max_steps": 4, "log_every": 2, "num_eval_examples": 10}))
points = sum(1 for event in playground.events(job.id, follow=True) if type(event).__name__ == "Progress")
job = playground.get(job.id)
from playground.serving.client import chat
endpoint = playground.serve(job.id)  # served out of the Ray job's model directory
try:
    answer = chat(endpoint, [{"role": "user", "content": "list pods"}], max_tokens=8, temperature=0.0)
finally:
    playground.unserve(job.id)
result = {"passed": job.phase == "Succeeded", "backend": playground.name, "job": job.to_dict(), "points": points,
          "endpoint": {"kind": endpoint.kind, "model": endpoint.model}, "answer": answer,
          "endpoints_left": len(playground.endpoints())}
pathlib.Path(out_dir, "result.json").write_text(json.dumps(result, default=str))
"""


def test_e2e_runs_a_notebook_on_the_ray_backend(tmp_path: Path, sequence: RaySequence) -> None:
    """`playground e2e --backend ray` hands the notebook its backend (here on the session's Ray, RAY_ADDRESS);
    the job it trained is found and labelled with the notebook's run, its output under the notebook's home, and
    its model is served out of that Ray job and answers."""
    import subprocess
    import sys

    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    params = new_code_cell('backend = "local"\nheadless = False\nout_dir = "."', metadata={"tags": ["parameters"]})
    notebook = tmp_path / "ray-toy.ipynb"
    kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [params, new_code_cell(E2E_NOTEBOOK_BODY)]
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": kernelspec}), notebook)
    ray = RayBackend(sequence.home).local_ray.read()
    assert ray is not None
    env = {**os.environ, "RAY_ADDRESS": ray.dashboard_url, "PLAYGROUND_RAY_WORKERS": "1"}
    command = [sys.executable, "-m", "playground.cli", "e2e", "--backend", "ray"]
    command += ["--out", str(tmp_path / "out"), str(notebook)]
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=repo)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "ray-toy" / "result.json").read_text())
    job = result["job"]
    assert result["passed"] and result["backend"] == job["backend"] == "ray" and result["points"] == 2, result
    assert job["labels"].get("e2e-run", "").startswith("playground-e2e-"), job["labels"]  # what its cleanup finds
    assert "/playground-home/ray/jobs/" in job["model_dir"]  # the notebook's private home
    assert result["endpoint"] == {"kind": "fine-tuned", "model": job["model_dir"]}  # served out of the Ray job
    # it answered (a failed request raises in the notebook; 4 steps may well answer with an end-of-text at once)
    assert isinstance(result["answer"], str) and result["endpoints_left"] == 0, result


def test_the_local_rays_ports_are_its_own(ray_home: Path) -> None:
    """The module's Ray started while Ray's fixed default ports were held (``ray_home``), as another Ray on the
    machine holds them, and takes jobs: its job agent and client server listen on ports of their own (on the
    defaults its agent never registered, and every submission got "No available agent")."""
    from ray.job_submission import JobStatus

    from playground.backends.ray.backend import submit_when_agent_ready

    backend = RayBackend(ray_home)
    started = backend.local_ray.read()
    assert started is not None
    command = " ".join(psutil.Process(started.pid).cmdline())
    flags = ("port", "dashboard-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
             "ray-client-server-port", "runtime-env-agent-port", "metrics-export-port")  # fmt: skip
    ports = {flag: int(command.split(f" --{flag}=")[1].split()[0]) for flag in flags}
    assert not set(ports.values()) & set(RAYS_DEFAULT_PORTS), ports
    # none from the ephemeral range, where a connection's local port could take it before Ray binds it
    ephemeral = ephemeral_ports()
    room = ephemeral.start - RAY_WORKER_PORTS.stop >= PORT_CANDIDATES * len(ports)  # listen_ports' own rule
    assert all(port < ephemeral.start for port in ports.values()) or not room, (ports, ephemeral)
    client = backend.client(start=False)
    job_id = submit_when_agent_ready(client, {"entrypoint": "python -c 'print(6 * 7)'"})
    status = wait_for(
        lambda: (s := client.get_job_status(job_id)).is_terminal() and s, timeout=120, what="the job to end"
    )
    assert status == JobStatus.SUCCEEDED and "42" in client.get_job_logs(job_id)
    client.delete_job(job_id)


def test_a_local_ray_that_stops_under_a_submission_says_why(ray_home: Path) -> None:
    """The module's last test (it stops the module's Ray). A local Ray whose client server exits stops every
    process it started (CI's "RemoteDisconnected", 2ee9830): a submission that meets it names the process that
    exited, from Ray's own log, and leaves no job behind; nothing of that Ray is left running."""
    backend = RayBackend(ray_home)
    backend.client(start=True)  # a client of the running Ray, as a backend that submitted before holds one
    running = backend.local_ray.read()
    assert running is not None
    client_servers = []
    for proc in psutil.Process(running.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # one that just ended (a zombie) has no command line
            if "ray.util.client.server" in " ".join(proc.cmdline()):
                client_servers.append(proc)
    assert len(client_servers) == 1, client_servers
    (ray_home / STOPPED_ON_PURPOSE).touch()
    client_servers[0].send_signal(signal.SIGKILL)
    wait_for(lambda: backend.local_ray.read() is None, timeout=90, what="the local Ray to stop by itself")

    def stored_jobs() -> list[str]:
        return sorted(path.name for path in backend.storage.iterdir()) if backend.storage.is_dir() else []

    jobs_before = stored_jobs()
    with pytest.raises(BackendError) as refused:
        backend.submit(make_request("tiny-llama-cpu", PARAMS))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("the local Ray stopped while job tiny-llama-cpu-"), message
    assert "ray_client_server" in message and "the next submission starts it again" in message, message
    assert str(backend.local_ray.dir / "ray-start.log") in message
    assert stored_jobs() == jobs_before  # the refused job's directory is gone
    wait_for(lambda: not processes_mentioning(str(running.temp_dir)), timeout=60, what="the stopped Ray's processes")
