"""A LoRA job's model is its PEFT adapter (a few MB); ``playground export JOB --merged`` makes the merged Hugging
Face directory, which answers as the adapter on its base does (issue 59: adapters, not copies)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from playground.cli import main

PROMPTS = ["Add 2 and 3.", "Name a colour.", "Reverse the word: kube"]
MAX_NEW_TOKENS = 12


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("playground: error: "), (code, err)
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def job_home(job) -> Path:
    """The PLAYGROUND_HOME of a local job (``HOME/jobs/ID/output/model``)."""
    return Path(job.model_dir).parents[3]


def load(directory: str | Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(directory)).eval(), AutoTokenizer.from_pretrained(str(directory))


def answers(model, tokenizer) -> list[str]:
    from playground.train.evaluate import generate_answers
    from playground.train.tokenizer import render

    prompts = [render(tokenizer, [{"role": "user", "content": p}], add_generation_prompt=True) for p in PROMPTS]
    return generate_answers(model, tokenizer, prompts, max_new_tokens=MAX_NEW_TOKENS, device="cpu")


def last_logits(model, tokenizer):
    import torch

    from playground.train.tokenizer import render

    ids = render(tokenizer, [{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def test_a_lora_jobs_model_is_its_adapter(trained_lora_job) -> None:
    """``model/`` holds the adapter (float32), its config (rank, targets, base) and the tokenizer with the job's chat
    template; no base weights, no model config; portable and readable by a server under another uid."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from playground.models.adapters import adapter_rank, is_adapter_dir
    from playground.models.portable import portability_problems

    model = Path(trained_lora_job.model_dir)
    names = {p.name for p in model.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not names & {"model.safetensors", "config.json", "generation_config.json"}, names
    assert sum(p.stat().st_size for p in model.iterdir()) < 5 * 2**20  # a few MB at most (here: KB)
    assert is_adapter_dir(model) and adapter_rank(model) == 4
    assert not is_adapter_dir(Path(trained_lora_job.base_model))
    config = json.loads((model / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert config["base_model_name_or_path"] == trained_lora_job.base_model  # the stand-in directory
    weights = load_file(model / "adapter_model.safetensors")
    assert weights and all(".lora_A." in k or ".lora_B." in k for k in weights), list(weights)
    assert {str(w.dtype) for w in weights.values()} == {"torch.float32"}
    tokenizer = AutoTokenizer.from_pretrained(model)  # the stand-in has no template: the trainer installed its own
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("### Assistant:\n")
    assert json.loads((model / "tokenizer_config.json").read_text())["chat_template"] == tokenizer.chat_template
    assert portability_problems(model) == []
    assert stat.S_IMODE((model / "adapter_model.safetensors").stat().st_mode) == 0o644


def test_export_merged_answers_as_the_adapter_on_its_base(
    trained_lora_job, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``export --merged`` writes a plain, portable HF directory: the base's tensors with only the LoRA targets
    changed, greedy answers equal to the adapter merged in memory, logits those of the adapter on its base."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    from playground.models.portable import portability_problems

    monkeypatch.setenv("PLAYGROUND_HOME", str(job_home(trained_lora_job)))
    output = tmp_path / "merged"
    code, out, err = run(capsys, "export", trained_lora_job.id, "--merged", "--output", str(output))
    assert code == 0, err
    assert out.strip() == str(output)
    assert [line for line in err.splitlines() if line.strip()] == [  # one progress line, no loaders' bars
        f"merging the adapter {trained_lora_job.model_dir} into {trained_lora_job.base_model} (loading the base model)"
    ]
    names = {p.name for p in output.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    assert not any(name.startswith("adapter_") for name in names)
    assert portability_problems(output) == []

    base_dir = Path(trained_lora_job.base_model)
    base, merged = load_file(base_dir / "model.safetensors"), load_file(output / "model.safetensors")
    assert set(merged) == set(base)
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed

    exported, tokenizer = load(output)
    on_base = PeftModel.from_pretrained(load(base_dir)[0], trained_lora_job.model_dir).eval()
    adapter_logits = last_logits(on_base, tokenizer)
    assert torch.allclose(last_logits(exported, tokenizer), adapter_logits, atol=1e-4)
    assert not torch.allclose(last_logits(load(base_dir)[0], tokenizer), adapter_logits, atol=1e-4)  # it trained
    in_memory = on_base.merge_and_unload()
    assert answers(exported, tokenizer) == answers(in_memory, tokenizer)

    code, out, err = run(capsys, "export", trained_lora_job.id, "--merged", "--output", str(output))
    assert code == 0 and out.strip() == str(output), err  # an earlier export is replaced


def test_export_names_or_copies_the_adapter(
    trained_lora_job, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without ``--merged``: the adapter directory itself (and a note), or a copy of it at ``--output``."""
    monkeypatch.setenv("PLAYGROUND_HOME", str(job_home(trained_lora_job)))
    code, out, err = run(capsys, "export", trained_lora_job.id)
    assert code == 0 and out.strip() == trained_lora_job.model_dir, err
    assert "LoRA adapter" in err and "--merged" in err
    copy = tmp_path / "adapter"
    code, out, err = run(capsys, "export", trained_lora_job.id, "--output", str(copy))
    assert code == 0 and out.strip() == str(copy), err
    model = Path(trained_lora_job.model_dir)
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in model.iterdir())
    assert (copy / "adapter_model.safetensors").read_bytes() == (model / "adapter_model.safetensors").read_bytes()


def test_export_of_a_full_fine_tune_is_its_model_dir(
    trained_tiny_job, session_home: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full fine-tune is already a merged directory: ``--merged`` names it, nothing is written."""
    monkeypatch.setenv("PLAYGROUND_HOME", str(session_home))
    code, out, err = run(capsys, "export", trained_tiny_job.id, "--merged")
    assert code == 0 and out.strip() == trained_tiny_job.model_dir, err
    assert not (Path(trained_tiny_job.model_dir).parent / "merged-model").exists()


def test_export_bad_input_is_one_line(
    trained_lora_job, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PLAYGROUND_HOME", str(job_home(trained_lora_job)))
    code, _, err = run(capsys, "export", "no-such-job", "--merged")
    assert_one_line_error(code, err, "unknown job 'no-such-job'")
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    code, _, err = run(capsys, "export", trained_lora_job.id, "--merged", "--output", str(taken))
    assert_one_line_error(code, err, "--output", "exists", "allowed: ")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "export", trained_lora_job.id, "--output", str(busy))
    assert_one_line_error(code, err, "--output")
    code, _, err = run(capsys, "export", trained_lora_job.id, "--merged", "--output", trained_lora_job.model_dir)
    assert_one_line_error(code, err, "--output", "the job's own model")
    assert taken.read_text() == "mine" and [p.name for p in busy.iterdir()] == ["notes.txt"]  # untouched
    assert (Path(trained_lora_job.model_dir) / "adapter_config.json").is_file()


def test_merge_adapter_refuses_what_it_cannot_merge(trained_lora_job, tmp_path: Path) -> None:
    from playground.errors import UserError
    from playground.models.adapters import merge_adapter

    with pytest.raises(UserError, match="not a PEFT adapter"):
        merge_adapter(trained_lora_job.base_model, trained_lora_job.base_model, tmp_path / "a")
    with pytest.raises(UserError, match=r"base model .*not a model directory.*allowed: "):
        merge_adapter(trained_lora_job.model_dir, str(tmp_path), tmp_path / "b")
    with pytest.raises(UserError, match="expected hf://ORG/NAME"):
        merge_adapter(trained_lora_job.model_dir, "hf://just-a-name", tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_registering_a_lora_job_records_its_adapter_and_base(trained_lora_job, trained_tiny_job, tmp_path: Path):
    """The registered version's source is the adapter directory; tags say it is an adapter, its rank and its base
    (what a server needs to load it); a full fine-tune is tagged a plain Hugging Face directory."""
    from mlflow import MlflowClient

    from playground.runs.registry import TAG_BASE_MODEL, TAG_LORA_RANK, TAG_MODEL_FORMAT, register

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    version = register(trained_lora_job, name="lora-tiny", tracking_uri=uri)
    assert version.source == trained_lora_job.model_dir
    tags = MlflowClient(tracking_uri=uri).get_model_version("lora-tiny", version.version).tags
    assert tags[TAG_MODEL_FORMAT] == "peft-lora" and tags[TAG_LORA_RANK] == "4"
    assert tags[TAG_BASE_MODEL] == trained_lora_job.base_model
    full = register(trained_tiny_job, name="full-tiny", tracking_uri=uri)
    tags = MlflowClient(tracking_uri=uri).get_model_version("full-tiny", full.version).tags
    assert tags[TAG_MODEL_FORMAT] == "huggingface" and TAG_BASE_MODEL not in tags


def test_a_packaged_base_is_written_beside_the_adapter_only_on_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """KServe loads nothing from a Python package, so a pkg:// job trained by the Kubernetes (or KubeRay) backend
    writes its base to output/base-model; locally the converted cache serves it and nothing is copied. A scratch
    model's untrained weights are written everywhere (they exist nowhere else)."""
    from playground.runs.settings import JOB_BACKEND_ENV
    from playground.train.recipe import saves_base_model

    monkeypatch.delenv(JOB_BACKEND_ENV, raising=False)
    assert saves_base_model("scratch") and not saves_base_model("pkg") and not saves_base_model("hf")
    for backend, expected in (("kubernetes", True), ("kuberay", True), ("local", False), ("ray", False)):
        monkeypatch.setenv(JOB_BACKEND_ENV, backend)
        assert saves_base_model("pkg") is expected and not saves_base_model("hf")
