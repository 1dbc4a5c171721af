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


def junit_xml(run: RunReport) -> ET.ElementTree:
    """One ``<testsuite>`` for the run, one ``<testcase>`` per notebook (timeouts are failures too)."""
    suites = ET.Element("testsuites", name="playground-e2e")
    failures = sum(1 for n in run.notebooks if n.status in ("failed", "timeout"))
    errors = sum(1 for n in run.notebooks if n.status == "error")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"playground-e2e.{run.profile}",
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
            classname=f"notebooks.{run.profile}",
            name=nb.name,
            file=str(nb.notebook),
            time=f"{nb.wall_seconds:.3f}",
        )
        if nb.status in ("failed", "timeout", "error"):
            tag = "error" if nb.status == "error" else "failure"
            node = ET.SubElement(case, tag, message=nb.message or nb.status, type=nb.status)
            body = [nb.message]
            if nb.diagnostics:
                body.append(f"diagnostics: {nb.diagnostics}")
            body += nb.log_tail[-30:]
            node.text = "\n".join(body)
        out_lines = [f"{k}: {v}" for k, v in {**nb.timings, **nb.resources.to_dict()}.items() if v is not None]
        if nb.dropped_parameters:
            out_lines.append(f"parameters not declared by the notebook: {', '.join(nb.dropped_parameters)}")
        ET.SubElement(case, "system-out").text = "\n".join(out_lines)
    for name in run.skipped:
        case = ET.SubElement(suite, "testcase", classname=f"notebooks.{run.profile}", name=name, time="0")
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
    """A Markdown summary for people (and ``$GITHUB_STEP_SUMMARY``)."""
    passed = sum(1 for nb in run.notebooks if nb.passed)
    total = len(run.notebooks) + len(run.skipped)
    verdict = "passed" if run.ok else "FAILED"
    gpu = ", ".join(run.gpu.names) if run.gpu.present else "none (CPU)"
    lines = [
        f"## Blueprint e2e ({run.profile}): {passed}/{total} notebooks passed — {verdict}",
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
        "| notebook | blueprint | result | wall | queue wait | train | CPU avg | GPU avg / peak | GPU mem peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for nb in run.notebooks:
        r = nb.resources
        lines.append(
            f"| `{nb.name}` | `{nb.blueprint_id or '?'}` | {_ICON.get(nb.status, '')} {nb.status} | "
            f"{_fmt_s(nb.wall_seconds)} | {_fmt_s(nb.timings.get('queue_wait_seconds'))} | "
            f"{_fmt_s(nb.timings.get('train_seconds'))} | {_fmt_pct(r.cpu_avg_percent)} | "
            f"{_fmt_pct(r.gpu_util_avg_percent)} / {_fmt_pct(r.gpu_util_peak_percent)} | "
            f"{_fmt_bytes(r.gpu_memory_peak_bytes)} |"
        )
    for name in run.skipped:
        lines.append(f"| `{name}` | | ⏭️ skipped | | | | | | |")
    failed = run.failed
    if failed:
        lines += ["", "### Failures", ""]
        for nb in failed:
            lines.append(f"- **{nb.name}** ({nb.status}): {_md_escape(nb.message)}")
            if nb.diagnostics:
                lines.append(f"  diagnostics: `{nb.diagnostics}`")
    lines += [
        "",
        f"Artifacts: executed notebooks, `result.json`, `junit.xml`, `metrics.json` in `{run.out}`.",
        "",
    ]
    return "\n".join(lines)


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
