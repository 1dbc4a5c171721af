"""Sharing the CPU (playground/train/cpu_share.py): which processes spin in OpenMP waits, and how a spinning
trainer's thread guard decides. The guard on real pressure, inside the training loop, is in test_train_recipe.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from playground.train import cpu_share
from playground.train.cpu_share import DEFAULTED, SETTING, choose_wait_policy, next_threads

TRAINER = ["/usr/bin/python3", "-u", "-m", "playground.train", "--blueprint", "tiny-llama-cpu", "--output", "o"]
NOTEBOOK = ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "kernel.json"]


class PodKernel:
    """A stand-in for the kernel's cgroup files of a pod, moved by rates the test sets (seconds per second: its tasks
    waited for a CPU, ``cpu.pressure``'s total; used CPU, ``cpu.stat``'s usage_usec). The kernel's files are current
    whenever they are read; this one writes them whenever it is read as the clock, which a meter reads before the
    files it pairs with it, so a reading is never older than its time however late a thread runs on a busy machine
    (a writer thread of its own fell behind in a loaded CI run: the guard read a stale cpu.stat as a free quota)."""

    def __init__(self, pod: Path, waited: float = 0.0, used: float = 0.0, used_before: float = 0.0) -> None:
        self.pod, self.rates = pod, {"waited": waited, "used": used}
        self.waited, self.used, self.last = 0.0, used_before, time.monotonic()
        self._lock = threading.Lock()
        self._write()

    def __call__(self) -> float:
        with self._lock:
            now = time.monotonic()
            self.waited += self.rates["waited"] * (now - self.last)
            self.used += self.rates["used"] * (now - self.last)
            self.last = now
            self._write()
            return now

    def _write(self) -> None:
        waited = f"some avg10=0.00 avg60=0.00 avg300=0.00 total={int(self.waited * 1e6)}\n"
        (self.pod / "cpu.pressure").write_text(waited)
        (self.pod / "cpu.stat").write_text(f"usage_usec {int(self.used * 1e6)}\n")


def test_threads_halve_while_others_wait_and_come_back_when_the_cores_are_idle() -> None:
    assert next_threads(2, 2, pressure=0.5, idle_cores=0.0) == 1  # a busy process beside a spinning trainer
    assert next_threads(2, 2, pressure=0.01, idle_cores=0.0) == 2  # alone: the busy cores are its own spinning
    assert next_threads(1, 2, pressure=0.0, idle_cores=0.95) == 2  # the other process is gone
    assert next_threads(1, 2, pressure=0.0, idle_cores=0.1) == 1  # still there: its core is not idle
    assert next_threads(1, 2, pressure=0.9, idle_cores=0.0) == 1  # never fewer than one
    # a bigger machine steps by halves: 16 → 8 under pressure, back to 16 only when ~8 cores sit idle
    assert next_threads(16, 16, pressure=0.3, idle_cores=0.0) == 8
    assert next_threads(8, 16, pressure=0.0, idle_cores=6.0) == 16
    assert next_threads(8, 16, pressure=0.0, idle_cores=4.0) == 8
    assert next_threads(4, 16, pressure=0.0, idle_cores=3.0) == 8


def test_only_a_training_entrypoint_may_spin_and_a_callers_policy_is_kept() -> None:
    caller = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert choose_wait_policy(caller, TRAINER) == "ACTIVE" and caller == {"OMP_WAIT_POLICY": "ACTIVE"}

    kernel: dict[str, str] = {}  # a notebook kernel, the app, pytest: any process but the trainer sleeps
    assert choose_wait_policy(kernel, NOTEBOOK) == "PASSIVE"
    assert kernel == {"OMP_WAIT_POLICY": "PASSIVE", DEFAULTED: "PASSIVE"}
    # its trainer child inherits that default, marked as one, so the child decides for itself
    child = {**kernel, SETTING: "spin"}
    assert choose_wait_policy(child, TRAINER) == "spin"
    assert "OMP_WAIT_POLICY" not in child and DEFAULTED not in child
    # ... while a policy the operator set (no mark, or another value) is theirs
    operator = {"OMP_WAIT_POLICY": "PASSIVE", SETTING: "spin"}
    assert choose_wait_policy(operator, TRAINER) == "PASSIVE" and operator["OMP_WAIT_POLICY"] == "PASSIVE"

    assert choose_wait_policy({SETTING: "passive"}, TRAINER) == "PASSIVE"
    assert choose_wait_policy({SETTING: "spin"}, NOTEBOOK) == "spin"  # forced
    # torchrun's processes share the cores already: never spinning on their own decision
    assert choose_wait_policy({"LOCAL_WORLD_SIZE": "2"}, TRAINER) == "PASSIVE"
    assert cpu_share.spinning({}) and cpu_share.spinning({"OMP_WAIT_POLICY": "active"})
    assert not cpu_share.spinning({"OMP_WAIT_POLICY": "passive"})


def test_a_trainer_starts_spinning_only_where_fewer_than_half_its_cores_are_busy() -> None:
    assert cpu_share.idle_at_start(pressure_avg10=0.5, busy_cores=0.1, cores=2)  # an idle booth: app, kernels
    assert not cpu_share.idle_at_start(pressure_avg10=0.5, busy_cores=0.98, cores=2)  # one busy process
    assert not cpu_share.idle_at_start(pressure_avg10=35.0, busy_cores=0.0, cores=2)  # others waited lately
    assert cpu_share.idle_at_start(pressure_avg10=1.0, busy_cores=7.0, cores=16)
    assert not cpu_share.idle_at_start(pressure_avg10=1.0, busy_cores=7.9, cores=16)
    assert not cpu_share.idle_at_start(pressure_avg10=0.0, busy_cores=0.3, cores=1)


@pytest.mark.skipif(cpu_share.pressure_avg10() is None, reason="no Linux PSI (/proc/pressure/cpu): the guard is off")
def test_a_busy_machine_is_not_idle() -> None:
    """Three busy processes on this machine's cores: a trainer starting now would sleep, not spin."""
    from _train_helpers import busy_processes

    with busy_processes(3):
        assert cpu_share.idle_at_start(*cpu_share.read_start()) is False
    if cpu_share.available_cores() == 2:  # this machine's size: one busy process takes half its cores
        with busy_processes(1):
            assert cpu_share.idle_at_start(*cpu_share.read_start()) is False


