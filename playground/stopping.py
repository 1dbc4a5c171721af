"""A request to stop training early and still finish: the trainer saves and evaluates what it trained.

Whoever runs a trainer (the local supervisor, when a booth job's deadline arrives) writes a small JSON file, the
*stop file*, whose path the trainer gets in ``PLAYGROUND_STOP_FILE``. The trainer looks for it at every step
boundary (the SFT loop after each optimizer step; the TRL recipes in a ``TrainerCallback`` that sets
``control.should_training_stop``), stops training there, then evaluates (on fewer held-out requests if
``finish_by`` is near: :func:`answer_in_time`) and saves the model as usual, and its ``metrics.json`` says where it
stopped (``"stopped": {"reason", "step", "total_steps", ...}``). The file::

    {"reason": "deadline", "requested_at": 1765000000.0, "finish_by": 1765000300.0}

``finish_by`` (epoch seconds, optional): when the runner stops waiting and kills the trainer; evaluation leaves the
last part of the time to the save. Torch-free: the supervisor imports it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STOP_FILE_ENV = "PLAYGROUND_STOP_FILE"
STOP_FILE = "stop-requested.json"  # in a local job's directory
EVAL_SHARE = 0.7  # of the time left until finish_by, what the evaluation may use (the rest: the save, a margin)
CHUNK = 16  # held-out requests answered between two looks at the clock when time is short


@dataclass(frozen=True)
class StopRequest:
    reason: str  # "deadline"
    requested_at: float
    finish_by: float | None = None  # epoch seconds: the trainer is killed then

    def eval_finish_by(self, now: float | None = None) -> float | None:
        """When the evaluation should be done: ``EVAL_SHARE`` of the time left until ``finish_by`` (None: no limit)."""
        if self.finish_by is None:
            return None
        now = time.time() if now is None else now
        return now + EVAL_SHARE * max(0.0, self.finish_by - now)

    def describe(self, step: int, total_steps: int) -> str:
        """``stopped at the deadline (step 120 of 240)``: the note a stopped job carries on the page and in the CLI."""
        what = "the deadline" if self.reason == "deadline" else f"a {self.reason} request"
        return f"stopped at {what} (step {step} of {total_steps})"


def write_stop_request(path: Path, reason: str, *, finish_by: float | None = None) -> StopRequest:
    """Ask the trainer watching ``path`` to stop (atomically: it never reads half a file)."""
    request = StopRequest(reason, time.time(), finish_by)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"reason": reason, "requested_at": request.requested_at, "finish_by": finish_by}))
    tmp.replace(path)
    return request


class StopWatch:
    """The trainer's side: :meth:`requested` is one ``stat`` while no stop was asked (cheap at every step)."""

    def __init__(self, path: Path | str | None) -> None:
        self.path = Path(path) if path else None
        self._found: StopRequest | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> StopWatch:
        return cls((os.environ if env is None else env).get(STOP_FILE_ENV) or None)

    def requested(self) -> StopRequest | None:
        """The stop request, once its file exists (then remembered); None before."""
        if self._found is not None or self.path is None or not self.path.exists():
            return self._found
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
            finish_by = data.get("finish_by")
            self._found = StopRequest(
                str(data.get("reason") or "stop"),
                float(data.get("requested_at") or time.time()),
                float(finish_by) if finish_by is not None else None,
            )
        except (OSError, ValueError, TypeError, AttributeError):
            self._found = StopRequest("stop", time.time())  # asked, even if unreadable
        return self._found


def answer_in_time(
    answer: Callable[[Sequence[Any], Callable[[int, int], None] | None], list[str]],
    prompts: Sequence[Any],
    *,
    finish_by: float | None,
    on_progress: Callable[[int, int], None] | None = None,
    chunk: int = CHUNK,
) -> list[str]:
    """Answers to the first requests of ``prompts`` that fit before ``finish_by`` (all of them when None).

    ``answer(prompts, on_progress)`` answers a list; with a limit, requests go ``chunk`` at a time and the next chunk
    starts only if, at the pace so far, it ends in time (the first chunk always runs). ``on_progress(done, total)``
    counts over all of ``prompts``."""
    if finish_by is None:
        return answer(prompts, on_progress)
    total, answers, started = len(prompts), [], time.monotonic()
    deadline = started + (finish_by - time.time())
    while len(answers) < total:
        part = prompts[len(answers) : len(answers) + chunk]
        if answers:
            pace = (time.monotonic() - started) / len(answers)
            if time.monotonic() + pace * len(part) > deadline:
                break
        offset = len(answers)

        def progress(done: int, _total: int, offset: int = offset) -> None:
            if on_progress is not None:
                on_progress(offset + done, total)

        answers += answer(part, progress)
    return answers


class NotedReporter:
    """A reporter whose phase reasons start with ``note`` (``stopped at the deadline (step 120 of 240) · answering 50
    held-out requests``): after a stop, the Evaluating and Saving phases say where training stopped, on the page
    and in the CLI. Everything else goes to ``reporter`` unchanged."""

    def __init__(self, reporter: Any, note: str) -> None:
        self.reporter, self.note = reporter, note

    def phase(self, phase: Any, reason: str = "") -> None:
        self.reporter.phase(phase, f"{self.note} · {reason}" if reason else self.note)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reporter, name)
