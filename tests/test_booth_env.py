"""Nothing to steal (issue 20, item 2): a booth job's supervisor and trainer, and a model server, start with an
allow-listed environment. Read from ``/proc/<pid>/environ`` of the real processes, as an attacker on the
machine would: no cookie-signing secret, no visitor cookie, no unrelated credential; what they need is there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _hooks import install_sitecustomize
from _waiting import wait_for

from playground.api import make_request
from playground.backends.local import LocalBackend
from playground.booth import BoothPolicy
from playground.owner import Owner
from playground.processes import child_env
from playground.serving.local import LocalServers

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")

SECRET = "s" * 48
COOKIE = "playground_visitor=2|1:0|10:1700000000|18:playground_visitor|8:YWJj|deadbeef"
HOLD_HOOK = """
import os, signal
if os.environ.get("PLAYGROUND_TEST_HOLD_TRAINER") and b"playground.train" in open("/proc/self/cmdline", "rb").read():
    signal.pause()
"""
STOLEN = ("PLAYGROUND_BOOTH_SECRET", "HTTP_COOKIE", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN")


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


@pytest.fixture
def kernel_like_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a booth visitor's kernel has in its environment (Voila puts the Cookie header there)."""
    monkeypatch.setenv("PLAYGROUND_BOOTH_SECRET", SECRET)
    monkeypatch.setenv("HTTP_COOKIE", COOKIE)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret_value")


def test_the_allow_list_keeps_what_processes_need_and_drops_the_rest():
    environ = {
        "PATH": "/usr/bin", "HOME": "/home/v", "PLAYGROUND_HOME": "/h", "HF_TOKEN": "hf_x", "CUDA_VISIBLE_DEVICES": "0",
        "PLAYGROUND_BOOTH_SECRET": SECRET, "HTTP_COOKIE": COOKIE, "AWS_SECRET_ACCESS_KEY": "a", "WANDB_API_KEY": "w",
        "PLAYGROUND_CHILD_ENV": "WANDB_*,MY_FLAG", "MY_FLAG": "1",
    }  # fmt: skip
    env = child_env({"PYTHONPATH": "/p", "HTTP_COOKIE": "x"}, environ=environ)
    assert {"PATH", "HOME", "PLAYGROUND_HOME", "HF_TOKEN", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"} <= set(env)
    assert env["WANDB_API_KEY"] == "w" and env["MY_FLAG"] == "1"  # the operator's additions
    assert not {"PLAYGROUND_BOOTH_SECRET", "HTTP_COOKIE", "AWS_SECRET_ACCESS_KEY"} & set(env)
    assert "HF_TOKEN" not in child_env(environ=environ, server=True)  # a server reads a local directory


@pytest.mark.slow
def test_booth_job_and_server_processes_hold_no_secret_or_cookie(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_like_env, trained_tiny_job
):
    install_sitecustomize(tmp_path / "hold-hook", HOLD_HOOK, monkeypatch)
    monkeypatch.setenv("PLAYGROUND_TEST_HOLD_TRAINER", "1")
    backend = LocalBackend(home=home, policy=BoothPolicy(max_concurrent_trainings=1), cancel_grace=2)
    job = backend.submit(make_request("tiny-llama-cpu", {"max_steps": 5}, owner="alice"))
    status_file = home / "jobs" / job.id / "status.json"
    status = wait_for(
        lambda: (s := json.loads(status_file.read_text())).get("trainer_pid") and s, 60, "the trainer to start"
    )
    try:
        for pid in (status["supervisor_pid"], status["trainer_pid"]):
            env = environ_of(int(pid))
            assert not set(STOLEN) & set(env), sorted(set(STOLEN) & set(env))
            assert SECRET not in "".join(env.values()) and env["PLAYGROUND_HOME"] == str(home)
    finally:
        backend.cancel(job.id, owner=Owner.visitor("alice"))

    # A model server started from the same environment, over the session's trained model (its own home here).
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)  # a kernel never loads the trainer, which sets it
    servers = LocalServers(home)
    endpoint = servers.start(trained_tiny_job.model_dir, job_id="env-check", owner=Owner.visitor("alice"))
    try:
        (record,) = [json.loads(p.read_text()) for p in (home / "servers").glob("*.json")]
        assert record["url"] == endpoint.url
        env = environ_of(int(record["pid"]))
        assert not (set(STOLEN) | {"HF_TOKEN"}) & set(env), sorted((set(STOLEN) | {"HF_TOKEN"}) & set(env))
        assert env["HF_HUB_OFFLINE"] == "1" and "PATH" in env
        assert env["OMP_WAIT_POLICY"] == "PASSIVE"  # sleeping, not spinning, OpenMP waits on a shared CPU
    finally:
        servers.stop_all()
