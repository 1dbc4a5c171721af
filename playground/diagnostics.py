"""The real cause of a failure, in one line, with the fix where one is known.

A crash deep in an import reaches the user wrapped: transformers' lazy import turns
``RuntimeError: operator torchvision::nms does not exist`` (a torchvision built for another torch)
into ``ModuleNotFoundError: Could not import module 'LlamaConfig'…``. These helpers find the innermost
cause, from an exception chain (:func:`explain_exception`) or from a log's traceback text
(:func:`explain_log`), and state it in one line (:func:`explain`); :func:`without_tracebacks` folds the
traceback blocks of a log into that one line for people who must not see frames or paths (booth
visitors). Standard library only: the trainer, the servers, the CLI and the widgets all import it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from playground.errors import UserError, one_line

CAUSE_LIMIT = 400  # characters of an exception message kept in a one-line cause
TORCH_COMPANIONS = ("torchvision", "torchaudio")  # compiled against one torch build; break on any other
TORCH_INDEX = "https://download.pytorch.org/whl"
TRACEBACK_HEADER = "Traceback (most recent call last):"
CHAIN_SEPARATORS = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
# Importable module -> the distribution to install, where the names differ.
DISTRIBUTION_OF = {
    "PIL": "pillow",
    "yaml": "pyyaml",
    "sklearn": "scikit-learn",
    "cv2": "opencv-python",
    "flask": "mlflow (the full package, not mlflow-skinny)",
    "google": "protobuf",
}
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line \d+')
_CARETS = re.compile(r"^\s+[\^~\s]+$")
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
_NO_MODULE = re.compile(r"No module named '(?P<module>[\w.]+)'")
_UNDEFINED_SYMBOL = re.compile(r"undefined symbol", re.IGNORECASE)


@dataclass(frozen=True)
class Cause:
    """The innermost exception of a failure: its type name, first message line, and the top-level module
    whose code raised it ('' when unknown)."""

    kind: str
    message: str
    origin: str = ""
    origin_version: str = ""  # the origin's version from the dist-info beside its files (a log of another env)

    def line(self) -> str:
        """``Type: message`` on one line."""
        return f"{self.kind}: {self.message}" if self.message else self.kind


# -- finding the innermost cause ----------------------------------------------------------------------


def innermost(exc: BaseException) -> BaseException:
    """The exception at the bottom of ``exc``'s chain (``raise … from``, or raised while handling another).

    A :class:`~playground.errors.UserError` on the way is kept: its message is already written for a person.
    """
    seen: set[int] = set()
    current = exc
    while id(current) not in seen and not isinstance(current, UserError):
        seen.add(id(current))
        following = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
        if following is None:
            break
        current = following
    return current


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return one_line(line.strip(), CAUSE_LIMIT)
    return ""


def _origin_of_path(path: str) -> str:
    """The top-level package a source file belongs to: the part after site-/dist-packages, else a known
    compiled package named in the path."""
    parts = re.split(r"[/\\]", path)
    for index, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            return parts[index + 1].removesuffix(".py").split(".")[0]
    for name in (*TORCH_COMPANIONS, "vllm", "torch"):
        if name in parts[:-1]:
            return name
    return ""


def cause_of(exc: BaseException) -> Cause:
    """The :class:`Cause` of ``exc``: its innermost exception, and where that was raised."""
    inner = innermost(exc)
    origin = ""
    tb = inner.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        path = tb.tb_frame.f_code.co_filename
        origin = module.split(".")[0] if module and module != "__main__" else _origin_of_path(path)
    if isinstance(inner, ImportError) and inner.name and not origin:
        origin = inner.name.split(".")[0]
    return Cause(type(inner).__name__, _first_line(str(inner)), origin)


@dataclass
class _Block:
    """One printed traceback: where its header and exception line are, and the last frame's file."""

    header: int
    exception: int = -1
    last_path: str = ""


def _blocks(lines: list[str]) -> list[_Block]:
    blocks: list[_Block] = []
    for index, line in enumerate(lines):
        if line.strip() == TRACEBACK_HEADER:
            blocks.append(_Block(index))
            continue
        if not blocks or blocks[-1].exception >= 0:
            continue
        frame = _FRAME.match(line)
        if frame:
            blocks[-1].last_path = frame.group("path")
        elif line.strip() and not line[:1].isspace() and _EXCEPTION_LINE.match(line.strip()):
            blocks[-1].exception = index
    return [block for block in blocks if block.exception >= 0]


