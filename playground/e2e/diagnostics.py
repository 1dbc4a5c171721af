"""Diagnostics for a failed e2e notebook, once and concise, the notebook's own first error on top:
the real cause (the first exception of a chained traceback), the failing cell; for the project's
notebooks the job's status, events and failing step's logs from the backend they used; in kubernetes
runs the TrainJobs created during the notebook, whichever client created them
(:mod:`playground.e2e.cluster`). Written next to the executed notebook."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from playground.e2e.scrub import Scrubber

if TYPE_CHECKING:
    from playground.e2e.types import NotebookRun

MAX_EVENTS = 20000
LOG_LINES = 120
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# An exception line of a traceback: ``OSError: 503 ...``, ``requests.exceptions.HTTPError: ...``
_EXCEPTION_LINE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Timeout)): (.+)$"
)


def root_cause(traceback: list[str]) -> str | None:
    """The first exception line of a (chained) traceback: what went wrong first, when the cell's final
    error is a consequence of it (``RuntimeError: training failed`` from ``HTTPError: 503 ...``)."""
    from playground.diagnostics import Cause, explain

    lines = [_ANSI.sub("", line) for chunk in traceback for line in str(chunk).splitlines()]
    matches = [m for line in lines if (m := _EXCEPTION_LINE.match(line.strip()))]
    if not matches:
        return None
    first, last = matches[0].group(0).strip(), matches[-1].group(0).strip()
    # with the fix where one is known: a torchvision built for another torch, a missing module...
    explained = explain(Cause(matches[0].group(1).rsplit(".", 1)[-1], matches[0].group(2).strip()))
    if explained != f"{matches[0].group(1).rsplit('.', 1)[-1]}: {matches[0].group(2).strip()}":
        return explained
    return first if len(matches) > 1 and first != last else None


def _backend_name(run: NotebookRun, default_backend: str) -> str:
    result = run.result or {}
    return str(result.get("backend") or run.parameters.get("backend") or default_backend)


def _job_id(run: NotebookRun) -> str | None:
    result = run.result or {}
    job = result.get("job")
    value = result.get("job_id") or (job.get("id") if isinstance(job, dict) else None)
    return str(value) if value else None


def _backend(name: str, home: Path, result: dict[str, Any]):
    from playground.backends import get_backend

    if name in ("local", "ray"):  # the notebook's private home: its jobs (ray: its local Ray, unless RAY_ADDRESS)
        if not home.exists():
            return None
        return get_backend(name, home=home)
    options = {k: result[k] for k in ("namespace", "context", "kubeconfig") if result.get(k)}
    return get_backend(name, **options)


def find_job(run: NotebookRun, home: Path, *, default_backend: str = "local") -> dict[str, Any] | None:
    """The job the notebook ran (``Job.to_dict()``), or None when it cannot be found."""
    try:
        backend = _backend(_backend_name(run, default_backend), home, run.result or {})
        if backend is None:
            return None
        job_id = _job_id(run)
        if job_id:
            return backend.get(job_id).to_dict()
        mine = [
            job
            for job in backend.list()
            if (run.blueprint_id is None or job.blueprint_id == run.blueprint_id)
            and job.created_at >= run.started_at - 5
        ]
        return mine[0].to_dict() if mine else None  # newest first
    except Exception:
        return None


def _kernelspec(notebook: Path) -> str | None:
    try:
        return json.loads(notebook.read_text(encoding="utf-8"))["metadata"]["kernelspec"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def notebook_failure(executed: Path) -> dict[str, Any] | None:
    """The first error output of the executed notebook: cell index, source head, ename, evalue, traceback."""
    try:
        nb = json.loads(executed.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for index, cell in enumerate(nb.get("cells", [])):
        for output in cell.get("outputs", []) or []:
            if output.get("output_type") == "error":
                source = cell.get("source", "")
                source = "".join(source) if isinstance(source, list) else source
                return {
                    "cell_index": index,
                    "execution_count": cell.get("execution_count"),
                    "cell_source_head": "\n".join(source.splitlines()[:15]),
                    "ename": output.get("ename"),
                    "evalue": output.get("evalue"),
                    "traceback": [_ANSI.sub("", line) for line in output.get("traceback", [])][-30:],
                }
    return None


def collect(
    run: NotebookRun, home: Path, *, default_backend: str = "local", cluster: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Everything known about why ``run`` failed, as a JSON-ready dict."""
    from playground.events import ClusterEvent, Log, Phase

    backend_name = _backend_name(run, default_backend)
    failing_cell = notebook_failure(run.executed)
    data: dict[str, Any] = {
        "notebook": run.name,
        "path": str(run.notebook),
        "own_notebook": run.own,
        "blueprint": run.blueprint_id,
        "status": run.status,
        "message": run.message,
        "cause": root_cause(failing_cell["traceback"]) if failing_cell else None,
        "returncode": run.returncode,
        "backend": backend_name,
        "kernel": run.kernel or f"{_kernelspec(run.notebook)} (the notebook's kernelspec)",
        "parameters": run.parameters,
        "failing_cell": failing_cell,
        "papermill_log_tail": run.log_tail,
        "cluster": cluster,
        "trainjobs": run.trainjobs,
        "job": run.job,
        "phases": [],
        "cluster_events": [],
        "failing_step": None,
        "failing_step_logs": [],
        "errors": [],
    }
    if not run.own:  # a foreign notebook's jobs are the cluster's TrainJobs above, not the project's backend
        return data
    job_id = (run.job or {}).get("id") or _job_id(run)
    if not job_id:
        if not run.trainjobs:
            data["errors"].append("no job found: the notebook failed before submitting, or wrote no job_id")
        return data
    try:
        backend = _backend(backend_name, home, run.result or {})
        if backend is None:
            data["errors"].append(f"the {backend_name} backend state is gone; job details unavailable")
            return data
        if run.job is None:
            data["job"] = backend.get(job_id).to_dict()
        logs: dict[str, list[str]] = {}
        for count, event in enumerate(backend.events(job_id, follow=False)):
            if count >= MAX_EVENTS:
                data["errors"].append(f"event history truncated at {MAX_EVENTS} events")
                break
            if isinstance(event, Phase):
                data["phases"].append({"phase": str(event.phase), "reason": event.reason, "time": event.time})
            elif isinstance(event, ClusterEvent):
                data["cluster_events"].append({"kind": event.kind, "reason": event.reason, "message": event.message})
            elif isinstance(event, Log):
                lines = logs.setdefault(event.source, [])
                lines.append(event.line)
                del lines[:-LOG_LINES]
    except Exception as exc:
        data["errors"].append(f"{type(exc).__name__}: {exc}")
        return data
    job = data["job"] or {}
    failed = [p for p in data["phases"] if p["phase"] == "Failed"]
    reason = (failed[-1]["reason"] if failed else "") or job.get("message") or ""
    step = next((source for source in logs if source and source in reason), None)
    if step is None and logs:
        # the step whose logs end last is the one that was running when the job stopped
        step = next(reversed(logs))
    data["failing_step"] = step
    data["failing_step_reason"] = reason
    data["failing_step_logs"] = logs.get(step, []) if step else list(job.get("log_tail") or [])
    data["log_sources"] = sorted(logs)
    return data


