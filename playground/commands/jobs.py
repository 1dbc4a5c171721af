"""Placeholder: filled in by the issue that owns this command group."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this group's commands to the ``playground`` CLI."""
