"""Run reports: ``junit.xml`` (written with the standard library's ``xml.etree``: no maintained JUnit
library is installed), ``metrics.json`` and ``summary.md`` (Markdown for ``$GITHUB_STEP_SUMMARY``,
appended there too when that variable is set). Every text goes through the scrubber."""

from __future__ import annotations

import json
import os
import socket
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

from playground.e2e.scrub import Scrubber

if TYPE_CHECKING:
    from playground.e2e.types import RunReport

METRICS_SCHEMA = "playground-e2e-metrics/v1"


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))


def suite_name(run: RunReport) -> str:
    """``playground-e2e.<profile>`` for the project's notebooks; else the run's title."""
    return f"playground-e2e.{run.profile}" if run.blueprint_run and not run.title else run.heading


def junit_xml(run: RunReport) -> ET.ElementTree:
    """One ``<testsuite>`` for the run, one ``<testcase>`` per notebook (timeouts are failures too); a
    failure's message is the notebook's own first error line (the failing cell's ``ename: evalue``)."""
    suites = ET.Element("testsuites", name="playground-e2e")
    failures = sum(1 for n in run.notebooks if n.status in ("failed", "timeout"))
    errors = sum(1 for n in run.notebooks if n.status == "error")
    classname = suite_name(run)
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=classname,
        tests=str(len(run.notebooks) + len(run.skipped)),
        failures=str(failures),
        errors=str(errors),
        skipped=str(len(run.skipped)),
        time=f"{run.wall_seconds:.3f}",
        timestamp=_iso(run.started_at),
        hostname=socket.gethostname(),
    )
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("title", run.heading),
        ("profile", run.profile),
        ("backend", run.backend),
        ("gpu", ", ".join(run.gpu.names) or "none"),
        ("cell_timeout_seconds", run.cell_timeout),
        ("run_timeout_seconds", run.run_timeout),
    ):
        ET.SubElement(props, "property", name=key, value=str(value))
    suites.set("tests", suite.get("tests", "0"))
    suites.set("failures", str(failures))
    suites.set("errors", str(errors))
    suites.set("time", f"{run.wall_seconds:.3f}")
    for nb in run.notebooks:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=classname,
            name=nb.name,
            file=str(nb.notebook),
            time=f"{nb.wall_seconds:.3f}",
        )
        if nb.status in ("failed", "timeout", "error"):
            tag = "error" if nb.status == "error" else "failure"
            node = ET.SubElement(case, tag, message=nb.first_error or nb.message or nb.status, type=nb.status)
            body = [nb.message] + ([f"cause: {nb.cause}"] if nb.cause else [])
            if nb.diagnostics:
                body.append(f"diagnostics: {nb.diagnostics}")
            body += nb.log_tail[-30:]
            node.text = "\n".join(body)
        out_lines = [f"{k}: {v}" for k, v in {**nb.timings, **nb.resources.to_dict()}.items() if v is not None]
        if nb.dropped_parameters:
            out_lines.append(f"parameters not declared by the notebook: {', '.join(nb.dropped_parameters)}")
        ET.SubElement(case, "system-out").text = "\n".join(out_lines)
    for name in run.skipped:
        case = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0")
        ET.SubElement(case, "skipped", message="not run: an earlier notebook failed and --fail-fast stopped the run")
    ET.indent(suites)
    return ET.ElementTree(suites)


def metrics(run: RunReport) -> dict[str, Any]:
    """The run's figures: per notebook wall/queue/train time, CPU and GPU use; run totals."""
    notebooks = [nb.to_dict() for nb in run.notebooks]
    for entry, nb in zip(notebooks, run.notebooks, strict=True):
        entry["result"] = nb.result
    passed = sum(1 for nb in run.notebooks if nb.passed)
    return {
        "schema": METRICS_SCHEMA,
        "title": run.heading,
        "profile": run.profile,
        "backend": run.backend,
        "started_at": run.started_at,
        "started_at_iso": _iso(run.started_at),
        "wall_seconds": round(run.wall_seconds, 3),
        "cell_timeout_seconds": run.cell_timeout,
        "run_timeout_seconds": run.run_timeout,
        "gpu": {
            "present": run.gpu.present,
            "count": run.gpu.count,
            "names": run.gpu.names,
            "driver": run.gpu.driver,
            "note": run.gpu.error,
            "sampled_with": "NVML (pynvml)" if run.gpu.present else None,
        },
        "cpu_sampled_with": "psutil.cpu_percent (system-wide)",
        "resources": run.resources.to_dict(),
        "totals": {
            "notebooks": len(run.notebooks) + len(run.skipped),
            "passed": passed,
            "failed": len(run.notebooks) - passed,
            "skipped": len(run.skipped),
            "queue_wait_seconds": _sum(nb.timings.get("queue_wait_seconds") for nb in run.notebooks),
            "train_seconds": _sum(nb.timings.get("train_seconds") for nb in run.notebooks),
        },
        "notebooks": notebooks,
        "skipped": run.skipped,
        "environment_problems": run.environment_problems,
    }


def _sum(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present), 3) if present else None


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "–"
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def _fmt_pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}%"


def _fmt_bytes(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**30:.2f} GiB"


