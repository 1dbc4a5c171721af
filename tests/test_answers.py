"""One rule for "is this answer correct": the trainer's held-out exact match, the headless check's
result.json and the chat panel's mark all call playground.answers.answer_is_correct."""

from __future__ import annotations

import math

import pytest

from playground import answers
from playground.e2e import headless
from playground.train import evaluate
from widgets.chat import Turn

CASES = [
    ("ebuk", "ebuk", True),
    ("  ebuk\n", "ebuk", True),  # surrounding whitespace
    ("EBUK", "ebuk", True),  # letter case
    ("ebukk", "ebuk", False),  # a short answer must match exactly
    ("ebuk ebuk", "ebuk", False),  # ... even when it contains the expected text
    ("ebukxxxxxxxxxxxx", "ebuk", False),  # long, but not as a whole word
    ("The capital of France is Paris.", "Paris", True),  # a chatty answer with the answer in it
    ("The capital of France is Parisian.", "Paris", False),
    ("Paris", "paris", True),
    ("", "ebuk", False),
    ("anything", None, None),  # nothing to check against
]


@pytest.mark.parametrize(("answer", "expected", "verdict"), CASES)
def test_every_surface_gives_the_same_verdict(answer: str, expected: str | None, verdict: bool | None) -> None:
    assert answers.answer_is_correct(answer, expected) is verdict
    assert Turn(prompt="p", answer=answer, done=True, expected=expected).correct is verdict  # the chat's mark
    assert headless.answer_is_correct is answers.answer_is_correct  # result.json's *_correct
    if expected is not None:  # the trainer's eval_exact_match
        assert evaluate.exact_match([answer], [expected]) == float(verdict)


def test_exact_match_is_the_share_correct() -> None:
    assert evaluate.exact_match(["ebuk", "EBUK", "x"], ["ebuk", "ebuk", "ebuk"]) == pytest.approx(2 / 3)
    assert math.isnan(evaluate.exact_match([], []))
    assert Turn(prompt="p", answer="ebuk", done=False, expected="ebuk").correct is None  # still streaming
