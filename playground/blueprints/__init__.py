"""Blueprint catalog: one YAML file per blueprint under ``catalog/``, validated by :mod:`.schema`."""

from playground.blueprints.loader import (
    blueprint_from_yaml,
    catalog_problems,
    get_blueprint,
    load_blueprint_file,
    load_catalog,
)
from playground.blueprints.schema import (
    KNOWN_PARAMETERS,
    TRAINING_DEFAULTS,
    Blueprint,
    Example,
    ParameterSpec,
    parse_set_options,
)

__all__ = [
    "KNOWN_PARAMETERS",
    "TRAINING_DEFAULTS",
    "Blueprint",
    "Example",
    "ParameterSpec",
    "blueprint_from_yaml",
    "catalog_problems",
    "get_blueprint",
    "load_blueprint_file",
    "load_catalog",
    "parse_set_options",
]
