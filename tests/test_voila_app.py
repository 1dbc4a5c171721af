"""Booth identity: the signed visitor cookie the Voila server sets and the kernel verifies."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
from tornado.web import create_signed_value

from voila_app import identity
from voila_app.identity import COOKIE_NAME, SECRET_ENV

SECRET = "s" * 40


def test_a_signed_visitor_id_round_trips() -> None:
    visitor = identity.new_visitor_id()
    assert identity.is_visitor_id(visitor)
    assert identity.verify(SECRET, identity.sign(SECRET, visitor)) == visitor
    assert identity.new_visitor_id() != visitor


def _swap_id(value: str, other: str) -> str:
    """Replace the (base64) value field of tornado's v2 signed format, keeping the signature."""
    fields = value.split("|")
    encoded = base64.b64encode(other.encode()).decode()
    fields[4] = f"{len(encoded)}:{encoded}"
    return "|".join(fields)


def _flip(text: str, index: int) -> str:
    return text[:index] + ("a" if text[index] != "a" else "b") + text[index + 1 :]


@pytest.mark.parametrize(
    "forge",
    [
        lambda v: identity.sign("another-secret-" + "x" * 30, v),  # signed with another secret
        lambda v: _flip(identity.sign(SECRET, v), -3),  # signature altered
        lambda v: _swap_id(identity.sign(SECRET, v), "v-" + "0" * 16),  # visitor id swapped, signature kept
        lambda v: create_signed_value(SECRET, "other_cookie", v).decode(),  # another cookie's signature
        lambda v: create_signed_value(SECRET, COOKIE_NAME, v, clock=lambda: time.time() - 8 * 86400).decode(),
        lambda v: create_signed_value(SECRET, COOKIE_NAME, "../../etc").decode(),  # not an id, though signed
        lambda v: v,  # an unsigned id
        lambda v: "",
        lambda v: "2|" * 5000,
        lambda v: "\x00\xff garbage",
    ],
)
def test_forged_altered_or_expired_cookies_are_no_identity(forge) -> None:
    assert identity.verify(SECRET, forge(identity.new_visitor_id())) is None


def test_the_kernel_reads_the_cookie_header_and_verifies_it() -> None:
    visitor = identity.new_visitor_id()
    value = identity.sign(SECRET, visitor)
    header = f'_xsrf=2|abc; {COOKIE_NAME}="{value}"; theme=dark'
    assert identity.cookie_value(header) == value
    assert identity.visitor_from_environ({"HTTP_COOKIE": header, SECRET_ENV: SECRET}) == visitor
    assert identity.visitor_from_environ({"HTTP_COOKIE": header}) is None  # no secret: no identity
    assert identity.visitor_from_environ({"HTTP_COOKIE": header, SECRET_ENV: "short"}) is None
    assert identity.visitor_from_environ({SECRET_ENV: SECRET}) is None  # no cookie
    assert identity.cookie_value('bad"header;;=') is None


def test_the_secret_comes_from_the_environment_or_a_private_file(tmp_path: Path) -> None:
    assert identity.booth_secret(tmp_path, {SECRET_ENV: SECRET}) == SECRET
    with pytest.raises(identity.IdentityError, match="at least 32"):
        identity.booth_secret(tmp_path, {SECRET_ENV: "too-short"})
    generated = identity.booth_secret(tmp_path, {})
    path = tmp_path / "booth" / "secret"
    assert len(generated) == 64 and path.read_text().strip() == generated
    assert path.stat().st_mode & 0o777 == 0o600
    assert identity.booth_secret(tmp_path, {}) == generated  # the same one after a restart
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".secret-")]  # no temp files left
    path.write_text("weak\n")
    with pytest.raises(identity.IdentityError, match="shorter than 32"):
        identity.booth_secret(tmp_path, {})
