"""Backends behind one interface: ``local`` (the embedded default), ``kubernetes`` (Kubeflow Trainer), ``ray``
(Ray Train through Ray's Job API) and ``kuberay`` (a KubeRay RayJob)."""

from __future__ import annotations

from typing import Any

from playground.backends.base import Backend
from playground.errors import UserError, shown

BACKENDS = ("local", "kubernetes", "ray", "kuberay")


def get_backend(name: str = "local", **options: Any) -> Backend:
    """Instantiate a backend by name. ``options`` go to its config (e.g. namespace, context)."""
    if name == "local":
        from playground.backends.local import LocalBackend

        return LocalBackend(**options)
    if name == "kubernetes":
        from playground.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(**options)
    if name == "ray":
        from playground.backends.ray.backend import RayBackend

        return RayBackend(**options)
    if name == "kuberay":
        from playground.backends.ray.kuberay import KubeRayBackend

        return KubeRayBackend(**options)
    raise UserError(f"unknown backend {shown(name)}; allowed: {', '.join(BACKENDS)}", field="backend")


__all__ = ["BACKENDS", "Backend", "get_backend"]
