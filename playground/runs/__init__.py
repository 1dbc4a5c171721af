"""Run records and model registration (MLflow; Kubeflow Hub for registration).

Every training job is an MLflow run, logged by the trainer itself (rank 0; ``tracking.py``) to
``MLFLOW_TRACKING_URI`` (default: ``sqlite:///$PLAYGROUND_HOME/mlflow.db``): parameters, the blueprint,
the loss / learning-rate / tokens-per-second curves at every logged step, eval metrics, the quality
verdict, a reference to the model directory and tags (job id, backend, owner). ``store.py`` reads runs
back (``playground runs``, the app's chart, a job's whole run), ``ui.py`` says where a run's page in MLflow's UI
is reachable (from a notebook pod: through its own base URL), ``registry.py`` registers a job's model
(``playground register``). Nothing here imports mlflow at import time (``import mlflow`` takes ~2 s).
"""

from playground.runs.settings import (
    ARTIFACTS_DIRNAME,
    DB_FILENAME,
    DISABLE_ENV,
    TRACKING_ENV,
    default_tracking_uri,
    mlflow_ui_command,
    safe_uri,
    store_uri,
    tracking_uri,
)

__all__ = [
    "ARTIFACTS_DIRNAME",
    "DB_FILENAME",
    "DISABLE_ENV",
    "TRACKING_ENV",
    "default_tracking_uri",
    "mlflow_ui_command",
    "safe_uri",
    "store_uri",
    "tracking_uri",
]
