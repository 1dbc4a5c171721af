"""The e2e runner: papermill executes each notebook headlessly, one kernel per notebook.

Any papermill notebook is a test case: its verdict is papermill's outcome, and a ``result.json`` it
writes (the project's blueprint notebooks do) adds its own verdict. The project's parameters
(``headless``, ``out_dir``, the profile's) and environment (offline hub, ``PLAYGROUND_HOME``, the
project on ``PYTHONPATH``) go only to the project's own notebooks (:func:`is_own_notebook`); a foreign
notebook gets exactly the parameters the run was given, the runner's environment unchanged, the
runner's working directory (as papermill's CLI) and its own kernelspec unless ``--kernel`` says otherwise.

Each notebook runs in its own process (``python -m playground.e2e.execute``, so a whole-run timeout can
kill it and its kernel), its log streamed live, scrubbed, to the console and ``papermill.log``. Per
notebook it leaves ``<out>/<folder>/``: the executed notebook, ``papermill.log``, the notebook's
``result.json`` if it wrote one and, on failure, ``diagnostics.{md,json}``. For the run: ``junit.xml``,
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

from playground.e2e.environment import THROWAWAY_KERNEL, kernel_python, make_throwaway
from playground.e2e.environment import Watch as EnvWatch
from playground.e2e.metrics import GpuInfo, Sampler, gpu_info, job_timings
from playground.e2e.scrub import Scrubber, check_parameter_names
from playground.e2e.types import (
    FAILED,
    PASSED,
    TIMEOUT,
    NotebookRun,
    NotebookSpec,
    PapermillOutcome,
    RunOptions,
    RunReport,
)
from playground.errors import UserError, shown_path
from playground.models.packaged import cache_root as model_cache_root
from playground.paths import ensure_writable_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
APP_NOTEBOOK = "playground.ipynb"
# Parameters every per-blueprint notebook is expected to declare; the runner always passes them.
CORE_PARAMETERS = ("headless", "out_dir")


def _check_gpu_here(profile: str, gpu: GpuInfo) -> None:
    """One line (exit 2) unless this machine has a GPU: NVML's word, unless ``PLAYGROUND_GPU_COUNT`` says."""
    from playground.blueprints.fit import GPU_COUNT_SETTING, gpu_count_override

    override = gpu_count_override()
    has_gpu = gpu.present if override is None else override > 0
    if has_gpu:
        return
    found = f"NVML found none ({gpu.error or 'no device'})" if override is None else f"{GPU_COUNT_SETTING} is 0"
    raise UserError(
        f"profile {profile!r} needs an NVIDIA GPU on this machine and {found}; use --profile smoke, "
        "or --backend kubernetes to run on the cluster's GPUs",
        field="--profile",
    )


def default_notebooks(directory: Path = NOTEBOOKS_DIR) -> list[Path]:
    """Every per-blueprint notebook in ``notebooks/`` (all ``*.ipynb`` but the Voila app)."""
    return sorted(p for p in directory.glob("*.ipynb") if p.name != APP_NOTEBOOK)


def test_names(paths: Sequence[Path]) -> list[str]:
    """Each notebook's test name: its file name without ``.ipynb``; where several share it, their paths
    from the folder they have in common (``jax/mnist``, ``pytorch/mnist``)."""
    resolved = [p.resolve() for p in paths]
    names = []
    for path in resolved:
        same = [q for q in resolved if q.stem == path.stem]
        if len(same) == 1:
            names.append(path.stem)
            continue
        common = Path(os.path.commonpath([q.parent for q in same]))
        names.append(path.relative_to(common).with_suffix("").as_posix())
    return names


def specs_for(paths: Sequence[Path]) -> list[NotebookSpec]:
    """Notebooks given on the command line, named by :func:`test_names`."""
    return [NotebookSpec(path=p, name=n) for p, n in zip(paths, test_names(paths), strict=True)]


def is_own_notebook(notebook: Path, declared: dict[str, dict[str, Any]]) -> bool:
    """One of the project's own notebooks: it lives in the project's ``notebooks/`` folder, or its
    parameters cell declares the project's core parameters (``headless`` and ``out_dir``). Only these
    get the project's parameters and environment."""
    try:
        if notebook.resolve().is_relative_to(NOTEBOOKS_DIR.resolve()):
            return True
    except OSError:
        pass
    return all(name in declared for name in CORE_PARAMETERS)


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


