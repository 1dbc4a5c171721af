"""Model servers behind one interface (:class:`~playground.serving.base.ModelServers`): local processes
(:mod:`.local`) and KServe InferenceServices (:mod:`.kserve`), and the one chat client (:mod:`.client`)."""

from __future__ import annotations

from typing import Any

from playground.errors import UserError


def servers_for(backend: Any) -> Any:  # -> ModelServers
    """The model servers that serve what ``backend`` trains: local processes beside the local backend's jobs,
    InferenceServices in the Kubernetes backend's namespace (same connection and options)."""
    if backend.name in ("local", "ray"):  # ray: the trained model lands on this machine's disk (or a shared path)
        from playground.serving.local import LocalServers

        return LocalServers(backend.home, policy=backend.policy)  # booth mode: shared base, cap, idle TTL
    if backend.name in ("kubernetes", "kuberay"):
        from playground.serving.kserve import KServeServers

        return KServeServers(backend.connection, backend.opts, serve_timeout=backend.serve_timeout, stats=backend.stats)
    raise UserError(f"the {backend.name} backend has no model servers", field="backend")
