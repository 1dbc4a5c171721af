"""Starting the local Ray on a loaded machine: Ray waits for its dashboard as long as the playground does, and a
``ray start`` that fails says Ray's own reason.

A fresh clone's test run here once lost its whole Ray module: the other lane's notebooks kept both cores busy, the
dashboard's nine module processes took more than Ray's 60 s to import, and ``ray start`` stopped every process it
had started and exited 1; the error showed the last lines of the dashboard's log ("Loaded 9 subprocess modules"),
not why. These tests run real ``ray start`` processes (no Ray test module fixture: a few seconds each).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _train_helpers import processes_mentioning
from _waiting import wait_for

from playground.backends.ray import cluster
from playground.backends.ray.cluster import (
    RAY_WORKER_PORTS,
    START_TIMEOUT,
    LocalRayHome,
    ephemeral_ports,
    exit_reason,
    listen_ports,
    start_env,
    start_failure,
)
from playground.errors import BackendError

pytest.importorskip("ray")

READ_RAYS_WAITS = """
import json
from ray._private import ray_constants
from ray.dashboard import consts
print(json.dumps({"dashboard": ray_constants.RAY_DASHBOARD_STARTUP_TIMEOUT_S,
                  "module": consts.SUBPROCESS_MODULE_WAIT_READY_TIMEOUT}))
"""


def test_ray_waits_for_its_dashboard_as_long_as_the_playground_waits_for_ray() -> None:
    """Read by Ray itself, in a process with the environment ``ray start`` gets: neither of Ray's waits (for the
    dashboard, 60 s by default; for each of its modules, 30 s) gives up before the playground's own."""
    env = start_env()
    out = subprocess.run(
        [sys.executable, "-c", READ_RAYS_WAITS], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    waits = json.loads(out.stdout.strip().splitlines()[-1])
    assert waits["dashboard"] >= START_TIMEOUT >= 120
    assert waits["module"] >= START_TIMEOUT


def test_a_ray_start_that_fails_says_why_and_leaves_nothing_running(tmp_path: Path) -> None:
    """A real ``ray start`` whose dashboard is given no time fails as a slow one did: the error says Ray's own
    reason and where the log is, and no process of that Ray is left behind."""
    home = LocalRayHome(tmp_path / "home", dashboard_wait=0)
    started = time.monotonic()
    with pytest.raises(BackendError) as failed:
        home.ensure()
    message = str(failed.value)
    assert message.startswith("the local Ray did not start (exit 1): Failed to start the dashboard; see ")
    assert message.endswith("ray-start.log") and "\n" not in message
    assert time.monotonic() - started < START_TIMEOUT  # its exit is seen at once, not after the wait
    assert home.read() is None
    temp_dir = cluster._temp_dir(home.dir.parent)
    wait_for(lambda: not processes_mentioning(str(temp_dir)), timeout=30, what=f"no process under {temp_dir}")


def test_a_failed_start_is_summed_up_by_rays_first_error() -> None:
    """Ray's output after a failed start: its error lines, a traceback, then the dashboard's log lines."""
    printed = "\n".join(
        [
            "2026-12-02 00:58:20,101\tINFO scripts.py:940 -- Local node IP: 127.0.0.1",
            "2026-12-02 00:59:21,015\tERROR services.py:1405 -- Failed to start the dashboard ",
            "2026-12-02 00:59:21,015\tERROR services.py:1430 -- Error should be written to 'dashboard.log'",
            "Traceback (most recent call last):",
            '  File "ray/_private/services.py", line 1453, in start_api_server',
            "Exception: Failed to start a dashboard. The last 20 lines of dashboard.log:",
            "2026-12-02 00:58:35,271\tINFO head.py:305 -- Loaded 9 subprocess modules: [...]",
        ]
    )
    assert start_failure(printed) == "Failed to start the dashboard"
    assert start_failure("Traceback (most recent call last):\n  File x\nValueError: bad --num-cpus") == (
        "ValueError: bad --num-cpus"
    )
    assert start_failure("one\ntwo\nthree\nfour") == "two / three / four"
    assert start_failure("") == "it printed nothing"


# What ``ray start --block`` printed when its client server could not bind its port (taken meanwhile by a
# connection's local port): the end of a real ray-start.log, colour codes and all.
RAY_STOPPED_BY_ITSELF = """\
2026-12-07 21:27:20,635\tINFO scripts.py:1160 -- This command will now block forever until terminated by a signal.
2026-12-07 21:27:21,636\tERR scripts.py:1201 -- \x1b[31mSome Ray subprocesses exited unexpectedly:\x1b[39m
2026-12-07 21:27:21,637\tERR scripts.py:1206 -- \x1b[31m\x1b[1mray_client_server\x1b[22m\x1b[26m\x1b[39m\x1b[0m\x1b[2m \
[exit code=1]\x1b[22m\x1b[0m
2026-12-07 21:27:21,638\tERR scripts.py:1224 -- \x1b[31mRemaining processes will be killed.\x1b[39m
"""


def test_a_local_ray_that_stopped_by_itself_is_summed_up_by_the_processes_that_exited(tmp_path: Path) -> None:
    """A local Ray dies whole when one of its processes exits: the submission that met it says which, from
    ``ray start``'s own lines; a Ray that was stopped (no such lines), or none at all, has no reason."""
    assert exit_reason(RAY_STOPPED_BY_ITSELF) == (
        "Some Ray subprocesses exited unexpectedly: ray_client_server [exit code=1]"
    )
    home = LocalRayHome(tmp_path / "home")
    assert home.exit_reason() is None  # never started
    home.dir.mkdir(parents=True)
    (home.dir / "ray-start.log").write_text("x" * 100_000 + "\n" + RAY_STOPPED_BY_ITSELF)  # the end of a long log
    assert home.exit_reason() == exit_reason(RAY_STOPPED_BY_ITSELF)
    stopped = RAY_STOPPED_BY_ITSELF.split("\n")[0] + "\n2026-12-07 21:28:00,000\tINFO scripts.py:1 -- Ray stopped\n"
    assert exit_reason(stopped) is None
    # the log is appended to by every start: an earlier Ray's exit is not the reason the last one is gone
    started_again = "2026-12-07 21:30:00,000\tINFO scripts.py:940 -- \x1b[37mLocal node IP\x1b[39m: 127.0.0.1\n"
    assert exit_reason(RAY_STOPPED_BY_ITSELF + started_again + stopped) is None
    assert exit_reason(started_again + RAY_STOPPED_BY_ITSELF) == exit_reason(RAY_STOPPED_BY_ITSELF)


def test_the_local_rays_ports_are_none_a_connection_could_take() -> None:
    """The ports the local Ray is started on lie between Ray's worker ports and the kernel's ephemeral range, where
    no outgoing connection and no bind to port 0 takes one first (one took the client server's port in CI, and
    the whole local Ray stopped under its first submission); they are distinct and free."""
    ephemeral = ephemeral_ports()
    if ephemeral.start - RAY_WORKER_PORTS.stop < 700:
        pytest.skip(f"this kernel's ephemeral ports start at {ephemeral.start}: no room below them")
    for _ in range(20):
        ports = listen_ports(7)
        assert len(set(ports)) == 7
        assert all(RAY_WORKER_PORTS.stop <= port < ephemeral.start for port in ports), (ports, ephemeral)
        with contextlib.ExitStack() as stack:
            for port in ports:
                stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