def render_markdown(data: dict[str, Any]) -> str:
    lines = [f"# Diagnostics: {data['notebook']}", "", f"**{data['status']}** — {data['message']}", ""]
    if data.get("cause"):
        lines.append(f"- first error (the cause): `{data['cause']}`")
    where = f"- notebook `{data.get('path')}`"
    if data.get("blueprint"):
        where += f", blueprint `{data['blueprint']}`"
    lines.append(f"{where}, backend `{data['backend']}`, kernel `{data.get('kernel')}`")
    lines.append(f"- papermill exit code: {data['returncode']}")
    cluster = data.get("cluster")
    if cluster:
        lines.append(
            f"- namespace `{cluster.get('namespace')}`: {len(data.get('trainjobs') or [])} TrainJob(s) created"
        )
        lines += [f"- note: {note}" for note in cluster.get("notes") or []]
    job = data.get("job") or {}
    if job:
        lines.append(f"- job `{job.get('id')}`: phase **{job.get('phase')}** {job.get('message') or ''}".rstrip())
    if data.get("failing_step"):
        lines.append(f"- failing step: `{data['failing_step']}` {data.get('failing_step_reason') or ''}".rstrip())
    for err in data.get("errors") or []:
        lines.append(f"- note: {err}")
    cell = data.get("failing_cell")
    if cell:
        label = f"In [{cell['execution_count']}]" if cell.get("execution_count") else f"cell {cell['cell_index']}"
        lines += ["", f"## Failing cell ({label})", "", "```python", cell["cell_source_head"], "```"]
        lines += ["", "```", *cell["traceback"][-15:], "```"]  # its last line is the error itself
    lines += _render_trainjobs(data.get("trainjobs") or [])
    if data.get("phases"):
        lines += ["", "## Phases", ""]
        lines += [f"- {p['phase']}{': ' + p['reason'] if p['reason'] else ''}" for p in data["phases"]]
    if data.get("cluster_events"):
        lines += ["", "## Cluster events", ""]
        lines += [f"- {e['kind']} {e['reason']}: {e['message']}" for e in data["cluster_events"]]
    if data.get("failing_step_logs"):
        lines += ["", f"## Logs: {data.get('failing_step') or 'job'}", "", "```", *data["failing_step_logs"], "```"]
    if data.get("papermill_log_tail") and not cell:  # with a failing cell, the log's tail is its traceback again
        lines += ["", "## papermill log (tail)", "", "```", *data["papermill_log_tail"][-25:], "```"]
    return "\n".join(lines) + "\n"