def test_a_sleeping_trainer_starts_on_the_free_cores_and_its_guard_takes_the_rest_when_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert cpu_share.free_cores(busy=1.0, cores=2) == 1  # one busy process on this machine's size
    assert cpu_share.free_cores(busy=1.9, cores=2) == 1  # never fewer than one
    assert cpu_share.free_cores(busy=0.3, cores=2) == 2  # busy by pressure only: the cores are free
    assert cpu_share.free_cores(busy=5.1, cores=16) == 11
    monkeypatch.setattr(cpu_share, "_free_at_start", 1)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert cpu_share.start_threads(2) == 1 and cpu_share.start_threads(16) == 1
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert cpu_share.start_threads(2) == 2  # spinning: it was alone at its start
    monkeypatch.setattr(cpu_share, "_free_at_start", None)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert cpu_share.start_threads(2) == 2  # nothing measured (not the entrypoint, no PSI): all of them
    if cpu_share.pressure_avg10() is not None:
        guard = cpu_share.ThreadGuard.for_this_process(2, start=1)
        assert guard is not None and (guard.threads, guard.full) == (1, 2)
        assert next_threads(guard.threads, guard.full, pressure=0.0, idle_cores=0.9) == 2  # the core it never took
        assert cpu_share.ThreadGuard.for_this_process(1) is None  # one thread: nothing to give or take


