"""The e2e runner's types: how to run (:class:`RunOptions`), one notebook to run (:class:`NotebookSpec`),
what papermill reported (:class:`PapermillOutcome`), one notebook's outcome (:class:`NotebookRun`) and
the run's (:class:`RunReport`). Plain dataclasses; the reports and diagnostics read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from playground.e2e.environment import EnvChanges
from playground.e2e.metrics import GpuInfo, ResourceSummary
from playground.e2e.profiles import Profile

PASSED, FAILED, TIMEOUT, ERROR = "passed", "failed", "timeout", "error"


@dataclass
class RunOptions:
    """How to run: the profile plus what the command line overrides."""

    profile: Profile
    out: Path
    backend: str = "local"
    cell_timeout: int | None = None  # None: the profile's
    run_timeout: int | None = None
    fail_fast: bool = False
    jobs: int = 1
    extra_parameters: dict[str, Any] = field(default_factory=dict)  # every notebook (-p, -r, -y, -f)
    kernel: str | None = None  # None: each notebook's kernelspec (papermill's default); --kernel overrides
    keep_home: bool = False  # keep each notebook's PLAYGROUND_HOME (models, logs) for inspection
    log: TextIO | None = None  # live output (default: stderr); None-like sink with log=False
    live: bool = True
    title: str | None = None  # the summary's title (the run file's name); None: a generic one
    namespace: str | None = None  # kubernetes: where the notebooks create TrainJobs (None: the context's)
    cleanup: bool = False  # delete the TrainJobs each notebook created during its run (never older ones)
    isolated_env: bool = False  # foreign notebooks in a throwaway venv (--system-site-packages): installs go with it

    @property
    def effective_cell_timeout(self) -> int:
        return self.cell_timeout or self.profile.cell_timeout

    @property
    def effective_run_timeout(self) -> int:
        return self.run_timeout or self.profile.run_timeout


@dataclass
class NotebookSpec:
    """One notebook to run: its test name (also its output folder, made file-system safe), its own
    parameters (on top of the run's) and limits (None: the run's)."""

    path: Path
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)
    cell_timeout: int | None = None
    run_timeout: int | None = None
    kernel: str | None = None
    groups: tuple[str, ...] = ()

    @property
    def folder(self) -> str:
        return folder_name(self.name)


def folder_name(test_name: str) -> str:
    """A test name as one safe folder name: ``/`` becomes ``__``, any other unsafe character ``_``."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]", "_", test_name.replace("/", "__")).lstrip(".") or "notebook"


@dataclass
class NotebookRun:
    """One notebook's outcome."""

    name: str
    notebook: Path
    out_dir: Path
    blueprint_id: str | None
    parameters: dict[str, Any]
    dropped_parameters: list[str] = field(default_factory=list)
    own: bool = True  # one of the project's notebooks: gets its parameters and environment
    kernel: str | None = None  # the kernel asked for (None: the notebook's kernelspec)
    cell_timeout: int = 0
    run_timeout: int = 0
    first_error: str = ""  # the notebook's own first error line (or papermill's), for the reports
    cause: str | None = None  # the first exception of the failing cell's chained traceback, when another
    trainjobs: list[dict[str, Any]] = field(default_factory=list)  # kubernetes: created during its window
    status: str = ERROR
    message: str = ""
    returncode: int | None = None
    started_at: float = 0.0
    wall_seconds: float = 0.0
    result: dict[str, Any] | None = None
    job: dict[str, Any] | None = None
    timings: dict[str, float | None] = field(default_factory=dict)
    resources: ResourceSummary = field(default_factory=ResourceSummary)
    log_tail: list[str] = field(default_factory=list)
    diagnostics: Path | None = None
    env_changes: EnvChanges | None = None  # foreign notebooks: distributions it installed, changed or removed
    isolated_env: bool = False  # it ran in a throwaway environment (--isolated-env)

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def executed(self) -> Path:
        return self.out_dir / self.notebook.name

    @property
    def log_path(self) -> Path:
        return self.out_dir / "papermill.log"

    @property
    def result_path(self) -> Path:
        return self.out_dir / "result.json"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "notebook": str(self.notebook),
            "blueprint": self.blueprint_id,
            "status": self.status,
            "message": self.message,
            "returncode": self.returncode,
            "own_notebook": self.own,
            "kernel": self.kernel,
            "first_error": self.first_error or None,
            "cause": self.cause,
            "parameters": self.parameters,
            "dropped_parameters": self.dropped_parameters,
            "started_at": self.started_at,
            "wall_seconds": round(self.wall_seconds, 3),
            **self.timings,
            **self.resources.to_dict(),
            "job_id": (self.job or {}).get("id"),
            "executed_notebook": str(self.executed),
            "result_json": str(self.result_path) if self.result_path.exists() else None,
            "diagnostics": str(self.diagnostics) if self.diagnostics else None,
            "trainjobs": [{k: job.get(k) for k in ("name", "state", "created")} for job in self.trainjobs],
            "environment_changes": self.env_changes.to_dict() if self.env_changes is not None else None,
            "isolated_env": self.isolated_env,
        }


@dataclass
class RunReport:
    """The whole run: every notebook plus run-level figures."""

    profile: str
    backend: str
    out: Path
    started_at: float
    wall_seconds: float
    gpu: GpuInfo
    resources: ResourceSummary
    notebooks: list[NotebookRun]
    cell_timeout: int
    run_timeout: int
    skipped: list[str] = field(default_factory=list)  # not run after --fail-fast stopped the run
    title: str | None = None  # the run file's name
    environment_problems: list[str] = field(default_factory=list)  # `playground doctor`'s fast part, at the start

    @property
    def blueprint_run(self) -> bool:
        """Every notebook is one of the project's (the blueprint check), none foreign."""
        return all(nb.own for nb in self.notebooks)

    @property
    def heading(self) -> str:
        """The summary's title: the run file's name, else the blueprint check's, else a generic one."""
        if self.title:
            return self.title
        return f"Blueprint e2e ({self.profile})" if self.notebooks and self.blueprint_run else "Notebook e2e"

    @property
    def failed(self) -> list[NotebookRun]:
        return [n for n in self.notebooks if not n.passed]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.skipped


@dataclass(frozen=True)
class PapermillOutcome:
    """What ``papermill.execute_notebook`` ended with, as the child process recorded it.

    ``exception`` is the class name papermill raised (None: it returned normally); for a failing
    cell (``PapermillExecutionError``) ``ename``/``evalue`` are the notebook's own error.
    """

    exception: str | None = None
    ename: str | None = None
    evalue: str | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.exception is None

    @property
    def cell_timed_out(self) -> bool:
        return self.exception == "CellTimeoutError"

    def to_dict(self) -> dict[str, Any]:
        return {"exception": self.exception, "ename": self.ename, "evalue": self.evalue, "message": self.message}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PapermillOutcome:
        return cls(**{k: data.get(k) for k in ("exception", "ename", "evalue")}, message=str(data.get("message") or ""))
