"""The e2e run file (YAML, ``playground e2e --run-file FILE``): the notebooks of a CI job with their
parameters, timeouts and groups, so that each of upstream's jobs is one command.

.. code-block:: yaml

    name: Kubeflow Trainer notebooks      # the summary's title
    root: ..                              # notebook paths are relative to this folder (itself relative
                                          #   to the run file); default: the current directory
    cell_timeout: 1800                    # defaults for every notebook (papermill --execution-timeout)
    timeout: 3600                         #   whole notebook, then its kernel is killed
    kernel: python3                       #   default: each notebook's kernelspec
    parameters: {}                        #   given to every notebook
    notebooks:
      - path: examples/jax/image-classification/mnist.ipynb
        name: jax-mnist                   # test name / output folder; default: from the path
        parameters: {num_gpu: 2}
        gpu: true                         # = group: gpu
        group: gpu                        # or groups: [gpu, nightly]; --group NAME selects

Bad input is one line naming the field (``notebooks[1].timeout``) and what is allowed; exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from playground.e2e.types import NotebookSpec
from playground.errors import UserError, shown, shown_path

_NAME_CHARS = "letters, digits, '.', '_', '-' and '/'"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _check_parameters(value: dict[str, Any]) -> dict[str, Any]:
    from playground.e2e.scrub import looks_like_secret_name

    for name in value:
        if not str(name).isidentifier():
            raise ValueError(f"parameter name {shown(name)} is not a Python identifier")
        if looks_like_secret_name(str(name)):
            raise ValueError(f"parameter {shown(name)} looks like a secret; set it in the environment instead")
    return value


class NotebookEntry(_Strict):
    path: str = Field(min_length=1)
    name: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._/-]+$")
    parameters: dict[str, Any] = Field(default_factory=dict)
    cell_timeout: PositiveInt | None = None
    timeout: PositiveInt | None = None
    kernel: str | None = Field(default=None, min_length=1)
    gpu: bool = False
    group: str | None = Field(default=None, min_length=1)
    groups: list[str] = Field(default_factory=list)

    _params = field_validator("parameters")(_check_parameters)

    def all_groups(self) -> tuple[str, ...]:
        names = [*self.groups, *([self.group] if self.group else []), *(["gpu"] if self.gpu else [])]
        return tuple(dict.fromkeys(names))


class RunFileModel(_Strict):
    name: str | None = Field(default=None, min_length=1, max_length=200)
    root: str | None = None
    cell_timeout: PositiveInt | None = None
    timeout: PositiveInt | None = None
    kernel: str | None = Field(default=None, min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)
    notebooks: list[NotebookEntry] = Field(min_length=1)

    _params = field_validator("parameters")(_check_parameters)


@dataclass
class RunFile:
    """A validated run file: its title and the notebooks to run (after ``--group``)."""

    path: Path
    title: str | None
    notebooks: list[NotebookSpec]
    groups: tuple[str, ...]  # every group the file names


def _where(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def load_run_file(path: Path, *, group: str | None = None, prefix: str | None = None) -> RunFile:
    """Read and validate ``path``; the notebooks of ``group`` (None: all), test names under ``prefix``."""
    import yaml

    from playground.e2e.runner import test_names

    where = f"run file {shown_path(path)}"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{where}: cannot be read ({exc.strerror or type(exc).__name__})", field="--run-file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{where}: not valid YAML{at}", field="--run-file") from None
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping with a 'notebooks' list", field="--run-file")
    try:
        model = RunFileModel.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field_path = _where(err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = NotebookEntry if "notebooks" in err["loc"][:1] and len(err["loc"]) > 2 else RunFileModel
            message = f"unknown field; allowed: {', '.join(allowed.model_fields)}"
        elif err["type"] == "string_pattern_mismatch":
            message = f"allowed: {_NAME_CHARS}"
        raise UserError(f"{where}: {field_path}: {message}", field=field_path) from None

    root = Path.cwd() if model.root is None else (path.parent / model.root)
    all_groups = tuple(dict.fromkeys(g for nb in model.notebooks for g in nb.all_groups()))
    if group is not None and group not in all_groups:
        allowed = ", ".join(all_groups) or "none: the file names no group"
        raise UserError(f"--group {shown(group)}: not a group of {where}; allowed: {allowed}", field="--group")
    paths = []
    for i, nb in enumerate(model.notebooks):
        nb_path = Path(nb.path).expanduser()
        nb_path = nb_path if nb_path.is_absolute() else root / nb_path
        if not nb_path.is_file():
            raise UserError(f"{where}: notebooks[{i}].path {shown_path(nb.path)} does not exist", field="path")
        if nb_path.suffix != ".ipynb":
            raise UserError(f"{where}: notebooks[{i}].path: allowed: a Jupyter .ipynb file", field="path")
        paths.append(nb_path)
    names = test_names(paths)  # from every notebook of the file: the same whichever --group runs
    specs = []
    for nb, nb_path, default_name in zip(model.notebooks, paths, names, strict=True):
        if group is not None and group not in nb.all_groups():
            continue
        name = nb.name or default_name
        specs.append(
            NotebookSpec(
                path=nb_path,
                name=f"{prefix}/{name}" if prefix else name,
                parameters={**model.parameters, **nb.parameters},
                cell_timeout=nb.cell_timeout or model.cell_timeout,
                run_timeout=nb.timeout or model.timeout,
                kernel=nb.kernel or model.kernel,
                groups=nb.all_groups(),
            )
        )
    return RunFile(path=path, title=model.name, notebooks=specs, groups=all_groups)
