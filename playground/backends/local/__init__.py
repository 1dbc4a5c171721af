"""The local backend: jobs as detached processes on this machine (the embedded default)."""

from playground.backends.local.backend import LocalBackend
from playground.backends.local.gpus import detect_gpus, runnable_here

__all__ = ["LocalBackend", "detect_gpus", "runnable_here"]