@pytest.mark.skipif(cpu_share.pressure_avg10() is None, reason="no Linux PSI (/proc/pressure/cpu): the guard is off")
def test_the_entrypoint_spins_with_a_guard_only_where_it_may(tmp_path) -> None:
    """The real entrypoint, from this (sleeping) test process: told to spin, its model line says so and it trains;
    told to sleep, it does not, on every core; left to choose beside a process that keeps a core busy, it sleeps on
    the cores left free."""
    from _train_helpers import busy_processes, describe, run_trainer

    cores = cpu_share.available_cores()
    if cores < 2:
        pytest.skip("one core: a single thread has nothing to spin for")
    few = ("--blueprint", "tiny-llama-cpu", "--set", "max_steps=3", "--set", "num_eval_examples=10")
    spin = run_trainer(*few, "--output", str(tmp_path / "spin"), env={SETTING: "spin"})
    sleep = run_trainer(*few, "--output", str(tmp_path / "sleep"), env={SETTING: "passive"})
    assert spin.returncode == 0 and sleep.returncode == 0, describe(spin) + describe(sleep)
    model_line = next(line for line in spin.stdout.splitlines() if line.startswith("model: "))
    assert model_line.endswith("threads (spinning: alone on an idle CPU)"), model_line
    sleep_line = next(line for line in sleep.stdout.splitlines() if line.startswith("model: "))
    assert sleep_line.endswith(f"× {cores} threads"), sleep_line  # forced: nothing measured, every core
    with busy_processes(cores - 1):  # all cores but one busy (whatever else this machine runs now)
        shared = run_trainer(*few, "--output", str(tmp_path / "shared"))
    assert shared.returncode == 0, describe(shared)
    shared_line = next(line for line in shared.stdout.splitlines() if line.startswith("model: "))
    assert f"× 1 threads of {cores} (the others were busy at the start" in shared_line, shared_line


def test_pressure_is_read_from_the_process_cgroup_where_it_has_one(tmp_path) -> None:
    """In a container (cgroup v2) the guard reads its own cgroup's cpu.pressure: the host's other containers
    have their own CPU shares. Elsewhere (cgroup v1, as on this VM, or the root cgroup) the machine's PSI."""
    root = tmp_path / "cgroup"
    pod = root / "kubepods.slice" / "pod-1" / "trainer"
    pod.mkdir(parents=True)
    (pod / "cpu.pressure").write_text("some avg10=1.50 avg60=0.40 avg300=0.10 total=123456\nfull avg10=0.00 total=0\n")
    self_cgroup = tmp_path / "self-cgroup"
    self_cgroup.write_text("0::/kubepods.slice/pod-1/trainer\n")
    assert cpu_share.pressure_file(self_cgroup, root) == pod / "cpu.pressure"
    assert cpu_share._read_psi_some(pod / "cpu.pressure", "total") == 123456.0
    assert cpu_share._read_psi_some(pod / "cpu.pressure", "avg10") == 1.5
    self_cgroup.write_text("4:memory:/process_api/x\n1:cpu:/\n0::/\n")  # v1 controllers; the v2 root has no file
    assert cpu_share.pressure_file(self_cgroup, root) == cpu_share.PRESSURE
    assert cpu_share.pressure_file(tmp_path / "missing", root) == cpu_share.PRESSURE