Plan = tuple[str | None, dict[str, Any], list[str], bool]


def plan_parameters(notebook: Path | NotebookSpec, options: RunOptions) -> Plan:
    """(blueprint id, parameters to pass, profile parameters the notebook does not declare, own notebook).

    A foreign notebook gets exactly the run's parameters (the run file's for it, then the command
    line's ``-f``/``-y``/``-p``/``-r``) and nothing of the project's; papermill passes them, declared or not.
    """
    spec = notebook if isinstance(notebook, NotebookSpec) else NotebookSpec(path=notebook, name=notebook.stem)
    given = {**spec.parameters, **options.extra_parameters}  # the command line's override the run file's
    check_parameter_names(given)
    declared = inspect_parameters(spec.path)
    if not is_own_notebook(spec.path, declared):
        return None, given, [], False
    blueprint_id = notebook_blueprint(spec.path, declared)
    wanted = options.profile.parameters(blueprint_id, backend=options.backend)
    wanted.update(given)
    params: dict[str, Any] = {}
    dropped: list[str] = []
    for name, value in wanted.items():
        if name in declared or name in CORE_PARAMETERS or name in given:
            params[name] = value
        else:
            dropped.append(name)
    return blueprint_id, params, dropped, True


# ----------------------------------------------------------------------------------------- execution


def run_e2e(notebooks: Sequence[Path | NotebookSpec], options: RunOptions) -> RunReport:
    """Run every notebook (sequentially unless ``options.jobs`` > 1) and write the run's reports."""
    from playground.e2e import report

    if not notebooks:
        raise UserError("no notebooks to run (none given and none found in notebooks/)", field="NOTEBOOK")
    paths = [nb for nb in notebooks if not isinstance(nb, NotebookSpec)]
    named = iter(specs_for(paths))
    specs = [nb if isinstance(nb, NotebookSpec) else next(named) for nb in notebooks]
    for spec in specs:
        if not spec.path.is_file():
            raise UserError(f"notebook {shown_path(spec.path)} does not exist", field="NOTEBOOK")
        if spec.path.suffix != ".ipynb":
            raise UserError(
                f"{shown_path(spec.path)} is not a notebook; allowed: a Jupyter .ipynb file", field="NOTEBOOK"
            )
    folders = [spec.folder for spec in specs]
    clash = next((f for f in folders if folders.count(f) > 1), None)
    if clash is not None:
        raise UserError(
            f"two notebooks have the test name / output folder {clash!r}; give them distinct names "
            "(the run file's name field)",
            field="NOTEBOOK",
        )
    check_parameter_names(options.extra_parameters)
    # plan every notebook first: bad input stops the run before anything starts
    plans = [plan_parameters(spec, options) for spec in specs]
    gpu = gpu_info()
    any_own = any(plan[3] for plan in plans)  # the profile's GPU is for the project's notebooks
    if options.profile.needs_gpu and any_own and options.backend == "local":
        _check_gpu_here(options.profile.name, gpu)
    out = ensure_writable_dir(options.out, what="--out", hint="choose another folder with --out")
    scrubber = Scrubber()
    log = options.log if options.log is not None else sys.stderr
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            log.write(scrubber.text(line) + "\n")
            log.flush()

    def emit(line: str) -> None:
        if options.live:
            say(line)

    emit(
        f"playground e2e: {options.title or 'profile=' + options.profile.name} backend={options.backend} "
        f"notebooks={len(specs)} cell-timeout={options.effective_cell_timeout}s "
        f"run-timeout={options.effective_run_timeout}s out={out}"
    )
    started = time.time()
    t0 = time.monotonic()
    stack_check = _StackCheck(emit)  # `playground doctor`'s fast part, beside the first notebook (summary.md too)
    results: list[NotebookRun | None] = [None] * len(specs)
    stop = threading.Event()

    def task(i: int) -> None:
        if stop.is_set():
            return
        results[i] = run_notebook(specs[i], options, plans[i], scrubber=scrubber, emit=emit)
        if options.fail_fast and not results[i].passed:
            stop.set()

    with Sampler(gpu=gpu.present) as run_sampler:
        if options.jobs <= 1:
            for i in range(len(specs)):
                task(i)
        else:
            with ThreadPoolExecutor(max_workers=options.jobs) as pool:
                for future in [pool.submit(task, i) for i in range(len(specs))]:
                    future.result()
    done = [r for r in results if r is not None]
    skipped = [spec.name for spec, r in zip(specs, results, strict=True) if r is None]
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
        title=options.title,
        environment_problems=stack_check.problems(),
    )
    report.write_all(run, scrubber=scrubber)
    scrubber.tree(out)  # last pass over every artifact the run left
    say(final_line(run))  # the verdict, once, --quiet or not
    return run


