"""Load and validate blueprint YAML files (one file per blueprint)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import ValidationError

from playground.blueprints.schema import Blueprint
from playground.errors import BlueprintError

CATALOG_DIR = Path(__file__).with_name("catalog")


def _field_path(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def load_blueprint_file(path: str | Path) -> Blueprint:
    """Parse and validate one YAML file; errors name the file and the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise BlueprintError(f"{path}: cannot read ({exc.strerror})", field=str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise BlueprintError(f"{path}:{where} malformed YAML: {problem}", field=str(path)) from None
    if not isinstance(data, dict):
        raise BlueprintError(f"{path}: expected a mapping at the top level", field=str(path))
    try:
        blueprint = Blueprint.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        field = _field_path(err["loc"])
        raise BlueprintError(f"{path}: field {field!r}: {err['msg']}{more}", field=field) from None
    if path.stem != blueprint.id:
        raise BlueprintError(f"{path}: field 'id': {blueprint.id!r} must match the file name {path.stem!r}", field="id")
    return blueprint


def catalog_dirs() -> list[Path]:
    """The shipped catalog plus any directories in ``$PLAYGROUND_BLUEPRINTS`` (os.pathsep-separated)."""
    extra = [Path(p) for p in os.environ.get("PLAYGROUND_BLUEPRINTS", "").split(os.pathsep) if p]
    return [CATALOG_DIR, *extra]


@lru_cache(maxsize=8)
def _load_dirs(dirs: tuple[Path, ...]) -> dict[str, Blueprint]:
    found: dict[str, Blueprint] = {}
    for directory in dirs:
        for file in sorted(directory.glob("*.yaml")):
            blueprint = load_blueprint_file(file)
            if blueprint.id in found:
                raise BlueprintError(f"{file}: field 'id': duplicate blueprint id {blueprint.id!r}", field="id")
            found[blueprint.id] = blueprint
    return found


def load_catalog() -> dict[str, Blueprint]:
    """All blueprints by id, in file-name order."""
    return dict(_load_dirs(tuple(catalog_dirs())))


def get_blueprint(blueprint_id: str) -> Blueprint:
    """One blueprint by id, or by path to a YAML file; unknown ids list the known ones."""
    if blueprint_id.endswith((".yaml", ".yml")) and Path(blueprint_id).exists():
        return load_blueprint_file(blueprint_id)
    catalog = load_catalog()
    try:
        return catalog[blueprint_id]
    except KeyError:
        known = ", ".join(catalog) or "(none)"
        raise BlueprintError(f"unknown blueprint {blueprint_id!r}; known: {known}", field="blueprint") from None
