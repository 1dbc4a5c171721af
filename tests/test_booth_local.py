"""Booth mode on the local backend, with real supervisors and real ``tiny-llama-cpu`` trainers: visitors own
their jobs, quotas, two Launch clicks at once, the machine's FIFO queue with live position and estimate,
cancel while queued, the job deadline's last resort and the TTL cleanup of finished jobs and their servers.

A control hook keeps a trainer from finishing on its own: with ``PLAYGROUND_TEST_HOLD_TRAINER`` set at
submit, the job's trainer stops at start-up (``signal.pause``) until cancel or the deadline's last resort kills it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from _hooks import install_sitecustomize
from _waiting import wait_for

from playground.api import make_request
from playground.backends.local import LocalBackend
from playground.backends.local.supervisor import VISITOR_LEFT
from playground.booth import BoothPolicy, QuotaExceeded, touch_presence
from playground.cli import main
from playground.errors import JobNotFound, UserError
from playground.events import JobPhase, Phase, Queued
from playground.facade import Playground
from playground.owner import Owner
from playground.processes import process_alive

pytestmark = pytest.mark.slow

SHORT = {"max_steps": 20, "log_every": 2, "num_eval_examples": 10, "checkpoint_every": 0}
HOLD_HOOK = """
import os, signal
if os.environ.get("PLAYGROUND_TEST_HOLD_TRAINER"):
    if b"playground.train" in open("/proc/self/cmdline", "rb").read():
        signal.pause()  # a trainer that never ends on its own: cancel or the deadline's last resort stops it
"""


@pytest.fixture
def hold_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Installs the hold hook (as sitecustomize) for jobs submitted from here on; returns a submit helper."""
    install_sitecustomize(tmp_path / "hold-hook", HOLD_HOOK, monkeypatch)

    def submit_held(backend: LocalBackend, request):
        monkeypatch.setenv("PLAYGROUND_TEST_HOLD_TRAINER", "1")
        try:
            return backend.submit(request)
        finally:
            monkeypatch.delenv("PLAYGROUND_TEST_HOLD_TRAINER")

    return submit_held


def phase_of(backend: LocalBackend, job_id: str) -> JobPhase:
    return backend.get(job_id).phase


def follow_to_end(backend: LocalBackend, job_id: str) -> list:
    return list(backend.events(job_id, follow=True))


