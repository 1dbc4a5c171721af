"""Is this answer correct? One rule for the trainer's held-out exact match, the headless check's
``result.json`` and the chat panel's ✓/✗, so the three never disagree.

The rule: compare the texts with surrounding whitespace, runs of inner whitespace and letter case
ignored. They must be equal, except that a free-text answer clearly longer than the expected one
(more than :data:`SLACK` characters longer) is also correct when it contains the expected text as
whole words ("The capital of France is Paris." for "Paris"). Short answers must match exactly, so
"ebukk" is not "ebuk".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

SLACK = 8  # characters a chatty answer must exceed the expected one by before containment counts


def normalize(text: str) -> str:
    """Case-folded, whitespace collapsed and trimmed."""
    return " ".join(text.split()).casefold()


def answer_is_correct(answer: str, expected: str | None) -> bool | None:
    """True/False by the rule above; None when there is no expected answer to check against."""
    if expected is None:
        return None
    got, want = normalize(answer), normalize(expected)
    if got == want:
        return True
    if not want or len(got) <= len(want) + SLACK:
        return False
    return re.search(rf"(?<!\w){re.escape(want)}(?!\w)", got) is not None


def exact_match(answers: Sequence[str], expected: Sequence[str]) -> float:
    """Share of ``answers`` correct by :func:`answer_is_correct` (NaN when there is nothing to score)."""
    if not expected:
        return math.nan
    return sum(bool(answer_is_correct(a, e)) for a, e in zip(answers, expected, strict=True)) / len(expected)
