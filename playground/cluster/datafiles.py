"""Your own data files on Kubernetes: they reach the trainer pod through a PersistentVolumeClaim, never inline.

A data scientist's notebook (Kubeflow Notebooks) keeps files on its workspace volume, a PVC mounted at e.g.
``/home/jovyan``. A local dataset file (``--dataset-source FILE``, a custom blueprint's ``dataset.source`` or
``eval_source``) must lie under such a mount: the TrainJob then mounts the same claim read-only at
``/mnt/playground-data`` in the trainer's pods (``spec.runtimePatches``, Trainer ≥ 2.2) and the trainer reads the
same file there. Which claim holds which directory comes from ``PLAYGROUND_DATA_PVC`` (``CLAIM:MOUNT_PATH``, several
comma-separated), else, inside a pod, from the pod's own volumes (read through the API). Hub (``hf://``) and S3
(``s3://``) datasets need no volume: the trainer or Kubeflow's dataset initializer downloads them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from playground.cluster.connection import IN_CLUSTER_NS
from playground.errors import UserError, shown_path

PVC_SETTING = "PLAYGROUND_DATA_PVC"
DATA_VOLUME = "playground-data"
DATA_MOUNT = "/mnt/playground-data"  # where the trainer's pods see the claim (read-only)
PATCH_MANAGER = "blueprint-playground.dev/data"
TRAINER_JOB = "node"  # the runtime's replicated job and container that run the trainer (deploy/runtimes)
_CLAIM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
ALLOWED = (
    "a file under a PersistentVolumeClaim's mount (set PLAYGROUND_DATA_PVC=CLAIM:MOUNT_PATH, or run in a "
    "notebook pod whose volume holds it), hf://ORG/NAME, or s3://BUCKET/PATH"
)


@dataclass(frozen=True)
class ClaimMount:
    """A PVC and where this machine sees it."""

    claim: str
    mount_path: str  # absolute, normalised, no trailing slash
    sub_path: str = ""  # the pod mounts only this directory of the claim (volumeMounts[].subPath)


def parse_setting(value: str, setting: str = PVC_SETTING) -> list[ClaimMount]:
    """``CLAIM:MOUNT_PATH[,CLAIM:MOUNT_PATH...]`` → claim mounts; a one-line error naming the setting."""
    mounts = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        claim, sep, path = item.partition(":")
        if not sep or not _CLAIM_NAME.match(claim) or not path.startswith("/"):
            raise UserError(
                f"{setting} {shown_path(item)} is not valid; allowed: CLAIM:MOUNT_PATH (a PVC name, then the "
                "absolute path it is mounted at here), several separated by commas",
                field=setting,
            )
        mounts.append(ClaimMount(claim, _normal(path)))
    return mounts


def _normal(path: str) -> str:
    return str(PurePosixPath(os.path.normpath(path)))


def pod_claims(pod: Any) -> list[ClaimMount]:
    """The PVC mounts of a pod (a ``V1Pod`` or its dict form), across its containers."""
    data = pod.to_dict() if hasattr(pod, "to_dict") else pod
    spec = data.get("spec") or {}
    claims = {}
    for volume in spec.get("volumes") or []:
        source = volume.get("persistent_volume_claim") or volume.get("persistentVolumeClaim")
        if source:
            claims[volume["name"]] = source.get("claim_name") or source.get("claimName")
    mounts = []
    for container in spec.get("containers") or []:
        for mount in container.get("volume_mounts") or container.get("volumeMounts") or []:
            claim = claims.get(mount.get("name"))
            if claim:
                sub = mount.get("sub_path") or mount.get("subPath") or ""
                path = mount.get("mount_path") or mount.get("mountPath")
                mounts.append(ClaimMount(claim, _normal(path), sub))
    return mounts


def in_pod() -> bool:
    """Whether this process runs in a Kubernetes pod (the API server's service variable is set)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("HOSTNAME"))


def own_pod_claims(core: Callable[[], Any]) -> list[ClaimMount]:
    """The claims mounted in the pod this process runs in (``$HOSTNAME`` in ``$POD_NAMESPACE``, else the service
    account's namespace); empty when the pod cannot be read (then ``PLAYGROUND_DATA_PVC`` is the way)."""
    name = os.environ.get("HOSTNAME", "")
    namespace = os.environ.get("POD_NAMESPACE") or _pod_namespace()
    if not name or not namespace:
        return []
    try:
        pod = core().read_namespaced_pod(name, namespace)
    except Exception:  # no connection, or not allowed to read its own pod
        return []
    return pod_claims(pod)


def _pod_namespace() -> str:
    """The service account's namespace file, as the connection reads it in a cluster."""
    try:
        return IN_CLUSTER_NS.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class DataPlacement:
    """Where each local file is in the trainer's pods, and the claim to mount there."""

    claim: ClaimMount
    paths: dict[str, str]  # local path → path in the pod


def place(files: list[str], mounts: list[ClaimMount]) -> DataPlacement | None:
    """Map local files onto one claim's mount (None for no files); a one-line error for a file on no claim."""
    files = [f for f in dict.fromkeys(files) if f]
    if not files:
        return None
    chosen: ClaimMount | None = None
    paths: dict[str, str] = {}
    for local in files:
        absolute = _normal(os.path.abspath(os.path.expanduser(local)))
        real = _normal(os.path.realpath(absolute))
        holding = (m for m in _by_depth(mounts) if _under(absolute, m.mount_path) or _under(real, m.mount_path))
        match = next(holding, None)
        if match is None:
            raise UserError(
                f"dataset file {shown_path(local)}: the kubernetes backend reads your file from a "
                f"PersistentVolumeClaim and this one is on none{_known(mounts)}; allowed: {ALLOWED}",
                field="dataset",
            )
        if chosen is not None and match.claim != chosen.claim:
            raise UserError(
                f"dataset files {shown_path(files[0])} and {shown_path(local)} are on two claims ({chosen.claim}, "
                f"{match.claim}); allowed: every data file of a run on one PersistentVolumeClaim",
                field="dataset",
            )
        chosen = match
        base = absolute if _under(absolute, match.mount_path) else real
        relative = PurePosixPath(base).relative_to(match.mount_path)
        paths[local] = str(PurePosixPath(DATA_MOUNT) / relative)
    assert chosen is not None
    return DataPlacement(chosen, paths)


def _by_depth(mounts: list[ClaimMount]) -> list[ClaimMount]:
    return sorted(mounts, key=lambda m: -len(m.mount_path))  # the innermost mount holding a file wins


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _known(mounts: list[ClaimMount]) -> str:
    if not mounts:
        return f" (no claim is known: {PVC_SETTING} is not set and no pod volume was found)"
    return " (known: " + ", ".join(f"{m.claim} at {m.mount_path}" for m in mounts[:4]) + ")"


def runtime_patch(placement: DataPlacement):
    """The TrainJob's ``runtimePatches`` entry: the claim as a read-only volume of the trainer's pods."""
    from kubeflow_trainer_api import models

    mount = models.IoK8sApiCoreV1VolumeMount(
        name=DATA_VOLUME, mountPath=DATA_MOUNT, readOnly=True, subPath=placement.claim.sub_path or None
    )
    volume = models.IoK8sApiCoreV1Volume(
        name=DATA_VOLUME,
        persistentVolumeClaim=models.IoK8sApiCoreV1PersistentVolumeClaimVolumeSource(
            claimName=placement.claim.claim, readOnly=True
        ),
    )
    pod = models.TrainerV1alpha1PodSpecPatch(
        volumes=[volume], containers=[models.TrainerV1alpha1ContainerPatch(name=TRAINER_JOB, volumeMounts=[mount])]
    )
    job = models.TrainerV1alpha1ReplicatedJobPatch(
        name=TRAINER_JOB,
        template=models.TrainerV1alpha1JobTemplatePatch(
            spec=models.TrainerV1alpha1JobSpecPatch(template=models.TrainerV1alpha1PodTemplatePatch(spec=pod))
        ),
    )
    return models.TrainerV1alpha1RuntimePatch(
        manager=PATCH_MANAGER,
        trainingRuntimeSpec=models.TrainerV1alpha1TrainingRuntimeSpecPatch(
            template=models.TrainerV1alpha1JobSetTemplatePatch(
                spec=models.TrainerV1alpha1JobSetSpecPatch(replicatedJobs=[job])
            )
        ),
    )