def test_owners_quotas_queue_and_ttl(home: Path, hold_hook):
    policy = BoothPolicy(max_concurrent_trainings=1, max_jobs_per_owner_per_hour=6, finished_ttl_seconds=600)
    backend = Playground(LocalBackend(home=home, policy=policy, cancel_grace=2))  # jobs with their servers

    # An operator's job first (no owner, no quota): the history the wait estimates learn the pace from.
    history = backend.submit(make_request("tiny-llama-cpu", SHORT))
    assert history.owner is None and follow_to_end(backend, history.id)[-1].phase == JobPhase.SUCCEEDED

    alice = hold_hook(backend, make_request("tiny-llama-cpu", {**SHORT, "max_steps": 400}, owner="alice"))
    wait_for(lambda: phase_of(backend, alice.id) == JobPhase.INITIALIZING, 60, "alice's job to take the slot")
    bob = backend.submit(make_request("tiny-llama-cpu", SHORT, owner="bob"))
    carol = backend.submit(make_request("tiny-llama-cpu", SHORT, owner="carol"))

    # The queue: bob next, with an estimate from the running job and the blueprint's past pace; carol after him.
    queued_bob = wait_for(lambda: (j := backend.get(bob.id)).estimated_wait_seconds is not None and j, 60, "estimate")
    assert queued_bob.phase == JobPhase.PENDING and queued_bob.queue_position == 1
    assert queued_bob.message == "waiting for a training slot: position 1"
    queued_carol = wait_for(lambda: (j := backend.get(carol.id)).queue_position == 2 and j, 60, "carol at 2")
    assert queued_carol.estimated_wait_seconds > queued_bob.estimated_wait_seconds  # bob's typical run on top
    cancelled = backend.cancel(carol.id, owner="carol")  # cancel a queued job: it leaves the line
    assert cancelled.phase == JobPhase.CANCELLED and cancelled.message == "cancelled while queued"
    assert backend.get(bob.id).queue_position == 1 and backend.get(alice.id).queue_position is None

    # Visitors own their jobs: someone else's job is reported exactly like an unknown one.
    assert [j.id for j in backend.list(owner="bob")] == [bob.id]
    assert {history.id, alice.id, bob.id, carol.id} <= {j.id for j in backend.list()}  # the operator's view
    for call in (
        lambda: backend.get(alice.id, owner="bob"),
        lambda: list(backend.events(alice.id, owner="bob")),
        lambda: backend.cancel(alice.id, owner="bob"),
        lambda: backend.delete(alice.id, owner="bob"),
        lambda: backend.serve(history.id, base=True, owner="bob"),
    ):
        with pytest.raises(JobNotFound, match=r"^unknown job '[a-z0-9-]+' on the local backend; known: ") as info:
            call()
        assert str(info.value).split("known: ")[1] == bob.id  # the hint names bob's jobs only
    assert phase_of(backend, alice.id) == JobPhase.INITIALIZING  # untouched

    # Quotas: one unfinished job per visitor (queued counts), and two clicks at the same moment make one job.
    for owner in ("alice", "bob"):
        with pytest.raises(QuotaExceeded, match=r"^you already have a job running; wait for it to finish or cancel"):
            backend.submit(make_request("tiny-llama-cpu", SHORT, owner=owner))
    outcomes: list = []
    barrier = threading.Barrier(2)

    def click() -> None:
        barrier.wait()
        try:
            outcomes.append(LocalBackend(home=home, policy=policy).submit(make_request("tiny-llama-cpu", owner="dave")))
        except QuotaExceeded as exc:
            outcomes.append(exc)

    clicks = [threading.Thread(target=click) for _ in range(2)]
    for t in clicks:
        t.start()
    for t in clicks:
        t.join()
    jobs = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(jobs) == 1 and len(outcomes) == 2 and len(backend.list(owner="dave")) == 1, outcomes
    wait_for(lambda: backend.get(jobs[0].id).queue_position == 2, 60, "dave's job behind bob")
    backend.cancel(jobs[0].id, owner="dave")

    # The job ahead ends: bob's job leaves the queue and trains.
    assert backend.cancel(alice.id, owner="alice").phase == JobPhase.CANCELLED
    events = follow_to_end(backend, bob.id)
    queued = [e for e in events if isinstance(e, Queued)]
    assert queued[0].position == 1 and queued[-1] == Queued(0, 0.0, time=queued[-1].time), queued
    phases = [e.phase for e in events if isinstance(e, Phase)]
    assert phases[0] == JobPhase.PENDING and phases[-1] == JobPhase.SUCCEEDED, (phases, backend.get(bob.id).message)
    first_start = next(i for i, e in enumerate(events) if isinstance(e, Phase) and e.phase != JobPhase.PENDING)
    assert events.index(queued[-1]) < first_start
    done = backend.get(bob.id)
    assert done.queue_position is None and done.estimated_wait_seconds is None

    # The hourly cap counts what was submitted, also jobs deleted since.
    backend.delete(carol.id, owner="carol")
    capped = LocalBackend(home=home, policy=BoothPolicy(max_jobs_per_owner_per_hour=1))
    with pytest.raises(QuotaExceeded, match=r"^hourly limit of 1 jobs reached; try again in (59|60) minutes$"):
        capped.submit(make_request("tiny-llama-cpu", owner="carol"))
    assert backend.list(owner="carol") == []

    # Servers belong to the job's owner (the base model's is shared, shown to each visitor using it); the TTL removes
    # finished jobs and their servers, and the shared server once idle for its own TTL.
    endpoint = backend.serve(bob.id, base=True, owner="bob")
    assert endpoint.owner == "bob" and [e.url for e in backend.endpoints(owner="bob")] == [endpoint.url]
    assert endpoint.shared and backend.endpoints(owner="alice") == []
    with pytest.raises(UserError, match="no local model server matches"):
        backend.unserve(bob.id, owner="alice")
    pid = next(r["pid"] for r in backend.servers.records() if r["url"] == endpoint.url)
    assert backend.get(bob.id, owner="bob").expires_at == done.finished_at + 600  # the policy's TTL, on the job
    assert bob.id not in backend.cleanup(now=done.finished_at + 599)
    assert bob.id in backend.cleanup(now=done.finished_at + 601)
    assert backend.endpoints(owner="bob") == []
    backend.servers.stop_idle(now=time.time() + policy.server_idle_seconds)
    assert backend.endpoints() == [] and not process_alive(pid)
    with pytest.raises(JobNotFound):
        backend.get(bob.id)


