"""The catalog validates, and parameter validation names the field and the allowed values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _fixtures import catalog_variant

from playground.blueprints import get_blueprint, load_blueprint_file, load_catalog, parse_set_options
from playground.errors import BlueprintError, ParameterError
from playground.events import JobPhase, Log, Metric, Phase, Progress, format_event_line, parse_line

SHIPPED = {"tiny-llama-cpu", "llama-3.2-1b-lora-alpaca", "qwen2.5-1.5b-lora-alpaca"}


def test_every_shipped_blueprint_validates_and_has_examples():
    """Every catalog file loads; with no overrides, the parameters are the YAML's own defaults
    (read from the file here, not from the schema), typed as the parameter says."""
    import yaml

    from playground.blueprints.loader import CATALOG_DIR, catalog_problems

    catalog = load_catalog()
    assert SHIPPED <= set(catalog) and catalog_problems() == []
    assert {f.stem for f in CATALOG_DIR.glob("*.yaml")} <= set(catalog)
    for blueprint in catalog.values():
        assert blueprint.examples, blueprint.id
        raw = yaml.safe_load((CATALOG_DIR / f"{blueprint.id}.yaml").read_text())["parameters"]
        resolved = blueprint.resolve_params()
        assert set(resolved) == set(raw), blueprint.id
        kinds = {"int": int, "float": float, "bool": bool}
        for name, spec in raw.items():
            default = float(spec["default"]) if spec["type"] == "float" else spec["default"]  # YAML may say 1e-4
            assert resolved[name] == default, (blueprint.id, name, resolved[name], default)
            if spec["type"] in kinds:
                assert type(resolved[name]) is kinds[spec["type"]], (blueprint.id, name, resolved[name])


def test_tiny_examples_carry_expected_answers():
    tiny = get_blueprint("tiny-llama-cpu")
    assert all(e.expected for e in tiny.examples)
    assert not tiny.needs_gpu
    assert get_blueprint("llama-3.2-1b-lora-alpaca").needs_gpu


def test_unknown_blueprint_lists_known_ids():
    with pytest.raises(BlueprintError) as err:
        get_blueprint("nope")
    assert "tiny-llama-cpu" in str(err.value) and "'nope'" in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "expected_fragments"),
    [
        ({"max_steps": "0"}, ["'max_steps'", "out of range", "from 1 to 5000"]),
        ({"max_steps": "ten"}, ["'max_steps'", "an integer from 1 to 5000"]),
        ({"max_steps": "2.5"}, ["'max_steps'", "an integer"]),
        ({"learning_rate": "nan"}, ["'learning_rate'", "a number from"]),
        ({"warp": "9"}, ["unknown parameter 'warp'", "allowed:", "max_steps"]),
    ],
)
def test_bad_parameters_name_field_and_allowed_values(overrides, expected_fragments):
    with pytest.raises(ParameterError) as err:
        get_blueprint("tiny-llama-cpu").resolve_params(overrides)
    message = str(err.value)
    assert "\n" not in message
    for fragment in expected_fragments:
        assert fragment in message


def test_strings_are_coerced_like_typed_values():
    params = get_blueprint("tiny-llama-cpu").resolve_params({"max_steps": "12", "learning_rate": 0.01})
    assert params["max_steps"] == 12 and isinstance(params["max_steps"], int)
    assert params["learning_rate"] == pytest.approx(0.01)


def test_set_options_parse_and_reject_malformed():
    assert parse_set_options(["a=1", "b = x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ParameterError, match="KEY=VALUE"):
        parse_set_options(["oops"])


def test_malformed_yaml_names_file_and_field(tmp_path: Path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("id: broken\ntitle: [unclosed\n")
    with pytest.raises(BlueprintError, match=r"broken\.yaml.*malformed YAML"):
        load_blueprint_file(broken)
    bad_field = catalog_variant(tmp_path, "tiny-llama-cpu", {"id": "bad-field", "method.kind": "qlora"})
    with pytest.raises(BlueprintError) as err:
        load_blueprint_file(bad_field)
    assert "bad-field.yaml" in str(err.value) and "method.kind" in str(err.value)


def test_event_lines_round_trip_and_plain_lines_are_logs():
    events = [
        Phase(JobPhase.TRAINING, "started"),
        Progress(step=3, total_steps=10, loss=1.5, tokens_per_second=100.0),
        Metric("eval_exact_match", 0.95),
    ]
    for event in events:
        assert parse_line("2026-11-21T00:00:00Z " + format_event_line(event)) == event
    log = parse_line("hello world\n", source="node-0")
    assert isinstance(log, Log) and log.line == "hello world" and log.source == "node-0"
    assert isinstance(parse_line("@@playground {not json"), Log)


def test_writable_dir_check_is_safe_from_many_threads_at_once(tmp_path: Path):
    """Serving base and fine-tuned models at once checks the same state dir from two threads."""
    from concurrent.futures import ThreadPoolExecutor

    from playground.paths import ensure_writable_dir

    target = tmp_path / "servers"
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so overlapping checks really interleave
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(lambda _: ensure_writable_dir(target, what="server state directory"), range(2000)))
    finally:
        sys.setswitchinterval(switch)
    assert results == [target] * 2000
    assert list(target.iterdir()) == []  # no probe left behind


def test_unwritable_dir_is_a_one_line_user_error(tmp_path: Path):
    from playground.errors import UserError
    from playground.paths import ensure_writable_dir

    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(UserError, match=r"state dir .*file/sub.* is not writable"):
        ensure_writable_dir(blocker / "sub", what="state dir")
