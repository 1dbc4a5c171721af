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
from pathlib import Path
from typing import Any, TextIO

import psutil

from playground.e2e.metrics import Sampler, gpu_info, job_timings
from playground.e2e.scrub import Scrubber, check_parameter_names
from playground.e2e.types import FAILED, PASSED, TIMEOUT, NotebookRun, PapermillOutcome, RunOptions, RunReport
from playground.errors import UserError, shown_path
from playground.models.packaged import cache_root as model_cache_root
from playground.paths import ensure_writable_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
APP_NOTEBOOK = "playground.ipynb"
# Parameters every per-blueprint notebook is expected to declare; the runner always passes them.
CORE_PARAMETERS = ("headless", "out_dir")


def default_notebooks(directory: Path = NOTEBOOKS_DIR) -> list[Path]:
    """Every per-blueprint notebook in ``notebooks/`` (all ``*.ipynb`` but the Voila app)."""
    return sorted(p for p in directory.glob("*.ipynb") if p.name != APP_NOTEBOOK)


# --------------------------------------------------------------------------------------------- setup


def inspect_parameters(notebook: Path) -> dict[str, dict[str, Any]]:
    """The notebook's declared parameters (papermill's inspection of the ``parameters`` cell)."""
    import papermill

    try:
        return dict(papermill.inspect_notebook(str(notebook)))
    except Exception as exc:  # malformed notebook: name the file, never echo its content
        raise UserError(
            f"{shown_path(notebook, quoted=False)}: not a readable notebook ({type(exc).__name__}); "
            "allowed: a Jupyter .ipynb file",
            field="NOTEBOOK",
        ) from None


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
            raise UserError(f"notebook {shown_path(nb)} does not exist", field="NOTEBOOK")
        if nb.suffix != ".ipynb":
            raise UserError(f"{shown_path(nb)} is not a notebook; allowed: a Jupyter .ipynb file", field="NOTEBOOK")
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
    out = ensure_writable_dir(options.out, what="--out", hint="choose another folder with --out")
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
    """Execute one notebook in its own papermill process and kernel; never raises for notebook failures.

    Three parts: :class:`PapermillProcess` (start, wait with the whole-run timeout, kill the tree),
    :class:`LogPump` (scrubbed lines to ``papermill.log``, the console and a tail) and :func:`verdict`
    (papermill's outcome, then the notebook's ``result.json``).
    """
    from playground.e2e import diagnostics

    run = _new_run(notebook, options, plan)
    if run.dropped_parameters:
        emit(f"[{run.name}] note: the notebook does not declare {', '.join(run.dropped_parameters)}; not passed")
    workdir = Path(tempfile.mkdtemp(prefix=f"playground-e2e-{run.name}-"))
    home = workdir / "playground-home"  # the notebook's private PLAYGROUND_HOME
    backend = run.parameters.get("backend", options.backend)
    emit(f"[{run.name}] start: blueprint={run.blueprint_id} parameters={json.dumps(run.parameters, default=str)}")
    run.started_at = time.time()
    t0 = time.monotonic()
    sampler = Sampler(gpu=None)
    sampler.start()
    process = PapermillProcess(run, options, workdir)
    with LogPump(run, scrubber, emit) as pump:
        try:
            process.start(pump)
            timed_out = not process.wait(options.effective_run_timeout)
            if timed_out:
                limit = options.effective_run_timeout
                emit(f"[{run.name}] whole-run timeout ({limit}s): killing papermill and its kernel")
                process.kill(before=lambda: _cleanup_jobs(home, backend, emit, run.name))
        except BaseException:  # Ctrl-C, or SIGTERM when CI cancels the run: leave nothing running
            process.kill(before=lambda: _cleanup_jobs(home, backend, emit, run.name, quiet=True))
            sampler.stop()
            if not options.keep_home:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
    run.resources = sampler.stop()
    run.wall_seconds = time.monotonic() - t0
    run.returncode = process.returncode
    run.log_tail = pump.tail[-40:]
    run.result = _read_json(run.result_path)
    run.status, run.message = verdict(run, process.outcome(), timed_out=timed_out, options=options)
    run.job = diagnostics.find_job(run, home, default_backend=options.backend)
    run.timings = job_timings(run.job, run.result)
    if not run.passed:
        try:
            run.diagnostics = diagnostics.write(run, home, scrubber=scrubber)
        except Exception as exc:  # diagnostics must never hide the failure itself
            emit(f"[{run.name}] diagnostics failed: {exc}")
    if not timed_out:  # the notebook should clean up after itself; make sure no trainer or server outlives it
        _cleanup_jobs(home, backend, emit, run.name, quiet=True)
    scrubber.tree(run.out_dir)
    if options.keep_home:
        emit(f"[{run.name}] PLAYGROUND_HOME kept at {home}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    emit(f"[{run.name}] {run.status.upper()} in {run.wall_seconds:.1f}s{': ' + run.message if run.message else ''}")
    return run


def _new_run(notebook: Path, options: RunOptions, plan: tuple[str | None, dict[str, Any], list[str]]) -> NotebookRun:
    """A fresh output folder and the run record, with ``out_dir`` passed to the notebook."""
    out_dir = options.out / notebook.stem
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    blueprint_id, params, dropped = plan[0], dict(plan[1]), plan[2]
    params["out_dir"] = str(out_dir.resolve())
    return NotebookRun(
        name=notebook.stem,
        notebook=notebook.resolve(),
        out_dir=out_dir,
        blueprint_id=blueprint_id,
        parameters=params,
        dropped_parameters=dropped,
    )


# ------------------------------------------------------------------------------- process control


class PapermillProcess:
    """``python -m playground.e2e.execute`` for one notebook, in its own session (process group), so
    a timeout or a cancelled run kills papermill, its kernel and anything the kernel started."""

    def __init__(self, run: NotebookRun, options: RunOptions, workdir: Path) -> None:
        self.run = run
        self.outcome_path = workdir / "papermill-outcome.json"
        self.request_path = workdir / "papermill-request.json"
        request = {
            "input": str(run.notebook),
            "output": str(run.executed.resolve()),
            "parameters": run.parameters,
            "kernel": options.kernel,
            "cwd": str(run.notebook.parent),
            "cell_timeout": options.effective_cell_timeout,
            "outcome": str(self.outcome_path),
        }
        self.request_path.write_text(json.dumps(request, default=str), encoding="utf-8")
        self.env = {
            **os.environ,
            **options.profile.env,
            "PLAYGROUND_HOME": str(workdir / "playground-home"),
            "PLAYGROUND_E2E_RUN": _run_label(workdir / "playground-home"),  # labels its TrainJobs for the cleanup
            # converted packaged models (pkg://) stay in the user's cache, not in each notebook's fresh home
            "PLAYGROUND_MODEL_CACHE": str(model_cache_root()),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.proc: subprocess.Popen | None = None

    def start(self, pump: LogPump) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "playground.e2e.execute", str(self.request_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        pump.follow(self.proc.stdout)

    def wait(self, timeout: float) -> bool:
        """True when papermill ended within ``timeout`` seconds."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self, *, before: Callable[[], None] | None = None) -> None:
        """Kill papermill and every descendant; ``before`` runs once they are known (cancel jobs)."""
        if self.proc is None or self.proc.poll() is not None:
            if before:
                before()
            return
        descendants = _descendants(self.proc.pid)
        if before:
            before()
        _kill_tree(self.proc, descendants)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    def outcome(self) -> PapermillOutcome | None:
        """What papermill ended with, as the child recorded it (None: it was killed or crashed first)."""
        data = _read_json(self.outcome_path)
        return PapermillOutcome.from_dict(data) if data is not None else None


# ------------------------------------------------------------------------------------- log pump


class LogPump:
    """Reads papermill's output on a thread: every line scrubbed, written to ``papermill.log``,
    emitted live with the notebook's name, and kept in a bounded tail for the reports."""

    TAIL = 200

    def __init__(self, run: NotebookRun, scrubber: Scrubber, emit: Callable[[str], None]) -> None:
        self.run, self.scrubber, self.emit = run, scrubber, emit
        self.tail: list[str] = []
        self._file: TextIO | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LogPump:
        self._file = self.run.log_path.open("w", encoding="utf-8")
        return self

    def follow(self, stream: TextIO) -> None:
        self._thread = threading.Thread(target=self._pump, args=(stream,), name=f"e2e-log-{self.run.name}", daemon=True)
        self._thread.start()

    def _pump(self, stream: TextIO) -> None:
        assert self._file is not None
        for raw in stream:
            line = self.scrubber.text(raw.rstrip("\n"))
            self._file.write(line + "\n")
            self._file.flush()
            self.tail.append(line)
            del self.tail[: -self.TAIL]
            self.emit(f"[{self.run.name}] {line}")

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._file is not None:
            self._file.close()


# ---------------------------------------------------------------------------------------- verdict


def verdict(
    run: NotebookRun, outcome: PapermillOutcome | None, *, timed_out: bool, options: RunOptions
) -> tuple[str, str]:
    """(status, message) from papermill's outcome, then the notebook's own ``result.json``."""
    if timed_out:
        return TIMEOUT, f"whole-run timeout: still running after {options.effective_run_timeout}s; kernel killed"
    if outcome is None:  # the child died before papermill returned or raised
        last = next((line for line in reversed(run.log_tail) if line.strip()), "")
        return FAILED, f"papermill exited with code {run.returncode}" + (f": {last.strip()}" if last else "")
    if outcome.cell_timed_out:
        return TIMEOUT, (
            f"cell timeout: a cell ran longer than {options.effective_cell_timeout}s (--timeout-cell); "
            "papermill interrupted the kernel"
        )
    if not outcome.ok:
        if outcome.ename:  # a cell raised: the notebook's own error
            return FAILED, f"{outcome.ename}: {' '.join((outcome.evalue or '').split())}"[:500]
        return FAILED, f"{outcome.exception}: {outcome.message}"[:500]
    if run.result is None:
        return FAILED, "the notebook finished but wrote no result.json in out_dir"
    if result_passed(run.result) is False:
        reason = run.result.get("message") or run.result.get("error")
        return FAILED, "result.json reports failure" + (f": {reason}" if reason else "")
    return PASSED, ""


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


def _run_label(home: Path) -> str:
    """The label value that marks a notebook run's cluster jobs (its private temp dir's name)."""
    from playground.backends.kubernetes.manifests import label_value

    return label_value(home.parent.name)


def _cleanup_jobs(home: Path, backend: str, emit: Callable[[str], None], name: str, *, quiet: bool = False) -> None:
    """Cancel jobs and stop servers a notebook left behind: in its private local state dir, or on the
    cluster the TrainJobs labelled with this run (and their InferenceServices)."""
    if backend == "local" and not home.exists():
        return
    try:
        from playground.backends import get_backend

        if backend == "local":
            be = get_backend("local", home=home)
            jobs = be.list()
        else:
            from playground.backends.kubernetes.manifests import LABEL_E2E_RUN, LABEL_PREFIX

            be = get_backend(backend)
            run = _run_label(home)
            jobs = [job for job in be.list() if job.labels.get(LABEL_E2E_RUN.removeprefix(LABEL_PREFIX)) == run]
        ours = {job.id for job in jobs}
        for job in jobs:
            if not job.done:
                be.cancel(job.id)
                emit(f"[{name}] cancelled job {job.id} left running by the notebook")
        for endpoint in be.endpoints():
            if backend == "local" or endpoint.job_id in ours:
                be.unserve(endpoint.url)
                emit(f"[{name}] stopped server {endpoint.url} left running by the notebook")
    except Exception as exc:
        if not quiet:
            emit(f"[{name}] cleanup of {backend} jobs failed: {exc}")
