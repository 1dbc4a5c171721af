"""MkDocs hook: the engine's docstrings use Sphinx roles (:func:`~playground.x.f`); show them as plain code names
(the last dotted part where Sphinx's ``~`` asks for it) instead of the raw role text."""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const):<code>(~?)([^<]*)</code>")


def _name(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, **_: object) -> str:
    return ROLE.sub(_name, html)
