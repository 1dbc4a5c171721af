"""Your own data and model (issue 21, items 1-3): files read and mapped to conversations, checked against the
chat template before anything starts, a custom blueprint saved and loaded unchanged, and a real run on a
multi-turn ``.jsonl`` through the local backend reaching the bar set for it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from playground.blueprints import get_blueprint, load_blueprint_file, load_catalog
from playground.blueprints.custom import blueprint_yaml, check_architecture, make_custom, save_blueprint
from playground.cli import main
from playground.errors import UserError
from playground.userdata import DatasetError, check_dataset, read_rows
from playground.userdata.shapes import parse_columns, to_conversations

TINY = "tiny-llama-cpu"
BAR = "eval_exact_match>=0.8"
CHAR_TEMPLATE_NO_SYSTEM = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% if m['role'] == 'assistant' %}<|end|>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def conversation(rng: random.Random, turns: int, system: bool = True) -> dict:
    """A multi-turn row: reverse each word the user sends (what the tiny model can learn in seconds)."""
    messages = [{"role": "system", "content": "Reverse each word."}] if system else []
    for _ in range(turns):
        word = "".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 5)))
        messages += [{"role": "user", "content": word}, {"role": "assistant", "content": word[::-1]}]
    return {"messages": messages}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def multi_turn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """1500 training conversations of 1-3 turns and 60 held-out ones of 1-2 turns, written separately."""
    rng = random.Random(1)
    directory = tmp_path_factory.mktemp("multi-turn")
    train = write_jsonl(directory / "train.jsonl", [conversation(rng, rng.randint(1, 3)) for _ in range(1500)])
    held = write_jsonl(directory / "eval.jsonl", [conversation(rng, rng.randint(1, 2)) for _ in range(60)])
    return train, held


# -- shapes and files -----------------------------------------------------------------------------
def test_every_shape_and_file_type_maps_to_conversations(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    alpaca = [{"instruction": "Add", "input": "1 2", "output": "3"}, {"instruction": "Say hi", "output": "hi"}]
    (tmp_path / "a.json").write_text(json.dumps({"train": alpaca}))
    (tmp_path / "b.csv").write_text('question,answer\nhello,"world, again"\nfoo,bar\n')
    pq.write_table(pa.Table.from_pylist([{"prompt": "p1", "completion": "c1"}, {"prompt": "p2", "completion": "c2"}]),
                   tmp_path / "c.parquet")  # fmt: skip
    shape, convs = to_conversations(read_rows(tmp_path / "a.json"), "a.json")
    assert shape == "alpaca" and convs[0][0]["content"] == "Add\n\n1 2" and convs[1][1]["content"] == "hi"
    rows = read_rows(tmp_path / "b.csv")
    assert [r.number for r in rows] == [2, 3]  # the CSV line a person finds the row on
    shape, convs = to_conversations(rows, "b.csv", columns=parse_columns("prompt=question,completion=answer"))
    assert shape == "prompt_completion" and convs[0][1]["content"] == "world, again"
    shape, convs = to_conversations(read_rows(tmp_path / "c.parquet"), "c.parquet")
    assert shape == "prompt_completion" and [c[1]["content"] for c in convs] == ["c1", "c2"]


PAIR = '{"prompt": "a", "completion": "b"}\n'


def messages_row(*turns: tuple[str, str]) -> str:
    return json.dumps({"messages": [{"role": role, "content": content} for role, content in turns]}) + "\n"


BAD_ROWS = [
    # (file name, content, what the one line must say)
    ("missing.jsonl", PAIR + '{"prompt": "c"}\n', ["missing.jsonl row 2", "'completion'", "missing"]),
    ("empty.jsonl", messages_row(("user", "hi"), ("assistant", " ")),
     ["empty.jsonl row 1", "'messages[1].content'", "empty answer"]),
    ("order.jsonl", messages_row(("user", "a"), ("user", "b"), ("assistant", "c")),
     ["order.jsonl row 1", "role order user, user, assistant", "allowed: an optional system message first"]),
    ("role.jsonl", messages_row(("robot", "a")),
     ["role.jsonl row 1", "'messages[0].role'", "allowed: system, user, assistant"]),
    ("json.jsonl", PAIR + '{"prompt": "a",\n', ["json.jsonl row 2", "not valid JSON"]),
    ("shape.jsonl", '{"question": "a", "reply": "b"}\n',
     ["columns question, reply match no dataset shape", "prompt/completion"]),
    ("notes.txt", "hello\n", ["unsupported file type '.txt'", "allowed: .jsonl, .json, .csv, .parquet"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "content", "needles"), BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_bad_rows_are_one_line_naming_file_row_and_field(tmp_path, name, content, needles):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DatasetError) as err:
        check_dataset(get_blueprint(TINY), {}, str(path))
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_non_utf8_names_the_row(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "a", "completion": "b"}\n{"prompt": "caf\xe9", "completion": "x"}\n')
    with pytest.raises(DatasetError, match=r"latin1.jsonl row 2: not UTF-8 \(byte 0xe9\)"):
        check_dataset(get_blueprint(TINY), {}, str(path))


def test_template_problems_are_caught_before_launch(tmp_path):
    rng = random.Random(0)
    path = write_jsonl(tmp_path / "sys.jsonl", [conversation(rng, 1, system=False), conversation(rng, 1)])
    tiny = get_blueprint(TINY)
    no_system = tiny.model_copy(
        update={"model": tiny.model.model_copy(update={"chat_template": CHAR_TEMPLATE_NO_SYSTEM})}
    )
    with pytest.raises(DatasetError) as err:  # row 2 has a system message this template refuses
        check_dataset(no_system, {}, str(path))
    assert "sys.jsonl row 2" in str(err.value) and "cannot render roles system, user, assistant" in str(err.value)
    assert "System role not supported" in str(err.value)

    template = CHAR_TEMPLATE_NO_SYSTEM.replace("{% if add_generation_prompt %}<|assistant|>{% endif %}", "")
    no_prompt = tiny.model_copy(update={"model": tiny.model.model_copy(update={"chat_template": template})})
    with pytest.raises(DatasetError, match="has no generation prompt"):
        check_dataset(no_prompt, {}, str(path))


def test_every_example_too_long_names_max_seq_length(tmp_path):
    path = write_jsonl(tmp_path / "long.jsonl", [{"prompt": f"{i}" + "x" * 80, "completion": "y"} for i in range(3)])
    with pytest.raises(DatasetError) as err:
        check_dataset(
            get_blueprint(TINY), {}, str(path)
        )  # tiny-llama-cpu: max_seq_length 64; 81 characters + 2 markers
    assert err.value.field == "max_seq_length"
    assert "every example is longer than max_seq_length=64" in str(err.value) and "shortest prompt: 83 tokens" in str(
        err.value
    )


def test_report_preview_marks_every_assistant_turn_and_counts_truncation(tmp_path, multi_turn):
    train, held = multi_turn
    report = check_dataset(get_blueprint(TINY), {}, str(train), eval_source=str(held))
    from playground.train.data import conversation_sample

    def keys(path: Path) -> list:
        return [conversation_sample(json.loads(line)["messages"]).key for line in path.read_text().splitlines()]

    held_keys = set(keys(held))
    overlap = sum(key in held_keys for key in keys(train))
    assert overlap > 0  # short random words repeat: those training rows must go (no held-out prompt is trained)
    assert (report.rows, report.shape, report.eval_rows, report.train_rows) == (1500, "messages", 60, 1500 - overlap)
    assert report.multi_turn_rows > 900 and report.truncated == 0
    assert report.tokens["p50"] <= report.tokens["p90"] <= report.tokens["max"] <= 64
    first = json.loads(train.read_text().splitlines()[0])["messages"]
    trained = [s["text"] for s in report.preview[0]["segments"] if s["trained"]]
    answers = [m["content"] for m in first if m["role"] == "assistant"]
    assert trained == [answer + "<|end|>" for answer in answers]  # each answer and its end token, nothing else
    assert "⟦" in report.describe() and "max_seq_length 64 truncates 0 of 1500 rows" in report.describe()

    share = check_dataset(get_blueprint(TINY), {}, str(train))
    assert share.eval_rows == 75  # 5 % of the file held out when no eval file is given


def test_trainer_labels_every_assistant_turn():
    from playground.train.data import Sample, tokenize
    from playground.train.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    sample = Sample("xyz", "zyx", (("system", "S"), ("user", "ab"), ("assistant", "ba")))
    data = tokenize([sample], tokenizer, max_seq_length=64)
    labels = data.labels[0][: int(data.lengths[0])]
    learned = tokenizer.decode([int(t) for t in labels if t != -100])
    assert learned == "ba<|end|>zyx<|end|>"
    assert tokenizer.decode(data.prompt_ids[0]).endswith("<|user|>xyz<|assistant|>")


# -- a model of your own: custom blueprints ---------------------------------------------------------
def test_custom_blueprint_round_trips_and_joins_the_catalog(tmp_path, multi_turn, isolated_home, monkeypatch):
    train, held = multi_turn
    blueprint, _ = make_custom(
        get_blueprint(TINY),
        "my-reverse",
        dataset_source=str(train),
        eval_source=str(held),
        quality="eval_exact_match>=0.8",
    )
    assert blueprint.dataset.source == str(train) and blueprint.dataset.eval_source == str(held)
    assert blueprint.quality.threshold == 0.8 and blueprint.examples[0].expected
    path = save_blueprint(blueprint)  # default: $PLAYGROUND_HOME/blueprints, part of the catalog
    assert path == isolated_home / "blueprints" / "my-reverse.yaml"
    assert load_blueprint_file(path) == blueprint
    assert load_catalog()["my-reverse"] == blueprint
    with pytest.raises(UserError, match="already exists"):
        save_blueprint(blueprint)
    other = tmp_path / "shared-blueprints"
    save_blueprint(blueprint.model_copy(update={"id": "team-reverse"}), other)
    monkeypatch.setenv("PLAYGROUND_BLUEPRINTS", str(other))
    assert "team-reverse" in load_catalog()
    monkeypatch.setenv("PLAYGROUND_BOOTH", "1")
    assert "my-reverse" not in load_catalog()  # a booth never loads blueprints saved on the machine
    assert blueprint_yaml(blueprint).startswith("id: my-reverse\n")


def write_model_dir(path: Path, config: dict) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer_config.json").write_text("{}")
    return path


def test_architecture_is_checked_before_launch(tmp_path):
    smol = get_blueprint("smollm2-135m-lora-kubectl")
    t5 = write_model_dir(tmp_path / "t5", {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
                                           "is_encoder_decoder": True})  # fmt: skip
    with pytest.raises(UserError, match="T5ForConditionalGeneration is not a causal language model"):
        check_architecture(str(t5), smol)
    gpt2 = write_model_dir(tmp_path / "gpt2", {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    check = check_architecture(str(gpt2), smol)  # the blueprint's q_proj… are not in GPT-2: its own layers
    assert check.target_modules == ["c_attn", "c_proj", "c_fc"] and "every linear layer" in check.notes[0]
    with pytest.raises(UserError, match=r"target_modules q_proj: not in a gpt2 model; allowed: c_attn, c_proj, c_fc"):
        check_architecture(str(gpt2), smol, target_modules=["q_proj"])
    with pytest.raises(UserError, match=r"no config\.json there"):
        check_architecture(str(tmp_path), smol)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{ not json")
    with pytest.raises(UserError, match=r"no tokenizer there"):
        check_architecture(str(tmp_path / "broken"), smol)
    (tmp_path / "broken" / "tokenizer.json").write_text("{}")
    with pytest.raises(UserError, match=r"config\.json is not valid JSON"):
        check_architecture(str(tmp_path / "broken"), smol)
    assert check_architecture(str(gpt2), smol, method="full").target_modules == list(smol.method.target_modules)


def test_cli_data_check_custom_and_train_refuse_bad_data(capsys, tmp_path, isolated_home, multi_turn):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": ""}\n')
    for argv in (
        ["data", "check", str(bad), "--blueprint", TINY],
        ["train", TINY, "--dataset-source", str(bad)],
        ["custom", "mine", "--from", TINY, "--dataset", str(bad)],
    ):
        code = main(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert "bad.jsonl row 2 field 'completion': empty answer" in err, err
    assert not (isolated_home / "jobs").exists() and not (isolated_home / "blueprints").exists()  # nothing started

    train, _ = multi_turn
    assert main(["data", "check", str(train), "--blueprint", TINY, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shape"] == "messages"
    assert main(["custom", "mine", "--from", TINY, "--dataset", str(train)]) == 0
    assert "saved mine" in capsys.readouterr().out and (isolated_home / "blueprints" / "mine.yaml").is_file()
    assert main(["plan", "mine", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["blueprint_id"] == "mine"


def test_own_multi_turn_data_trains_through_the_local_backend(tmp_path, multi_turn, home):
    """The bar: held-out exact match ≥ 0.8 (measured 0.97 at 150 steps on 2 cores, ~25 s of training).
    The plan's peak memory for the custom blueprint is checked against the run's measured peak."""
    from playground.api import make_request, plan_run
    from playground.backends.local import LocalBackend
    from playground.events import JobPhase

    train, held = multi_turn
    blueprint, _ = make_custom(
        get_blueprint(TINY),
        "reverse-turns",
        dataset_source=str(train),
        eval_source=str(held),
        quality="eval_exact_match>=0.8",
    )
    path = save_blueprint(blueprint, tmp_path)
    params = {"max_steps": 150, "checkpoint_every": 0}
    plan = plan_run(str(path), params)
    backend = LocalBackend(home=home)
    job = backend.submit(make_request(str(path), params))
    for _ in backend.events(job.id, follow=True):
        pass
    job = backend.get(job.id)
    assert job.phase == JobPhase.SUCCEEDED, f"{job.phase}: {job.message}\n" + "\n".join(job.log_tail)
    metrics = json.loads((Path(job.model_dir).parent / "metrics.json").read_text())
    assert metrics["num_eval_examples"] == 60 and metrics["eval_exact_match"] >= 0.8, metrics
    assert abs(plan.memory.total - metrics["peak_memory_bytes"]) <= 0.2 * metrics["peak_memory_bytes"]
