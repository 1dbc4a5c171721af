"""The blueprint schema (pydantic). A blueprint is defined once, in YAML; the launch form,
the CLI ``--set``, notebook parameters and the TrainJob are all derived from it."""

from __future__ import annotations

import math
import numbers
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from playground.errors import ParameterError, shown

# Parameters the training entrypoint understands. A blueprint exposes a bounded subset.
KNOWN_PARAMETERS: dict[str, str] = {
    "learning_rate": "peak learning rate (cosine decay after warmup)",
    "max_steps": "optimizer steps to train",
    "batch_size": "examples per micro-batch; × gradient_accumulation_steps = the global batch, whatever the GPU count",
    "gradient_accumulation_steps": "micro-batches per optimizer step (split over the processes first)",
    "warmup_steps": "linear warmup steps",
    "weight_decay": "AdamW weight decay",
    "seed": "random seed (data order, init)",
    "max_seq_length": "tokens per example (longer examples are truncated)",
    "num_train_examples": "training examples to use",
    "num_eval_examples": "held-out examples to evaluate",
    "lora_rank": "LoRA rank r",
    "lora_alpha": "LoRA alpha",
    "lora_dropout": "LoRA dropout",
    "eval_every": "evaluate every N steps (0: only at the end)",
    "checkpoint_every": "save a resumable checkpoint every N steps (0: never)",
    "log_every": "print a progress line every N steps",
    "packing": "pack each micro-batch's examples into one row without padding (no cross-example attention)",
    "compile": "torch.compile the training forward/backward",
    "cpu_bf16": "on a CPU with native bf16 (AVX512-BF16, AMX): the training forward/backward in bf16 (autocast)",
    "average_last": "the model saved is the mean of the trainable weights over this last fraction of the steps "
    "(0: the last step's weights)",
    "distributed": "several processes: auto (FSDP2 when DDP's replicated state would not fit), ddp or fsdp",
    "beta": "DPO/GRPO: how far the policy may move from the reference model (the KL weight)",
    "sft_weight": "DPO: weight of the SFT loss on the chosen answer beside the DPO loss (0: pure DPO)",
    "num_generations": "GRPO: completions sampled per prompt (their rewards are compared)",
    "max_completion_length": "GRPO: tokens per sampled completion",
    "temperature": "GRPO: sampling temperature of the tries (lower: nearer the greedy answer evaluated and served)",
    "warm_start_steps": "GRPO: supervised steps on the task before the reward takes over (0: start from the base)",
    "sample_every": "GRPO: print sampled completions with their rewards every N steps (0: never)",
}

