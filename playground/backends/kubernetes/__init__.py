"""The Kubernetes backend (Kubeflow Trainer v2 TrainJob + KServe InferenceService)."""

from __future__ import annotations

from playground.backends.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend"]
