"""The e2e runner: papermill executes each per-blueprint notebook headlessly, one kernel per notebook.

Each notebook runs in its own ``python -m papermill`` process (so a whole-run timeout can kill it and
its kernel), with ``--log-output`` streamed live, scrubbed, to the console and ``papermill.log``.
Per notebook it leaves ``<out>/<name>/``: the executed notebook, the notebook's ``result.json``,
``papermill.log`` and, on failure, ``diagnostics.{md,json}``. For the run: ``junit.xml``,
``metrics.json`` and ``summary.md`` (see :mod:`playground.e2e.report`).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psutil
import yaml

from playground.e2e.metrics import GpuInfo, ResourceSummary, Sampler, gpu_info, job_timings
from playground.e2e.profiles import Profile
from playground.e2e.scrub import Scrubber, check_parameter_names
from playground.errors import UserError
from playground.models.packaged import cache_root as model_cache_root

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
APP_NOTEBOOK = "playground.ipynb"
# Parameters every per-blueprint notebook is expected to declare; the runner always passes them.
CORE_PARAMETERS = ("headless", "out_dir")

PASSED, FAILED, TIMEOUT, ERROR = "passed", "failed", "timeout", "error"


def default_notebooks(directory: Path = NOTEBOOKS_DIR) -> list[Path]:
    """Every per-blueprint notebook in ``notebooks/`` (all ``*.ipynb`` but the Voila app)."""
    return sorted(p for p in directory.glob("*.ipynb") if p.name != APP_NOTEBOOK)


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
    extra_parameters: dict[str, Any] = field(default_factory=dict)
    kernel: str = "python3"
    keep_home: bool = False  # keep each notebook's PLAYGROUND_HOME (models, logs) for inspection
    log: TextIO | None = None  # live output (default: stderr); None-like sink with log=False
    live: bool = True

    @property
    def effective_cell_timeout(self) -> int:
        return self.cell_timeout or self.profile.cell_timeout

    @property
    def effective_run_timeout(self) -> int:
        return self.run_timeout or self.profile.run_timeout


@dataclass
class NotebookRun:
    """One notebook's outcome."""

    name: str
    notebook: Path
    out_dir: Path
    blueprint_id: str | None
    parameters: dict[str, Any]
    dropped_parameters: list[str] = field(default_factory=list)
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

    @property
    def failed(self) -> list[NotebookRun]:
        return [n for n in self.notebooks if not n.passed]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.skipped


# --------------------------------------------------------------------------------------------- setup


def inspect_parameters(notebook: Path) -> dict[str, dict[str, Any]]:
    """The notebook's declared parameters (papermill's inspection of the ``parameters`` cell)."""
    import papermill

    try:
        return dict(papermill.inspect_notebook(str(notebook)))
    except Exception as exc:  # malformed notebook, no such file
        raise UserError(f"{notebook}: cannot read its parameters cell ({exc})", field="NOTEBOOK") from None


def notebook_blueprint(notebook: Path, declared: dict[str, dict[str, Any]]) -> str | None:
    """The blueprint a notebook runs: its ``blueprint``/``blueprint_id`` parameter default, else its file name."""
    for key in ("blueprint", "blueprint_id"):
        spec = declared.get(key)
        if spec and spec.get("default"):
            try:
                value = ast.literal_eval(spec["default"])
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, str):
                return value
    from playground.blueprints import load_catalog

    return notebook.stem if notebook.stem in load_catalog() else None


def plan_parameters(notebook: Path, options: RunOptions) -> tuple[str | None, dict[str, Any], list[str]]:
    """(blueprint id, parameters to pass, profile parameters the notebook does not declare)."""
    declared = inspect_parameters(notebook)
    blueprint_id = notebook_blueprint(notebook, declared)
    wanted = options.profile.parameters(blueprint_id, backend=options.backend)
    wanted.update(options.extra_parameters)
    check_parameter_names(wanted)
    params: dict[str, Any] = {}
    dropped: list[str] = []
    for name, value in wanted.items():
        if name in declared or name in CORE_PARAMETERS or name in options.extra_parameters:
            params[name] = value
        else:
            dropped.append(name)
    return blueprint_id, params, dropped


