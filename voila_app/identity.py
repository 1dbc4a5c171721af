"""Visitor identity for booth mode: a signed cookie set by the Voila server, verified by the kernel.

The Voila server gives each browser a random visitor id in an HMAC-signed cookie (tornado's
signed-value format, SHA-256, with a timestamp) and hands the request's ``Cookie`` header to the
kernel it starts (``HTTP_COOKIE``). The kernel verifies the signature with the same secret before
trusting the id: a forged, edited or expired cookie yields no identity (and the app shows nothing).

The secret comes from ``PLAYGROUND_BOOTH_SECRET`` or, when that is unset, from a file generated
once under ``$PLAYGROUND_HOME/booth/secret`` (mode 0600), so identities survive an app restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from tornado.web import create_signed_value

# The cookie's rule, its name, the secret's setting and the kernel's verification are the engine's
# (playground.owner: the widgets get their visitor from there); re-exported here for the server side.
from playground.owner import (  # noqa: F401
    COOKIE_NAME,
    MAX_AGE_DAYS,
    MIN_SECRET_CHARS,
    SECRET_ENV,
    cookie_value,
    is_visitor_id,
    verify,
    visitor_from_environ,
)


class IdentityError(ValueError):
    """The booth secret is missing or too weak."""


def new_visitor_id() -> str:
    """A random visitor id (64 bits), usable as an owner label."""
    return f"v-{secrets.token_hex(8)}"


def sign(secret: str, visitor_id: str) -> str:
    """The cookie value for ``visitor_id``."""
    if not is_visitor_id(visitor_id):
        raise ValueError(f"not a visitor id: {visitor_id!r}")
    return create_signed_value(secret, COOKIE_NAME, visitor_id, version=2).decode("ascii")


KERNEL_PROOF_HEADER = "X-Playground-Kernel"


def kernel_proof(secret: str, kernel_id: str) -> str:
    """What a warm kernel shows to read its page request (``/voila/query/<kernel_id>``): an HMAC of its id."""
    return hmac.new(secret.encode(), b"voila-query\0" + kernel_id.encode(), hashlib.sha256).hexdigest()


def kernel_proof_ok(secret: str, kernel_id: str, proof: str) -> bool:
    return bool(secret and kernel_id and proof) and hmac.compare_digest(kernel_proof(secret, kernel_id), proof)


def receive_request(environ: MutableMapping[str, str] | None = None, *, open_timeout: float = 10) -> bool:
    """In a warm (preheated) kernel: wait until a page request takes this kernel, then put the request's variables
    (``HTTP_COOKIE`` among them) into ``environ``, as a kernel started for the request has them from its start.
    True when a request arrived; False at once in a kernel that was not preheated, or when the server cannot be
    reached (then the app has no visitor and shows nothing)."""
    environ = os.environ if environ is None else environ
    kernel_id, secret = environ.get("VOILA_KERNEL_ID", ""), environ.get(SECRET_ENV, "")
    if environ.get("VOILA_PREHEAT") != "True" or not kernel_id or len(secret) < MIN_SECRET_CHARS:
        return False
    host, port = environ.get("VOILA_APP_IP") or "127.0.0.1", environ.get("VOILA_APP_PORT", "8866")
    url = f"ws://{host}:{port}{environ.get('VOILA_SERVER_URL', '/')}voila/query/{kernel_id}"
    from websockets.sync.client import connect

    try:
        with connect(url, additional_headers={KERNEL_PROOF_HEADER: kernel_proof(secret, kernel_id)},
                     open_timeout=open_timeout, max_size=256 * 1024) as socket:  # fmt: skip
            request = json.loads(socket.recv())
    except Exception as exc:  # no server, refused, closed: no identity (fail closed)
        print(f"playground: this warm kernel got no page request ({type(exc).__name__})", file=sys.stderr)
        return False
    environ.update({k: v for k, v in request.items() if isinstance(k, str) and isinstance(v, str)})
    return True


def booth_secret(home: Path, environ: Mapping[str, str] | None = None) -> str:
    """``PLAYGROUND_BOOTH_SECRET``, else the secret stored under ``home/booth/secret`` (created once)."""
    environ = os.environ if environ is None else environ
    secret = environ.get(SECRET_ENV, "").strip()
    if secret:
        if len(secret) < MIN_SECRET_CHARS:
            raise IdentityError(
                f"{SECRET_ENV} is {len(secret)} characters; allowed: at least {MIN_SECRET_CHARS} "
                "(e.g. python -c 'import secrets; print(secrets.token_hex(32))')"
            )
        return secret
    path = home / "booth" / "secret"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        tmp = path.with_name(f".secret-{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
        try:
            os.link(tmp, path)  # atomic: the first writer wins, nobody reads a half-written file
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    stored = path.read_text().strip()
    if len(stored) < MIN_SECRET_CHARS:
        raise IdentityError(f"{path} holds a secret shorter than {MIN_SECRET_CHARS} characters; delete it")
    return stored
