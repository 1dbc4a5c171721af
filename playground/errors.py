"""User-facing errors: one clear line, CLI exit code 2, shown inline in the UI."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or an unmet precondition. The message is one line meant for a person.

    ``field`` names the offending input (parameter, flag, file) when there is one.
    """

    exit_code = 2

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def __str__(self) -> str:  # always a single line
        return " ".join(str(self.args[0]).split("\n")) if self.args else ""


class BlueprintError(UserError):
    """Unknown blueprint, or a blueprint YAML that does not validate."""


class ParameterError(UserError):
    """A blueprint parameter that is unknown, of the wrong type or out of range."""


class JobNotFound(UserError):
    """No job with that id on the chosen backend."""


class BackendError(UserError):
    """The backend cannot do what was asked (cluster unreachable, forbidden, conflict...)."""