# ----------------------------------------------------------------------------------------- execution


def run_e2e(notebooks: Sequence[Path], options: RunOptions) -> RunReport:
    """Run every notebook (sequentially unless ``options.jobs`` > 1) and write the run's reports."""
    from playground.e2e import report

    if not notebooks:
        raise UserError("no notebooks to run (none given and none found in notebooks/)", field="NOTEBOOK")
    for nb in notebooks:
        if not nb.is_file():
            raise UserError(f"notebook {str(nb)!r} does not exist", field="NOTEBOOK")
    names = [nb.stem for nb in notebooks]
    if len(set(names)) != len(names):
        raise UserError("two notebooks share a file name; their output folders would clash", field="NOTEBOOK")
    check_parameter_names(options.extra_parameters)
    # plan every notebook first: bad input stops the run before anything starts
    plans = {nb: plan_parameters(nb, options) for nb in notebooks}
    gpu = gpu_info()
    if options.profile.needs_gpu and not gpu.present and options.backend == "local":
        raise UserError(
            f"profile {options.profile.name!r} needs an NVIDIA GPU on this machine and NVML found none "
            f"({gpu.error or 'no device'}); use --profile smoke, or --backend kubernetes to run on the cluster's GPUs",
            field="--profile",
        )
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    scrubber = Scrubber()
    log = options.log if options.log is not None else sys.stderr
    lock = threading.Lock()

    def emit(line: str) -> None:
        if options.live:
            with lock:
                log.write(scrubber.text(line) + "\n")
                log.flush()

    emit(
        f"playground e2e: profile={options.profile.name} backend={options.backend} notebooks={len(notebooks)} "
        f"cell-timeout={options.effective_cell_timeout}s run-timeout={options.effective_run_timeout}s out={out}"
    )
    started = time.time()
    t0 = time.monotonic()
    results: list[NotebookRun | None] = [None] * len(notebooks)
    stop = threading.Event()
    with Sampler(gpu=gpu.present) as run_sampler:
        if options.jobs <= 1:
            for i, nb in enumerate(notebooks):
                if stop.is_set():
                    break
                results[i] = run_notebook(nb, options, plans[nb], scrubber=scrubber, emit=emit)
                if options.fail_fast and not results[i].passed:
                    stop.set()
        else:
            with ThreadPoolExecutor(max_workers=options.jobs) as pool:

                def task(i: int, nb: Path) -> None:
                    if stop.is_set():
                        return
                    results[i] = run_notebook(nb, options, plans[nb], scrubber=scrubber, emit=emit)
                    if options.fail_fast and not results[i].passed:
                        stop.set()

                for future in [pool.submit(task, i, nb) for i, nb in enumerate(notebooks)]:
                    future.result()
    done = [r for r in results if r is not None]
    skipped = [nb.stem for nb, r in zip(notebooks, results, strict=True) if r is None]
    run = RunReport(
        profile=options.profile.name,
        backend=options.backend,
        out=out,
        started_at=started,
        wall_seconds=time.monotonic() - t0,
        gpu=gpu,
        resources=run_sampler.summary(),
        notebooks=done,
        cell_timeout=options.effective_cell_timeout,
        run_timeout=options.effective_run_timeout,
        skipped=skipped,
    )
    report.write_all(run, scrubber=scrubber)
    scrubber.tree(out)  # last pass over every artifact the run left
    for nb in done:
        emit(f"[{nb.name}] {nb.status.upper()} in {nb.wall_seconds:.1f}s{': ' + nb.message if nb.message else ''}")
    emit(f"playground e2e: {len(done) - len(run.failed)}/{len(notebooks)} passed; reports in {out}")
    return run


