"""The owner type: the operator explicit, visitors validated (the cookie's rule where an id comes from a browser),
fail closed on empty or bad ids with one line naming ``owner``, and the facade taking it at its edge."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tornado.web import create_signed_value

from playground.errors import JobNotFound, UserError
from playground.owner import COOKIE_NAME, SECRET_ENV, Owner, as_owner, is_visitor_id

SECRET = "s" * 40
COOKIE_ID = "v-0123456789abcdef"


def _cookie(visitor_id: str, secret: str = SECRET) -> str:
    return f"{COOKIE_NAME}={create_signed_value(secret, COOKIE_NAME, visitor_id, version=2).decode()}"


def test_the_operator_is_explicit_and_sees_every_job():
    operator = Owner.operator()
    assert operator.is_operator and operator.id is None and str(operator) == "(operator)"
    assert operator.sees(None) and operator.sees("alice") and operator == as_owner(None)


def test_a_visitor_sees_only_their_own_jobs_and_the_type_is_frozen():
    alice = Owner.visitor("alice@example.com")
    assert not alice.is_operator and alice.id == "alice@example.com"
    assert alice.sees("alice@example.com") and not alice.sees("bob") and not alice.sees(None)
    assert as_owner("alice@example.com") == alice and as_owner(alice) is alice
    with pytest.raises(dataclasses.FrozenInstanceError):
        alice.id = None  # type: ignore[misc]


@pytest.mark.parametrize("bad", ["", "   ", "a\nb", "x" * 257, 5])
def test_empty_or_bad_visitor_ids_fail_closed_with_one_line(bad):
    for make in (Owner.visitor, as_owner, Owner):
        with pytest.raises(UserError, match=r"^owner: .* is not a valid visitor id; allowed: 1 to 256 printable") as e:
            make(bad)
        assert e.value.field == "owner" and "\n" not in str(e.value)


def test_ids_from_a_browser_follow_the_cookies_rule():
    assert is_visitor_id(COOKIE_ID) and Owner.from_cookie_id(COOKIE_ID).id == COOKIE_ID
    for bad in ("alice", "v-0123456789ABCDEF", "v-0123456789abcde", "v-0123456789abcdef0", "", "../../etc", None):
        assert not is_visitor_id(bad)
        with pytest.raises(UserError, match=r"^owner: .* is not a visitor id; allowed: 'v-' and 16 lowercase hex"):
            Owner.from_cookie_id(bad)


def test_the_kernels_owner_comes_from_its_verified_cookie_and_never_falls_back_to_the_operator():
    found = Owner.from_environment({SECRET_ENV: SECRET, "HTTP_COOKIE": _cookie(COOKIE_ID)})
    assert found == Owner.from_cookie_id(COOKIE_ID)
    nobody = [
        {SECRET_ENV: SECRET},  # no cookie
        {"HTTP_COOKIE": _cookie(COOKIE_ID)},  # no secret
        {SECRET_ENV: "short", "HTTP_COOKIE": _cookie(COOKIE_ID)},  # a secret too weak to trust
        {SECRET_ENV: SECRET, "HTTP_COOKIE": _cookie(COOKIE_ID, secret="another-secret-" + "x" * 30)},  # forged
        {SECRET_ENV: SECRET, "HTTP_COOKIE": _cookie("alice")},  # signed, but not the cookie's form of id
    ]
    assert [Owner.from_environment(env) for env in nobody] == [None] * len(nobody)


def test_the_facade_takes_an_owner_or_the_legacy_text_and_refuses_a_bad_one(tmp_path: Path):
    from playground.backends.local import LocalBackend
    from playground.facade import Playground

    playground = Playground(LocalBackend(home=tmp_path))
    assert playground.list(owner=Owner.operator()) == playground.list() == []
    assert playground.list(owner=Owner.visitor("alice")) == playground.list(owner="alice") == []
    with pytest.raises(JobNotFound):
        playground.get("nope", owner=Owner.visitor("alice"))
    with pytest.raises(UserError, match=r"^owner: '' is not a valid visitor id"):
        playground.list(owner="")