def test_the_cpu_quota_is_the_tightest_of_the_process_cgroup_and_its_parents(tmp_path) -> None:
    """A quota set on a pod's cgroup holds for the container below it, which says ``max`` itself; outside a
    container (no cgroup namespace) the process's cgroup is nested, so the root's ``cpu.max`` alone misses it."""
    root = tmp_path / "cgroup"
    container = root / "kubepods.slice" / "pod-1" / "trainer"
    container.mkdir(parents=True)
    (root / "kubepods.slice" / "cpu.max").write_text("max 100000\n")
    (root / "kubepods.slice" / "pod-1" / "cpu.max").write_text("150000 100000\n")
    (container / "cpu.max").write_text("max 100000\n")
    self_cgroup = tmp_path / "self-cgroup"
    self_cgroup.write_text("0::/kubepods.slice/pod-1/trainer\n")
    assert cpu_share.cgroup_dirs(self_cgroup, root)[:2] == [container, container.parent]
    assert cpu_share.cgroup_dirs(self_cgroup, root)[-1] == root
    assert cpu_share.quota_cores(self_cgroup, root) == 1.5
    assert cpu_share.usable_cores(self_cgroup, root) == 1  # the threads a trainer runs: the quota's whole cores
    (container / "cpu.max").write_text("50000 100000\n")  # the container's own is tighter
    assert cpu_share.quota_cores(self_cgroup, root) == 0.5
    assert cpu_share.usable_cores(self_cgroup, root) == 1  # never fewer than one
    self_cgroup.write_text("0::/\n")  # in a cgroup namespace the root is the container's own cgroup
    assert cpu_share.quota_cores(self_cgroup, root) is None
    assert cpu_share.usable_cores(self_cgroup, root) == cpu_share.available_cores()  # no quota: the affinity mask
    (root / "cpu.max").write_text("200000 100000\n")
    assert cpu_share.quota_cores(self_cgroup, root) == 2.0
    assert cpu_share.usable_cores(self_cgroup, root) == min(2, cpu_share.available_cores())
    self_cgroup.write_text("4:memory:/x\n1:cpu:/\n")  # cgroup v1 only: the root's file, as before
    assert cpu_share.quota_cores(self_cgroup, root) == 2.0
    assert cpu_share.quota_cores(tmp_path / "missing", tmp_path / "none") is None


@pytest.mark.skipif(cpu_share.available_cores() < 2, reason="one core: a quota below the affinity mask needs two")
def test_a_pod_under_a_cpu_quota_starts_from_its_own_use_not_the_hosts_cores(tmp_path) -> None:
    """A pod with a CPU limit of 1.5 cores, not pinned: every core of the host is in its affinity mask, so the host's
    busy cores said nothing of the pod. Its start decision reads its quota's cgroup: idle while the host is busy and
    the pod uses nothing; busy while the pod's own tasks use 0.8 of a core."""

    from _train_helpers import busy_processes

    root = tmp_path / "cgroup"
    pod = root / "kubepods.slice" / "pod-1"
    container = pod / "trainer"
    container.mkdir(parents=True)
    (pod / "cpu.max").write_text("150000 100000\n")
    (container / "cpu.max").write_text("max 100000\n")
    (container / "cpu.pressure").write_text("some avg10=0.50 avg60=0.40 avg300=0.10 total=123456\n")
    (pod / "cpu.stat").write_text("usage_usec 5000000\nuser_usec 4000000\nsystem_usec 1000000\n")
    self_cgroup = tmp_path / "self-cgroup"
    self_cgroup.write_text("0::/kubepods.slice/pod-1/trainer\n")
    assert cpu_share.quota_cgroup(self_cgroup, root) == (1.5, pod)
    assert cpu_share.cgroup_cpu_seconds(pod) == 5.0 and cpu_share.cgroup_cpu_seconds(container) is None
    with busy_processes(cpu_share.available_cores()):  # the host's cores are busy; the pod's own use is nil
        assert cpu_share.busy_cores(0.3, self_cgroup, root) == (0.0, 1)
        assert cpu_share.idle_at_start(*cpu_share.read_start(0.3, self_cgroup, root)) is True

    kernel = PodKernel(pod, used=0.8, used_before=5.0)  # the pod's tasks use 0.8 of a core
    busy, cores = cpu_share.busy_cores(0.5, self_cgroup, root, clock=kernel)
    assert abs(busy - 0.8) < 0.01 and cores == 1
    assert cpu_share.idle_at_start(*cpu_share.read_start(0.5, self_cgroup, root, clock=kernel)) is False


