"""The one place that relies on the kubeflow SDK beyond its public ``TrainerClient`` API.

What it relies on (``tests/test_kubernetes_backend.py::test_sdk_adapter_names_what_it_relies_on`` fails when any of
these moves in a new SDK release):

- ``kubeflow.trainer.backends.kubernetes.utils.get_args_using_torchtune_config``: the SDK's TorchTune argument
  mapping, for the opt-in ``builtin-torchtune`` trainer (``TorchTuneConfig`` → ``tune run`` arguments); no public
  call renders them without creating the TrainJob.
- ``TrainerClient.backend.custom_api.api_client``: the SDK's own API client, whose thread pool (4 threads, started by
  the SDK's async requests) :func:`close_pools` closes after each call so a long-lived app does not gather threads.

Everything else uses public calls: ``TrainerClient.get_runtime``/``delete_job`` and the ``kubernetes`` client's own
``CustomObjectsApi``/``CoreV1Api`` over the same configuration.
"""

from __future__ import annotations

from typing import Any


def torchtune_args(config: Any, initializer: Any) -> list[str]:
    """The ``tune run`` arguments the SDK derives from a ``TorchTuneConfig`` and its initializer."""
    from kubeflow.trainer.backends.kubernetes import utils

    return list(utils.get_args_using_torchtune_config(config, initializer))


def close_pools(trainer_client: Any) -> None:
    """Close the thread pool the SDK's async requests started (it is opened again when needed)."""
    api = getattr(getattr(trainer_client, "backend", None), "custom_api", None)
    if api is not None:
        api.api_client.close()
