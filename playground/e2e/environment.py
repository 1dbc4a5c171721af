"""What a foreign notebook did to the Python environment: the installed distributions, read with
``importlib.metadata`` by the kernel's own interpreter before and after the notebook, and their difference
(an upstream notebook's ``pip install`` cell once brought a torchvision that broke every later training run).
With ``--isolated-env`` a foreign notebook runs in a throwaway virtual environment instead
(``--system-site-packages``: it sees everything installed, and its installs land in the throwaway one)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SNAPSHOT_TIMEOUT = 60.0
# Prints {name: version} of every distribution the interpreter sees (the first one found wins, as imports do).
_SNAPSHOT = """
import json
from importlib import metadata
seen = {}
for dist in metadata.distributions():
    name = (dist.metadata["Name"] or "").strip()
    if name:
        seen.setdefault(name.lower().replace("_", "-"), dist.version)
print(json.dumps(seen))
"""


@dataclass
class EnvChanges:
    """Distributions a notebook installed, changed (old → new version) or removed."""

    installed: dict[str, str] = field(default_factory=dict)
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)
    note: str = ""  # why the environment could not be compared ('' when it was)

    def __bool__(self) -> bool:
        return bool(self.installed or self.changed or self.removed)

    def lines(self) -> list[str]:
        """One short line per change: ``installed torchvision 0.28.0``, ``changed numpy 1.26.4 → 2.0.0``."""
        return (
            [f"installed {name} {version}" for name, version in sorted(self.installed.items())]
            + [f"changed {name} {old} → {new}" for name, (old, new) in sorted(self.changed.items())]
            + [f"removed {name} {version}" for name, version in sorted(self.removed.items())]
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "installed": self.installed,
            "changed": {name: {"before": old, "after": new} for name, (old, new) in self.changed.items()},
            "removed": self.removed,
        }
        if self.note:
            data["note"] = self.note
        return data


def kernel_python(kernel: str | None, notebook: Path) -> str:
    """The interpreter a notebook's kernel runs: the kernelspec's (``kernel``, else the notebook's own), with
    ``python``/``python3`` meaning this interpreter as jupyter_client resolves it; this one when unknown."""
    name = kernel
    if name is None:
        try:
            name = json.loads(notebook.read_text(encoding="utf-8"))["metadata"]["kernelspec"]["name"]
        except (OSError, ValueError, KeyError, TypeError):
            name = None
    if not name:
        return sys.executable
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        argv = KernelSpecManager().get_kernel_spec(name).argv
    except Exception:  # no such kernel: papermill says so; the snapshot uses this interpreter
        return sys.executable
    major, minor = sys.version_info[:2]
    if not argv or argv[0] in ("python", f"python{major}", f"python{major}.{minor}"):
        return sys.executable
    return argv[0]


def snapshot(python: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``{distribution: version}`` as ``python`` sees them (with ``env``: the notebook's environment)."""
    out = subprocess.run(
        [python, "-c", _SNAPSHOT],
        capture_output=True,
        text=True,
        timeout=SNAPSHOT_TIMEOUT,
        env=env,
        stdin=subprocess.DEVNULL,
        check=True,
    ).stdout
    return {str(k): str(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def diff(before: dict[str, str], after: dict[str, str]) -> EnvChanges:
    """What changed from ``before`` to ``after``."""
    return EnvChanges(
        installed={name: after[name] for name in after.keys() - before.keys()},
        changed={
            name: (before[name], after[name]) for name in before.keys() & after.keys() if before[name] != after[name]
        },
        removed={name: before[name] for name in before.keys() - after.keys()},
    )


class Watch:
    """Snapshot before a notebook (:meth:`start`), compare after (:meth:`changes`); never fails the run."""

    def __init__(self, python: str, env: dict[str, str] | None = None) -> None:
        self.python, self.env = python, env
        self.before: dict[str, str] | None = None
        self.note = ""

    def start(self) -> None:
        try:
            self.before = snapshot(self.python, self.env)
        except (OSError, ValueError, IndexError, subprocess.SubprocessError) as exc:
            self.note = f"the environment could not be read before the notebook ({type(exc).__name__})"

    def changes(self) -> EnvChanges:
        if self.before is None:
            return EnvChanges(note=self.note)
        try:
            return diff(self.before, snapshot(self.python, self.env))
        except (OSError, ValueError, IndexError, subprocess.SubprocessError) as exc:
            return EnvChanges(note=f"the environment could not be read after the notebook ({type(exc).__name__})")


# -- a throwaway environment -----------------------------------------------------------------------------

THROWAWAY_KERNEL = "playground-e2e-throwaway"


def make_throwaway(root: Path, python: str = sys.executable) -> tuple[Path, dict[str, str]]:
    """A virtual environment under ``root`` that sees ``python``'s packages (``--system-site-packages``) and a
    kernelspec for it; returns (its python, the environment variables that make Jupyter find the kernel).

    The notebook's ``pip install`` lands in it and goes with it; the main environment stays as it was.
    """
    target = root / "venv"
    if Path(python).resolve() == Path(sys.executable).resolve():
        venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(target)
    else:
        subprocess.run([python, "-m", "venv", "--system-site-packages", "--without-pip", str(target)], check=True)
    venv_python = target / "bin" / "python"
    _link_pip(venv_python)
    kernels = root / "jupyter" / "kernels" / THROWAWAY_KERNEL
    kernels.mkdir(parents=True)
    spec = {
        "argv": [str(venv_python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (throwaway e2e environment)",
        "language": "python",
    }
    (kernels / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return venv_python, {"JUPYTER_PATH": str(root / "jupyter"), "VIRTUAL_ENV": str(target)}


def _link_pip(venv_python: Path) -> None:
    """``pip`` in the throwaway environment without downloading it: the system pip, run by the venv's python
    (``python -m pip`` finds it through the system site packages and installs into the venv's prefix)."""
    bin_dir = venv_python.parent
    script = bin_dir / "pip"
    script.write_text(f'#!/bin/sh\nexec "{venv_python}" -m pip "$@"\n', encoding="utf-8")
    script.chmod(0o755)


def remove_throwaway(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
