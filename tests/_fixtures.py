"""Small fixtures several test files need: tiny-llama-cpu's held-out prompts, a catalog blueprint file with a
field changed, a localhost port nothing listens on."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from playground.train.data import Sample


def tiny_held_out(n: int) -> list[Sample]:
    """The first ``n`` of tiny-llama-cpu's held-out samples (prompt, answer), as its trainer draws them: never
    trained on. The held-out split depends on neither the training rows nor the seed."""
    from playground.blueprints import get_blueprint
    from playground.train.data import synthetic_splits

    blueprint = get_blueprint("tiny-llama-cpu")
    task = blueprint.dataset.source.split("://", 1)[1]
    return synthetic_splits(task, dict(blueprint.dataset.options), num_train=0, num_eval=n, seed=0)[1]


def catalog_variant(directory: Path, blueprint_id: str, changes: Mapping[str, Any]) -> Path:
    """The catalog's ``blueprint_id`` with ``changes`` (dotted keys: ``{"id": "x", "method.kind": "qlora"}``),
    written as ``directory/<its id>.yaml`` (the directory made if missing); the file's path."""
    from playground.blueprints.loader import CATALOG_DIR

    data = yaml.safe_load((CATALOG_DIR / f"{blueprint_id}.yaml").read_text())
    for key, value in changes.items():
        *parents, leaf = key.split(".")
        node = data
        for name in parents:
            node = node[name]
        node[leaf] = value
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{data['id']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def unused_port() -> int:
    """A localhost port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


WARM_KERNEL_READY = "Kernel pool of playground.ipynb is filled"  # Voila's log line once the warm kernels ran the app


def wait_for_app(port: int, proc: subprocess.Popen, timeout: float = 90, warm_log: Path | None = None) -> None:
    """Until ``playground app`` (``proc``) listens on ``port``, and with ``warm_log`` (a booth's log) until its warm
    kernel is ready, so that tests counting kernels start from a settled booth; an AssertionError when it exits
    first."""
    import contextlib

    from _waiting import wait_for

    def listening() -> bool:
        assert proc.poll() is None, f"playground app exited with {proc.returncode}"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False

    wait_for(listening, timeout, f"playground app listening on port {port}", interval=0.3)
    if warm_log is not None:
        wait_for(lambda: listening() and WARM_KERNEL_READY in warm_log.read_text(errors="replace"), timeout,
                 "the booth's warm kernel", interval=0.3)  # fmt: skip


def stop_process(proc: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; waits until it is gone."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def adapter_job(job_id: str, adapter_dir: Path | str, base_model: Path | str, owner: str | None = None):
    """A Succeeded LoRA job (no job directory): ``adapter_dir`` as its model, on ``base_model``."""
    import time

    from playground.events import JobPhase
    from playground.types import Job

    return Job(id=job_id, blueprint_id="smollm2-135m-lora-kubectl", backend="local", phase=JobPhase.SUCCEEDED,
               params={}, created_at=time.time(), model_dir=str(adapter_dir), base_model=str(base_model),
               owner=owner)  # fmt: skip
