"""Model directories give the same greedy answers on transformers 5.x and 4.57.x (KServe's HuggingFace runtime
images still ship 4.x): the configs both versions read alike, and real answers compared token by token.

The 4.57.x environment is built once into the user cache (``tf4_env``); the SmolLM2 directories (the
fine-tuned default blueprint and the converted package model) are checked in test_smollm2_blueprint.py,
where the module's trained model lives; here the scratch blueprint's directories and the stand-ins.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from _fixtures import tiny_held_out

from playground.models.fidelity import first_difference, identical_count
from playground.models.portable import (
    LOADER_ONLY_TOKENIZER_KEYS,
    make_portable,
    portability_problems,
    portable_config,
    portable_generation_config,
    portable_tokenizer_config,
)

REPO = Path(__file__).resolve().parents[1]
MAX_NEW_TOKENS = 16

# config.json as transformers 5 writes a Llama 3.2 (scaled RoPE) converted from a GGUF file
LLAMA3_AS_WRITTEN = {
    "_model_name_or_path": "Llama 3.2 1B Instruct",
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": None,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 131072,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "vocab_size": 600,
}


def test_configs_carry_what_transformers_4_reads_and_5_reads_them_unchanged() -> None:
    """rope_theta at top level (4.x ignores rope_parameters and would use 10000), 4.x's rope_scaling for a
    scaled RoPE; transformers 5 reads the rewritten config to the very same rope_parameters."""
    from transformers import LlamaConfig, Qwen2Config

    config = portable_config(LLAMA3_AS_WRITTEN)
    assert "_model_name_or_path" not in config
    assert config["rope_theta"] == 500000.0 == config["rope_parameters"]["rope_theta"]
    scaling = {k: v for k, v in LLAMA3_AS_WRITTEN["rope_parameters"].items() if k != "rope_theta"}
    assert config["rope_scaling"] == scaling
    assert LlamaConfig.from_dict(config).rope_parameters == LlamaConfig.from_dict(LLAMA3_AS_WRITTEN).rope_parameters

    default = {
        "model_type": "qwen2",
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "rope_scaling": None,
    }
    rewritten = portable_config(default)
    assert rewritten["rope_theta"] == 1e6 and "rope_scaling" not in rewritten  # 4.x: no scaling = default RoPE
    assert Qwen2Config.from_dict(rewritten).rope_parameters == {"rope_type": "default", "rope_theta": 1e6}
    nested = portable_config({"model_type": "x", "text_config": {"rope_parameters": {"rope_theta": 7.0}}})
    assert nested["text_config"]["rope_theta"] == 7.0

    generation = portable_generation_config({"eos_token_id": [2, 5]}, {"bos_token_id": 1, "eos_token_id": 2})
    assert generation == {"eos_token_id": [2, 5], "bos_token_id": 1}  # the model's own stop list kept
    tokenizer_config = {"is_local": True, "local_files_only": True, "backend": "tokenizers", "eos_token": "<e>"}
    assert portable_tokenizer_config(tokenizer_config) == {"eos_token": "<e>"}


def test_make_portable_rewrites_a_directory_and_problems_are_named(tmp_path: Path) -> None:
    directory = tmp_path / "model"
    directory.mkdir(mode=0o700)
    (directory / "config.json").write_text(json.dumps(LLAMA3_AS_WRITTEN))
    (directory / "tokenizer_config.json").write_text(json.dumps({"is_local": True, "eos_token": "<e>"}))
    (directory / "model.safetensors").write_bytes(b"")
    (directory / "model.safetensors").chmod(0o600)  # as tempfile-based writers leave it
    problems = portability_problems(directory)
    assert "config.json: rope_theta None != rope_parameters 500000.0" in problems
    assert "config.json: loader-only key _model_name_or_path" in problems
    assert "tokenizer_config.json: loader-only key is_local" in problems
    assert "generation_config.json: eos_token_id missing (config.json has 2)" in problems
    assert "model.safetensors: mode 600, expected 644" in problems and ".: mode 700, expected 755" in problems

    make_portable(directory)
    assert portability_problems(directory) == []
    assert stat.S_IMODE((directory / "model.safetensors").stat().st_mode) == 0o644
    assert json.loads((directory / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": 2}


def _report(version: str, answers: list[tuple[str, list[int]]], read: dict | None = None) -> dict:
    rows = [{"prompt": p, "prompt_ids": [1], "token_ids": ids, "text": str(ids)} for p, ids in answers]
    return {"transformers": version, "models": [{"dir": "/m", "read": read or {}, "answers": rows}]}


def test_the_comparer_fails_on_the_first_differing_token_naming_the_prompt() -> None:
    new = _report("5.23.0", [("a", [5, 6, 7]), ("b", [8, 9, 2]), ("c", [3, 3])])
    assert first_difference(new, new) is None and identical_count(new, new) == (3, 3)
    old = _report("4.57.6", [("a", [5, 6, 7]), ("b", [8, 4, 2]), ("c", [1])])
    assert first_difference(new, old) == (
        "transformers 5.23.0 vs 4.57.6: /m: prompt 'b': answer token 1 differs (9 vs 4); "
        "answers '[8, 9, 2]' vs '[8, 4, 2]'"
    )
    assert identical_count(new, old) == (1, 3)
    shorter = _report("4.57.6", [("a", [5, 6]), ("b", [8, 9, 2]), ("c", [3, 3])])
    assert "prompt 'a': one answer stops after 2 tokens, the other goes on (3 vs 2 tokens)" in first_difference(
        new, shorter
    )
    misread = _report("4.57.6", [("a", [5, 6, 7]), ("b", [8, 9, 2]), ("c", [3, 3])], {"rope_theta": 10000.0})
    new_read = _report("5.23.0", [("a", [5, 6, 7]), ("b", [8, 9, 2]), ("c", [3, 3])], {"rope_theta": 100000.0})
    assert first_difference(new_read, misread).endswith("the loaders read rope_theta as 100000.0 vs 10000.0")


def _prompts() -> list[str]:
    """Every blueprint's example prompts and a held-out sample of each synthetic task and of Alpaca rows."""
    from playground.models.fidelity import example_prompts
    from playground.train.data import alpaca_sample, synthetic_splits
    from playground.train.standins import task_rows

    reverse = tiny_held_out(3)
    _, kubectl = synthetic_splits("kubectl", {}, num_train=0, num_eval=2, seed=0)
    alpaca = [alpaca_sample(row) for row in task_rows(3, seed=7)]
    return example_prompts() + [s.prompt for s in (*reverse, *kubectl, *alpaca)]