class _StackCheck:
    """``playground doctor``'s fast part (imports in a child, versions agreeing) on a thread from the run's start:
    its problems are said as soon as known and kept for the summary. Never stops the run: a foreign notebook may not
    need the project's stack, and a broken one shows in the notebooks' own failures (with the cause)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._found: list[str] = []
        self._say = say
        self._thread = threading.Thread(target=self._run, name="e2e-stack-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            from playground.commands.doctor import fast_problems

            report = fast_problems(full=False, remember=True)  # the slim e2e install: only what is installed
        except Exception as exc:  # the check must never break the run
            self._found = [f"the stack check itself failed ({type(exc).__name__}: {exc})"]
        else:
            self._found = report.problems
        for line in self._found:
            self._say(f"playground e2e: environment problem: {line}")

    def problems(self, timeout: float = 120.0) -> list[str]:
        self._thread.join(timeout)
        return list(self._found) if not self._thread.is_alive() else ["the stack check did not finish"]


def final_line(run: RunReport) -> str:
    """The run's verdict in one line: passed/FAILED, the count, the failed and skipped notebooks, the reports."""
    total = len(run.notebooks) + len(run.skipped)
    passed = total - len(run.failed) - len(run.skipped)
    line = f"playground e2e: {'passed' if run.ok else 'FAILED'} — {passed}/{total} notebooks passed"
    if run.failed:
        line += " (" + ", ".join(f"{nb.name}: {nb.status}" for nb in run.failed) + ")"
    if run.skipped:
        line += f"; {len(run.skipped)} skipped after --fail-fast"
    changed = [nb.name for nb in run.notebooks if nb.env_changes and not nb.isolated_env]
    if changed:
        line += f"; the environment changed by {', '.join(changed)} (see summary.md)"
    return f"{line}; reports in {run.out}"


