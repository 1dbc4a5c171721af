"""The same greedy answers on transformers 5.x and 4.57.x (the 4.x line KServe's HuggingFace runtime images
still ship): a model directory's token ids compared prompt by prompt, failing on the first differing token.

    python -m playground.models.fidelity DIR [DIR ...] [--prompt TEXT ...] [--max-new-tokens N]
    python -m playground.models.fidelity --prepare      # only build the transformers 4.57.x environment

Each directory answers its prompts (default: every catalog blueprint's example prompts) through
:mod:`playground.models.kserve_load` twice, in child processes of this interpreter: once with the installed
transformers, once with transformers 4.57.x put in front of it on ``PYTHONPATH``. Exit 0 when every answer
is token-identical, 1 naming the directory, the prompt and the first differing token otherwise.

The 4.57.x environment is ``pip install --no-deps --target`` of the pinned :data:`TF4_PINS` (transformers
with the huggingface-hub and tokenizers releases it accepts; ~135 MB, seconds to build), cached under
``$PLAYGROUND_TF4_CACHE`` (default: the user cache dir) keyed by the pins and the Python version, built
once under a file lock and renamed into place when complete. Everything else (torch, safetensors,
numpy...) is this interpreter's own, so nothing is installed twice and a project installed in a venv works
as it does outside one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# transformers 4.57.x with what it requires of the two packages the 5.x line moved past (huggingface-hub<1.0,
# tokenizers<=0.23.0); its other requirements (safetensors, numpy, regex, ...) are satisfied by this environment.
TF4_PINS = ("transformers==4.57.6", "huggingface-hub==0.36.2", "tokenizers==0.22.2")
# pip's messages when the package index cannot be reached (as opposed to a package that does not resolve)
PIP_NETWORK_ERRORS = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "NewConnectionError",
    "ProxyError",
    "No route to host",
)
DEFAULT_MAX_NEW_TOKENS = 24


class RegistryUnreachable(RuntimeError):
    """The package index could not be reached to build the transformers 4.x environment."""


@dataclass(frozen=True)
class Tf4Environment:
    """A directory that, first on ``PYTHONPATH``, makes this interpreter import transformers 4.57.x."""

    path: Path
    version: str
    built_seconds: float | None  # None: found in the cache

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.path), env.get("PYTHONPATH", "")) if p)
        return env


def tf4_cache_root() -> Path:
    env = os.environ.get("PLAYGROUND_TF4_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("blueprint-playground", appauthor=False)) / "transformers4"


def _key() -> str:
    text = "\n".join((*TF4_PINS, f"{sys.version_info.major}.{sys.version_info.minor}", sys.platform))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _dist_info(path: Path, pin: str) -> Path:
    """Where pip records the pinned distribution inside the ``--target`` directory ``path``."""
    name, version = pin.split("==")
    return path / f"{name.replace('-', '_')}-{version}.dist-info"


def _installed_version(path: Path) -> str | None:
    """The transformers version this interpreter imports with ``path`` first on its path, or None."""
    proc = subprocess.run(
        [sys.executable, "-c", "import transformers, tokenizers, huggingface_hub; print(transformers.__version__)"],
        env={**Tf4Environment(path, "", None).env(), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def ensure_tf4_environment(root: Path | None = None, *, say=None) -> Tf4Environment:
    """The cached transformers 4.57.x environment, built first when missing (see the module docstring).

    Raises :class:`RegistryUnreachable` when pip cannot reach the index, RuntimeError on any other failure."""
    from filelock import FileLock

    say = say or (lambda message: print(message, file=sys.stderr, flush=True))
    root = (root or tf4_cache_root()).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"tf4-{_key()}"
    wanted = TF4_PINS[0].split("==")[1]
    with FileLock(str(root / f".{target.name}.lock")):
        if (target / "ready").is_file():  # verified by importing it when built
            if all(_dist_info(target, pin).is_dir() for pin in TF4_PINS):
                return Tf4Environment(target, wanted, None)
            shutil.rmtree(target)  # damaged: build it again
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                 "--no-input", "--target", str(tmp), *TF4_PINS],
                capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            output = (proc.stdout + proc.stderr).strip()
            if proc.returncode != 0:
                last = " | ".join(output.splitlines()[-3:])
                if any(marker in output for marker in PIP_NETWORK_ERRORS):
                    raise RegistryUnreachable(f"pip could not reach the package index for {' '.join(TF4_PINS)}: {last}")
                raise RuntimeError(f"pip install {' '.join(TF4_PINS)} failed (exit {proc.returncode}): {last}")
            version = _installed_version(tmp)
            if version != wanted:
                raise RuntimeError(f"{tmp} imports transformers {version}, expected {wanted}")
            (tmp / "ready").write_text(json.dumps({"pins": TF4_PINS, "python": sys.version}) + "\n")
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        built = time.monotonic() - started
        say(f"built the transformers {version} environment in {built:.1f}s: {target}")
        return Tf4Environment(target, version, built)


def greedy_answers(
    models: list[dict[str, Any]], *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """:mod:`playground.models.kserve_load`'s report for ``models`` ([{"dir", "prompts"}]), in a child
    process of this interpreter with ``env`` (a :class:`Tf4Environment`'s for transformers 4.57.x)."""
    env = dict(os.environ if env is None else env)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.setdefault("TQDM_DISABLE", "1")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"models": models, "max_new_tokens": max_new_tokens}, fh)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "playground.models.kserve_load", fh.name],
            capture_output=True,
            text=True,
            timeout=1800,
            env=env,
            cwd=str(Path(__file__).resolve().parents[2]),  # this checkout's playground, whatever is installed
        )
    finally:
        os.unlink(fh.name)
    lines = proc.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, ValueError):
        report = {"error": f"exit {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-5:])}
    if proc.returncode != 0 or "error" in report:
        raise RuntimeError(f"loading {[m['dir'] for m in models]} failed: {report.get('error')}")
    return report


def first_difference(expected: dict[str, Any], actual: dict[str, Any]) -> str | None:
    """None when both reports hold the same token ids for every directory and prompt and the loaders read the
    same settings (RoPE, special tokens, context); else one line naming the directory, the prompt and the
    first token where they part (or the setting read differently)."""
    names = f"transformers {expected.get('transformers')} vs {actual.get('transformers')}"
    dirs_a = [m["dir"] for m in expected["models"]]
    dirs_b = [m["dir"] for m in actual["models"]]
    if dirs_a != dirs_b:
        return f"{names}: different directories {dirs_a} vs {dirs_b}"
    for model_a, model_b in zip(expected["models"], actual["models"], strict=True):
        prompts_a = [a["prompt"] for a in model_a["answers"]]
        if prompts_a != [b["prompt"] for b in model_b["answers"]]:
            return f"{names}: {model_a['dir']}: different prompts"
        for a, b in zip(model_a["answers"], model_b["answers"], strict=True):
            where = f"{names}: {model_a['dir']}: prompt {a['prompt']!r}"
            if a.get("prompt_ids") != b.get("prompt_ids"):
                ids = f"{a.get('prompt_ids')} vs {b.get('prompt_ids')}"
                return f"{where}: the chat template tokenizes differently ({ids})"
            ids_a, ids_b = a["token_ids"], b["token_ids"]
            for index, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)):
                if x != y:
                    return f"{where}: answer token {index} differs ({x} vs {y}); answers {a['text']!r} vs {b['text']!r}"
            if len(ids_a) != len(ids_b):
                return (
                    f"{where}: one answer stops after {min(len(ids_a), len(ids_b))} tokens, the other goes on "
                    f"({len(ids_a)} vs {len(ids_b)} tokens); answers {a['text']!r} vs {b['text']!r}"
                )
        read_a, read_b = model_a.get("read", {}), model_b.get("read", {})
        for key in sorted(set(read_a) | set(read_b)):  # the same answers, yet a setting read differently
            if read_a.get(key) != read_b.get(key):
                return (
                    f"{names}: {model_a['dir']}: the loaders read {key} as {read_a.get(key)!r} vs {read_b.get(key)!r}"
                )
    return None