def test_every_kind_of_model_directory_answers_the_same_on_transformers_4_and_5(
    trained_tiny_job, trained_lora_job, tf4_env, tmp_path: Path
) -> None:
    """The scratch blueprint's fine-tuned ``model/`` and untrained ``base-model/`` (character tokenizer), the
    Llama and Qwen2 stand-ins, a Llama 3.2-shaped model (llama3-scaled RoPE, base 500000) and a LoRA job's merged
    export (``playground export --merged``): token-identical greedy answers under transformers 5.x and 4.57.x,
    checked by the README's command."""
    from playground.models.adapters import merge_adapter
    from playground.train.standins import build_from_config, build_standin

    shrink = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 600}  # fmt: skip
    dirs = [
        Path(trained_tiny_job.model_dir),
        Path(trained_tiny_job.base_model),
        build_standin("llama", tmp_path / "llama"),
        build_standin("qwen2", tmp_path / "qwen2"),
        build_from_config("llama", tmp_path / "llama-3.2", overrides=shrink, dtype="float32"),
        merge_adapter(trained_lora_job.model_dir, trained_lora_job.base_model, tmp_path / "lora-merged"),
    ]
    for directory in dirs:
        assert portability_problems(directory) == [], directory
        config = json.loads((directory / "config.json").read_text())
        assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
        tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
        assert not LOADER_ONLY_TOKENIZER_KEYS & set(tokenizer_config)
        generation = json.loads((directory / "generation_config.json").read_text())
        assert generation["eos_token_id"] is not None
    assert json.loads((dirs[4] / "config.json").read_text())["rope_scaling"]["rope_type"] == "llama3"

    prompts = _prompts()
    args = [str(d) for d in dirs] + [arg for p in prompts for arg in ("--prompt", p)]
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "check_transformers4.sh"), *args, "--max-new-tokens", str(MAX_NEW_TOKENS)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},  # the script finds tf4_env in the same cache
    )
    total = len(dirs) * len(prompts)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{total}/{total} answers token-identical on transformers 5." in proc.stdout
    assert "and 4.57." in proc.stdout


def _no_pip_config(monkeypatch: pytest.MonkeyPatch, index: str) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no machine-wide mirrors or find-links
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_INDEX_URL", index)
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip reports connection errors only when it retries


def test_building_transformers_4_is_skipped_only_when_the_index_is_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tests skip (RegistryUnreachable) only where pip cannot reach the index; a reachable index without the
    pinned releases is a failure, and neither leaves a half-built environment to be taken for a ready one."""
    from playground.models.fidelity import RegistryUnreachable, ensure_tf4_environment

    _no_pip_config(monkeypatch, "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    with pytest.raises(RegistryUnreachable, match="could not reach the package index"):
        ensure_tf4_environment(tmp_path / "unreachable", say=lambda _: None)
    empty_index = tmp_path / "empty-index"
    empty_index.mkdir()
    _no_pip_config(monkeypatch, empty_index.as_uri())
    with pytest.raises(RuntimeError, match="failed") as failed:
        ensure_tf4_environment(tmp_path / "no-such-release", say=lambda _: None)
    assert not isinstance(failed.value, RegistryUnreachable)
    for root in ("unreachable", "no-such-release"):
        assert [p.name for p in (tmp_path / root).iterdir() if not p.name.endswith(".lock")] == []
