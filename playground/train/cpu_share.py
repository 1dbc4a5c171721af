"""Sharing the CPU: OpenMP threads that spin while the trainer has the machine, fewer threads while others need it.

PyTorch's OpenMP threads wait for each other thousands of times a training step. Spinning in those waits
(libgomp's default) makes the default blueprint's step 1.5× faster on an idle 2-core machine (40 steps: 30.9 s
spinning, 47.4 s sleeping), but a spinning process starves and is starved by anything else that wants the cores
(one step beside a CPU hog: 2.6 s spinning, 1.3 s sleeping; two spinning trainers: 3.6 s each, 1.4 s sleeping).

So (``PLAYGROUND_CPU_WAIT=auto``, the default) only the training entrypoint of a single-process run that starts
on an idle machine spins; every other process sleeps (``OMP_WAIT_POLICY=PASSIVE``), as before. A trainer that
sleeps because others kept the CPU busy at its start starts on the cores they left free (:func:`start_threads`: a
second sleeping thread on a busy core costs more CPU than it saves time). A trainer runs :class:`ThreadGuard`: once a
second it reads how long other tasks waited for a CPU (Linux PSI: the process's cgroup v2 ``cpu.pressure`` where it
has one, as in a container, else ``/proc/pressure/cpu``) and how many of its cores sat idle (their lines of
``/proc/stat``); while others wait it halves its threads (one thread has no OpenMP waits to spin in), and when the
cores it gave up, or never took, are idle it takes them.
``spin`` or ``passive`` force the choice. Torch-free: ``playground.train`` decides before torch loads libgomp.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path

SETTING = "PLAYGROUND_CPU_WAIT"  # auto | spin | passive
DEFAULTED = "PLAYGROUND_OMP_WAIT_DEFAULT"  # marks an OMP_WAIT_POLICY a playground process chose, not its caller
PRESSURE = Path("/proc/pressure/cpu")  # the whole machine's
CGROUP_ROOT = Path("/sys/fs/cgroup")  # cgroup v2: <root>/<this process's cgroup>/cpu.pressure
SELF_CGROUP = Path("/proc/self/cgroup")
STAT = Path("/proc/stat")
BUSY_PRESSURE = 20.0  # PSI "some" avg10 (%) at start above which the machine is not idle (a run that just
# ended leaves ~5-10 %: the busy cores say more)
BUSY_MARGIN = 0.25  # cores, below half the process's cores busy at start
CONTENDED = 0.2  # share of a second in which some task waited for a CPU: give threads back
IDLE_SHARE = 0.7  # share of the given-up cores idle: take them back
SAMPLES = 2  # consecutive one-second samples that must agree before the thread count changes
SETTLE_SECONDS = 5.0  # not sampled after watch(): a run's first steps make pressure of their own (allocations)


def _trainer_entrypoint(argv: list[str]) -> bool:
    """Whether this interpreter was started as ``python [flags] -m playground.train``."""
    return any(arg == "-m" and argv[i + 1 : i + 2] == ["playground.train"] for i, arg in enumerate(argv))


def _affinity() -> set[int]:
    """The CPUs this process may run on (its affinity mask; every CPU where there is none)."""
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def available_cores() -> int:
    """How many CPUs this process may run on."""
    return len(_affinity())


def _read_psi_some(path: Path, field: str) -> float | None:
    try:
        return float(path.read_text().splitlines()[0].split(f"{field}=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


def cgroup_dirs(self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> list[Path]:
    """This process's cgroup v2 directory and its ancestors up to the root, innermost first (only the root where
    the process has no v2 line, as under cgroup v1)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    relative = next((line[3:].strip().strip("/") for line in lines if line.startswith("0::")), "")
    own = cgroup_root / relative if relative else cgroup_root
    return [own, *[parent for parent in own.parents if parent.is_relative_to(cgroup_root)]]


