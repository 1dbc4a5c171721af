"""Booth mode's model servers, with real ``transformers serve`` processes over the shared trained tiny model:
one shared base server for every visitor (answering them in one batch), one fine-tuned server per visitor, the
machine's cap with least recently used eviction (else a one-line refusal), the idle TTL and gone visitors in the
facade's cleanup, and the operator's ``playground servers`` / ``unserve --all``.

Visitors' jobs are copies of the session's trained job (its model and state files, a new id and an owner; the
base model stays the trained job's), so nothing is trained here. Six servers start in all.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from _fixtures import tiny_held_out

from playground.backends.local import LocalBackend
from playground.booth import BoothPolicy, touch_presence
from playground.cli import main
from playground.errors import UserError
from playground.facade import Playground
from playground.processes import process_alive
from playground.serving.client import chat

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def visitor_job(trained, session_home: Path, home: Path, owner: str, suffix: str) -> str:
    """A Succeeded job of ``owner`` under ``home``: the trained job's state and model, a new id."""
    source = session_home / "jobs" / trained.id
    job_id = f"{trained.id}-{suffix}"
    target = home / "jobs" / job_id
    (target / "output").mkdir(parents=True)
    for name in ("status.json", "train.log"):
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    shutil.copytree(source / "output" / "model", target / "output" / "model")
    spec = json.loads((source / "spec.json").read_text())
    spec.update(id=job_id, owner=owner)  # base_model: still the trained job's, the same for every visitor
    (target / "spec.json").write_text(json.dumps(spec))
    return job_id


def pid_of(backend: Playground, url: str) -> int:
    return next(int(r["pid"]) for r in backend.servers.records() if r["url"] == url)


def age_last_use(home: Path, url: str, backend: Playground, seconds: float) -> None:
    """Make a server's last request ``seconds`` old: its usage file's time, which the server touches per request."""
    name = next(r["name"] for r in backend.servers.records() if r["url"] == url)
    when = time.time() - seconds
    os.utime(home / "servers" / f"{name}.used", (when, when))


