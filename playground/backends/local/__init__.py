"""The local backend: jobs as detached processes on this machine (the embedded default).

Names load lazily, so the supervisor process (``python -m playground.backends.local.supervisor``)
starts without importing the blueprint schema it does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playground.backends.gpus import detect_gpus
    from playground.backends.local.backend import LocalBackend

__all__ = ["LocalBackend", "detect_gpus"]


def __getattr__(name: str) -> Any:
    if name == "LocalBackend":
        from playground.backends.local.backend import LocalBackend

        return LocalBackend
    if name == "detect_gpus":
        from playground.backends.gpus import detect_gpus

        return detect_gpus
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
