"""Load and validate blueprint YAML files (one file per blueprint)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import ValidationError

from playground.blueprints.schema import Blueprint
from playground.errors import BlueprintError, shown, shown_path

CATALOG_DIR = Path(__file__).with_name("catalog")


def _field_path(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def load_blueprint_file(path: str | Path) -> Blueprint:
    """Parse and validate one YAML file; errors name the file and the field."""
    path = Path(path)
    where = shown_path(path, quoted=False)
    try:
        text = path.read_text()
    except OSError as exc:
        raise BlueprintError(f"{where}: cannot read ({exc.strerror or exc})", field="blueprint") from None
    blueprint = blueprint_from_yaml(text, where=where)
    if path.stem != blueprint.id:
        raise BlueprintError(
            f"{where}: field 'id': {blueprint.id!r} must match the file name {path.stem!r}", field="id"
        )
    return blueprint


def blueprint_from_yaml(text: str, *, where: str = "--blueprint-yaml") -> Blueprint:
    """Parse and validate a blueprint's YAML text (a file's, or one passed to a TrainJob pod)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise BlueprintError(f"{where}:{line} malformed YAML: {problem}", field="blueprint") from None
    if not isinstance(data, dict):
        raise BlueprintError(f"{where}: expected a mapping at the top level", field="blueprint")
    try:
        return Blueprint.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        field = _field_path(err["loc"])
        raise BlueprintError(f"{where}: field {field!r}: {err['msg']}{more}", field=field) from None


def catalog_dirs() -> list[Path]:
    """The shipped catalog, the blueprints saved under ``$PLAYGROUND_HOME/blueprints`` (``playground custom``;
    not in booth mode) and any directories in ``$PLAYGROUND_BLUEPRINTS`` (os.pathsep-separated)."""
    from playground.booth import booth_enabled
    from playground.paths import playground_home

    extra = [Path(p) for p in os.environ.get("PLAYGROUND_BLUEPRINTS", "").split(os.pathsep) if p]
    saved = playground_home() / "blueprints"
    mine = [saved] if saved.is_dir() and not booth_enabled() else []
    return [CATALOG_DIR, *mine, *extra]


@lru_cache(maxsize=8)
def _load_dirs(dirs: tuple[Path, ...]) -> tuple[dict[str, Blueprint], dict[str, BlueprintError]]:
    """(blueprints by id, the error of each file that did not load, by file stem)."""
    found: dict[str, Blueprint] = {}
    problems: dict[str, BlueprintError] = {}
    for directory in dirs:
        for file in sorted(directory.glob("*.yaml")):
            try:
                blueprint = load_blueprint_file(file)
            except BlueprintError as exc:  # one bad file costs that blueprint only
                problems.setdefault(file.stem, exc)
                continue
            if blueprint.id in found:
                message = f"{shown_path(file, quoted=False)}: field 'id': duplicate blueprint id {blueprint.id!r}"
                problems.setdefault(file.stem, BlueprintError(message, field="id"))
                continue
            found[blueprint.id] = blueprint
    return found, problems


def load_catalog() -> dict[str, Blueprint]:
    """All blueprints that load, by id, in file-name order (see :func:`catalog_problems` for the rest)."""
    return dict(_load_dirs(tuple(catalog_dirs()))[0])


def catalog_problems() -> list[BlueprintError]:
    """One error per catalog file that did not load (malformed YAML, invalid field, duplicate id)."""
    return list(_load_dirs(tuple(catalog_dirs()))[1].values())


def looks_like_file(reference: str) -> bool:
    """Whether a blueprint reference is a path to a YAML file rather than a catalog id."""
    return reference.endswith((".yaml", ".yml")) or "/" in reference or os.sep in reference


def get_blueprint(reference: str) -> Blueprint:
    """One blueprint by catalog id, or by path to a YAML file; unknown ids list the known ones.

    A catalog file that did not load is reported when its blueprint is asked for, and only then.
    """
    if looks_like_file(reference):
        return load_blueprint_file(Path(reference).expanduser())
    found, problems = _load_dirs(tuple(catalog_dirs()))
    if reference in found:
        return found[reference]
    if reference in problems:
        raise problems[reference]
    known = ", ".join(found) or "(none)"
    raise BlueprintError(f"unknown blueprint {shown(reference)}; known: {known}", field="blueprint")