def pressure_file(self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> Path:
    """Where this process's CPU pressure is: its cgroup v2 ``cpu.pressure`` (a container's own tasks, not the
    host's other containers, which have their own CPU shares), else the machine's ``/proc/pressure/cpu``."""
    own = cgroup_dirs(self_cgroup, cgroup_root)[0] / "cpu.pressure"  # a container's root is its own cgroup
    return own if _read_psi_some(own, "total") is not None else PRESSURE


def quota_cgroup(self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> tuple[float, Path] | None:
    """The CPU quota this process runs under, in cores, and the cgroup that sets it: the tightest ``cpu.max`` of its
    cgroup v2 directory and every one above it (a limit set on a parent holds for its children), or None where none
    is set."""
    tightest = None
    for directory in cgroup_dirs(self_cgroup, cgroup_root):
        try:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
            cores = int(quota) / int(period) if quota != "max" else None
        except (OSError, ValueError, ZeroDivisionError):
            continue
        if cores is not None and (tightest is None or cores < tightest[0]):
            tightest = (cores, directory)
    return tightest


def whole_cores(cores: float) -> int:
    """The threads worth running on ``cores`` of CPU time: its whole cores, at least one (a 1.5-core quota runs one
    thread well; a second would wait for the first's time)."""
    return max(1, math.floor(cores))


def usable_cores(self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> int:
    """Whole cores this process may use: its affinity mask, capped by a cgroup CPU quota's :func:`whole_cores`."""
    quota = quota_cores(self_cgroup, cgroup_root)
    return available_cores() if quota is None else min(available_cores(), whole_cores(quota))


def quota_cores(self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """:func:`quota_cgroup`'s cores, or None where no quota is set."""
    found = quota_cgroup(self_cgroup, cgroup_root)
    return found[0] if found is not None else None


def cgroup_cpu_seconds(directory: Path) -> float | None:
    """CPU seconds the tasks of a cgroup v2 directory have used (``cpu.stat``'s ``usage_usec``), or None."""
    try:
        for line in (directory / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return None


def _psi_some(field: str) -> float | None:
    """A field of PSI's ``some`` line for the CPU (``avg10``: % of the last 10 s; ``total``: µs since boot), or None."""
    return _read_psi_some(pressure_file(), field)


def pressure_avg10() -> float | None:
    """The share of the last 10 s (%) in which some task waited for a CPU (PSI), or None without Linux PSI."""
    return _psi_some("avg10")


def idle_at_start(pressure_avg10: float, busy_cores: float, cores: int) -> bool:
    """The start decision: other tasks waited little for a CPU in the last 10 s (PSI ``avg10``, %) and fewer than
    half of this process's cores were busy (less a quarter core: a busy core reads 0.96–1.02 over half a second)."""
    return pressure_avg10 < BUSY_PRESSURE and busy_cores < cores / 2 - BUSY_MARGIN


def busy_cores(
    window: float = 0.5, self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[float, int]:  # fmt: skip
    """How many cores others keep busy while this process sleeps ``window`` seconds, and out of how many whole cores
    it may use (:class:`IdleMeter`: under a CPU quota smaller than its affinity mask, a pod with a CPU limit that is
    not pinned to cores, the quota's cgroup's own use, since the host's other cores are not its to take)."""
    meter = IdleMeter(self_cgroup, cgroup_root, clock)
    time.sleep(window)
    busy = meter.capacity - meter.sample()
    return busy, whole_cores(meter.capacity)


def read_start(
    window: float = 0.5, self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[float, float, int] | None:  # fmt: skip
    """The machine as a trainer starts: the CPU pressure of its cgroup or machine (PSI ``avg10``, %) and
    :func:`busy_cores` over ``window`` seconds (a run that just ended does not count; the load average would still
    count it): ``(avg10, busy cores, whole cores)``. None without Linux PSI."""
    avg10 = _read_psi_some(pressure_file(self_cgroup, cgroup_root), "avg10")
    if avg10 is None:
        return None
    busy, cores = busy_cores(window, self_cgroup, cgroup_root, clock)
    return avg10, busy, cores


def free_cores(busy: float, cores: int) -> int:
    """The whole cores others left free at a trainer's start (at least one): ``cores`` less the busy ones, rounded (a
    busy core reads 0.96–1.02)."""
    return max(1, min(cores, round(cores - busy)))


_free_at_start: int | None = None  # this trainer's free_cores() at its start, where it chose to sleep in its waits


def start_threads(full: int) -> int:
    """The threads a trainer starts with, of the ``full`` it may use: all of them where it spins or nothing was
    measured; where it sleeps in its waits because others kept the CPU busy at its start, only the cores they left
    free. A second sleeping thread on a busy core mostly waits: on this project's 2-core machine it cost SmolLM2's
    LoRA run 26 % more CPU for 6 % less wall time (DPO: 16 % more for 25 % less), and a busy machine has no CPU to
    spare. The thread guard takes the cores back once they sit idle (:func:`next_threads`)."""
    if spinning() or _free_at_start is None:
        return full
    return min(full, _free_at_start)


def choose_wait_policy(environ: MutableMapping[str, str] | None = None, argv: list[str] | None = None) -> str:
    """Set ``OMP_WAIT_POLICY`` for this process before torch loads (see the module doc); returns ``"PASSIVE"``,
    ``"spin"`` (left to libgomp's default) or the caller's own policy, which is kept."""
    environ = os.environ if environ is None else environ
    argv = list(getattr(sys, "orig_argv", sys.argv)) if argv is None else argv
    policy = environ.get("OMP_WAIT_POLICY")
    if policy is not None and environ.get(DEFAULTED) != policy:
        return policy  # the caller's choice
    global _free_at_start
    choice = environ.get(SETTING, "auto").strip().lower()
    single = int(environ.get("LOCAL_WORLD_SIZE", "1") or 1) == 1
    start = read_start() if choice == "auto" and single and _trainer_entrypoint(argv) else None
    if choice == "spin" or (start is not None and idle_at_start(*start)):
        environ.pop("OMP_WAIT_POLICY", None)
        environ.pop(DEFAULTED, None)
        return "spin"
    if start is not None:  # a trainer that sleeps because the machine is busy starts on the cores left free
        _free_at_start = free_cores(start[1], start[2])
    environ["OMP_WAIT_POLICY"] = environ[DEFAULTED] = "PASSIVE"
    return "PASSIVE"


def spinning(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether this process's OpenMP threads spin in their waits (libgomp's default, or ``ACTIVE``)."""
    environ = os.environ if environ is None else environ
    return environ.get("OMP_WAIT_POLICY", "").strip().upper() != "PASSIVE"


def next_threads(current: int, full: int, pressure: float, idle_cores: float) -> int:
    """The thread count one sample asks for: half while others wait for a CPU (``pressure``: the share of the
    last second some task waited), back up when the cores given up are idle, else ``current``."""
    if pressure >= CONTENDED and current > 1:
        return max(1, current // 2)
    if current < full and idle_cores >= IDLE_SHARE * (min(full, current * 2) - current):
        return min(full, current * 2)
    return current


def idle_jiffies(cpus: set[int], stat: str | None = None) -> tuple[int, int]:
    """(idle + iowait, all) jiffies since boot summed over ``cpus``' own lines of ``/proc/stat`` (a container pinned
    to some cores of a bigger host counts those, not the host's average)."""
    idle = total = 0
    for line in (STAT.read_text() if stat is None else stat).splitlines():
        name, _, fields = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = [int(v) for v in fields.split()]
            idle, total = idle + values[3] + values[4], total + sum(values)
    return idle, total


def idle_cores(before: tuple[int, int], after: tuple[int, int], cores: int) -> float:
    """How many of ``cores`` sat idle between two :func:`idle_jiffies` readings."""
    return cores * (after[0] - before[0]) / max(1, after[1] - before[1])


class IdleMeter:
    """Idle cores since the last :meth:`sample`: under a CPU quota smaller than the affinity mask (a pod with a CPU
    limit, not pinned) the quota less its cgroup's use, this process's included; elsewhere the affinity mask's cores
    idle in their own /proc/stat lines. ``clock`` is read before the files it is paired with."""

    def __init__(
        self, self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.cpus, self.clock = _affinity(), clock
        found = quota_cgroup(self_cgroup, cgroup_root)
        now = clock()
        used = cgroup_cpu_seconds(found[1]) if found is not None and found[0] < len(self.cpus) else None
        self.quota = found if used is not None else None  # (cores, cgroup) where the quota's use is readable
        self.capacity = self.quota[0] if self.quota is not None else float(len(self.cpus))
        self._used, self._clock = used, now  # the quota's cgroup: CPU seconds used
        self._jiffies = idle_jiffies(self.cpus) if self.quota is None else (0, 0)  # elsewhere: (idle, all) jiffies

    def sample(self) -> float:
        if self.quota is None:
            before, self._jiffies = self._jiffies, idle_jiffies(self.cpus)
            return idle_cores(before, self._jiffies, len(self.cpus))
        now = self.clock()
        used = cgroup_cpu_seconds(self.quota[1])
        before, seconds = self._used, max(1e-6, now - self._clock)
        self._used, self._clock = used, now
        if used is None or before is None:  # the cgroup went away: nothing known to be idle
            return 0.0
        return max(0.0, self.capacity - (used - before) / seconds)


class ThreadGuard:
    """A daemon thread that samples the machine once a ``period`` and asks for a thread count
    (:func:`next_threads`); the training thread applies it between steps (:meth:`apply`), since torch's thread
    count belongs to the thread that sets it. ``clock`` is read before the readings it times (the kernel's files
    are current when read; a stand-in that writes them when the clock is read is then exact)."""

    def __init__(
        self, full: int, period: float = 1.0, settle: float = SETTLE_SECONDS,
        self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT,
        clock: Callable[[], float] = time.monotonic, start: int | None = None,
    ) -> None:  # fmt: skip
        self.full = full
        self.threads = self.wanted = full if start is None else max(1, min(full, start))
        self.period, self.settle, self.clock = period, settle, clock
        self._cgroup = (self_cgroup, cgroup_root)
        self._asks: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="playground-thread-guard", daemon=True)

    @classmethod
    def for_this_process(cls, full: int, start: int | None = None) -> ThreadGuard | None:
        """A guard for a process that may use more than one thread where PSI exists, else None: a spinning one
        gives threads back while others wait; a sleeping one that started on fewer (:func:`start_threads`)
        takes cores back once they sit idle. It samples from :meth:`watch` on (setup's model loading makes pressure
        of its own)."""
        if full < 2 or _psi_some("total") is None:
            return None
        return cls(full, start=start)

    @property
    def watching(self) -> bool:
        """Whether it samples (from :meth:`watch` until :meth:`stop`)."""
        return self._thread.is_alive() and not self._stop.is_set()

    def watch(self) -> None:
        """Start sampling (once: the base model's held-out answers or training are about to begin)."""
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self.settle):
            return
        psi, idle = pressure_file(*self._cgroup), IdleMeter(*self._cgroup, self.clock)
        clock = self.clock()
        pressure = _read_psi_some(psi, "total") or 0
        while not self._stop.wait(self.period):
            now = self.clock()
            now_pressure = _read_psi_some(psi, "total") or 0
            waited = (now_pressure - pressure) / 1e6 / max(1e-6, now - clock)
            pressure, clock = now_pressure, now
            self._asks = [*self._asks[-(SAMPLES - 1) :], next_threads(self.threads, self.full, waited, idle.sample())]
            if len(self._asks) == SAMPLES and len(set(self._asks)) == 1:
                self.wanted = self._asks[0]

    def apply(self) -> str | None:
        """Set torch's thread count to the guard's ask (call from the training thread); a log line when it changed."""
        wanted = self.wanted
        if wanted == self.threads:
            return None
        import torch

        torch.set_num_threads(wanted)
        before, self.threads, self._asks = self.threads, wanted, []
        why = "other processes wait for the CPU" if wanted < before else "the CPU is free again"
        return f"CPU threads {before} → {wanted}: {why}"

    def stop(self) -> None:
        self._stop.set()