# Every training setting's default, in one place (nanoGPT style). A run's setting is its parameter (a
# blueprint's ``parameters``, their defaults in its YAML) > the blueprint's fixed ``training`` block > this
# block: ``playground.train.settings.resolve_setting``, which the trainer's ``Settings``, ``playground plan``
# and ``playground data check`` all ask. LoRA's (lora_rank, lora_alpha, lora_dropout): the blueprint's ``method``.
TRAINING_DEFAULTS: dict[str, Any] = {
    "learning_rate": 2e-4,
    "max_steps": 100,
    "batch_size": 8,
    "gradient_accumulation_steps": 1,
    "warmup_steps": None,  # None: 5% of max_steps, at most 100
    "weight_decay": 0.0,
    "seed": 0,
    "max_seq_length": 512,
    "num_train_examples": None,  # None: all rows (synthetic: max_steps × global batch, capped)
    "num_eval_examples": 200,  # the held-out prompts are kept out of the training rows
    "eval_every": 0,
    "checkpoint_every": 0,
    "log_every": 10,
    "packing": False,  # speed levers (playground/train/perf.py): fixed settings, off unless a blueprint sets them
    "compile": False,
    "cpu_bf16": False,
    "average_last": 0.0,  # a uniform weight average over the run's tail (stochastic weight averaging); 0: off
    "distributed": "auto",  # auto | ddp | fsdp (playground/train/parallel.py has the rule)
    # Preference and reinforcement methods (method.objective dpo | grpo; playground/train/dpo.py, grpo.py)
    "beta": 0.1,
    "sft_weight": 0.0,
    "num_generations": 4,
    "max_completion_length": 32,
    "temperature": 1.0,
    "warm_start_steps": 0,
    "sample_every": 10,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParameterSpec(_Strict):
    """One bounded, user-settable parameter."""

    type: Literal["int", "float", "bool", "choice"]
    default: Any
    min: float | None = None
    max: float | None = None
    choices: list[Any] | None = None
    help: str = ""
    log_scale: bool = False  # a hint for UI sliders (learning rates)

    @model_validator(mode="after")
    def _check(self) -> ParameterSpec:
        if self.type == "choice" and not self.choices:
            raise ValueError("type 'choice' needs 'choices'")
        if self.type in ("int", "float") and (self.min is None or self.max is None):
            raise ValueError(f"type {self.type!r} needs both 'min' and 'max' (parameters are bounded)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is greater than max {self.max}")
        return self

    def describe_allowed(self) -> str:
        """Human text for the allowed values, used in every error message."""
        if self.type == "choice":
            return "one of " + ", ".join(str(c) for c in self.choices or [])
        if self.type == "bool":
            return "true or false"
        kind = "an integer" if self.type == "int" else "a number"
        return f"{kind} from {_fmt(self.min)} to {_fmt(self.max)}"

    def coerce(self, name: str, value: Any) -> Any:
        """Convert ``value`` (typed, or a string from ``--set``/a form/a notebook) and check bounds.

        Text is parsed by :func:`parse_number`: ASCII digits only, the same rule everywhere.
        """
        allowed = self.describe_allowed()

        def bad(why: str = "") -> ParameterError:
            message = f"parameter {name!r}: {shown(value)} is not valid{why}; allowed: {allowed}"
            return ParameterError(message, field=name)

        if self.type == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise bad()
        if self.type == "choice":
            for choice in self.choices or []:
                if value == choice or str(value).strip() == str(choice):
                    return choice
            raise bad()
        if isinstance(value, bool):
            raise bad()
        number: int | float
        if isinstance(value, numbers.Integral):
            number = int(value)  # compared exactly; a float parameter gets float() once in range
        elif isinstance(value, numbers.Real):
            number = float(value)
            if self.type == "int":
                if not number.is_integer():
                    raise bad()
                number = int(number)
        elif isinstance(value, str):
            try:
                number = parse_number(value, integer=self.type == "int")
            except ValueError as exc:
                raise bad(f" ({exc})" if str(exc) else "") from None
        else:
            raise bad()
        if isinstance(number, float) and not math.isfinite(number):
            raise bad()
        assert self.min is not None and self.max is not None
        if not (self.min <= number <= self.max):
            raise ParameterError(f"parameter {name!r}: {_fmt(number)} is out of range; allowed: {allowed}", field=name)
        if self.type == "float":
            number = float(number)
        return number


_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_number(text: str, *, integer: bool) -> int | float:
    """The one parser for numbers typed as text (``--set``, the form, notebook and e2e parameters).

    ASCII digits only, surrounding whitespace ignored: ``12``, ``+3``, ``5e-3``, ``.5``. Refused
    with ValueError: other scripts' digits (``٣``, ``３``), ``1_0``, hex, ``inf``/``nan``, and for
    integers a decimal point or an exponent.
    """
    stripped = text.strip()
    if not stripped.isascii():
        raise ValueError("use the ASCII digits 0-9")
    if "_" in stripped:
        raise ValueError("no '_' separators")
    if not (_INT_TEXT if integer else _FLOAT_TEXT).fullmatch(stripped):
        raise ValueError("")
    if integer:
        if len(stripped.lstrip("+-")) > 18:  # far beyond any bound; also keeps int() cheap
            raise ValueError("too many digits")
        return int(stripped)
    return float(stripped)


def _fmt(x: float | None) -> str:
    """A bound or a parsed number for a message: ``5000``, ``0.003``, ``1e-05``; huge integers by size."""
    if x is None:
        return "?"
    if isinstance(x, int) and abs(x) >= 10**15:  # typed from the API: say its size, never its digits
        return f"a {math.floor(math.log10(abs(x))) + 1}-digit integer"
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:g}"


class ModelSpec(_Strict):
    """Where the base model comes from.

    ``source``: ``hf://org/name`` (hub), ``scratch://llama`` (architecture ``config`` built
    locally with random init) or a local directory path (a stand-in or a mirror).
    """

    source: str
    gated: bool = False
    config: dict[str, Any] = Field(default_factory=dict)
    tokenizer: str | None = None  # e.g. "chars" for a tokenizer the trainer builds itself
    chat_template: str | None = None  # Jinja template stored with the tokenizer
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"


class DatasetSpec(_Strict):
    """Where the data comes from and how it is formatted.

    ``source``: ``hf://org/name``, ``synthetic://<task>`` (generated by the project), a local
    ``.jsonl``/``.json``/``.csv``/``.parquet`` file, or a directory. ``format``: ``auto`` finds the
    shape from the columns (``messages``; ``prompt``/``completion``; Alpaca ``instruction``/``input``/
    ``output``); ``columns`` maps those names to the file's own. Held out: ``eval_source`` (a file),
    else ``eval_split`` (a hub split), else ``eval_fraction`` of the rows.
    """

    source: str
    format: Literal["auto", "alpaca", "chat", "synthetic"] = "auto"
    split: str = "train"
    eval_split: str | None = None  # None: hold out ``eval_fraction`` of ``split``
    eval_source: str | None = None  # a local file of held-out rows (same shape and columns)
    eval_fraction: float = Field(default=0.05, gt=0, lt=1)
    columns: dict[str, str] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_columns(self) -> DatasetSpec:
        from playground.userdata.shapes import CANONICAL

        unknown = sorted(set(self.columns) - set(CANONICAL))
        if unknown:
            raise ValueError(f"unknown column name(s) {', '.join(unknown)}; allowed: {', '.join(CANONICAL)}")
        return self


