"""Booth mode's model servers: the one SmolLM2 base server on vLLM shared by every visitor (each sees it as
theirs), one fine-tuned model per visitor (a LoRA adapter on that server: serving another unloads the previous one),
the adapter cap, idle and gone visitors' adapters unloaded by ``stop_idle``, and the operator's ``playground
servers`` / ``unserve --all``.

Visitors' LoRA jobs are random PEFT adapters of SmolLM2 (conftest's ``random_adapters``), loaded onto the run's shared
base server (``smollm2_base``, which tests/test_serving.py uses too), so nothing is trained and no vLLM server starts
here. The cap on server processes is engine-independent: it runs on the suite's default engine (``transformers
serve``) with the session's tiny full fine-tune.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from _fixtures import adapter_job

from playground.booth import BoothPolicy, touch_presence
from playground.cli import main
from playground.errors import UserError
from playground.owner import Owner
from playground.processes import process_alive
from playground.serving.client import chat
from playground.serving.local import LocalServers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first test's setup starts the vLLM base server

BOB = "bob-0123456789abcdef"
IDLE = 3000  # server_idle_seconds here: longer than the run, so only the adapters aged below count as idle


def _loaded(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(url.rstrip("/") + "/models", timeout=30).json()["data"]}


def _ask(endpoint, prompt: str = "list the pods") -> str:
    return chat(endpoint, [{"role": "user", "content": prompt}], max_tokens=8, temperature=0.0)


def _age(servers: LocalServers, server_name: str, model: str | None, seconds: float) -> None:
    """Make the last use of ``model`` (None: every model) on server ``server_name`` ``seconds`` old: its usage file,
    which the server touches at every chat request."""
    when = time.time() - seconds
    for path in (servers.dir / f"{server_name}.usage").glob("*.used"):
        if model is None or path.stem == model:
            os.utime(path, (when, when))


def test_visitors_share_the_base_server_with_one_fine_tuned_model_each(
    shared_base, random_adapters, smollm2_dir, session_home, monkeypatch, capsys
):
    policy = BoothPolicy(max_adapters=2, server_idle_seconds=IDLE)
    servers = LocalServers(session_home, policy=policy)
    alice1, alice2, bob1 = (
        adapter_job(job_id, path, smollm2_dir, owner=owner)
        for job_id, path, owner in zip(
            ("alice-1", "alice-2", "bob-1"), random_adapters, ("alice", "alice", BOB), strict=True
        )
    )
    shared_pid = next(r["pid"] for r in servers.records() if r["url"] == shared_base.url)

    # One base server for every visitor: each sees it as theirs (their job), the operator sees the one shared server.
    base_a, base_b = servers.serve(alice1, base=True), servers.serve(bob1, base=True)
    assert base_a.url == base_b.url == shared_base.url and base_a.shared and base_a.kind == "base"
    assert (base_a.job_id, base_a.owner, base_b.job_id, base_b.owner) == ("alice-1", "alice", "bob-1", BOB)
    assert [(e.job_id, e.kind, e.owner) for e in servers.endpoints(owner=Owner.visitor("alice"))] == [
        ("alice-1", "base", "alice")
    ]
    assert [(e.job_id, e.kind, e.owner) for e in servers.endpoints(owner=Owner.visitor(BOB))] == [
        ("bob-1", "base", BOB)
    ]

    # One fine-tuned model per visitor: serving another unloads the previous adapter.
    first = servers.serve(alice1)
    assert (first.url, first.model, first.owner) == (shared_base.url, "alice-1", "alice") and "alice-1" in _loaded(
        shared_base.url
    )
    second = servers.serve(alice2)
    assert "alice-2" in _loaded(shared_base.url) and "alice-1" not in _loaded(shared_base.url)
    assert [e.job_id for e in servers.endpoints(owner=Owner.visitor("alice")) if e.kind == "fine-tuned"] == ["alice-2"]
    bobs = servers.serve(bob1)
    assert {(e.job_id, e.kind) for e in servers.endpoints(owner=Owner.visitor(BOB))} == {
        ("bob-1", "base"),
        ("bob-1", "fine-tuned"),
    }

    # Concurrent visitors, one server: each gets their own model's answer.
    alone = [_ask(ep) for ep in (second, bobs, base_a)]
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(_ask, (second, bobs, base_a)))
    # Each answers in the batch exactly as alone, the base side too (vLLM 0.32's CPU LoRA path gave it the adapter
    # in the last slot, here Bob's, until playground_vllm_lora_cpu), and nothing of the batch stays on the server.
    assert len(set(alone)) == 3, alone
    assert together == alone, (together, alone)
    assert _ask(base_a) == alone[2], (together, alone)

    # A visitor never stops the shared server nor another visitor's model: naming the shared one only takes them
    # off it.
    for target in (bobs.url, "bob-1", bobs.name):
        with pytest.raises(UserError, match=r"^no local model server matches"):
            servers.unserve(target, owner=Owner.visitor("dave"))
    servers.unserve(shared_base.url, owner=Owner.visitor(BOB))
    assert servers.endpoints(owner=Owner.visitor(BOB)) == [] and "bob-1" not in _loaded(shared_base.url)
    assert process_alive(shared_pid) and "alice-2" in _loaded(shared_base.url)
    bobs = servers.serve(bob1)  # back on

    # The operator's view: the shared server with its users, its idle time and memory.
    monkeypatch.setenv("PLAYGROUND_HOME", str(session_home))
    assert main(["servers"]) == 0
    header, *rows, total = capsys.readouterr().out.splitlines()
    assert header.split()[:6] == ["NAME", "JOB", "OWNER", "KIND", "IDLE", "MEMORY"]
    (base_row,) = [row.split() for row in rows if shared_base.url in row]
    users = re.fullmatch(r"shared\((\d+)\)", base_row[2])
    assert (base_row[1], base_row[3]) == ("-", "base") and users and int(users.group(1)) >= 3, base_row
    assert 100 < float(base_row[5].replace(",", "")) < 20_000, base_row  # MB, every process of the server
    assert total.startswith("total: ") and total.endswith(" MB resident")

    # stop_idle: an adapter with no chat request for server_idle_seconds is unloaded; a used one and the base
    # server stay. A gone visitor's adapter and base-side use go too.
    name = next(r["name"] for r in servers.records() if r["url"] == shared_base.url)
    assert _ask(bobs) and _ask(base_a)
    _age(servers, name, "alice-2", IDLE + 100)
    servers.stop_idle()
    assert "alice-2" not in _loaded(shared_base.url) and "bob-1" in _loaded(shared_base.url)
    assert [e.kind for e in servers.endpoints(owner=Owner.visitor("alice"))] == ["base"] and process_alive(shared_pid)
    touch_presence(session_home, BOB, when=time.time() - policy.visitor_gone_seconds - 60)
    servers.stop_idle()
    assert "bob-1" not in _loaded(shared_base.url) and servers.endpoints(owner=Owner.visitor(BOB)) == []
    assert process_alive(shared_pid) and _ask(base_a)
    assert [e.job_id for e in servers.endpoints(owner=Owner.visitor("alice"))] == ["alice-1"]


def test_the_adapter_cap_in_a_booth_unloads_the_least_recently_used_visitor(
    shared_base, random_adapters, smollm2_dir, session_home
):
    """Two adapters at most: a third visitor's unloads the least recently used one; its visitor's next serve (the
    chat panel's, before a chat) loads it again."""
    servers = LocalServers(session_home, policy=BoothPolicy(max_adapters=2))
    jobs = [adapter_job(f"visitor-{i}-job", path, smollm2_dir, owner=f"visitor-{i}") for i, path in
            enumerate(random_adapters)]  # fmt: skip
    first, second = servers.serve(jobs[0]), servers.serve(jobs[1])
    assert _ask(first) and _ask(second)  # the second is the most recently used
    name = next(r["name"] for r in servers.records() if r["url"] == shared_base.url)
    _age(servers, name, first.model, 60)
    servers.serve(jobs[2])
    assert {"visitor-1-job", "visitor-2-job"} <= _loaded(shared_base.url) and "visitor-0-job" not in _loaded(
        shared_base.url
    )
    assert servers.endpoints(owner=Owner.visitor("visitor-0")) == []
    again = servers.serve(jobs[0])
    assert again == first and _ask(again) and "visitor-0-job" in _loaded(shared_base.url)


def test_the_server_cap_and_the_operators_unserve_all(trained_tiny_job, tmp_path, monkeypatch, capsys):
    """Full fine-tunes get servers of their own (here on ``transformers serve``): at ``max_servers`` a new one is
    refused in one line unless a visitor's server is idle long enough to make room; ``playground unserve --all``
    stops everything."""
    home = tmp_path / "home"
    policy = BoothPolicy(max_servers=1, server_evict_idle_seconds=60)
    servers = LocalServers(home, policy=policy)
    alice, carol = (
        adapter_job(f"{owner}-full", trained_tiny_job.model_dir, trained_tiny_job.base_model or "", owner=owner)
        for owner in ("alice", "carol")
    )
    try:
        alices = servers.serve(alice)
        assert chat(alices, "reverse: kube", max_tokens=12) == "ebuk"
        alice_pid = next(r["pid"] for r in servers.records())
        with pytest.raises(UserError) as refused:
            servers.serve(carol)
        assert str(refused.value) == (
            "all 1 model servers are busy; try again in a few minutes (PLAYGROUND_BOOTH_MAX_SERVERS)"
        )
        assert [r["pid"] for r in servers.records()] == [alice_pid] and servers.endpoints(
            owner=Owner.visitor("carol")
        ) == []
        _age(servers, alices.name, None, 120)
        carols = servers.serve(carol)
        carol_pid = next(r["pid"] for r in servers.records())
        assert not process_alive(alice_pid) and [e.job_id for e in servers.endpoints()] == ["carol-full"]

        monkeypatch.setenv("PLAYGROUND_HOME", str(home))
        assert main(["unserve", "--all"]) == 0
        assert capsys.readouterr().out == f"stopped fine-tuned server {carols.name} ({carols.url})\n"
        assert servers.endpoints() == []
        assert main(["unserve"]) == 2
        assert "give a URL, server name or job id, or --all" in capsys.readouterr().err
        assert not (home / "servers" / f"{alices.name}.json").exists() and not process_alive(carol_pid)
    finally:
        servers.stop_all()
