"""``playground plan``: parameters, memory per device, fit and time, checked against measured runs (issue 21, item 4).

The predictions are compared with what the trainer measured in the session's tiny-llama-cpu run (its
metrics.json: parameters, peak RSS, padded width, step time); the SmolLM2 comparison lives with that
blueprint's module-scoped run in test_smollm2_blueprint.py. benchmarks/plan_vs_measured.py measures the
same on every CPU blueprint with runs of other parameters.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _fixtures import catalog_variant

from playground.blueprints import get_blueprint, load_catalog
from playground.blueprints.plan import MachineLoad, example_lengths, make_plan, measured_runs, resolve_architecture

IDLE = MachineLoad(cores=2, busy_cores=0.0)  # times compared on an idle machine: the run's scaled back by its load


def _plan_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "PLAYGROUND_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "playground.cli", "plan", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture
def measured_home(trained_tiny_job, session_home: Path, tmp_path: Path) -> Path:
    """A PLAYGROUND_HOME holding only the session's measured tiny-llama-cpu run."""
    home = tmp_path / "measured-home"
    shutil.copytree(session_home / "jobs" / trained_tiny_job.id, home / "jobs" / trained_tiny_job.id)
    return home


@pytest.fixture
def tiny_metrics(trained_tiny_job, session_home: Path) -> dict:
    return json.loads((session_home / "jobs" / trained_tiny_job.id / "output" / "metrics.json").read_text())


def test_every_catalog_blueprint_has_a_plan(tmp_path: Path) -> None:
    for blueprint_id in load_catalog():
        proc = _plan_cli(blueprint_id, "--json", home=tmp_path)
        assert proc.returncode == 0, proc.stderr
        plan = json.loads(proc.stdout)
        memory = plan["memory"]
        parts = ("framework", "weights", "gradients", "optimizer", "activations")
        assert memory["total"] == sum(memory[k] for k in parts) and all(memory[k] >= 0 for k in parts)
        assert 0 < plan["trainable_parameters"] <= plan["parameters"] and plan["seconds"] > 0
        assert isinstance(plan["fits"], bool) and plan["time_basis"]
        blueprint = get_blueprint(blueprint_id)
        if blueprint.needs_gpu:  # this machine has none: planned for the blueprint's GPUs, and said so
            assert plan["device"] == "gpu" and plan["dtype"] == "bfloat16"
            assert any("no GPU" in note for note in plan["notes"])
        text = _plan_cli(blueprint_id, home=tmp_path).stdout
        assert "memory per device" in text and ("fits" in text) and "time: ~" in text


def test_hub_architectures_match_their_published_sizes() -> None:
    """Llama-3.2-1B has 1.24B parameters and Qwen2.5-1.5B 1.54B (their model cards); LoRA r8 on q/v trains
    851,968 and 1,089,536 of them (peft's print_trainable_parameters for these configs)."""
    llama = get_blueprint("llama-3.2-1b-lora-alpaca")
    qwen = get_blueprint("qwen2.5-1.5b-lora-alpaca")
    assert round(resolve_architecture(llama).parameters / 1e9, 2) == 1.24
    assert round(resolve_architecture(qwen).parameters / 1e9, 2) == 1.54
    assert make_plan(llama, llama.defaults(), gpus=1).trainable_parameters == 851_968
    assert make_plan(qwen, qwen.defaults(), gpus=1).trainable_parameters == 1_089_536


@pytest.mark.slow
def test_plan_against_the_measured_tiny_run(
    trained_tiny_job, tiny_metrics: dict, measured_home: Path, tmp_path: Path
) -> None:
    blueprint = get_blueprint("tiny-llama-cpu")
    params = blueprint.defaults()
    fresh = make_plan(blueprint, params, home=tmp_path / "empty", load=IDLE)
    # Before any run: the counts are exact, the data's padded width comes from the chat template.
    assert fresh.parameters == tiny_metrics["parameters"]
    assert fresh.trainable_parameters == tiny_metrics["trainable_parameters"]
    assert fresh.tokens_per_example == pytest.approx(tiny_metrics["mean_padded_width"], rel=0.10)
    peak = tiny_metrics["peak_memory_bytes"]
    assert fresh.memory.total == pytest.approx(peak, rel=0.25), (fresh.memory, peak)
    measured_step = tiny_metrics["train_seconds"] / tiny_metrics["steps"] / tiny_metrics["load_factor"]  # idle
    assert "stated" in fresh.time_basis
    assert 1 / 3 < fresh.seconds_per_step / measured_step < 3, (fresh.seconds_per_step, measured_step)

    # After it: time from that run, named; the same parameters predict its own figures.
    runs = measured_runs(measured_home)
    assert [r.job_id for r in runs] == [trained_tiny_job.id]
    planned = make_plan(blueprint, params, home=measured_home, load=IDLE)
    assert trained_tiny_job.id in planned.time_basis and trained_tiny_job.id in planned.memory_basis
    assert planned.memory.total == pytest.approx(peak, rel=0.05)  # its framework share, measured
    assert planned.seconds_per_step == pytest.approx(measured_step, rel=0.01)
    # At the load that run trained under, the plan gives back the run's own wall time: each phase was scaled back to
    # an idle machine by that load (training by all of it, start-up and saving by their single-thread share) and is
    # scaled forward again by the same load. (Dividing the whole wall time by the training's load factor is not the
    # model: on a fresh clone's loaded suite it said 32.4 s where the phases give 42.1 s.)
    own_load = MachineLoad.behind(tiny_metrics["load_factor"], threads=IDLE.cores, cores=IDLE.cores)
    again = make_plan(blueprint, params, home=measured_home, load=own_load)
    assert again.seconds == pytest.approx(runs[0].job_seconds, rel=0.10), (again.time, runs[0])
    assert planned.seconds < again.seconds or tiny_metrics["load_factor"] <= 1.0  # idle is faster than loaded
    # Twice the batch: twice the FLOPs per step, so about twice the time per step.
    doubled = make_plan(blueprint, {**params, "batch_size": params["batch_size"] * 2}, home=measured_home, load=IDLE)
    assert doubled.seconds_per_step == pytest.approx(2 * planned.seconds_per_step, rel=0.05)
    assert doubled.memory.activations > planned.memory.activations


