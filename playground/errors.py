"""User-facing errors: one clear line, CLI exit code 2, shown inline in the UI."""

from __future__ import annotations

ECHO_LIMIT = 60  # characters of a user's input repeated back in a message
PATH_ECHO_LIMIT = 300  # a path repeated back (file systems allow 4096)
LINE_LIMIT = 1000  # the longest message line; longer ones lose their middle


def shown(value: object, limit: int = ECHO_LIMIT, *, quoted: bool = True) -> str:
    """``repr(value)`` for an error message, capped: a long input is cut and its length said.

    Every message that repeats what a person typed (a parameter value, an id, a path, a URL)
    goes through here, so a 1 MB value never becomes a 1 MB error line. ``quoted=False`` gives
    the text itself (a path at the start of a message).
    """
    text = value if isinstance(value, str) else repr(value)
    as_text = quoted and isinstance(value, str)
    if len(text) <= limit:
        return repr(value) if as_text else text
    head = repr(text[:limit]) if as_text else text[:limit]
    return f"{head}… ({len(text):,} characters)"


def shown_path(path: object, *, quoted: bool = True) -> str:
    """A path for a message: paths are legitimately long, so the cap is wider than for other input."""
    return shown(str(path), PATH_ECHO_LIMIT, quoted=quoted)


def one_line(message: str, limit: int = LINE_LIMIT) -> str:
    """``message`` on a single line of at most about ``limit`` characters (head and tail kept)."""
    text = " ".join(message.split("\n"))
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]} …[{len(text) - 2 * keep:,} characters cut]… {text[-keep:]}"


class UserError(Exception):
    """Bad input or an unmet precondition. The message is one line meant for a person.

    ``field`` names the offending input (parameter, flag, file) when there is one.
    """

    exit_code = 2

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def __str__(self) -> str:  # always a single line, never an unbounded one
        return one_line(str(self.args[0])) if self.args else ""


class BlueprintError(UserError):
    """Unknown blueprint, or a blueprint YAML that does not validate."""


class ParameterError(UserError):
    """A blueprint parameter that is unknown, of the wrong type or out of range."""


class JobNotFound(UserError):
    """No job with that id on the chosen backend."""


class BackendError(UserError):
    """The backend cannot do what was asked (cluster unreachable, forbidden, conflict...)."""
