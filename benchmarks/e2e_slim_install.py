"""The slim `playground e2e` install for CI runners (issue 19): install time, size and start-up time.

Creates a fresh venv (no system site packages), installs ``requirements/e2e.txt`` and the project with
``--no-deps`` as the composite action does, checks that torch/transformers/voila/kubeflow are absent,
and times ``playground e2e --help`` (goal: start in under 2 s). Needs the package registry.

    python benchmarks/e2e_slim_install.py [--venv DIR] [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def _size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=None, help="where to build it (default: a temp dir)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    venv = args.venv or Path(tempfile.mkdtemp(prefix="playground-slim-")) / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    t_venv = _timed([sys.executable, "-m", "venv", str(venv)])
    t_reqs = _timed([*pip, "-r", str(REPO / "requirements" / "e2e.txt")])
    t_project = _timed([*pip, "--no-deps", str(REPO)])
    absent = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print([m for m in ('torch', 'transformers', 'voila', "
         "'kubeflow', 'ipywidgets') if u.find_spec(m)])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    starts = [_timed([str(venv / "bin" / "playground"), "e2e", "--help"]) for _ in range(args.repeats)]
    print(f"venv: {t_venv:.1f} s; requirements/e2e.txt: {t_reqs:.1f} s; project --no-deps: {t_project:.1f} s")
    print(f"venv size: {_size_mb(venv):.0f} MB; heavy packages present: {absent}")
    print(
        f"`playground e2e --help` start: median {statistics.median(starts):.3f} s, "
        f"min {min(starts):.3f} s, max {max(starts):.3f} s ({args.repeats} runs; goal < 2 s)"
    )
    return 0 if absent == "[]" and statistics.median(starts) < 2 else 1


if __name__ == "__main__":
    sys.exit(main())
