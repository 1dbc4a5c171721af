"""A Ray job's log as the playground's events: Ray decorates every line a worker prints with ANSI colour and
``(RayTrainWorker pid=N, ip=A)``; both go, the ``@@playground`` event lines parse as the trainer's events and
everything else stays a readable log line. The same for the ``ray`` backend (Ray's Job API) and ``kuberay``
(the RayJob's submitter pod, which streams the same log)."""

from __future__ import annotations

import re

from playground.events import Event, parse_line

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\((?P<actor>[A-Za-z_][\w.]*)(?: pid=\d+)?(?:, ip=[^)]*)?\)\s?")


def split_line(line: str) -> tuple[str, str]:
    """(the Ray actor that printed ``line``, e.g. ``RayTrainWorker``, or "" for the driver; its text without ANSI
    colour, Ray's prefix or its line end)."""
    text = _ANSI.sub("", line.rstrip("\r\n"))
    match = _RAY_PREFIX.match(text)
    return (match.group("actor"), text[match.end() :]) if match else ("", text)


def clean_line(line: str) -> str:
    """``line`` without ANSI colour or Ray's ``(Actor pid=N, ip=A)`` prefix (and without its line end)."""
    return split_line(line)[1]


def tail_lines(text: str, count: int) -> list[str]:
    """The last ``count`` lines worth showing: the trainer's and the driver's, not Ray Train's controller, whose
    failure report repeats every worker's traceback (the job's message carries its one-line reason)."""
    lines = map(split_line, text.splitlines())
    return [clean for actor, clean in lines if clean.strip() and actor != "TrainController"][-count:]


def ray_event(line: str, source: str = "trainer") -> Event:
    """One line of a Ray job's log as an event (see :func:`playground.events.parse_line`)."""
    return parse_line(clean_line(line), source)


def split_lines(text: str) -> tuple[list[str], str]:
    """Complete lines of ``text`` and the unfinished rest (a log read while it is being written)."""
    *lines, rest = text.split("\n")
    return lines, rest