def run_notebook(
    notebook: Path,
    options: RunOptions,
    plan: tuple[str | None, dict[str, Any], list[str]],
    *,
    scrubber: Scrubber,
    emit: Callable[[str], None],
) -> NotebookRun:
    """Execute one notebook in its own papermill process and kernel; never raises for notebook failures."""
    from playground.e2e import diagnostics

    name = notebook.stem
    out_dir = options.out / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    blueprint_id, params, dropped = plan[0], dict(plan[1]), plan[2]
    params["out_dir"] = str(out_dir.resolve())
    run = NotebookRun(
        name=name, notebook=notebook.resolve(), out_dir=out_dir, blueprint_id=blueprint_id, parameters=params
    )
    run.dropped_parameters = dropped
    if dropped:
        emit(f"[{name}] note: the notebook does not declare {', '.join(dropped)}; not passed")
    home = Path(tempfile.mkdtemp(prefix=f"playground-e2e-{name}-"))
    params_file = home / "e2e-parameters.yaml"
    params_file.write_text(yaml.safe_dump(params, sort_keys=True))
    env = {
        **os.environ,
        **options.profile.env,
        "PLAYGROUND_HOME": str(home / "playground-home"),
        # converted packaged models (pkg://) stay in the user's cache: each notebook's fresh home would convert again
        "PLAYGROUND_MODEL_CACHE": str(model_cache_root()),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    cmd = [
        sys.executable,
        "-m",
        "papermill",
        str(notebook.resolve()),
        str(run.executed.resolve()),
        "-f",
        str(params_file),
        "--log-output",
        "--no-progress-bar",
        "--request-save-on-cell-execute",
        "--execution-timeout",
        str(options.effective_cell_timeout),
        "--kernel",
        options.kernel,
        "--cwd",
        str(notebook.resolve().parent),
    ]
    emit(f"[{name}] start: blueprint={blueprint_id} parameters={json.dumps(params, default=str)}")
    run.started_at = time.time()
    t0 = time.monotonic()
    timed_out = False
    tail: list[str] = []
    sampler = Sampler(gpu=None)
    sampler.start()
    with run.log_path.open("w", encoding="utf-8") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,  # its own process group: a timeout kills papermill and its kernel
        )

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = scrubber.text(raw.rstrip("\n"))
                log_file.write(line + "\n")
                log_file.flush()
                tail.append(line)
                del tail[:-200]
                emit(f"[{name}] {line}")

        reader = threading.Thread(target=pump, name=f"e2e-log-{name}", daemon=True)
        reader.start()
        try:
            proc.wait(timeout=options.effective_run_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            emit(f"[{name}] whole-run timeout ({options.effective_run_timeout}s): killing papermill and its kernel")
            descendants = _descendants(proc.pid)
            _cleanup_jobs(home / "playground-home", params.get("backend", options.backend), emit, name)
            _kill_tree(proc, descendants)
        except BaseException:  # Ctrl-C, or SIGTERM when CI cancels the run: leave nothing running
            descendants = _descendants(proc.pid)
            _cleanup_jobs(home / "playground-home", params.get("backend", options.backend), emit, name, quiet=True)
            _kill_tree(proc, descendants)
            sampler.stop()
            if not options.keep_home:
                shutil.rmtree(home, ignore_errors=True)
            raise
        finally:
            reader.join(timeout=10)
            if proc.poll() is None:
                _kill_tree(proc, _descendants(proc.pid))
    run.resources = sampler.stop()
    run.wall_seconds = time.monotonic() - t0
    run.returncode = proc.returncode
    cell_timed_out = any("CellTimeoutError" in line for line in tail)
    run.log_tail = clean_log_tail(tail)[-40:]
    run.result = _read_json(run.result_path)
    run.status, run.message = _verdict(run, timed_out, options.effective_run_timeout)
    if cell_timed_out and not timed_out:
        run.status = TIMEOUT
        run.message = (
            f"cell timeout: a cell ran longer than {options.effective_cell_timeout}s (--timeout-cell); "
            "papermill interrupted the kernel"
        )
    run.job = diagnostics.find_job(run, home / "playground-home", default_backend=options.backend)
    run.timings = job_timings(run.job, run.result)
    if not run.passed:
        try:
            run.diagnostics = diagnostics.write(run, home / "playground-home", scrubber=scrubber)
        except Exception as exc:  # diagnostics must never hide the failure itself
            emit(f"[{name}] diagnostics failed: {exc}")
    if not timed_out:
        # the notebook should clean up after itself; make sure no trainer or server outlives it
        _cleanup_jobs(home / "playground-home", params.get("backend", options.backend), emit, name, quiet=True)
    scrubber.tree(out_dir)
    if not options.keep_home:
        shutil.rmtree(home, ignore_errors=True)
    else:
        emit(f"[{name}] PLAYGROUND_HOME kept at {home / 'playground-home'}")
    emit(f"[{name}] {run.status.upper()} in {run.wall_seconds:.1f}s{': ' + run.message if run.message else ''}")
    return run


def _verdict(run: NotebookRun, timed_out: bool, run_timeout: int) -> tuple[str, str]:
    if timed_out:
        return TIMEOUT, f"whole-run timeout: still running after {run_timeout}s; kernel killed"
    error = notebook_error(run.executed)
    if run.returncode != 0:
        if error:
            return FAILED, error
        last = next((line for line in reversed(run.log_tail) if line.strip()), "")
        return FAILED, f"papermill exited with code {run.returncode}" + (f": {last.strip()}" if last else "")
    if run.result is None:
        return FAILED, "the notebook finished but wrote no result.json in out_dir"
    verdict = result_passed(run.result)
    if verdict is False:
        return FAILED, "result.json reports failure" + (
            f": {run.result.get('message') or run.result.get('error')}"
            if run.result.get("message") or run.result.get("error")
            else ""
        )
    return PASSED, ""


def clean_log_tail(lines: list[str]) -> list[str]:
    """Drop papermill's own Python traceback (its CLI frames) and keep the notebook's error after it."""
    out: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith("Traceback (most recent call last):"):
            skipping = True
            start = len(out)
            out.append(line)
            continue
        if skipping and ("papermill.exceptions." in line or "nbclient.exceptions." in line):
            del out[start:]
            skipping = False
        out.append(line)
    return out


def result_passed(result: dict[str, Any]) -> bool | None:
    """The notebook's own verdict in result.json (``passed``/``ok``/``success`` or ``status``); None if absent."""
    for key in ("passed", "ok", "success"):
        if isinstance(result.get(key), bool):
            return result[key]
    status = str(result.get("status", "")).lower()
    if status in ("passed", "succeeded", "success", "ok"):
        return True
    if status in ("failed", "failure", "error", "cancelled"):
        return False
    return None


def notebook_error(executed: Path) -> str | None:
    """``ename: evalue`` of the first error output in an executed notebook (papermill's failure cell)."""
    try:
        nb = json.loads(executed.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) or []:
            if output.get("output_type") == "error":
                value = " ".join(str(output.get("evalue", "")).split())
                return f"{output.get('ename', 'Error')}: {value}"[:500]
    return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else {"value": data}


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_tree(proc: subprocess.Popen, descendants: list[psutil.Process]) -> None:
    """SIGTERM papermill's process group and every descendant (the kernel, a trainer it spawned), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    _gone, alive = psutil.wait_procs(descendants, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _cleanup_jobs(home: Path, backend: str, emit: Callable[[str], None], name: str, *, quiet: bool = False) -> None:
    """Cancel jobs and stop servers a notebook left behind in its private local state dir."""
    if backend != "local" or not home.exists():
        return
    try:
        from playground.backends import get_backend

        be = get_backend("local", home=home)
        for job in be.list():
            if not job.done:
                be.cancel(job.id)
                emit(f"[{name}] cancelled job {job.id} left running by the notebook")
        for endpoint in be.endpoints():
            be.unserve(endpoint.url)
            emit(f"[{name}] stopped server {endpoint.url} left running by the notebook")
    except Exception as exc:
        if not quiet:
            emit(f"[{name}] cleanup of local jobs failed: {exc}")
