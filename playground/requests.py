"""The checks a training request gets before it reaches any backend (the facade and ``api.make_request`` run them;
a backend given a request made by hand runs them too): what is the same whatever runs the job."""

from __future__ import annotations

from pathlib import Path

from playground.errors import UserError, shown_path
from playground.types import RunRequest

DATASET_FORMS = "a local .jsonl/.json/.csv/.parquet file or directory, or hf://ORG/NAME"


def check_request(request: RunRequest) -> None:
    """A model or dataset override that names a local path must exist here (a URL is checked where it is read)."""
    model, dataset = request.overrides.model, request.overrides.dataset
    if model is not None and "://" not in model and not Path(model).expanduser().is_dir():
        raise UserError(
            f"--model-source {shown_path(model)}: no such directory; allowed: a local model directory or hf://ORG/NAME",
            field="model_source",
        )
    if dataset is not None and "://" not in dataset and not Path(dataset).expanduser().exists():
        raise UserError(
            f"--dataset-source {shown_path(dataset)}: no such file or directory; allowed: {DATASET_FORMS}",
            field="dataset_source",
        )