def _chained(lines: list[str], earlier: _Block, later: _Block) -> bool:
    between = [line.strip() for line in lines[earlier.exception + 1 : later.header] if line.strip()]
    return len(between) == 1 and between[0] in CHAIN_SEPARATORS


def _chains(lines: list[str]) -> list[list[_Block]]:
    chains: list[list[_Block]] = []
    for block in _blocks(lines):
        if chains and _chained(lines, chains[-1][-1], block):
            chains[-1].append(block)
        else:
            chains.append([block])
    return chains


def _cause_of_block(lines: list[str], block: _Block) -> Cause:
    match = _EXCEPTION_LINE.match(lines[block.exception].strip())
    kind = (match.group("type") if match else "Error").rsplit(".", 1)[-1]
    message = one_line((match.group("message") or "").strip(), CAUSE_LIMIT) if match else ""
    origin = _origin_of_path(block.last_path)
    return Cause(kind, message, origin, _version_beside(block.last_path, origin))


def _version_beside(path: str, package: str) -> str:
    """The version in the ``PACKAGE-*.dist-info`` next to the package directory ``path`` lies in ('' if none)."""
    parts = Path(path).parts
    if not package or package not in parts[:-1]:
        return ""
    site = Path(*parts[: len(parts) - 1 - parts[::-1].index(package, 1)])
    try:
        for info in sorted(site.glob(f"{package}-*.dist-info")):
            return metadata.Distribution.at(info).version or ""
    except OSError:
        return ""
    return ""


def cause_in_text(text: str | Iterable[str]) -> Cause | None:
    """The innermost cause of the last traceback printed in a log (its first block: Python prints the root
    cause first); None when the text holds no complete traceback."""
    lines = text.splitlines() if isinstance(text, str) else [line.rstrip("\n") for line in text]
    chains = _chains(lines)
    return _cause_of_block(lines, chains[-1][0]) if chains else None


# -- stating it, with the fix ------------------------------------------------------------------------


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", version.split("+")[0])[:2]
    return tuple(int(n) for n in numbers)


def _build(version: str) -> str:
    """The local build tag (``cpu``, ``cu128``, …) of a PyTorch wheel version, '' for none."""
    return version.partition("+")[2]


def expected_companion(companion: str, torch_version: str) -> str | None:
    """The release line (``0.28``) of ``companion`` built for ``torch_version``; None when unknown."""
    release = _release(torch_version)
    if len(release) < 2 or release[0] != 2:
        return None
    if companion == "torchvision":
        return f"0.{release[1] + 15}"
    if companion == "torchaudio":
        return f"2.{release[1]}"
    return None


def companion_mismatch(companion: str, versions: Mapping[str, str | None] | None = None) -> str | None:
    """One line when the installed ``companion`` (torchvision, torchaudio) was not built for the installed
    torch (another release line, or another build such as CUDA beside ``+cpu``), with the fix; else None.

    ``versions`` replaces the installed versions (distribution name -> version or None)."""
    lookup = versions if versions is not None else {}
    torch_version = lookup.get("torch") if "torch" in lookup else installed_version("torch")
    version = lookup.get(companion) if companion in lookup else installed_version(companion)
    if not torch_version or not version:
        return None
    expected = expected_companion(companion, torch_version)
    if (expected is None or _release(version) == _release(expected)) and _build(version) == _build(torch_version):
        return None
    return f"{companion} {version} does not match torch {torch_version}: {companion_fix(companion, torch_version)}"


def companion_fix(companion: str, torch_version: str) -> str:
    """How to get rid of a torch companion that does not fit the installed torch."""
    expected = expected_companion(companion, torch_version)
    if expected is None:
        return f"uninstall it (pip uninstall {companion}) or install the build made for torch {torch_version}"
    build = _build(torch_version)
    index = f" --index-url {TORCH_INDEX}/{build}" if build else ""
    install = f"pip install '{companion}=={expected}.*'{index}"
    return f"uninstall it (pip uninstall {companion}) or install the matching build ({install})"


