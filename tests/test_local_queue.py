"""The machine-wide training queue (``playground/backends/local/queue.py``): FIFO order, slots held by
real processes (a crash frees its slot), stale entries pruned, and the wait estimate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from playground.backends.local.queue import (
    Timing,
    TrainingQueue,
    estimate_wait,
    remaining_seconds,
    timing_from_status,
    typical_timing,
)


def everyone_alive(job: str) -> bool:
    return True


def test_fifo_by_submit_time_one_slot(tmp_path: Path):
    q = TrainingQueue(tmp_path, slots=1, alive=everyone_alive)
    q.join("b", submitted=2.0)  # supervisors may join out of order; the submit time decides
    q.join("a", submitted=1.0)
    q.join("c", submitted=3.0)
    assert [q.position(j) for j in "abc"] == [1, 2, 3]
    assert q.try_start("b") is None  # not at the head
    slot_a = q.try_start("a")
    assert slot_a is not None and q.running() == ["a"]
    assert [q.position(j) for j in "abc"] == [None, 1, 2]
    assert q.try_start("b") is None  # the one slot is taken
    assert q.leave("c") and not q.leave("c") and q.position("c") is None  # a queued job cancelled
    slot_a.release()
    slot_b = q.try_start("b")
    assert slot_b is not None and q.running() == ["b"] and q.waiting() == []
    slot_b.release()
    assert q.running() == []


def test_two_slots_run_two_jobs(tmp_path: Path):
    q = TrainingQueue(tmp_path, slots=2, alive=everyone_alive)
    for i, job in enumerate("xyz"):
        q.join(job, submitted=float(i))
    slots = [q.try_start("x"), q.try_start("y")]
    assert all(slots) and sorted(q.running()) == ["x", "y"]
    assert q.try_start("z") is None and q.position("z") == 1
    slots[1].release()
    assert q.try_start("z") is not None


def test_a_crashed_slot_holder_frees_its_slot(tmp_path: Path):
    q = TrainingQueue(tmp_path, slots=1, alive=everyone_alive)
    holder_code = (
        "import sys, time\n"
        "from playground.backends.local.queue import TrainingQueue\n"
        "q = TrainingQueue(sys.argv[1], slots=1, alive=lambda job: True)\n"
        "q.join('held', 0.0)\n"
        "slot = q.try_start('held')\n"
        "assert slot is not None\n"
        "print('holding', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        q.join("next", submitted=1.0)
        assert q.running() == ["held"] and q.try_start("next") is None
    finally:
        holder.kill()
        holder.wait()
    assert q.running() == []  # the kernel dropped the dead process's lock
    assert q.try_start("next") is not None


def test_entries_of_jobs_no_longer_alive_are_pruned(tmp_path: Path):
    alive = {"ghost", "next"}
    q = TrainingQueue(tmp_path, slots=1, alive=alive.__contains__)
    q.join("ghost", submitted=0.5)
    q.join("next", submitted=1.0)
    assert q.position("next") == 2
    alive.discard("ghost")  # its supervisor died while it waited
    assert [e.job for e in q.waiting()] == ["next"] and q.position("next") == 1
    assert not list((tmp_path / "queue" / "waiting").glob("*-ghost.json"))
    assert q.try_start("next") is not None


def test_wait_estimate_from_running_etas_and_typical_durations():
    assert estimate_wait([], [], slots=1) == 0.0
    assert estimate_wait([30.0], [], slots=1) == 30.0
    assert estimate_wait([30.0], [40.0, 40.0], slots=1) == 110.0
    assert estimate_wait([30.0, 10.0], [40.0], slots=2) == 30.0  # the job ahead takes the slot free at 10
    assert estimate_wait([30.0], [], slots=2) == 0.0  # a free slot
    assert estimate_wait([None], [], slots=1) is None
    assert estimate_wait([30.0], [None], slots=1) is None


def test_timing_from_a_finished_jobs_status_and_remaining_time():
    status = {
        "started_at": 100.0,
        "first_progress_at": 110.0,
        "first_progress_step": 5,
        "progress": {"step": 105, "time": 130.0, "eta_seconds": 0.0},
        "finished_at": 134.0,
    }
    timing = timing_from_status(status)
    assert timing == Timing(startup=pytest.approx(9.0), per_step=pytest.approx(0.2), finish=pytest.approx(4.0))
    assert timing.duration(300) == pytest.approx(9 + 60 + 4)
    assert timing_from_status({"started_at": 1.0}) is None
    still_running = {**status, "finished_at": None}
    assert timing_from_status(still_running) == Timing(pytest.approx(9.0), pytest.approx(0.2), 0.0)
    typical = typical_timing([timing, Timing(1, 0.4, 2), Timing(20, 0.3, 6)])
    assert typical == Timing(9.0, 0.3, 4.0)
    running = {"started_at": 0.0, "progress": {"step": 10, "time": 50.0, "eta_seconds": 30.0}}
    assert remaining_seconds(running, 300, typical, now=60.0) == pytest.approx(20 + 4)  # ETA aged 10 s + finish
    loading = {"started_at": 50.0}
    assert remaining_seconds(loading, 300, typical, now=60.0) == pytest.approx(9 + 90 + 4 - 10)
    assert remaining_seconds(loading, 300, None, now=60.0) is None
