"""One duration formatter and one progress-line formatter for the CLI, the log tails and the page."""

from __future__ import annotations

import math

from playground.events import Progress, Queued
from playground.formatting import describe_event, format_duration, progress_line


def test_durations_read_alike_everywhere():
    assert [format_duration(s) for s in (0, 59.4, 75, 3725)] == ["0:00", "0:59", "1:15", "1:02:05"]
    assert [format_duration(s) for s in (None, math.nan, -1, math.inf)] == ["?"] * 4
    assert format_duration(None, unknown="–") == "–"
    assert [format_duration(s, sub_minute=True) for s in (12.34, 75)] == ["12.3 s", "1:15"]


def test_progress_line_for_the_cli_and_for_the_page():
    point = Progress(step=5, total_steps=80, loss=0.12345, learning_rate=1e-3, tokens_per_second=1234.0, eta_seconds=60)
    assert progress_line(point) == "step 5/80  loss 0.1235  lr 1.00e-03  1,234 tok/s  eta 1:00"
    assert progress_line(point, page=True) == "step 5/80 · loss 0.1235 · lr 1.00e-03 · 1.2k tokens/s"
    assert describe_event(point) == "[progress] " + progress_line(point)
    assert progress_line(Progress(step=1, total_steps=2)) == "step 1/2"
    # DPO/GRPO: the method's own figures, short, in the order the trainer gave them
    grpo = Progress(step=3, total_steps=40, loss=0.01, metrics={"mean_reward": 0.4575, "kl": 0.0016})
    assert progress_line(grpo) == "step 3/40  loss 0.0100  reward 0.458  KL 0.0016"
    assert describe_event(Queued(position=2, estimated_wait_seconds=90)) == (
        "[queue] waiting for a training slot: position 2, about 1:30"
    )
