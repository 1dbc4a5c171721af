"""One training run, typed and validated once per process: :class:`RunRequest`.

Every entry point builds one with :meth:`RunRequest.build` (the launch form through ``api.parameters`` and
``api.make_request``, the CLI's ``--set``, notebook parameters, a run file): the values are checked against the
blueprint's bounded parameters there, once, with the one-line errors naming the field and the allowed values. The
backends carry it, unchanged in what it says, as one JSON document to the trainer (:data:`REQUEST_ENV` in the job's
environment: locally, in a TrainJob pod, on Ray), which reads it with :meth:`RunRequest.from_json` (its process's one
validation) and resolves its ``Settings`` once. No untyped parameter dict travels between the form and the loop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from playground.blueprints import Blueprint, blueprint_from_yaml, get_blueprint
from playground.blueprints.loader import looks_like_file
from playground.errors import ParameterError, UserError
from playground.owner import Owner

REQUEST_ENV = "PLAYGROUND_RUN_REQUEST"  # the trainer's run request (JSON) in a job's environment
SCHEMA_VERSION = 1


class RunParameters(BaseModel):
    """The run's parameter values, one typed field per parameter a blueprint may expose (``KNOWN_PARAMETERS``).

    A field is None when the blueprint does not expose that parameter (its fixed ``training`` block or
    ``TRAINING_DEFAULTS`` then decide: ``playground.train.settings.resolve_setting``). Strict: JSON numbers and
    booleans only, never text (text is parsed once, by :meth:`RunRequest.build`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    learning_rate: float | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    warmup_steps: int | None = None
    weight_decay: float | None = None
    seed: int | None = None
    max_seq_length: int | None = None
    num_train_examples: int | None = None
    num_eval_examples: int | None = None
    lora_rank: int | None = None
    lora_alpha: int | None = None
    lora_dropout: float | None = None
    eval_every: int | None = None
    checkpoint_every: int | None = None
    log_every: int | None = None
    packing: bool | None = None
    compile: bool | None = None
    cpu_bf16: bool | None = None
    average_last: float | None = None
    distributed: Literal["auto", "ddp", "fsdp"] | None = None
    beta: float | None = None
    sft_weight: float | None = None
    num_generations: int | None = None
    max_completion_length: int | None = None
    temperature: float | None = None
    warm_start_steps: int | None = None
    sample_every: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The values set, by name (for display, run tracking and the job's record)."""
        return self.model_dump(exclude_none=True)

    @classmethod
    def of(cls, blueprint: Blueprint, values: Mapping[str, Any] | None = None) -> RunParameters:
        """``values`` (typed, or text from a form, ``--set`` or a notebook) over the blueprint's defaults, each
        checked against its bounds: the one validation. A one-line :class:`ParameterError` naming the field."""
        return cls.model_validate(blueprint.resolve_params(dict(values or {})), strict=False)

    @classmethod
    def check_fields(cls, blueprint: Blueprint, values: Mapping[str, Any]) -> tuple[RunParameters | None, dict]:
        """Each value checked on its own, so every bad field gets its own error (the launch form shows each next to
        its field): (the parameters, {}) when all hold, else (None, {field: one-line error})."""
        errors: dict[str, str] = {}
        for name, value in values.items():
            try:
                blueprint.resolve_params({name: value})
            except ParameterError as exc:
                errors[exc.field or name] = str(exc)
        if errors:
            return None, errors
        try:
            return cls.of(blueprint, values), {}
        except ParameterError as exc:
            return None, {exc.field or "form": str(exc)}


class SourceOverrides(BaseModel):
    """Replace a blueprint's model or dataset source (a local stand-in, a mirror, a PVC path).

    A blueprint that needs a GPU may run on CPU when its model is overridden by a local directory: that is how
    the hub blueprints' code is tested on tiny stand-ins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    dataset: str | None = None


class RunRequest(BaseModel):
    """What ``submit`` takes and the trainer reads: a blueprint, its typed parameters, source overrides, labels and
    the owner. Build one with :meth:`build` (or ``playground.api.make_request``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    version: Literal[1] = SCHEMA_VERSION
    blueprint_id: str  # a catalog id, or the absolute path of a blueprint YAML file
    blueprint_yaml: str | None = None  # the blueprint itself (a blueprint of your own, carried into a pod)
    params: RunParameters
    overrides: SourceOverrides = SourceOverrides()
    labels: dict[str, str] = Field(default_factory=dict)  # free-form labels (session, app, ...)
    owner_id: str | None = None  # the visitor who owns the job (booth mode); None: an operator's job

    @classmethod
    def build(
        cls,
        blueprint: str | Blueprint,
        params: Mapping[str, Any] | RunParameters | None = None,
        *,
        model_source: str | None = None,
        dataset_source: str | None = None,
        labels: Mapping[str, str] | None = None,
        owner: Owner | None = None,
    ) -> RunRequest:
        """The request for ``blueprint`` (a catalog id, a YAML file's path, or the Blueprint itself): ``params``
        validated against it (:meth:`RunParameters.of`), unless they already are :class:`RunParameters` (validated
        by whoever made them, e.g. the launch form)."""
        if isinstance(blueprint, Blueprint):
            loaded, reference = blueprint, blueprint.id
        else:
            loaded = get_blueprint(blueprint)
            reference = str(Path(blueprint).expanduser().resolve()) if looks_like_file(blueprint) else loaded.id
        typed = params if isinstance(params, RunParameters) else RunParameters.of(loaded, params)
        request = cls(
            blueprint_id=reference,
            params=typed,
            overrides=SourceOverrides(model=model_source, dataset=dataset_source),
            labels=dict(labels or {}),
            owner_id=(owner or Owner.operator()).id,
        )
        request.__dict__["blueprint"] = loaded  # the cached_property: not loaded twice
        return request

    @classmethod
    def from_json(cls, text: str, *, where: str = REQUEST_ENV) -> RunRequest:
        """Read a request another process wrote (the trainer's one validation): the document's types, then each
        parameter against the blueprint's bounds. A one-line UserError naming ``where`` and the field."""
        try:
            request = cls.model_validate_json(text)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(part) for part in error["loc"]) or "request"
            message = f"{where}: {field}: {error['msg']}; allowed: a run request (RunRequest)"
            raise UserError(message, field=field) from None
        request.blueprint.resolve_params(request.params.as_dict())  # declared by the blueprint, its bounds and choices
        return request

    def to_json(self) -> str:
        """The document the trainer reads (compact, keys in a fixed order)."""
        return json.dumps(self.model_dump(mode="json", exclude_none=True), separators=(",", ":"))

    @cached_property
    def blueprint(self) -> Blueprint:
        """The blueprint: carried YAML first, else by catalog id or file path."""
        if self.blueprint_yaml is not None:
            return blueprint_from_yaml(self.blueprint_yaml, where=f"{REQUEST_ENV} blueprint_yaml")
        return get_blueprint(self.blueprint_id)

    @property
    def owner(self) -> Owner:
        return Owner(self.owner_id)

    @property
    def model_source(self) -> str:
        """The model the trainer loads: the override, else the blueprint's."""
        return self.overrides.model or self.blueprint.model.source

    @property
    def dataset_source(self) -> str:
        return self.overrides.dataset or self.blueprint.dataset.source

    def for_trainer(self, **changes: Any) -> RunRequest:
        """This request as a job hands it to its trainer: ``changes`` (e.g. ``overrides`` with the pod's paths,
        ``blueprint_id`` of the job's own copy) applied, the parameters as they are."""
        if "overrides" in changes and isinstance(changes["overrides"], Mapping):
            changes["overrides"] = SourceOverrides(**changes["overrides"])
        updated = self.model_copy(update=changes)
        updated.__dict__.pop("blueprint", None)  # the cached blueprint: loaded again from what the copy names
        return updated