_ICON = {"passed": "✅", "failed": "❌", "timeout": "⏱️", "error": "💥"}


def summary_markdown(run: RunReport) -> str:
    """A Markdown summary for people (and ``$GITHUB_STEP_SUMMARY``): a row per notebook with its verdict,
    time, GPU figures and first error line; the blueprint columns only when a notebook ran a blueprint."""
    passed = sum(1 for nb in run.notebooks if nb.passed)
    total = len(run.notebooks) + len(run.skipped)
    verdict = "passed" if run.ok else "FAILED"
    gpu = ", ".join(run.gpu.names) if run.gpu.present else "none (CPU)"
    blueprints = any(nb.blueprint_id or nb.timings.get("train_seconds") is not None for nb in run.notebooks)
    header = (
        ["notebook", "blueprint", "result", "wall", "queue wait", "train"] if blueprints else ["notebook", "result"]
    )
    header += ["time"] if not blueprints else []
    header += ["CPU avg", "GPU avg / peak", "GPU mem peak", "first error"]
    lines = [
        f"## {_md_escape(run.heading)}: {passed}/{total} notebooks passed — {verdict}",
        "",
        f"Backend `{run.backend}` · GPU: {gpu} · wall time {_fmt_s(run.wall_seconds)} · "
        f"CPU avg {_fmt_pct(run.resources.cpu_avg_percent)}"
        + (
            f" · GPU util avg {_fmt_pct(run.resources.gpu_util_avg_percent)} / peak "
            f"{_fmt_pct(run.resources.gpu_util_peak_percent)} · peak GPU memory "
            f"{_fmt_bytes(run.resources.gpu_memory_peak_bytes)}"
            if run.gpu.present
            else ""
        ),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for nb in run.notebooks:
        r = nb.resources
        cells = [f"`{nb.name}`"]
        if blueprints:
            cells.append(f"`{nb.blueprint_id}`" if nb.blueprint_id else "–")
        cells += [f"{_ICON.get(nb.status, '')} {nb.status}", _fmt_s(nb.wall_seconds)]
        if blueprints:
            cells += [_fmt_s(nb.timings.get("queue_wait_seconds")), _fmt_s(nb.timings.get("train_seconds"))]
        cells += [
            _fmt_pct(r.cpu_avg_percent),
            f"{_fmt_pct(r.gpu_util_avg_percent)} / {_fmt_pct(r.gpu_util_peak_percent)}",
            _fmt_bytes(r.gpu_memory_peak_bytes),
            _md_escape(_cut(nb.first_error, 160)) if not nb.passed else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for name in run.skipped:
        cells = [f"`{name}`"] + ([""] if blueprints else []) + ["⏭️ skipped"]
        lines.append("| " + " | ".join(cells + [""] * (len(header) - len(cells))) + " |")
    failed = run.failed
    if failed:
        lines += ["", "### Failures", ""]
        for nb in failed:
            lines.append(f"- **{nb.name}** ({nb.status}): {_md_escape(nb.message)}")
            if nb.cause:
                lines.append(f"  first error (the cause): `{_md_escape(nb.cause)}`")
            for job in nb.trainjobs:
                lines.append(f"  TrainJob `{job['name']}`: {job['state']}")
            if nb.diagnostics:
                lines.append(f"  diagnostics: `{nb.diagnostics}`")
    lines += environment_markdown(run)
    lines += [
        "",
        f"Artifacts: executed notebooks, `papermill.log`, `junit.xml`, `metrics.json` in `{run.out}`.",
        "",
    ]
    return "\n".join(lines)


def environment_markdown(run: RunReport) -> list[str]:
    """The stack check's problems, and the packages each foreign notebook installed, changed or removed."""
    lines: list[str] = []
    for problem in run.environment_problems:
        lines.append(f"- problem: {_md_escape(problem)} (see `playground doctor`)")
    for nb in run.notebooks:
        changes = nb.env_changes
        if changes is None or not (changes or changes.note):
            continue
        if not changes:
            lines.append(f"- **{nb.name}**: {_md_escape(changes.note)}")
            continue
        where = " (in its throwaway environment)" if nb.isolated_env else ""
        lines.append(f"- **{nb.name}** changed the environment{where}: {_md_escape('; '.join(changes.lines()))}")
    return ["", "### Environment", "", *lines] if lines else []


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_all(run: RunReport, *, scrubber: Scrubber) -> dict[str, Path]:
    """Write junit.xml, metrics.json and summary.md into the run's folder (and $GITHUB_STEP_SUMMARY)."""
    out = run.out
    paths = {"junit": out / "junit.xml", "metrics": out / "metrics.json", "summary": out / "summary.md"}
    tree = junit_xml(run)
    xml_text = ET.tostring(tree.getroot(), encoding="unicode", xml_declaration=True)
    paths["junit"].write_text(scrubber.text(xml_text) + "\n", encoding="utf-8")
    paths["metrics"].write_text(scrubber.text(json.dumps(metrics(run), indent=2, default=str)) + "\n", encoding="utf-8")
    summary = scrubber.text(summary_markdown(run))
    paths["summary"].write_text(summary, encoding="utf-8")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(summary + "\n")
        except OSError:
            pass
    return paths
