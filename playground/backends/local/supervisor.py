"""The detached process that runs one local job: ``python -m playground.backends.local.supervisor JOBDIR``.

Started by :meth:`LocalBackend.submit` in its own session, so the job outlives the process that
submitted it. It runs the trainer command from ``spec.json`` in a process group of its own, tees
the output to ``train.log``, turns event lines into ``status.json`` updates, and on exit records
``Succeeded``, ``Failed`` (exit code or signal, last log lines) or ``Cancelled``.

SIGTERM (sent by :meth:`LocalBackend.cancel`) means cancel: the trainer's group gets SIGTERM, then
SIGKILL after the grace period in ``spec.json``. The supervisor is the only writer of ``status.json`` while it
lives: it inherits the job's ``supervisor.lock``, held since before the job existed, and keeps it (not passed on
to the trainer) until it exits; readers reconcile only a job whose lock they can take.

A booth job's deadline (``deadline_seconds`` in ``spec.json``, counted from the trainer's start) never throws finished
work away. Arriving during training, it asks the trainer to stop at the next step (a stop file,
:mod:`playground.stopping`); the trainer evaluates and saves what it trained, and the job ends Succeeded with the
message "stopped at the deadline (step N of M)". Arriving in Evaluating or Saving (the steps are done), it changes
nothing. Only a trainer still running ``deadline_grace_seconds`` after the deadline (hung, or deaf to the stop file)
is killed, as a last resort: Failed "deadline exceeded" with its last log lines.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from playground.backends.local import state
from playground.backends.local.queue import POLL_INTERVAL, Slot, WaitEstimator, jobs_queue
from playground.booth import visitor_gone
from playground.events import (
    Event,
    JobPhase,
    Metric,
    Phase,
    Progress,
    Queued,
    event_to_dict,
    format_event_line,
    parse_line,
)
from playground.formatting import describe_event
from playground.owner import Owner
from playground.processes import child_env
from playground.stopping import STOP_FILE, write_stop_request

PROGRESS_WRITE_INTERVAL = 0.5  # seconds between status.json rewrites caused by progress alone
VISITOR_LEFT = "visitor left the booth before the job's turn"


class Supervisor:
    def __init__(self, jobdir: Path) -> None:
        self.jobdir = jobdir
        self.spec = state.read_json(jobdir / state.SPEC)
        self.status = state.read_json(jobdir / state.STATUS)
        self.lock = threading.RLock()
        self.tail: collections.deque[str] = collections.deque(maxlen=state.LOG_TAIL_LINES)
        self.proc: subprocess.Popen[bytes] | None = None
        self.cancel_requested = False
        self.trainer_reason = ""  # the reason of a Failed phase the trainer itself reported
        self.trainer_succeeded = False  # the trainer reported Succeeded: its model and metrics are written
        self.last_write = 0.0
        self.dirty = False
        self.wakeup = threading.Event()  # set by a cancel: stop waiting in the queue at once
        self.slot: Slot | None = None  # the training slot held while the trainer runs (booth mode)
        self.deadline_hit: int | None = None  # seconds, once the job's deadline arrived while the trainer ran
        self.stop_asked = False  # the trainer was asked to stop training (the deadline arrived during training)
        self.grace_over: float | None = None  # seconds, once the trainer outlived the deadline's grace and was killed
        self.grace_timer: threading.Timer | None = None  # the deadline's last resort, armed when it arrives
        self.log: Any = None  # train.log, open while the trainer runs
        self.left_reason = ""  # why a queued job left the queue without being cancelled (its visitor left)

    # -- status -------------------------------------------------------------------------
    def write_status(self, **changes: Any) -> None:
        with self.lock:
            self.status.update(changes)
            self.status["updated_at"] = time.time()
            self.status["log_tail"] = list(self.tail)
            state.write_json_atomic(self.jobdir / state.STATUS, self.status)
            self.last_write = time.monotonic()
            self.dirty = False

    def on_event(self, line: str) -> None:
        with self.lock:
            self._on_event(line)

    def _on_event(self, line: str) -> None:
        event = parse_line(line)
        self.tail.append(describe_event(event))
        if isinstance(event, Progress):
            data = event_to_dict(event)
            data.pop("type", None)
            self.status["progress"] = data
            if "first_progress_at" not in self.status:  # with the latest point: the job's pace (queue estimates)
                self.status.update(first_progress_at=event.time, first_progress_step=event.step)
            self.dirty = True
        elif isinstance(event, Metric):
            self.status.setdefault("metrics", {})[event.name] = event.value
            self.dirty = True
        elif isinstance(event, Phase):
            if event.phase.terminal:
                # The supervisor decides the terminal phase once the process has exited.
                if event.phase == JobPhase.FAILED and event.reason:
                    self.trainer_reason = event.reason
                self.trainer_succeeded = event.phase == JobPhase.SUCCEEDED
                return
            self.write_status(phase=str(event.phase), message=event.reason)
            return
        if self.dirty and time.monotonic() - self.last_write >= PROGRESS_WRITE_INTERVAL:
            self.write_status()

    # -- signals ------------------------------------------------------------------------
    def on_sigterm(self, signum: int, frame: object) -> None:
        if self.cancel_requested:
            return
        self.cancel_requested = True
        self.wakeup.set()
        proc = self.proc
        if proc is None:
            return
        state.kill_group(proc.pid, signal.SIGTERM)
        grace = float(self.spec.get("cancel_grace_seconds", 10))
        timer = threading.Timer(grace, state.kill_group, args=(proc.pid, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def log_line(self, line: str) -> None:
        """A line of the supervisor's own in train.log (the job's history) and the status's log tail."""
        self.tail.append(line)
        try:
            self.log.write(f"{line}\n".encode())
            self.log.flush()
        except (AttributeError, ValueError, OSError):  # no log open (yet, or any more)
            pass

    def _cause_in_log(self) -> str | None:
        """The innermost cause of the last traceback in train.log, in one line (a trainer that died before it could
        report its own failure, e.g. while importing its modules); None when the log holds none."""
        from playground.diagnostics import explain_log

        try:
            with open(self.jobdir / state.LOG, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 64_000))
                text = log.read().decode(errors="replace")
        except OSError:
            return None
        return explain_log(text)

    def on_deadline(self, seconds: int) -> None:
        """The deadline arrived (timer thread). In training: ask the trainer to stop at the next step, then evaluate
        and save (it ends Succeeded). In Evaluating or Saving: nothing to stop. Either way the trainer has
        ``deadline_grace_seconds`` more before :meth:`on_grace_over` kills it."""
        grace = float(self.spec.get("deadline_grace_seconds") or self.spec.get("cancel_grace_seconds", 10))
        with self.lock:
            proc = self.proc
            if proc is None or proc.poll() is not None or self.cancel_requested:
                return
            self.deadline_hit = seconds
            phase = self.status.get("phase")
            if phase in (JobPhase.EVALUATING, JobPhase.SAVING):
                self.log_line(
                    f"[supervisor] deadline of {seconds} s reached while {phase}: training is done, the job finishes "
                    f"(stopped only if still running {grace:.0f} s from now)"
                )
            else:
                write_stop_request(self.jobdir / STOP_FILE, "deadline", finish_by=time.time() + grace)
                self.stop_asked = True
                self.log_line(
                    f"[supervisor] deadline of {seconds} s reached: asking the trainer to stop training at the next "
                    f"step, then evaluate and save (within {grace:.0f} s)"
                )
        self.grace_timer = threading.Timer(grace, self.on_grace_over, args=(proc, grace))
        self.grace_timer.daemon = True
        self.grace_timer.start()

    def on_grace_over(self, proc: subprocess.Popen[bytes], grace: float) -> None:
        """The last resort: the trainer outlived the deadline by its grace; SIGTERM, SIGKILL after the cancel grace."""
        with self.lock:
            if proc.poll() is not None or self.cancel_requested:
                return
            self.grace_over = grace
            self.log_line(f"[supervisor] the trainer did not finish within {grace:.0f} s of the deadline: stopping it")
        state.kill_group(proc.pid, signal.SIGTERM)
        timer = threading.Timer(
            float(self.spec.get("cancel_grace_seconds", 10)), state.kill_group, args=(proc.pid, signal.SIGKILL)
        )
        timer.daemon = True
        timer.start()

    # -- the machine's training queue (booth mode) -----------------------------------------
    def emit(self, log, event: Event) -> None:
        """An event of the supervisor's own, in the job's event history (train.log) like the trainer's."""
        log.write((format_event_line(event) + "\n").encode())
        log.flush()
        self.tail.append(describe_event(event))

    def visitor_left(self) -> bool:
        """Whether the job's visitor has been gone longer than the booth allows (never for the operator's jobs)."""
        after = self.spec.get("visitor_gone_seconds")
        home = self.jobdir.parent.parent
        return bool(after) and visitor_gone(home, Owner(self.spec.get("owner")), float(after))

    def wait_for_slot(self, log) -> bool:
        """Wait (FIFO by submit time) for one of the machine's training slots; False if cancelled meanwhile
        (by a cancel, or because the job's visitor left the booth: :attr:`left_reason` says so).

        While waiting, a :class:`Queued` event goes to the history whenever the position changes or the
        wait estimate departs from its countdown; ``Queued(0)`` once it leaves the queue.
        """
        job_id, slots = self.spec["id"], int(self.spec["queue_slots"])
        queue = jobs_queue(self.jobdir.parent.parent, slots)
        estimator = WaitEstimator(self.jobdir.parent, slots)
        shown: tuple[int, float | None, float] | None = None  # position, estimate, when
        while True:
            if self.cancel_requested or self.visitor_left():  # a gone visitor's job never starts
                if not self.cancel_requested:
                    self.left_reason = VISITOR_LEFT
                queue.leave(job_id)
                return False
            self.slot = queue.try_start(job_id)
            if self.slot is not None:
                if shown is not None:
                    self.emit(log, Queued(0, 0.0))
                return True
            entries = queue.waiting()
            ids = [entry.job for entry in entries]
            if job_id not in ids:  # our entry is gone (the queue dir was wiped): line up again by submit time
                queue.join(job_id, float(self.spec["created_at"]))
            else:
                position = ids.index(job_id) + 1
                try:
                    estimate = estimator.estimate(queue.running(), ids[: position - 1])
                except (OSError, ValueError, KeyError, TypeError):
                    estimate = None
                now = time.time()
                if shown is None or shown[0] != position or _estimate_moved(shown[1], estimate, now - shown[2]):
                    self.emit(log, Queued(position, None if estimate is None else round(estimate, 1)))
                    shown = (position, estimate, now)
                    self.write_status(
                        queue_position=position,
                        estimated_wait_seconds=estimate,
                        message=f"waiting for a training slot: position {position}",
                    )
            self.wakeup.wait(POLL_INTERVAL)

    # -- main ---------------------------------------------------------------------------
    def pump(self, log) -> None:
        """Reader thread: copy trainer output to train.log line by line and parse it."""
        assert self.proc is not None and self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            log.write(raw)
            log.flush()
            text = raw.decode("utf-8", errors="replace")
            try:
                self.on_event(text)
            except Exception as exc:  # a status write must never stop the log copy
                print(f"supervisor: status update failed: {exc!r}", file=sys.stderr, flush=True)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGINT, self.on_sigterm)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if (self.jobdir / state.CANCEL_REQUESTED).exists():  # cancelled before the handler was in place
            self.cancel_requested = True
        command = list(self.spec["command"])
        env = child_env(self.spec.get("env", {}))
        log = open(self.jobdir / state.LOG, "ab")  # noqa: SIM115 - closed below, after the reader ends
        self.write_status(supervisor_pid=os.getpid())
        if self.cancel_requested:
            log.close()
            return self.finish(JobPhase.CANCELLED, "cancelled before the trainer started")
        if self.spec.get("queue_slots") and not self.wait_for_slot(log):
            reason = self.left_reason or "cancelled while queued"
            log.write(f"[supervisor] left the queue: {reason}\n".encode())
            log.close()
            self.tail.append(f"[supervisor] left the queue: {reason}")
            return self.finish(JobPhase.CANCELLED, reason, queue_position=None, estimated_wait_seconds=None)
        log.write(f"[supervisor] starting: {' '.join(command)}\n".encode())
        log.flush()
        self.log = log
        try:
            self.proc = subprocess.Popen(
                command,
                cwd=self.jobdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: cancel reaches torchrun's workers too
            )
        except OSError as exc:
            line = f"[supervisor] cannot start the trainer: {exc}"
            log.write(f"{line}\n".encode())
            log.close()
            self.tail.append(line)
            return self.finish(JobPhase.FAILED, line.removeprefix("[supervisor] "))
        self.write_status(
            phase=str(JobPhase.INITIALIZING),
            message="",
            started_at=time.time(),
            trainer_pid=self.proc.pid,
            trainer_pgid=self.proc.pid,
            queue_position=None,
            estimated_wait_seconds=None,
        )
        deadline = self.spec.get("deadline_seconds")
        timer = threading.Timer(float(deadline), self.on_deadline, args=(int(deadline),)) if deadline else None
        if timer is not None:  # counted from the trainer's start: time in the queue is not the job's fault
            timer.daemon = True
            timer.start()
        if self.cancel_requested:  # SIGTERM arrived while starting
            self.cancel_requested = False
            self.on_sigterm(signal.SIGTERM, None)
        reader = threading.Thread(target=self.pump, args=(log,), daemon=True)
        reader.start()
        returncode = self.proc.wait()
        if timer is not None:
            timer.cancel()
        if self.grace_timer is not None:
            self.grace_timer.cancel()
        # Leftovers of the group (torchrun workers, dataloader processes) would keep the pipe open.
        state.kill_group(self.proc.pid, signal.SIGKILL)
        reader.join(timeout=30)
        return self.conclude(returncode, log)

    def conclude(self, returncode: int, log) -> int:
        model_dir = self.jobdir / state.OUTPUT / "model"
        # A trainer killed by the deadline's last resort after it reported Succeeded (closing its MLflow run, say)
        # has written everything: the job keeps its model.
        done = returncode == 0 or (self.grace_over is not None and self.trainer_succeeded)
        stopped = read_stopped(self.jobdir / state.OUTPUT) if done else None
        if done and model_dir.is_dir():
            phase, message = JobPhase.SUCCEEDED, str((stopped or {}).get("message") or "")
        elif self.grace_over is not None:
            phase, message = (
                JobPhase.FAILED,
                f"deadline exceeded: the trainer did not stop, evaluate and save within {self.grace_over:.0f} s "
                f"of the {self.deadline_hit} s deadline",
            )
        elif self.cancel_requested:
            phase, message = JobPhase.CANCELLED, "cancelled by user"
        elif returncode < 0:
            phase, message = JobPhase.FAILED, f"trainer killed by signal {signal_name(-returncode)} ({-returncode})"
        elif returncode == 0:
            phase, message = JobPhase.FAILED, "trainer exited with code 0 but wrote no model directory"
        else:
            detail = self.trainer_reason or self._cause_in_log() or last_error_line(self.tail)
            message = f"trainer exited with code {returncode}" + (f": {detail}" if detail else "")
            phase = JobPhase.FAILED
        line = f"[supervisor] trainer exited ({returncode}); job {phase}" + (f": {message}" if message else "")
        log.write(f"{line}\n".encode())
        log.close()
        self.tail.append(line)
        changes: dict[str, Any] = {"exit_code": returncode if returncode >= 0 else None}
        if returncode < 0:
            changes["signal"] = signal_name(-returncode)
        if phase == JobPhase.SUCCEEDED:
            changes["metrics"] = {**self.status.get("metrics", {}), **read_metrics(self.jobdir / state.OUTPUT)}
            if stopped:
                changes["stopped"] = stopped
        return self.finish(phase, message, **changes)

    def finish(self, phase: JobPhase, message: str, **changes: Any) -> int:
        self.write_status(phase=str(phase), message=message, finished_at=time.time(), **changes)
        return 0 if phase == JobPhase.SUCCEEDED else 1