def run_notebook(
    notebook: Path | NotebookSpec,
    options: RunOptions,
    plan: Plan,
    *,
    scrubber: Scrubber,
    emit: Callable[[str], None],
) -> NotebookRun:
    """Execute one notebook in its own papermill process and kernel; never raises for notebook failures.

    Three parts: :class:`PapermillProcess` (start, wait with the whole-run timeout, kill the tree),
    :class:`LogPump` (scrubbed lines to ``papermill.log``, the console and a tail) and :func:`verdict`
    (papermill's outcome, then the notebook's ``result.json``).
    """
    spec = notebook if isinstance(notebook, NotebookSpec) else NotebookSpec(path=notebook, name=notebook.stem)
    run = _new_run(spec, options, plan)
    if run.dropped_parameters:
        emit(f"[{run.name}] note: the notebook does not declare {', '.join(run.dropped_parameters)}; not passed")
    workdir = Path(tempfile.mkdtemp(prefix=f"playground-e2e-{spec.folder}-"))
    home = workdir / "playground-home"  # the notebook's private PLAYGROUND_HOME
    backend = run.parameters.get("backend", options.backend)
    what = f"blueprint={run.blueprint_id}" if run.own else "notebook"
    emit(f"[{run.name}] start: {what} parameters={json.dumps(run.parameters, default=str)}")
    cluster = ClusterWatch.open(options, emit, run.name)  # kubernetes: what exists before the notebook starts
    run.started_at = time.time()
    cluster.start(run.started_at)
    t0 = time.monotonic()
    sampler = Sampler(gpu=None)
    sampler.start()

    def abandon() -> None:
        sampler.stop()
        cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)

    process, python = _papermill_process(run, options, workdir, abandon)
    env_watch = None if run.own else EnvWatch(python, process.env)  # what a foreign notebook installs
    if env_watch is not None:
        env_watch.start()

    def stop_jobs(*, quiet: bool) -> None:  # a timeout or a cancelled run: nothing may outlive it
        if run.own:
            _cleanup_jobs(home, backend, emit, run.name, quiet=quiet)
        cluster.cleanup(None)

    with LogPump(run, scrubber, emit) as pump:
        try:
            process.start(pump)
            timed_out = not process.wait(run.run_timeout)
            if timed_out:
                emit(f"[{run.name}] whole-run timeout ({run.run_timeout}s): killing papermill and its kernel")
                process.kill(before=lambda: stop_jobs(quiet=False))
        except BaseException:  # Ctrl-C, or SIGTERM when CI cancels the run: leave nothing running
            process.kill(before=lambda: stop_jobs(quiet=True))
            sampler.stop()
            cluster.close()
            if not options.keep_home:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
    ended = time.time()
    run.resources = sampler.stop()
    run.wall_seconds = time.monotonic() - t0
    run.returncode = process.returncode
    run.log_tail = pump.tail[-40:]
    if env_watch is not None:
        run.env_changes = env_watch.changes()
        if run.env_changes or run.env_changes.note:
            where = "its throwaway environment" if run.isolated_env else "the environment"
            said = "; ".join(run.env_changes.lines()) or run.env_changes.note
            emit(f"[{run.name}] {where}: {said}")
    _judge(
        run,
        process,
        options,
        timed_out=timed_out,
        ended=ended,
        home=home,
        cluster=cluster,
        scrubber=scrubber,
        emit=emit,
    )
    if not timed_out and run.own:  # the notebook should clean up after itself; no trainer or server outlives it
        _cleanup_jobs(home, backend, emit, run.name, quiet=True)
    cluster.cleanup(ended)
    cluster.close()
    scrubber.tree(run.out_dir)
    if options.keep_home:
        emit(f"[{run.name}] PLAYGROUND_HOME kept at {home}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    emit(f"[{run.name}] {run.status.upper()} in {run.wall_seconds:.1f}s{': ' + run.message if run.message else ''}")
    return run


def _papermill_process(
    run: NotebookRun, options: RunOptions, workdir: Path, abandon: Callable[[], None]
) -> tuple[PapermillProcess, str | Path]:
    """The run's papermill process and its kernel's python: with ``--isolated-env``, a foreign notebook's runs in a
    throwaway venv under ``workdir`` (its pip installs go with it); ``abandon`` is called before the error when that
    venv cannot be made (the notebook never runs in the main environment instead)."""
    throwaway = workdir / "throwaway-env" if options.isolated_env and not run.own else None
    python = kernel_python(run.kernel, run.notebook)
    isolated: dict[str, str] = {}
    if throwaway is not None:  # its pip installs land in a venv that goes with the workdir
        try:
            python, isolated = make_throwaway(throwaway, python)
        except (OSError, subprocess.CalledProcessError) as exc:  # never run it in the main environment instead
            abandon()
            raise UserError(f"--isolated-env: cannot create a throwaway environment for {run.name}: {exc}") from exc
        run.kernel, run.isolated_env = THROWAWAY_KERNEL, True
    process = PapermillProcess(run, options, workdir)
    if throwaway is not None:
        process.env |= {
            **isolated,
            "JUPYTER_PATH": os.pathsep.join(filter(None, [isolated["JUPYTER_PATH"], process.env.get("JUPYTER_PATH")])),
            "PATH": os.pathsep.join(filter(None, [str(Path(python).parent), process.env.get("PATH")])),
        }
    return process, python


def _judge(
    run: NotebookRun,
    process: PapermillProcess,
    options: RunOptions,
    *,
    timed_out: bool,
    ended: float,
    home: Path,
    cluster: ClusterWatch,
    scrubber: Scrubber,
    emit: Callable[[str], None],
) -> None:
    """The finished run's verdict (papermill's outcome, then ``result.json``), its failure's cause, the cluster's
    jobs, its own job and timings, and the diagnostics of a run that did not pass."""
    from playground.e2e import diagnostics

    run.result = _read_json(run.result_path)
    run.status, run.message = verdict(run, process.outcome(), timed_out=timed_out, options=options)
    run.first_error = run.message.splitlines()[0] if run.message else ""
    if run.status == FAILED:
        failing_cell = diagnostics.notebook_failure(run.executed)
        run.cause = diagnostics.root_cause(failing_cell["traceback"]) if failing_cell else None
    run.trainjobs = cluster.describe(ended, details=not run.passed)
    if run.own:
        run.job = diagnostics.find_job(run, home, default_backend=options.backend)
    run.timings = job_timings(run.job, run.result)
    if not run.passed:
        try:
            run.diagnostics = diagnostics.write(
                run, home, scrubber=scrubber, default_backend=options.backend, cluster=cluster.context()
            )
        except Exception as exc:  # diagnostics must never hide the failure itself
            emit(f"[{run.name}] diagnostics failed: {exc}")


def _new_run(spec: NotebookSpec, options: RunOptions, plan: Plan) -> NotebookRun:
    """A fresh output folder and the run record; the project's own notebooks get ``out_dir``."""
    out_dir = options.out / spec.folder
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    blueprint_id, params, dropped, own = plan[0], dict(plan[1]), plan[2], plan[3]
    if own:
        params["out_dir"] = str(out_dir.resolve())
    return NotebookRun(
        name=spec.name,
        notebook=spec.path.resolve(),
        out_dir=out_dir,
        blueprint_id=blueprint_id,
        parameters=params,
        dropped_parameters=dropped,
        own=own,
        kernel=options.kernel or spec.kernel,
        # --timeout-cell / --timeout, else the run file's, else the profile's
        cell_timeout=options.cell_timeout or spec.cell_timeout or options.profile.cell_timeout,
        run_timeout=options.run_timeout or spec.run_timeout or options.profile.run_timeout,
    )


# --------------------------------------------------------------------------------- the cluster


class ClusterWatch:
    """A notebook's window on the cluster (``--backend kubernetes``; a no-op otherwise): its TrainJobs,
    whichever client created them, for the diagnostics, and ``--cleanup`` deleting exactly those.
    Cluster trouble is a note in the diagnostics and a console line, never the notebook's verdict."""

    def __init__(self, options: RunOptions, emit: Callable[[str], None], name: str) -> None:
        self.options, self.emit, self.name = options, emit, name
        self.cluster: Any = None
        self.window: Any = None
        self.error: str | None = None

    @classmethod
    def open(cls, options: RunOptions, emit: Callable[[str], None], name: str) -> ClusterWatch:
        watch = cls(options, emit, name)
        if options.backend != "kubernetes":
            return watch
        try:
            from playground.e2e.cluster import Cluster

            watch.cluster = Cluster(options.namespace)
        except Exception as exc:  # no kubeconfig, no kubernetes client
            watch.error = f"cluster not reachable for diagnostics: {type(exc).__name__}: {' '.join(str(exc).split())}"
            emit(f"[{name}] {watch.error}")
        return watch

    def start(self, started_at: float) -> None:
        if self.cluster is not None:
            self.window = self.cluster.open_window(started_at)

    def describe(self, ended_at: float, *, details: bool) -> list[dict[str, Any]]:
        if self.window is None:
            return []
        self.window.ended_at = ended_at
        try:
            return self.cluster.describe(self.window, details=details)
        except Exception as exc:
            from playground.e2e.cluster import short_error

            self.window.notes.append(f"could not list the TrainJobs: {short_error(exc)}")
            return []

    def context(self) -> dict[str, Any] | None:
        """What the diagnostics say about the cluster: namespace, window, notes (None: not a kubernetes run)."""
        if self.options.backend != "kubernetes":
            return None
        window = self.window
        return {
            "namespace": self.cluster.namespace if self.cluster is not None else self.options.namespace,
            "window": [window.started_at, window.ended_at] if window is not None else None,
            "notes": ([self.error] if self.error else []) + (window.notes if window is not None else []),
        }

    def cleanup(self, ended_at: float | None) -> None:
        """--cleanup: delete the TrainJobs created in the window (``ended_at`` None: up to now)."""
        if not self.options.cleanup or self.window is None:
            return
        self.window.ended_at = ended_at
        try:
            for job in self.cluster.delete(self.window):
                self.emit(f"[{self.name}] cleanup: deleted TrainJob {job} (created during the notebook)")
        except Exception as exc:
            from playground.e2e.cluster import short_error

            self.emit(f"[{self.name}] cleanup of TrainJobs failed: {short_error(exc)}")

    def close(self) -> None:
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.close()
            self.cluster = None


# ------------------------------------------------------------------------------- process control


# The child process imports the runner's code by path (not through PYTHONPATH, which its kernel would inherit).
_CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); from playground.e2e.execute import main; sys.exit(main(sys.argv[2:]))"
)


