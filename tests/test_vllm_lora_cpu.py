"""The vLLM CPU LoRA plugin's operations (grouped by adapter slot; no LoRA term for a request without an adapter),
how vLLM finds the plugin, and the base server's LoRA layers. The servers that run it: test_booth_servers.py (a base
chat batched with two adapters' chats answers as alone) and test_serving.py."""

from __future__ import annotations

import json
from importlib.metadata import distributions
from pathlib import Path

import pytest
import torch

from playground.errors import UserError
from playground.serving import vllm_lora_cpu as ops
from playground.serving import vllm_server


def _reference(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Row b: inputs[b] @ weights[indices[b]].T, and zeros where indices[b] is -1 (no adapter)."""
    stacked = weights.squeeze(1)
    rows = [
        inputs[b] @ stacked[i].T if i >= 0 else torch.zeros(stacked.shape[1]) for b, i in enumerate(indices.tolist())
    ]
    return torch.stack(rows)


@pytest.fixture
def lora() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    slots, rank, width, out = 3, 8, 24, 40
    return {
        "a": torch.randn(slots, 1, rank, width, generator=generator),
        "b": torch.randn(slots, 1, out, rank, generator=generator),
        "x": torch.randn(9, width, generator=generator),
        "h": torch.randn(9, rank, generator=generator),
        # base rows (-1) between adapters' rows, the last slot (2) among them: what vLLM's own ops read as slot 2
        "segments": torch.tensor([-1, 0, -1, 2, 1]),
        "lengths": torch.tensor([2, 2, 1, 3, 1]),
    }


def test_shrink_and_expand_leave_base_rows_without_lora(lora: dict[str, torch.Tensor]) -> None:
    per_token = torch.repeat_interleave(lora["segments"], lora["lengths"])
    shrunk = torch.full((9, 8), 7.0)
    ops.sgmv_shrink(lora["x"], lora["a"], shrunk, None, lora["lengths"], lora["segments"], 5, 3, 9, 0.5)
    assert torch.allclose(shrunk, 0.5 * _reference(lora["x"], lora["a"], per_token), atol=1e-5)
    assert not shrunk[per_token < 0].any()  # vLLM 0.32's torch ops gave these rows slot 2's adapter

    expanded = torch.ones(9, 40)
    ops.sgmv_expand(lora["h"], lora["b"], expanded, None, lora["lengths"], lora["segments"], 5, 3, 9, True)
    assert torch.allclose(expanded, 1 + _reference(lora["h"], lora["b"], per_token), atol=1e-5)

    wide = torch.ones(9, 50)
    ops.sgmv_expand_slice(lora["h"], lora["b"], wide, None, lora["lengths"], lora["segments"], 5, 3, 9, 6, 40, False)
    assert torch.allclose(wide[:, 6:46], _reference(lora["h"], lora["b"], per_token), atol=1e-5)
    assert (wide[:, :6] == 1).all() and (wide[:, 46:] == 1).all()


def test_one_slot_and_no_slot_batches(lora: dict[str, torch.Tensor]) -> None:
    for slot in (2, -1):
        indices = torch.full((9,), slot)
        out = torch.zeros(9, 40)
        ops.bgmv_expand(lora["h"], lora["b"], out, indices, add_inputs=False)
        assert torch.allclose(out, _reference(lora["h"], lora["b"], indices), atol=1e-5)
    assert not out.any()


def test_vllm_finds_the_plugin_beside_the_guard(tmp_path: Path) -> None:
    guard = vllm_server.guard_dir(tmp_path)
    (dist,) = [d for d in distributions(path=[str(guard)]) if d.metadata["Name"] == "playground_vllm_plugins"]
    (entry,) = [e for e in dist.entry_points if e.group == "vllm.general_plugins"]
    assert entry.value == f"{vllm_server.LORA_CPU_MODULE}:register"
    assert (guard / f"{vllm_server.LORA_CPU_MODULE}.py").read_text() == Path(ops.__file__).read_text()


def test_base_server_puts_lora_on_linear_layers_only(tmp_path: Path) -> None:
    argv = vllm_server.command(Path("python"), "m", 1, "127.0.0.1", served_name="m", lora=True, max_adapters=2)
    targets = argv[argv.index("--lora-target-modules") + 1 :]
    targets = targets[: next((i for i, a in enumerate(targets) if a.startswith("--")), len(targets))]
    assert {"q_proj", "v_proj", "down_proj", "qkv_proj", "c_attn"} <= set(targets) and "lm_head" not in targets

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"target_modules": ["q_proj", "lm_head"]}))
    with pytest.raises(UserError, match=r"^method.target_modules lm_head: the base model server puts LoRA only on"):
        vllm_server.load_adapter("http://127.0.0.1:1/v1", "job", str(adapter))