def identical_count(expected: dict[str, Any], actual: dict[str, Any]) -> tuple[int, int]:
    """(answers with the same prompt and answer token ids, answers) over every directory."""
    pairs = [
        ((a.get("prompt_ids"), a["token_ids"]), (b.get("prompt_ids"), b["token_ids"]))
        for model_a, model_b in zip(expected["models"], actual["models"], strict=True)
        for a, b in zip(model_a["answers"], model_b["answers"], strict=True)
    ]
    return sum(a == b for a, b in pairs), len(pairs)


def example_prompts() -> list[str]:
    """Every catalog blueprint's example prompts, each once, in catalog order."""
    from playground.blueprints import load_catalog

    prompts = [example.prompt for blueprint in load_catalog().values() for example in blueprint.examples]
    return list(dict.fromkeys(prompts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m playground.models.fidelity",
        description="Check that model directories give token-identical greedy answers on the installed "
        "transformers and on transformers 4.57.x (KServe's HuggingFace runtime images).",
    )
    parser.add_argument("dirs", nargs="*", metavar="DIR", help="model directories")
    parser.add_argument("--prepare", action="store_true", help="only build the cached transformers 4.57.x environment")
    parser.add_argument("--prompt", action="append", default=None, help="a prompt (default: the blueprints' examples)")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    args = parser.parse_args(argv)
    if args.prepare:
        try:
            print(ensure_tf4_environment().path)
        except RuntimeError as exc:
            print(f"FAIL: {exc}")
            return 1
        return 0
    if not args.dirs:
        parser.error("give at least one model directory (or --prepare)")
    for directory in args.dirs:
        if (Path(directory) / "adapter_config.json").is_file():  # a LoRA job's model: checked merged
            parser.error(f"{directory!r} is a LoRA adapter; check its merged export (playground export JOB --merged)")
        if not (Path(directory) / "config.json").is_file():
            parser.error(f"{directory!r} is not a model directory (no config.json)")
    prompts = args.prompt or example_prompts()
    models = [{"dir": str(Path(d).resolve()), "prompts": prompts} for d in args.dirs]
    try:
        tf4 = ensure_tf4_environment()
        with ThreadPoolExecutor(1) as pool:  # both versions at once (mostly imports and loads)
            pending = pool.submit(greedy_answers, models, max_new_tokens=args.max_new_tokens, env=tf4.env())
            current = greedy_answers(models, max_new_tokens=args.max_new_tokens)
            older = pending.result()
    except RuntimeError as exc:  # RegistryUnreachable included
        print(f"FAIL: {exc}")
        return 1
    same, total = identical_count(current, older)
    difference = first_difference(current, older)
    versions = f"transformers {current['transformers']} and {older['transformers']}"
    print(f"{same}/{total} answers token-identical on {versions}")
    if difference:
        print(f"FAIL: {difference}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
