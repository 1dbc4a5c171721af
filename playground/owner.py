"""Who acts on jobs: the operator (every job) or one visitor (their own jobs only), as one explicit type.

An :class:`Owner` is made explicitly: :meth:`Owner.operator` or :meth:`Owner.visitor`. Where an id comes from a
browser, it is checked with the cookie's own rule (:data:`VISITOR_ID`, ``v-`` and 16 hex digits: what the booth's
Voila server issues, also a Kubernetes label value): :meth:`Owner.from_cookie_id`, and :meth:`Owner.from_environment`
in a visitor's kernel (the signed cookie the server hands the kernel in ``HTTP_COOKIE``, verified with the booth's
secret). Programmatic callers (the CLI's ``--owner``, notebooks, tests) may name a visitor with any short printable
text. The legacy ``str | None`` of the public edges (``None``: the operator) becomes an Owner with :func:`as_owner`;
an empty or unprintable id is a one-line error naming ``owner`` (fail closed: never the operator).

Engine only: no Jupyter imports (tornado, for the signed cookie, only when a cookie is verified).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie

from playground.errors import UserError

VISITOR_ID = re.compile(r"^v-[0-9a-f]{16}$")  # the cookie's rule (voila_app issues such ids)
VISITOR_ID_FORM = "'v-' and 16 lowercase hex digits"
TEXT_MAX_LEN = 256  # a programmatic visitor id: 1 to 256 printable characters
COOKIE_NAME = "playground_visitor"
SECRET_ENV = "PLAYGROUND_BOOTH_SECRET"
MIN_SECRET_CHARS = 32
MAX_AGE_DAYS = 7
_COOKIE_MAX_LEN = 512


def is_visitor_id(value: object) -> bool:
    """Whether ``value`` is a visitor id by the cookie's rule (``v-`` and 16 lowercase hex digits)."""
    return isinstance(value, str) and bool(VISITOR_ID.match(value))


@dataclass(frozen=True)
class Owner:
    """The operator (``id`` None: sees every job) or one visitor (``id``: sees only the jobs owned by that id)."""

    id: str | None

    def __post_init__(self) -> None:
        if self.id is not None:
            _check_text(self.id)

    @classmethod
    def operator(cls) -> Owner:
        """The operator: every job, every server."""
        return cls(None)

    @classmethod
    def visitor(cls, visitor_id: str) -> Owner:
        """A visitor named by a program (1 to 256 printable characters); one-line UserError naming ``owner``."""
        return cls(_check_text(visitor_id))

    @classmethod
    def from_cookie_id(cls, visitor_id: str) -> Owner:
        """A visitor whose id came from a browser: the cookie's rule, ``v-`` and 16 hex digits."""
        if not is_visitor_id(visitor_id):
            message = f"owner: {_shown_id(visitor_id)} is not a visitor id; allowed: {VISITOR_ID_FORM}"
            raise UserError(message, field="owner")
        return cls(visitor_id)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Owner | None:
        """In a kernel the booth's Voila server started: the visitor of its verified cookie; None when there is
        none (no secret, no cookie, a forged, altered or expired one). Never the operator: fail closed."""
        visitor_id = visitor_from_environ(environ)
        return cls.from_cookie_id(visitor_id) if visitor_id is not None else None

    @property
    def is_operator(self) -> bool:
        return self.id is None

    def sees(self, job_owner: str | None) -> bool:
        """Whether this owner may see a job (or server) owned by ``job_owner``: the operator sees all."""
        return self.id is None or job_owner == self.id

    def __str__(self) -> str:
        return "(operator)" if self.id is None else self.id


OPERATOR = Owner.operator()  # the default of every engine signature that takes an owner


def as_owner(owner: Owner | str | None) -> Owner:
    """The legacy ``str | None`` of the public edges as an :class:`Owner` (None: the operator; an Owner as is)."""
    if isinstance(owner, Owner):
        return owner
    return OPERATOR if owner is None else Owner.visitor(owner)


_TEXT_RULE = f"1 to {TEXT_MAX_LEN} printable characters"


def _shown_id(value: object) -> str:
    return repr(str(value)[:40])


def _check_text(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > TEXT_MAX_LEN or not value.isprintable():
        raise UserError(f"owner: {_shown_id(value)} is not a valid visitor id; allowed: {_TEXT_RULE}", field="owner")
    return value


# -- the signed cookie (set by voila_app's server, verified in the visitor's kernel) ---------------------------
def verify(secret: str, value: str | None, *, max_age_days: float = MAX_AGE_DAYS) -> str | None:
    """The visitor id in a cookie value, or None when it is missing, forged, altered or expired."""
    if not value or not secret or len(value) > _COOKIE_MAX_LEN:
        return None
    from tornado.web import decode_signed_value

    try:
        decoded = decode_signed_value(secret, COOKIE_NAME, value, max_age_days=max_age_days, min_version=2)
    except Exception:  # malformed input of any kind is simply not an identity
        return None
    if decoded is None:
        return None
    visitor = decoded.decode("ascii", errors="replace")
    return visitor if is_visitor_id(visitor) else None


def cookie_value(cookie_header: str | None) -> str | None:
    """Our cookie's raw value from a ``Cookie`` request header."""
    if not cookie_header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(cookie_header)
    except CookieError:
        return None
    morsel = jar.get(COOKIE_NAME)
    return morsel.value if morsel is not None else None


def visitor_from_environ(environ: Mapping[str, str] | None = None) -> str | None:
    """In a kernel Voila started: the verified visitor id from ``HTTP_COOKIE`` (None if absent/invalid)."""
    environ = os.environ if environ is None else environ
    secret = environ.get(SECRET_ENV, "")
    if len(secret) < MIN_SECRET_CHARS:
        return None
    return verify(secret, cookie_value(environ.get("HTTP_COOKIE")))
