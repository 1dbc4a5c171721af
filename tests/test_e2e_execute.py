"""``playground.e2e.execute``: a kernel that dies before it answers (a port taken between jupyter_client picking it
and the kernel binding it) is started again, since no cell ran; a kernel that keeps dying fails the notebook with
papermill's own error. Real papermill and a real ipykernel, behind a kernelspec whose first starts die."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

from playground.e2e import execute

LAUNCHER = """
import os, pathlib, sys
starts = pathlib.Path(sys.argv[1])
count = int(starts.read_text()) + 1 if starts.exists() else 1
starts.write_text(str(count))
if count <= int(sys.argv[2]):
    sys.exit("Address already in use (as a kernel whose port was taken)")
os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", sys.argv[3]])
"""


def _request(tmp_path: Path, kernel: str) -> dict:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    notebook.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    source = tmp_path / "in.ipynb"
    nbformat.write(notebook, source)
    return {"input": str(source), "output": str(tmp_path / "out.ipynb"), "parameters": {}, "kernel": kernel,
            "cwd": str(tmp_path), "cell_timeout": 120}  # fmt: skip


def _kernel_dying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deaths: int) -> tuple[str, Path]:
    """A kernelspec (on JUPYTER_PATH) whose first ``deaths`` starts exit at once; its start counter file."""
    launcher, starts = tmp_path / "launcher.py", tmp_path / "starts"
    launcher.write_text(LAUNCHER)
    spec = tmp_path / "jupyter" / "kernels" / "dies-first"
    spec.mkdir(parents=True)
    argv = [sys.executable, str(launcher), str(starts), str(deaths), "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "dies first", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "dies-first", starts


def test_a_kernel_that_died_starting_is_started_again(tmp_path: Path, monkeypatch, capsys) -> None:
    kernel, starts = _kernel_dying(tmp_path, monkeypatch, deaths=2)
    outcome = execute.execute(_request(tmp_path, kernel))
    assert outcome.ok, outcome
    assert starts.read_text() == "3"  # two deaths, then the kernel that ran the notebook
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert out.cells[0].outputs[0]["text"].strip() == "42"
    assert capsys.readouterr().err.count("the kernel died before it answered") == 2


def test_a_kernel_that_keeps_dying_fails_the_notebook(tmp_path: Path, monkeypatch) -> None:
    kernel, starts = _kernel_dying(tmp_path, monkeypatch, deaths=99)
    outcome = execute.execute(_request(tmp_path, kernel))
    assert not outcome.ok and "Kernel died before replying to kernel_info" in outcome.message
    assert starts.read_text() == str(execute.KERNEL_STARTS)