class PapermillProcess:
    """``playground.e2e.execute`` for one notebook, in its own session (process group), so a timeout or
    a cancelled run kills papermill, its kernel and anything the kernel started.

    The project's own notebooks run in their folder with the profile's environment, a private
    ``PLAYGROUND_HOME`` and the project on ``PYTHONPATH``; a foreign one gets the runner's environment
    and working directory unchanged, as ``papermill`` run by hand would.
    """

    def __init__(self, run: NotebookRun, options: RunOptions, workdir: Path) -> None:
        self.run = run
        self.outcome_path = workdir / "papermill-outcome.json"
        self.request_path = workdir / "papermill-request.json"
        request = {
            "input": str(run.notebook),
            "output": str(run.executed.resolve()),
            "parameters": run.parameters,
            "kernel": run.kernel,  # None: the notebook's kernelspec
            "cwd": str(run.notebook.parent) if run.own else None,
            "cell_timeout": run.cell_timeout,
            "outcome": str(self.outcome_path),
        }
        self.request_path.write_text(json.dumps(request, default=str), encoding="utf-8")
        self.env = dict(os.environ)
        if run.own:
            self.env |= {
                **options.profile.env,
                "PLAYGROUND_HOME": str(workdir / "playground-home"),
                "PLAYGROUND_E2E_RUN": _run_label(workdir / "playground-home"),  # labels its TrainJobs for cleanup
                # converted packaged models (pkg://) stay in the user's cache, not in each notebook's fresh home
                "PLAYGROUND_MODEL_CACHE": str(model_cache_root()),
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            }
        self.proc: subprocess.Popen | None = None

    def start(self, pump: LogPump) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(REPO_ROOT), str(self.request_path)],
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
    """(status, message) from papermill's outcome, then the notebook's own ``result.json`` if it wrote one."""
    if timed_out:
        limit = run.run_timeout or options.effective_run_timeout
        return TIMEOUT, f"whole-run timeout: still running after {limit}s; kernel killed"
    if outcome is None:  # the child died before papermill returned or raised
        last = next((line for line in reversed(run.log_tail) if line.strip()), "")
        return FAILED, f"papermill exited with code {run.returncode}" + (f": {last.strip()}" if last else "")
    if outcome.cell_timed_out:
        limit = run.cell_timeout or options.effective_cell_timeout
        return TIMEOUT, (
            f"cell timeout: a cell ran longer than {limit}s (--timeout-cell); papermill interrupted the kernel"
        )
    if not outcome.ok:
        if outcome.ename:  # a cell raised: the notebook's own error
            return FAILED, f"{outcome.ename}: {' '.join((outcome.evalue or '').split())}"[:500]
        return FAILED, f"{outcome.exception}: {outcome.message}"[:500]
    if run.result is None:  # papermill's verdict stands: result.json is read when written, never required
        return PASSED, ""
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
    from playground.cluster.manifests import label_value

    return label_value(home.parent.name)