def _mentions_companion(cause: Cause) -> str | None:
    for companion in TORCH_COMPANIONS:
        if cause.origin == companion or f"{companion}::" in cause.message or f"'{companion}" in cause.message:
            return companion
    return None


def explain(cause: Cause, versions: Mapping[str, str | None] | None = None) -> str:
    """``cause`` as one line a person can act on: a known fix where there is one, else ``Type: message``.

    ``versions`` replaces installed distribution versions (tests, or another interpreter's metadata)."""
    lookup = versions if versions is not None else {}

    def version_of(name: str) -> str | None:
        if name in lookup:
            return lookup[name]
        return installed_version(name) or (cause.origin_version if name == cause.origin else None)

    companion = _mentions_companion(cause)
    if companion is not None and cause.kind != "ModuleNotFoundError":
        mismatch = companion_mismatch(companion, {"torch": version_of("torch"), companion: version_of(companion)})
        if mismatch:
            return mismatch
        torch_version = version_of("torch") or "?"
        return (
            f"{companion} {version_of(companion) or ''} fails to import with torch {torch_version} ({cause.line()}): "
            f"{companion_fix(companion, torch_version)}".replace("  ", " ")
        )
    if _UNDEFINED_SYMBOL.search(cause.message) and cause.origin and cause.origin != "torch":
        version = version_of(cause.origin) or ""
        return (
            f"{cause.origin} {version} was built for another torch than torch {version_of('torch') or '?'} "
            f"({cause.line()}): reinstall the {cause.origin} build made for it, or uninstall it "
            f"(pip uninstall {cause.origin})"
        ).replace("  ", " ")
    missing = _NO_MODULE.search(cause.message) if cause.kind in ("ModuleNotFoundError", "ImportError") else None
    if missing:
        top = missing.group("module").split(".")[0]
        return f"{cause.line()}: install it (pip install {DISTRIBUTION_OF.get(top, top)})"
    return cause.line()


def explain_exception(exc: BaseException) -> str:
    """One line for a failure: the engine's own message for a UserError, else its innermost cause explained."""
    if isinstance(exc, UserError):
        return str(exc)
    return explain(cause_of(exc))


def explain_log(text: str | Iterable[str]) -> str | None:
    """One line for the last traceback in a log; None when it holds none."""
    cause = cause_in_text(text)
    return explain(cause) if cause is not None else None


# -- logs for people who must not see frames ----------------------------------------------------------


def _frame_lines(lines: list[str]) -> set[int]:
    """Indexes of traceback furniture: headers, separators, frame lines, their code and caret lines (also in a
    tail window that starts in the middle of a traceback), and the exception lines that end a block."""
    marks: set[int] = set()
    in_block = False
    for index, line in enumerate(lines):
        text = line.strip()
        if text == TRACEBACK_HEADER or text in CHAIN_SEPARATORS:
            marks.add(index)
            in_block = text == TRACEBACK_HEADER
            continue
        if _FRAME.match(line) or (_CARETS.match(line) and text):
            marks.add(index)
            in_block = True
            continue
        if line[:1].isspace() and text:
            neighbours = [lines[i] for i in (index - 1, index + 1) if 0 <= i < len(lines)]
            if in_block or any(_FRAME.match(n) or (_CARETS.match(n) and n.strip()) for n in neighbours):
                marks.add(index)
            continue
        if in_block and text:  # the exception line that ends the block
            marks.add(index)
            in_block = False
    return marks


def without_tracebacks(lines: Iterable[str]) -> list[str]:
    """``lines`` with each printed traceback replaced by one ``error: <cause and fix>`` line (left out when a
    later line says the same already, e.g. the trainer's own error line)."""
    lines = list(lines)
    marks = _frame_lines(lines)
    if not marks:
        return lines
    causes: dict[int, str] = {}
    for chain in _chains(lines):
        causes[chain[-1].exception] = explain(_cause_of_block(lines, chain[0]))
        marks.update(i for i in range(chain[0].header, chain[-1].exception) if not lines[i].strip())
    kept: list[str] = []
    for index, line in enumerate(lines):
        if index in causes:
            later = lines[index + 1 :]
            if not any(causes[index] in other for other in later):
                kept.append(f"error: {causes[index]}")
        elif index not in marks:
            kept.append(line)
    return kept
