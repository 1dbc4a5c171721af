"""The cluster plumbing that the backends whose jobs run on Kubernetes (``kubernetes``, ``kuberay``) and the KServe
model servers (:mod:`playground.serving.kserve`) share, so that none of them imports another's internals.

By concern: the connection and the API's errors (:mod:`.connection`, :mod:`.errors`; the Kubeflow SDK's internals:
:mod:`.sdk`), what every playground object on a cluster carries (:mod:`.manifests`: options, labels, owner
annotations, names, workspace and model URIs), your data files through a PVC (:mod:`.datafiles`), watches and log
followers (:mod:`.watch`), Kueue's queue position (:mod:`.queue`), pods and the rules every job's follow shares
(:mod:`.pods`, :mod:`.follow`). Nothing here imports a backend's package or ``playground.serving``
(``playground.backends.common.is_uri`` is the one shared helper it uses).
"""