def _cleanup_jobs(home: Path, backend: str, emit: Callable[[str], None], name: str, *, quiet: bool = False) -> None:
    """Cancel jobs and stop servers a notebook left behind: in its private local state dir, or on the
    cluster the jobs labelled with this run (and their InferenceServices); the notebook's local Ray, if it
    started one, is stopped."""
    if backend in ("local", "ray") and not home.exists():
        return
    try:
        from playground.facade import connect  # deletes a job with its servers

        if backend == "local":
            be = connect("local", home=home)
            jobs = be.list()
        else:
            from playground.cluster.manifests import LABEL_E2E_RUN, LABEL_PREFIX

            be = connect(backend, home=home) if backend == "ray" else connect(backend)
            run = _run_label(home)
            jobs = [job for job in be.list() if job.labels.get(LABEL_E2E_RUN.removeprefix(LABEL_PREFIX)) == run]
        ours = {job.id for job in jobs}
        for job in jobs:
            if not job.done:
                be.cancel(job.id)
                emit(f"[{name}] cancelled job {job.id} left running by the notebook")
        for endpoint in be.endpoints():
            if backend in ("local", "ray") or endpoint.job_id in ours:
                be.unserve(endpoint.url)
                emit(f"[{name}] stopped server {endpoint.url} left running by the notebook")
        if backend == "ray" and be.backend.is_local and be.backend.stop_local_ray():
            emit(f"[{name}] stopped the notebook's local Ray")
    except Exception as exc:
        if not quiet:
            emit(f"[{name}] cleanup of {backend} jobs failed: {exc}")
