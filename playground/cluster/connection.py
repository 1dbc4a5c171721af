"""One connection to a cluster: which kubeconfig, context and namespace; the ``kubernetes`` client's APIs over that
configuration; the kubeflow SDK's ``TrainerClient`` for what it does publicly (``get_runtime``, ``delete_job``).

Nothing contacts the cluster before it is needed, so manifests render without a kubeconfig. Shared by the training
backends on a cluster (kubernetes, kuberay) and the KServe model servers (:mod:`playground.serving.kserve`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from playground.cluster import sdk
from playground.cluster.errors import api_error
from playground.errors import BackendError, UserError

IN_CLUSTER_NS = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
POOL_SIZE = 64  # one stream per watch and per followed log


class Connection:
    """``--namespace``/``--context``/``--kubeconfig`` (else ``$KUBECONFIG``, ``~/.kube/config``, in-cluster)."""

    def __init__(self, namespace: str | None = None, context: str | None = None, kubeconfig: str | None = None):
        self.context = context
        self.kubeconfig = kubeconfig
        self._namespace = namespace
        self._api: Any = None
        self._trainer: Any = None
        self._lock = threading.Lock()
        self._sdk_lock = threading.Lock()
        self.host: str | None = None

    @property
    def namespace(self) -> str:
        """--namespace, else the kubeconfig context's, else the pod's, else ``default`` (no request made)."""
        if self._namespace:
            return self._namespace
        ns = None
        try:
            from kubernetes import config

            path = self.kubeconfig_path()
            if path and os.path.exists(path):
                contexts, active = config.list_kube_config_contexts(config_file=path)
                ctx = next((c for c in contexts if c["name"] == self.context), active) if self.context else active
                ns = ((ctx or {}).get("context") or {}).get("namespace")
            elif IN_CLUSTER_NS.exists():
                ns = IN_CLUSTER_NS.read_text().strip()
        except Exception:  # a broken kubeconfig is reported when connecting
            ns = None
        self._namespace = ns or "default"
        return self._namespace

    def kubeconfig_path(self) -> str | None:
        if self.kubeconfig:
            return os.path.expanduser(self.kubeconfig)
        env = os.environ.get("KUBECONFIG")
        if env:
            return os.path.expanduser(env.split(os.pathsep)[0])
        return os.path.expanduser("~/.kube/config")

    def configuration(self) -> Any:
        """The ``kubernetes.client.Configuration`` (read when asked: ``$KUBECONFIG`` as it is now)."""
        from kubernetes import client, config

        cfg = client.Configuration()
        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not (
            self.kubeconfig or os.environ.get("KUBECONFIG")
        )
        path = self.kubeconfig_path()
        if not in_cluster:
            if not path or not os.path.exists(path):
                raise BackendError(
                    f"no kubeconfig found at {path} and not running inside a cluster; "
                    "pass --kubeconfig FILE / --context NAME or set KUBECONFIG",
                    field="kubeconfig",
                )
            try:
                config.load_kube_config(config_file=path, context=self.context, client_configuration=cfg)
            except config.ConfigException as exc:
                raise BackendError(f"kubeconfig {path}: {' '.join(str(exc).split())}", field="context") from None
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException as exc:
                raise BackendError(f"in-cluster config: {exc}") from None
        cfg.connection_pool_maxsize = POOL_SIZE
        return cfg

    @property
    def api_client(self) -> Any:
        """The ``kubernetes`` ApiClient (configured on first use)."""
        with self._lock:
            if self._api is None:
                from kubernetes import client

                cfg = self.configuration()
                self._api = client.ApiClient(cfg)
                self.host = cfg.host
            return self._api

    @property
    def custom(self) -> Any:
        """``CustomObjectsApi``: TrainJobs, runtimes, InferenceServices."""
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)

    @property
    def core(self) -> Any:
        """``CoreV1Api``: pods, their logs, Events."""
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    @property
    def trainer(self) -> Any:
        """The kubeflow SDK ``TrainerClient`` (connected on first use)."""
        with self._lock:
            if self._trainer is None:
                import logging

                from kubeflow.common.types import KubernetesBackendConfig
                from kubeflow.trainer import TrainerClient

                cfg = self.configuration()
                logging.getLogger("kubeflow.trainer.backends.kubernetes.backend").setLevel(logging.ERROR)
                try:
                    config = KubernetesBackendConfig(
                        namespace=self.namespace, context=self.context, client_configuration=cfg
                    )
                    self._trainer = TrainerClient(config)
                except Exception as exc:
                    raise self.error(exc, "connect to", "the Kubernetes API") from None
                self.host = self.host or cfg.host
            return self._trainer

    def sdk(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a public ``TrainerClient`` method, then close the thread pool its async requests started."""
        trainer = self.trainer
        with self._sdk_lock:
            try:
                return getattr(trainer, method)(*args, **kwargs)
            finally:
                sdk.close_pools(trainer)

    def error(self, exc: BaseException, verb: str, resource: str, name: str | None = None) -> BackendError:
        """A one-line error naming the verb, the resource and the cluster (a UserError passes through)."""
        if isinstance(exc, UserError):
            return exc  # type: ignore[return-value]
        return api_error(exc, verb=verb, resource=resource, namespace=self.namespace, name=name, host=self.host)
