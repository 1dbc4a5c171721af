"""Model servers behind one interface (:class:`~playground.serving.base.ModelServers`): local processes
(:mod:`.local`) and KServe InferenceServices (:mod:`.kserve`), and the one chat client (:mod:`.client`)."""

from __future__ import annotations

from typing import Any

from playground.errors import UserError


def servers_for(backend: Any) -> Any:  # -> ModelServers
    """The model servers that serve what ``backend`` trains: local processes beside the local backend's jobs,
    InferenceServices in the Kubernetes backend's namespace (same connection and options)."""
    if backend.name == "local":
        from playground.serving.local import LocalServers

        return LocalServers(backend.home)
    if backend.name == "ray":  # the trained model lands on this machine's disk (or a path every node sees)
        from playground.serving.local import LocalServers

        return LocalServers(backend.home)
    if backend.name in ("kubernetes", "kuberay"):
        from playground.serving.kserve import KServeServers

        return KServeServers(backend.connection, backend.opts, serve_timeout=backend.serve_timeout, stats=backend.stats)
    raise UserError(f"the {backend.name} backend has no model servers", field="backend")