def _estimate_moved(shown: float | None, estimate: float | None, elapsed: float) -> bool:
    """Whether a new wait estimate is news: known/unknown changed, or it departs from the shown countdown."""
    if shown is None or estimate is None:
        return (shown is None) != (estimate is None)
    expected = max(0.0, shown - elapsed)
    return abs(estimate - expected) >= max(5.0, 0.15 * expected)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def last_error_line(lines) -> str:
    """The most telling line of a failed run's output: the last exception line, else the last line."""
    candidates = [ln.strip() for ln in lines if ln.strip() and not ln.startswith(("[progress]", "[supervisor]"))]
    for line in reversed(candidates):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Interrupt", "Exit")) or ": error:" in line or line.startswith("error"):
            return line[:300]
    return candidates[-1][:300] if candidates else ""


def read_stopped(output: Path) -> dict[str, Any] | None:
    """``metrics.json``'s ``stopped`` record (where a stop request ended training), None when it ran to the end."""
    try:
        stopped = state.read_json(output / "metrics.json").get("stopped")
    except (OSError, ValueError, AttributeError):
        return None
    return stopped if isinstance(stopped, dict) else None


def read_metrics(output: Path) -> dict[str, float]:
    """Numeric top-level values of the trainer's ``metrics.json`` (missing or odd files give nothing)."""
    try:
        data = state.read_json(output / "metrics.json")
    except (OSError, ValueError):
        return {}
    if isinstance(data.get("metrics"), dict):
        data = {**data, **data["metrics"]}
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m playground.backends.local.supervisor JOBDIR", file=sys.stderr)
        return 2
    supervisor = Supervisor(Path(args[0]))
    try:
        return supervisor.run()
    except BaseException as exc:  # record why, kill the trainer, never leave a job "running"
        if supervisor.proc is not None:
            state.kill_group(supervisor.proc.pid, signal.SIGKILL)
        supervisor.tail.append(f"[supervisor] error: {exc!r}")
        supervisor.finish(JobPhase.FAILED, f"supervisor error: {exc!r}")
        raise
    finally:
        if supervisor.slot is not None:  # the next job in the queue may start
            supervisor.slot.release()


if __name__ == "__main__":
    sys.exit(main())