@pytest.mark.skipif(cpu_share.available_cores() < 2, reason="one core: a quota below the affinity mask needs two")
def test_a_guard_under_a_cpu_quota_takes_threads_back_only_when_the_quota_is_free(tmp_path) -> None:
    """A spinning trainer in a pod limited to 1.5 cores (not pinned) halves its threads while its cgroup's tasks wait,
    keeps one while the pod's other tasks still use most of the quota (the host's idle cores are not the pod's), and
    takes two back once the pod's use falls. The cgroup's files move as the kernel's would (PodKernel)."""

    import torch

    root = tmp_path / "cgroup"
    pod = root / "kubepods.slice" / "pod-1"
    pod.mkdir(parents=True)
    (pod / "cpu.max").write_text("150000 100000\n")
    self_cgroup = tmp_path / "self-cgroup"
    self_cgroup.write_text("0::/kubepods.slice/pod-1\n")
    kernel = PodKernel(pod, waited=0.5, used=1.5)  # the pod's tasks wait for a CPU half the time, use all 1.5 cores

    def asks_for(threads: int, within: float = 10.0) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and guard.wanted != threads:
            time.sleep(0.02)
        return guard.wanted == threads

    torch_threads = torch.get_num_threads()
    guard = cpu_share.ThreadGuard(2, period=0.25, settle=0.0, self_cgroup=self_cgroup, cgroup_root=root, clock=kernel)
    try:
        guard.watch()
        assert asks_for(1)  # the pod's tasks wait: give a thread back
        assert guard.apply() == "CPU threads 2 → 1: other processes wait for the CPU"
        kernel.rates.update(waited=0.0, used=1.4)  # nobody waits now, but the pod's tasks use 1.4 of its 1.5 cores
        assert not asks_for(2, within=1.5)
        kernel.rates.update(used=0.5)  # the others are done: 1 of the 1.5 cores sits idle
        assert asks_for(2)
        assert guard.apply() == "CPU threads 1 → 2: the CPU is free again"
    finally:
        guard.stop()
        torch.set_num_threads(torch_threads)


def test_idle_cores_count_the_cores_this_process_may_use() -> None:
    """A trainer pinned to cpu1 of a host whose cpu0 is busy sees its one core idle (the aggregate line would say
    half a core); over every CPU the per-core lines add up to the aggregate line."""
    before = "cpu  100 0 100 200 0 0 0 0 0 0\ncpu0 100 0 100 0 0 0 0 0 0 0\ncpu1 0 0 0 200 0 0 0 0 0 0\n\nintr 1 2\n"
    after = "cpu  300 0 100 400 0 0 0 0 0 0\ncpu0 300 0 100 0 0 0 0 0 0 0\ncpu1 0 0 0 400 0 0 0 0 0 0\n"
    pinned = cpu_share.idle_cores(cpu_share.idle_jiffies({1}, before), cpu_share.idle_jiffies({1}, after), 1)
    assert pinned == 1.0
    both = cpu_share.idle_cores(cpu_share.idle_jiffies({0, 1}, before), cpu_share.idle_jiffies({0, 1}, after), 2)
    assert both == 1.0  # one of two cores idle
    assert cpu_share.idle_cores(cpu_share.idle_jiffies({0}, before), cpu_share.idle_jiffies({0}, after), 1) == 0.0
    stat = cpu_share.STAT.read_text()
    every = {int(line.split()[0][3:]) for line in stat.splitlines() if line[:3] == "cpu" and line[3].isdigit()}
    idle, total = cpu_share.idle_jiffies(every, stat)
    aggregate = [int(v) for v in stat.splitlines()[0].split()[1:]]
    assert abs(idle - (aggregate[3] + aggregate[4])) <= len(every) and abs(total - sum(aggregate)) <= 10 * len(every)
