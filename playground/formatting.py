"""How durations and events read, once for the CLI, the logs and the page (no Jupyter, no torch)."""

from __future__ import annotations

import math

from playground.events import METRIC_LABELS, ClusterEvent, Event, Log, Metric, Phase, Progress, Queued


def format_duration(seconds: float | None, *, unknown: str = "?", sub_minute: bool = False) -> str:
    """``75`` → ``1:15``, ``3725`` → ``1:02:05``; unknown (None, NaN, negative) → ``unknown``.
    ``sub_minute``: below a minute as ``12.3 s`` (a measured time on the page)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return unknown
    if sub_minute and seconds < 60:
        return f"{seconds:.1f} s"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def time_left_text(seconds: float) -> str:
    """``~0:40 left``: the time left in a phase, as the Evaluating and Saving reasons say it (:func:`time_left_in`)."""
    return f"~{format_duration(seconds)} left"


def time_left_in(reason: str) -> float | None:
    """The seconds a phase reason's ``~M:SS left`` says (:func:`time_left_text`); None when it says none."""
    marker = reason.rfind("~")
    if marker < 0 or not reason.endswith(" left"):
        return None
    parts = reason[marker + 1 : -len(" left")].split(":")
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        return None
    seconds = 0
    for number in numbers:
        seconds = seconds * 60 + number
    return float(seconds) if 2 <= len(numbers) <= 3 else None


def format_rate(value: float | None) -> str:
    """Tokens per second, short: ``1.2k``, ``950``; unknown → ``–``."""
    if value is None:
        return "–"
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


def progress_line(point: Progress, *, page: bool = False) -> str:
    """One line for a progress point: the CLI's and log tails' (``step 5/80  loss 0.1234  …  eta 1:00``), or the
    page's log (``page``: ``step 5/80 · loss 0.1234 · … · 1.2k tokens/s``, the ETA shown apart)."""
    parts = [f"step {point.step}/{point.total_steps}"]
    if point.loss is not None:
        parts.append(f"loss {point.loss:.4f}")
    if point.learning_rate is not None:
        parts.append(f"lr {point.learning_rate:.2e}")
    for name, value in point.metrics.items():
        parts.append(f"{METRIC_LABELS.get(name, name)} {value:.3g}")
    if point.tokens_per_second is not None:
        rate = f"{format_rate(point.tokens_per_second)} tokens/s" if page else f"{point.tokens_per_second:,.0f} tok/s"
        parts.append(rate)
    if page:
        return " · ".join(parts)
    if point.eta_seconds is not None:
        parts.append(f"eta {format_duration(point.eta_seconds)}")
    return "  ".join(parts)


def describe_event(event: Event) -> str:
    """One readable line for an event (``playground logs``, log tails)."""
    if isinstance(event, Log):
        return event.line
    if isinstance(event, Progress):
        return "[progress] " + progress_line(event)
    if isinstance(event, Phase):
        return f"[phase] {event.phase}" + (f": {event.reason}" if event.reason else "")
    if isinstance(event, Metric):
        return f"[metric] {event.name} = {event.value:.4g}"
    if isinstance(event, ClusterEvent):
        return f"[{event.kind}] {event.reason}: {event.message}"
    if isinstance(event, Queued):
        if event.position <= 0:
            return "[queue] a training slot is free: starting"
        wait = (
            "" if event.estimated_wait_seconds is None else f", about {format_duration(event.estimated_wait_seconds)}"
        )
        return f"[queue] waiting for a training slot: position {event.position}{wait}"
    return str(event)
