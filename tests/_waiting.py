"""Polling for tests: wait for a condition, or fail naming what never happened."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