def test_shared_base_one_fine_tuned_per_visitor_cap_idle_and_the_operator_cli(
    trained_tiny_job, session_home, home, capsys
):
    policy = BoothPolicy(
        max_servers=3, server_evict_idle_seconds=60, server_idle_seconds=600, finished_ttl_seconds=86400
    )
    backend = Playground(LocalBackend(home=home, policy=policy))
    alice1, alice2 = (visitor_job(trained_tiny_job, session_home, home, "alice", s) for s in ("a1", "a2"))
    bob1 = visitor_job(trained_tiny_job, session_home, home, "bob-0123456789abcdef", "b1")
    carol1 = visitor_job(trained_tiny_job, session_home, home, "carol", "c1")
    try:
        # One base server for every visitor: each sees it as theirs (their job), the operator sees one shared one.
        base_a = backend.serve(alice1, base=True, owner="alice")
        base_b = backend.serve(bob1, base=True, owner="bob-0123456789abcdef")
        assert base_a.url == base_b.url and base_a.shared and (base_a.job_id, base_b.job_id) == (alice1, bob1)
        shared_pid = pid_of(backend, base_a.url)
        assert [(e.job_id, e.kind, e.owner) for e in backend.endpoints(owner="alice")] == [(alice1, "base", "alice")]
        assert [(e.url, e.owner, e.shared) for e in backend.endpoints()] == [(base_a.url, None, True)]

        # It answers concurrent visitors in one batch (continuous batching); its sampling is shared, so it refuses
        # a request that would change it, in one line naming the field.
        (shared_record,) = [r for r in backend.servers.records() if r.get("shared")]
        assert shared_record["batch_tokens"] == policy.shared_server_batch_tokens == 4096
        assert "--batch-tokens 4096" in " ".join(psutil.Process(shared_pid).cmdline())
        for extra, field in (({"temperature": 0.7}, "temperature"), ({"stop": ["\n"]}, "stop")):
            body = {"messages": [{"role": "user", "content": "reverse: kube"}], "max_tokens": 4, **extra}
            refused_request = httpx.post(f"{base_a.url}/chat/completions", json=body, timeout=30)
            error = refused_request.json()["error"]
            assert refused_request.status_code == 400 and error["param"] == field, refused_request.text
            assert error["message"].startswith(f"{field}: this server answers concurrent requests in one batch")
        other = httpx.post(f"{base_a.url}/responses", json={"input": "reverse: kube", "temperature": 1.0}, timeout=30)
        assert other.status_code == 404 and "answers /v1/chat/completions and /v1/completions only" in other.text

        # One fine-tuned server per visitor: serving another job stops the previous one.
        first = backend.serve(alice1, owner="alice")
        first_pid = pid_of(backend, first.url)
        second = backend.serve(alice2, owner="alice")
        fine_tuned = [e.job_id for e in backend.endpoints(owner="alice") if e.kind == "fine-tuned"]
        assert not process_alive(first_pid) and fine_tuned == [alice2]

        # Batched, each visitor still gets their own answer: the trained model behind a batching server, asked 6
        # prompts at once, answers as alice's fine-tuned server (one request after another) does.
        batched = backend.servers.start(trained_tiny_job.model_dir, name="batched", batch_tokens=512)
        prompts = [sample.prompt for sample in tiny_held_out(6)]
        try:
            with ThreadPoolExecutor(len(prompts)) as pool:
                together = list(pool.map(lambda p: chat(batched, p, max_tokens=12), prompts))
            assert together == [chat(second, p, max_tokens=12) for p in prompts] and any(together), together
        finally:
            backend.servers.stop("batched")
        bobs = backend.serve(bob1, owner="bob-0123456789abcdef")  # the third server: the cap

        # At the cap with no server idle long enough: refused in one line, nothing starts.
        pids = {r["pid"] for r in backend.servers.records()}
        with pytest.raises(UserError) as refused:
            backend.serve(carol1, owner="carol")
        assert str(refused.value) == (
            "all 3 model servers are busy; try again in a few minutes (PLAYGROUND_BOOTH_MAX_SERVERS)"
        )
        assert refused.value.field == "PLAYGROUND_BOOTH_MAX_SERVERS"
        assert {r["pid"] for r in backend.servers.records()} == pids and backend.endpoints(owner="carol") == []

        # The operator's view: owner (shortened), kind, idle time, memory and the total.
        assert main(["servers"]) == 0
        header, *rows, total = capsys.readouterr().out.splitlines()
        assert header.split()[:6] == ["NAME", "JOB", "OWNER", "KIND", "IDLE", "MEMORY"]
        cells = {tuple(row.split()[1:4]) for row in rows}
        assert cells == {("-", "shared(2)", "base"), (alice2, "alice", "fine-tuned"), (bob1, "bob-0123", "fine-tuned")}
        sizes = [float(row.split()[5].replace(",", "")) for row in rows]  # MB
        assert all(50 < size < 2000 for size in sizes), rows
        assert total.startswith("total: 3 servers, ") and total.endswith(" MB resident")

        # A chat request is a use (the server touches its usage file); at the cap the least recently used
        # visitor's server idle long enough makes room for a new one.
        age_last_use(home, bobs.url, backend, 200)
        assert chat(bobs, "reverse: kube", max_tokens=4) is not None
        assert time.time() - (home / "servers" / f"{bobs.name}.used").stat().st_mtime < 30
        age_last_use(home, second.url, backend, 300)
        age_last_use(home, bobs.url, backend, 200)
        carols = backend.serve(carol1, owner="carol")
        assert not any(e.job_id == alice2 for e in backend.endpoints()) and process_alive(pid_of(backend, bobs.url))

        # A visitor never stops the shared server nor another visitor's: naming the shared one only takes them off it.
        backend.unserve(base_b.url, owner="bob-0123456789abcdef")
        assert [e.kind for e in backend.endpoints(owner="bob-0123456789abcdef")] == ["fine-tuned"]
        assert process_alive(shared_pid) and [e.job_id for e in backend.endpoints(owner="alice")] == [alice1]
        for target in (base_a.url, carol1, carols.url):
            with pytest.raises(UserError, match=r"^no local model server matches"):
                backend.unserve(target, owner="dave")
        assert process_alive(pid_of(backend, carols.url))

        # The facade's cleanup: a server idle past the TTL stops, and so does a gone visitor's (bob's presence
        # is old); the shared one, used recently, stays, and a gone visitor leaves its user list (alice's
        # presence is old too).
        age_last_use(home, carols.url, backend, 700)
        assert [d.users for d in backend.servers.details() if d.endpoint.shared] == [1]  # alice
        for visitor in ("bob-0123456789abcdef", "alice"):
            touch_presence(home, visitor, when=time.time() - policy.visitor_gone_seconds - 60)
        carol_pid, bob_pid = pid_of(backend, carols.url), pid_of(backend, bobs.url)
        backend.cleanup()
        assert [e.url for e in backend.endpoints()] == [base_a.url]
        assert not process_alive(carol_pid) and not process_alive(bob_pid) and process_alive(shared_pid)
        assert [d.users for d in backend.servers.details()] == [0]

        # The operator stops everything.
        assert main(["unserve", "--all"]) == 0
        assert capsys.readouterr().out == f"stopped base server {base_a.name} ({base_a.url})\n"
        assert backend.endpoints() == [] and not process_alive(shared_pid)
        assert main(["unserve"]) == 2
        assert "give a URL, server name or job id, or --all" in capsys.readouterr().err
    finally:
        backend.servers.stop_all()
