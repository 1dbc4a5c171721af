"""Diagnostics for a failed e2e notebook: the failing cell, the job's status, its events (phases,
cluster events, queue decisions) and the failing step's logs, from the backend the notebook used
(named in its ``result.json``, else in its parameters). Written next to the executed notebook."""

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

    if name == "local":
        if not home.exists():
            return None
        return get_backend("local", home=home)
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
                    "cell_source_head": "\n".join(source.splitlines()[:15]),
                    "ename": output.get("ename"),
                    "evalue": output.get("evalue"),
                    "traceback": [_ANSI.sub("", line) for line in output.get("traceback", [])][-30:],
                }
    return None


def collect(run: NotebookRun, home: Path, *, default_backend: str = "local") -> dict[str, Any]:
    """Everything known about why ``run`` failed, as a JSON-ready dict."""
    from playground.events import ClusterEvent, Log, Phase

    backend_name = _backend_name(run, default_backend)
    data: dict[str, Any] = {
        "notebook": run.name,
        "blueprint": run.blueprint_id,
        "status": run.status,
        "message": run.message,
        "returncode": run.returncode,
        "backend": backend_name,
        "parameters": run.parameters,
        "failing_cell": notebook_failure(run.executed),
        "papermill_log_tail": run.log_tail,
        "job": run.job,
        "phases": [],
        "cluster_events": [],
        "failing_step": None,
        "failing_step_logs": [],
        "errors": [],
    }
    job_id = (run.job or {}).get("id") or _job_id(run)
    if not job_id:
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
    lines = [
        f"# Diagnostics: {data['notebook']}",
        "",
        f"- status: **{data['status']}** — {data['message']}",
        f"- blueprint: `{data['blueprint']}`, backend: `{data['backend']}`, papermill exit code: {data['returncode']}",
    ]
    job = data.get("job") or {}
    if job:
        lines.append(f"- job `{job.get('id')}`: phase **{job.get('phase')}** {job.get('message') or ''}".rstrip())
    if data.get("failing_step"):
        lines.append(f"- failing step: `{data['failing_step']}` {data.get('failing_step_reason') or ''}".rstrip())
    for err in data.get("errors") or []:
        lines.append(f"- note: {err}")
    cell = data.get("failing_cell")
    if cell:
        lines += ["", f"## Failing cell ({cell['cell_index']})", "", "```python", cell["cell_source_head"], "```"]
        lines += ["", "```", f"{cell['ename']}: {cell['evalue']}", *cell["traceback"][-15:], "```"]
    if data.get("phases"):
        lines += ["", "## Phases", ""]
        lines += [f"- {p['phase']}{': ' + p['reason'] if p['reason'] else ''}" for p in data["phases"]]
    if data.get("cluster_events"):
        lines += ["", "## Cluster events", ""]
        lines += [f"- {e['kind']} {e['reason']}: {e['message']}" for e in data["cluster_events"]]
    if data.get("failing_step_logs"):
        lines += ["", f"## Logs: {data.get('failing_step') or 'job'}", "", "```", *data["failing_step_logs"], "```"]
    if data.get("papermill_log_tail"):
        lines += ["", "## papermill log (tail)", "", "```", *data["papermill_log_tail"][-25:], "```"]
    return "\n".join(lines) + "\n"


def write(run: NotebookRun, home: Path, *, scrubber: Scrubber, default_backend: str = "local") -> Path:
    """Write ``diagnostics.json`` and ``diagnostics.md`` into the notebook's output folder; returns the .md path."""
    data = collect(run, home, default_backend=default_backend)
    text = json.dumps(data, indent=2, default=str)
    (run.out_dir / "diagnostics.json").write_text(scrubber.text(text) + "\n", encoding="utf-8")
    md = run.out_dir / "diagnostics.md"
    md.write_text(scrubber.text(render_markdown(data)), encoding="utf-8")
    return md
