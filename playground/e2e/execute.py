"""``python -m playground.e2e.execute REQUEST.json``: one notebook through ``papermill.execute_notebook``,
in its own process so the runner can kill it (and its kernel) on a whole-run timeout.

The request names the input and output notebooks, the parameters and papermill's options. The log
goes to stderr exactly as ``papermill --log-output`` writes it. What papermill ended with (returned,
or the exception it raised: ``PapermillExecutionError`` with the notebook's ``ename``/``evalue``,
nbclient's ``CellTimeoutError``, ...) is written to the request's ``outcome`` file as JSON: the
runner's verdict reads that, not the log. Exit code 0 when papermill returned, 1 otherwise.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from playground.e2e.types import PapermillOutcome

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def outcome_of(exc: BaseException | None) -> PapermillOutcome:
    """The outcome for what ``execute_notebook`` raised (None: it returned)."""
    if exc is None:
        return PapermillOutcome()
    message = _ANSI.sub("", " ".join(str(exc).split()))[:1000]
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)  # PapermillExecutionError
    return PapermillOutcome(
        exception=type(exc).__name__,
        ename=str(ename) if ename is not None else None,
        evalue=_ANSI.sub("", str(evalue)) if evalue is not None else None,
        message=message,
    )


KERNEL_STARTS = 3  # a kernel that dies before it answers is started again, at most this many times in all
_DIED_STARTING = "Kernel died before replying to kernel_info"  # nbclient's words: no cell had run


def _died_starting(exc: BaseException) -> bool:
    """Whether the kernel died before it answered at all, so nothing of the notebook ran: jupyter_client picks
    its ports free, then the kernel binds them, and a process started meanwhile may take one first ("Address
    already in use"), most often when several kernels and servers start at once on a busy machine."""
    return _DIED_STARTING in str(exc)


def execute(request: dict[str, Any]) -> PapermillOutcome:
    import papermill

    start = 1
    while True:
        try:
            papermill.execute_notebook(
                request["input"],
                request["output"],
                parameters=request["parameters"],
                kernel_name=request["kernel"],
                cwd=request["cwd"],
                execution_timeout=request["cell_timeout"],
                log_output=True,
                progress_bar=False,
                request_save_on_cell_execute=True,
            )
            return PapermillOutcome()
        except Exception as exc:  # the notebook failed, a cell timed out, the kernel died...
            if not _died_starting(exc) or start == KERNEL_STARTS:
                return _failed(exc)
            print(f"papermill: the kernel died before it answered (start {start} of {KERNEL_STARTS}); "
                  "no cell ran: starting it again", file=sys.stderr, flush=True)  # fmt: skip
            start += 1


def _failed(exc: BaseException) -> PapermillOutcome:
    """The outcome of a failed run, its notebook's traceback and one summary line printed to the log."""
    outcome = outcome_of(exc)
    traceback = getattr(exc, "traceback", None)  # the notebook's own traceback, for the log
    for line in traceback or []:
        print(_ANSI.sub("", str(line)), file=sys.stderr)
    said = f"{outcome.ename}: {outcome.evalue}" if outcome.ename else outcome.message
    print(f"papermill: {outcome.exception}: {said}", file=sys.stderr, flush=True)
    return outcome


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # as the papermill CLI configures it
    outcome = execute(request)
    Path(request["outcome"]).write_text(json.dumps(outcome.to_dict()), encoding="utf-8")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