OBJECTIVES = ("sft", "dpo", "grpo")


class MethodSpec(_Strict):
    """How the weights train: ``kind`` (all of them, or LoRA adapters) and ``objective`` (the recipe:
    supervised fine-tuning, DPO on preference pairs, or GRPO against a verifiable reward)."""

    kind: Literal["full", "lora"]
    objective: Literal["sft", "dpo", "grpo"] = "sft"
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"])


class ResourcesSpec(_Strict):
    nodes: int = Field(default=1, ge=1)
    gpus_per_node: int = Field(default=0, ge=0)
    cpu: str | None = None
    memory: str | None = None

    @property
    def needs_gpu(self) -> bool:
        return self.gpus_per_node > 0


class KubernetesSpec(_Strict):
    """How the blueprint runs as a TrainJob: always the project's trainer (``python -m playground.train``)."""

    trainer: Literal["playground"] = "playground"
    runtime: str = "playground-torch"
    image: str | None = None
    # Download the hf:// model and dataset with Kubeflow's initializers into the job's workspace
    # before the trainer starts (needs a runtime with those steps: playground-torch-hf).
    initializers: bool = False
    # The opt-in upstream variant (`--trainer builtin-torchtune`): its TorchTune runtime.
    torchtune_runtime: str | None = None
    active_deadline_seconds: int = Field(default=3600, ge=60)
    storage: str = "10Gi"


class ServingSpec(_Strict):
    runtime: Literal["huggingface"] = "huggingface"
    max_new_tokens: int = Field(default=128, ge=1, le=4096)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    # kubectl: an answer that would change the cluster is shown only when the request asked for that change
    # (playground/kubectl/guard.py); none: answers are shown as the model gives them.
    guard: Literal["none", "kubectl"] = "none"
    # kubectl: the models are asked the request with its mistyped kubectl words spelt right and a typed ``-n NAME``
    # said in words (playground/kubectl/request.py; the panel shows that reading); none: the request as typed.
    normalize: Literal["none", "kubectl"] = "none"
    # kubectl: a bare command without a namespace gets the one the request says ("the pods in payments" answered
    # ``kubectl get pods`` → ``… -n payments``; playground/kubectl/answer.py; the panel says so); none: as given.
    complete: Literal["none", "kubectl"] = "none"


class QualitySpec(_Strict):
    """What the headless notebook (and the e2e check) asserts."""

    metric: str
    threshold: float
    higher_is_better: bool = True

    def passed(self, value: float) -> bool:
        return value >= self.threshold if self.higher_is_better else value <= self.threshold


class Example(_Strict):
    prompt: str
    expected: str | None = None


class Blueprint(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,62}$")
    title: str
    description: str = ""
    task: str
    model: ModelSpec
    dataset: DatasetSpec
    method: MethodSpec
    parameters: dict[str, ParameterSpec]
    # Fixed training settings a visitor cannot change (e.g. warmup_steps), keys from KNOWN_PARAMETERS;
    # a same-named entry in ``parameters`` overrides them, and they override TRAINING_DEFAULTS.
    training: dict[str, Any] = Field(default_factory=dict)
    resources: ResourcesSpec = ResourcesSpec()
    kubernetes: KubernetesSpec = KubernetesSpec()
    serving: ServingSpec = ServingSpec()
    quality: QualitySpec
    examples: list[Example] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Blueprint:
        unknown = sorted(set(self.parameters) - set(KNOWN_PARAMETERS))
        if unknown:
            raise ValueError(f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(KNOWN_PARAMETERS))}")
        unknown = sorted(set(self.training) - set(KNOWN_PARAMETERS))
        if unknown:
            known = ", ".join(sorted(KNOWN_PARAMETERS))
            raise ValueError(f"unknown training setting(s) {', '.join(unknown)}; known: {known}")
        for name, spec in self.parameters.items():
            try:
                spec.coerce(name, spec.default)
            except ParameterError as exc:
                raise ValueError(f"default of {name!r} is invalid: {exc}") from None
        return self

    @property
    def needs_gpu(self) -> bool:
        return self.resources.needs_gpu

    def defaults(self) -> dict[str, Any]:
        return {name: spec.coerce(name, spec.default) for name, spec in self.parameters.items()}

    def resolve_params(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Defaults merged with ``overrides`` (typed values or strings), validated.

        Raises :class:`ParameterError` naming the field and the allowed values.
        """
        params = self.defaults()
        for name, value in (overrides or {}).items():
            spec = self.parameters.get(name)
            if spec is None:
                known = ", ".join(sorted(self.parameters)) or "(none)"
                raise ParameterError(
                    f"unknown parameter {shown(name)} for blueprint {self.id!r}; allowed: {known}", field=name
                )
            params[name] = spec.coerce(name, value)
        return params


def parse_set_options(items: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` from ``--set`` into a dict; malformed items are a one-line error."""
    result: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ParameterError(f"--set {shown(item)}: expected KEY=VALUE", field="--set")
        result[key.strip()] = value.strip()
    return result