def _render_trainjobs(jobs: list[dict[str, Any]]) -> list[str]:
    """The cluster's TrainJobs created during the notebook: one section each."""
    lines: list[str] = []
    for job in jobs:
        conds = [c for c in job.get("conditions") or [] if str(c.get("status")) == "True"]
        lines += ["", f"## TrainJob `{job['name']}`: {job['state']}", ""]
        lines.append(f"- created {job.get('created')}")
        for c in conds:
            lines.append(f"- condition {c['type']}: {c.get('reason') or ''} {c.get('message') or ''}".rstrip())
        for c in job.get("jobset_conditions") or []:
            if str(c.get("status")) == "True":
                lines.append(f"- JobSet {c['type']}: {c.get('reason') or ''} {c.get('message') or ''}".rstrip())
        for pod in job.get("pods") or []:
            lines.append(
                f"- pod `{pod['name']}` ({pod.get('step')}): {pod['phase']} {pod.get('detail') or ''}".rstrip()
            )
        for note in job.get("notes") or []:
            lines.append(f"- note: {note}")
        if job.get("events"):
            lines += ["", "Events:", ""]
            lines += [f"- {e['type']} {e['reason']} ({e['object']}): {e['message']}" for e in job["events"]]
        if job.get("failing_step_logs"):
            lines += [
                "",
                f"Failing step `{job.get('failing_step')}`, last lines:",
                "",
                "```",
                *job["failing_step_logs"],
            ]
            lines.append("```")
        if job.get("node0_logs"):
            lines += ["", f"node-0 `{job.get('node0_pod')}`, last lines:", "", "```", *job["node0_logs"], "```"]
        if job.get("controller_note"):
            lines += ["", job["controller_note"]]
        elif job.get("controller_logs"):
            lines += ["", "Trainer controller, lines about this TrainJob:", "", "```", *job["controller_logs"], "```"]
    return lines


def write(
    run: NotebookRun,
    home: Path,
    *,
    scrubber: Scrubber,
    default_backend: str = "local",
    cluster: dict[str, Any] | None = None,
) -> Path:
    """Write ``diagnostics.json`` and ``diagnostics.md`` into the notebook's output folder; returns the .md path."""
    data = collect(run, home, default_backend=default_backend, cluster=cluster)
    text = json.dumps(data, indent=2, default=str)
    (run.out_dir / "diagnostics.json").write_text(scrubber.text(text) + "\n", encoding="utf-8")
    md = run.out_dir / "diagnostics.md"
    md.write_text(scrubber.text(render_markdown(data)), encoding="utf-8")
    return md