def test_a_trainer_deaf_to_its_deadline_is_killed_after_the_grace_and_the_operator_cli(
    home: Path, hold_hook, capsys, monkeypatch
):
    # The held trainer never reaches a step boundary, so it never sees the stop request: the last resort, a kill
    # after the grace, and Failed (a trainer that stops saves and succeeds: tests/test_deadline.py).
    policy = BoothPolicy(job_deadline_seconds=2, deadline_grace_seconds=2)
    backend = LocalBackend(home=home, policy=policy, cancel_grace=2)
    job = hold_hook(backend, make_request("tiny-llama-cpu", SHORT, owner="erin"))
    last = follow_to_end(backend, job.id)[-1]
    job = backend.get(job.id)
    assert job.phase == JobPhase.FAILED and job.message == (
        "deadline exceeded: the trainer did not stop, evaluate and save within 2 s of the 2 s deadline"
    )
    assert last == Phase(JobPhase.FAILED, job.message, time=job.finished_at)
    assert any("deadline of 2 s reached: asking the trainer to stop training" in line for line in job.log_tail)
    assert any("did not finish within 2 s of the deadline: stopping it" in line for line in job.log_tail)

    # The operator's CLI: every job with its owner, one visitor's, and the TTL cleanup.
    operator = LocalBackend(home=home)  # booth mode off: no deadline for the operator's own job
    other = operator.submit(make_request("tiny-llama-cpu", SHORT))
    follow_to_end(operator, other.id)
    assert main(["jobs"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["ID", "BLUEPRINT", "OWNER", "PHASE"]
    assert {tuple(r.split()[:4]) for r in rows} == {
        (job.id, "tiny-llama-cpu", "erin", "Failed"),
        (other.id, "tiny-llama-cpu", "-", "Succeeded"),
    }
    assert main(["jobs", "--owner", "erin", "--json"]) == 0
    assert [j["id"] for j in json.loads(capsys.readouterr().out)] == [job.id]
    assert main(["jobs", "--owner", "zed"]) == 0 and capsys.readouterr().out == "no jobs of 'zed'\n"
    monkeypatch.setenv("PLAYGROUND_BOOTH", "maybe")
    assert main(["jobs"]) == 2
    assert capsys.readouterr().err == (
        "playground: error: PLAYGROUND_BOOTH: 'maybe' is not a boolean; allowed: 1, true, yes, on, 0, false, no, off\n"
    )
    monkeypatch.setenv("PLAYGROUND_BOOTH", "1")
    monkeypatch.setenv("PLAYGROUND_BOOTH_FINISHED_TTL_SECONDS", "0")
    assert main(["jobs", "--cleanup"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("removed 2 finished job(s) past their TTL: ") and {job.id, other.id} <= set(
        out.splitlines()[0].split(": ")[1].split(", ")
    )
    assert "no jobs yet" in out and not any((home / "jobs").iterdir())


def test_the_queue_is_bounded_and_a_gone_visitors_queued_job_leaves_it(home: Path, hold_hook):
    policy = BoothPolicy(max_concurrent_trainings=1, max_queued=2, visitor_gone_seconds=300)
    backend = LocalBackend(home=home, policy=policy, cancel_grace=2)
    running = hold_hook(backend, make_request("tiny-llama-cpu", SHORT, owner="xena"))  # a present visitor's job
    wait_for(lambda: phase_of(backend, running.id) == JobPhase.INITIALIZING, 60, "xena's job to take the slot")
    vic = backend.submit(make_request("tiny-llama-cpu", SHORT, owner="vic"))
    operators = backend.submit(make_request("tiny-llama-cpu", SHORT))  # no owner: never dropped, never capped
    wait_for(lambda: backend.get(operators.id).queue_position == 2, 60, "the operator's job behind vic's")

    # The queue is full: a visitor's submit is refused in one line and creates nothing.
    before = sorted(p.name for p in (home / "jobs").iterdir())
    with pytest.raises(QuotaExceeded) as refused:
        backend.submit(make_request("tiny-llama-cpu", SHORT, owner="wes"))
    assert str(refused.value) == "the training queue is full (2 jobs waiting, the limit); try again in a few minutes"
    assert refused.value.field == "quota"
    assert (
        sorted(p.name for p in (home / "jobs").iterdir()) == before and backend.list(owner=Owner.visitor("wes")) == []
    )

    # Vic's kernel stopped showing presence 6 minutes ago: his queued job leaves the line, Cancelled, never started.
    touch_presence(home, "vic", when=time.time() - 360)
    gone = wait_for(lambda: (j := backend.get(vic.id)).done and j, 30, "vic's job to leave the queue")
    assert gone.phase == JobPhase.CANCELLED and gone.message == VISITOR_LEFT and gone.started_at is None
    assert follow_to_end(backend, vic.id)[-1].phase == JobPhase.CANCELLED
    wait_for(lambda: backend.get(operators.id).queue_position == 1, 30, "the operator's job to move up")
    assert phase_of(backend, running.id) == JobPhase.INITIALIZING  # the present visitor's job still runs
    for job in (operators, running):
        backend.cancel(job.id)
