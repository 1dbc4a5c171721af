"""The typed run request: built and validated once where it is made, carried as one JSON document to the trainer,
read there (its process's one validation) into the trainer's settings once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from playground.api import make_request, parameters
from playground.blueprints import KNOWN_PARAMETERS, get_blueprint
from playground.errors import ParameterError, UserError
from playground.owner import Owner
from playground.run_request import REQUEST_ENV, RunParameters, RunRequest
from playground.train.__main__ import prepare


def test_every_known_parameter_is_one_typed_field():
    assert set(RunParameters.model_fields) == set(KNOWN_PARAMETERS)
    with pytest.raises(ValueError):
        RunParameters(max_steps="5")  # strict: text is parsed once, where the request is made
    with pytest.raises(ValueError):
        RunParameters(distributed="zero3")


def test_text_typed_values_and_defaults_make_one_typed_request():
    request = make_request("tiny-llama-cpu", {"max_steps": " 7 ", "learning_rate": "5e-3"}, owner="v-0123456789abcdef")
    blueprint = get_blueprint("tiny-llama-cpu")
    assert request.params.max_steps == 7 and request.params.learning_rate == 0.005
    assert isinstance(request.params.max_steps, int) and isinstance(request.params.learning_rate, float)
    assert request.params.as_dict() == {**blueprint.defaults(), "max_steps": 7, "learning_rate": 0.005}
    assert request.params.lora_rank is None  # not exposed by this blueprint: its method decides
    assert request.owner == Owner.visitor("v-0123456789abcdef") and request.owner_id == "v-0123456789abcdef"
    assert make_request("tiny-llama-cpu", request.params).params is request.params  # typed: taken as it is


@pytest.mark.parametrize(
    ("values", "field", "needles"),
    [
        ({"max_steps": "0"}, "max_steps", ["out of range", "an integer from 1 to 5000"]),
        ({"max_steps": "1.5"}, "max_steps", ["not valid", "an integer"]),
        ({"lora_rank": 4}, "lora_rank", ["unknown parameter", "allowed: batch_size"]),
    ],
)
def test_bad_values_are_one_line_naming_the_field(values, field, needles):
    with pytest.raises(ParameterError) as err:
        make_request("tiny-llama-cpu", values)
    assert err.value.field == field and "\n" not in str(err.value)
    assert all(needle in str(err.value) for needle in needles)


def test_the_form_gets_every_bad_field_at_once_and_typed_values_otherwise():
    typed, errors = parameters("tiny-llama-cpu", {"max_steps": "x", "learning_rate": "9", "seed": "3"})
    assert typed is None and set(errors) == {"max_steps", "learning_rate"}
    typed, errors = parameters("tiny-llama-cpu", {"max_steps": "12", "seed": "3"})
    assert errors == {} and (typed.max_steps, typed.seed) == (12, 3)


def test_the_document_round_trips_and_is_validated_once_on_reading():
    request = make_request("tiny-llama-cpu", {"max_steps": 9}, labels={"app": "playground"})
    text = request.to_json()
    document = json.loads(text)
    assert document["params"]["max_steps"] == 9 and "lora_rank" not in document["params"]  # unset: left out
    assert RunRequest.from_json(text) == request
    for params, field, needle in (
        ({"max_steps": "9"}, "params.max_steps", "valid integer"),  # text is not a typed value
        ({"max_steps": 0}, "max_steps", "out of range"),  # the blueprint's bounds
        ({"lora_rank": 8}, "lora_rank", "unknown parameter"),  # a field the blueprint does not expose
    ):
        with pytest.raises(UserError) as err:
            RunRequest.from_json(json.dumps({**document, "params": params}))
        assert err.value.field == field and needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match=f"^{REQUEST_ENV}: "):
        RunRequest.from_json("{not json")


def test_the_trainer_reads_the_request_from_its_environment(tmp_path, monkeypatch):
    request = make_request("tiny-llama-cpu", {"max_steps": 4, "log_every": 2})
    monkeypatch.setenv(REQUEST_ENV, request.to_json())
    spec = prepare(["--output", str(tmp_path / "out")])
    assert spec.params == request.params and spec.blueprint.id == "tiny-llama-cpu"
    assert (spec.settings.max_steps, spec.settings.log_every) == (4, 2)
    assert spec.settings is spec.settings  # resolved once per run
    (tmp_path / "request.json").write_text(make_request("tiny-llama-cpu", {"max_steps": 6}).to_json())
    assert (
        prepare(["--request", str(tmp_path / "request.json"), "--output", str(tmp_path / "o2")]).settings.max_steps == 6
    )
    with pytest.raises(UserError) as err:
        prepare(["--request", str(tmp_path / "request.json"), "--set", "max_steps=3", "--output", str(tmp_path / "o3")])
    assert err.value.field == "--set" and "goes with --blueprint" in str(err.value)


def test_a_bad_document_fails_the_trainer_in_one_line_and_writes_nothing(tmp_path):
    document = json.loads(make_request("tiny-llama-cpu").to_json())
    env = {**os.environ, REQUEST_ENV: json.dumps({**document, "params": {"max_steps": 99999}})}
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "playground.train", "--output", str(out)], env=env, capture_output=True, text=True
    )
    assert run.returncode == 2 and not out.exists()
    assert run.stderr.strip().count("\n") == 0 and "max_steps" in run.stderr and "from 1 to 5000" in run.stderr
    env.pop(REQUEST_ENV)
    run = subprocess.run(
        [sys.executable, "-m", "playground.train", "--output", str(out)], env=env, capture_output=True, text=True
    )
    assert run.returncode == 2 and f"--request FILE or ${REQUEST_ENV}" in run.stderr


def test_the_local_backend_hands_the_trainer_one_document(tmp_path, monkeypatch):
    from playground.backends.local.backend import LocalBackend

    monkeypatch.setenv("PLAYGROUND_HOME", str(tmp_path))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) + "\n" for i in range(30)))
    request = make_request("tiny-llama-cpu", {"max_steps": 5}, dataset_source=str(data))
    spec = yaml.safe_load(LocalBackend(home=tmp_path).render_train(request))
    assert "--set" not in spec["command"] and spec["command"][-2:] == ["--output", spec["command"][-1]]
    sent = RunRequest.model_validate_json(spec["env"][REQUEST_ENV])  # a dry run: its blueprint copy is not written
    assert sent.params == request.params and sent.overrides.dataset == str(data)
    assert sent.blueprint_id.endswith("/blueprint/tiny-llama-cpu.yaml")  # the job's own copy of the blueprint