def test_the_weight_average_is_planned_as_one_float32_copy_of_the_trainable_weights(tmp_path: Path) -> None:
    from playground.blueprints.loader import load_blueprint_file

    plans = {}
    for average in (0.0, 0.5):
        variant = catalog_variant(
            tmp_path, "smollm2-135m-lora-kubectl", {"id": f"avg-{average}", "training.average_last": average}
        )
        blueprint = load_blueprint_file(variant)
        plans[average] = make_plan(blueprint, blueprint.defaults(), home=tmp_path)
    off, on = plans[0.0], plans[0.5]
    assert on.memory.optimizer - off.memory.optimizer == 4 * on.trainable_parameters > 0
    assert on.memory.total - off.memory.total == 4 * on.trainable_parameters


@pytest.mark.slow
def test_a_bf16_cpu_blueprint_is_not_timed_by_a_float32_run(
    trained_tiny_job, measured_home: Path, tmp_path: Path
) -> None:
    """The cpu_bf16 setting roughly halves a step's time on a CPU with bf16 instructions: a float32 run of another
    blueprint is no basis for it there (the stated rate × the measured speed-up is); elsewhere it trains in float32
    and that run is its basis, as it is for a float32 blueprint."""
    from playground.blueprints.plan import CPU_BF16_SPEEDUP, cpu_has_bf16_flags

    plans = {}
    for bf16 in (True, False):
        changes = {"id": f"tiny-variant-{'bf16' if bf16 else 'fp32'}", "training.cpu_bf16": bf16}
        variant = catalog_variant(tmp_path, "tiny-llama-cpu", changes)
        proc = _plan_cli(str(variant), "--json", home=measured_home)
        assert proc.returncode == 0, proc.stderr
        plans[bf16] = json.loads(proc.stdout)
    assert trained_tiny_job.id in plans[False]["time_basis"]
    if cpu_has_bf16_flags():
        assert trained_tiny_job.id not in plans[True]["time_basis"] and "for bf16" in plans[True]["time_basis"]
        assert f"{CPU_BF16_SPEEDUP:g}" in plans[True]["time_basis"]
    else:
        assert plans[True]["time_basis"] == plans[False]["time_basis"]


def test_bf16_instructions_are_read_from_the_cpu_flags(tmp_path: Path) -> None:
    from playground.blueprints.plan import cpu_has_bf16_flags

    cpuinfo = tmp_path / "cpuinfo"
    for flags, expected in (("fpu avx2 avx512f avx512_bf16", True), ("fpu amx_tile amx_bf16", True),
                            ("fpu avx2 avx512f avx512_vnni", False)):  # fmt: skip
        cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
        assert cpu_has_bf16_flags(cpuinfo) is expected, flags
    assert cpu_has_bf16_flags(tmp_path / "absent") is False


def test_does_not_fit_names_the_change_that_would(tmp_path: Path) -> None:
    small = catalog_variant(tmp_path, "tiny-llama-cpu", {"id": "tiny-small-pod", "resources.memory": "560Mi"})
    proc = _plan_cli(str(small), "--backend", "kubernetes", "--set", "batch_size=512", "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["fits"] is False and plan["capacity_bytes"] == 560 * 2**20
    assert "pod memory request 560Mi" in plan["capacity_basis"]
    advised = int(plan["advice"].split("batch_size=")[1].split()[0])
    assert 1 <= advised < 512
    refit = json.loads(_plan_cli(str(small), "--backend", "kubernetes", "--set", f"batch_size={advised}", "--json",
                                 home=tmp_path).stdout)  # fmt: skip
    assert refit["fits"] is True


def test_a_custom_model_directory_is_planned_from_its_config(tmp_path: Path) -> None:
    model = tmp_path / "my-model"
    model.mkdir()
    config = {"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128}
    config |= {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True}
    (model / "config.json").write_text(json.dumps(config))
    blueprint = get_blueprint("qwen2.5-1.5b-lora-alpaca")
    plan = make_plan(blueprint, blueprint.defaults(), model_source=str(model), gpus=0)
    # embeddings 64k + 3 layers × (q 64·64 + k,v 2·64·32 + o 64·64 + mlp 3·64·128 + qkv bias 128 + norms 128) + norm
    layer = 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128 + 128 + 128
    lora = 3 * 8 * ((64 + 64) + (64 + 32))  # r8 on q_proj (64→64) and v_proj (64→32)
    assert plan.parameters == 1000 * 64 + 3 * layer + 64 + lora and plan.trainable_parameters == lora
    assert example_lengths(blueprint, blueprint.defaults(), str(model)) is None  # Alpaca rows: not read offline


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["no-such-blueprint"], "no-such-blueprint"),
        (["tiny-llama-cpu", "--set", "batch_size=0"], "batch_size"),
        (["tiny-llama-cpu", "--backend", "slurm"], "--backend"),
        (["tiny-llama-cpu", "--model-source", "/nonexistent/dir"], "/nonexistent/dir"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], field: str, tmp_path: Path) -> None:
    proc = _plan_cli(*args, home=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and field in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "jobs").exists()
