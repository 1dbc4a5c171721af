"""DPO and GRPO on SmolLM2-135M-Instruct (issue 22): the CPU blueprints against their bars, and step rates.

    python benchmarks/methods.py bars [--method dpo|grpo|both] [--set KEY=VALUE ...]
    python benchmarks/methods.py rates [--steps 8] [--method sft|dpo|grpo|all]

``bars`` trains each CPU blueprint through the real entrypoint (``python -m playground.train``) with its
defaults and prints, from its metrics.json, the held-out figures of the base model (and of GRPO's warm start)
next to the trained model's, and the training seconds: DPO's bar is a held-out preference accuracy and exact
match above the base within 5 minutes of training; GRPO's a mean reward and exact match well above the
starting model within 10 minutes. ``--set warm_start_steps=0`` measures GRPO from the base model.

``rates`` times optimizer steps per CPU-second, each pair in the same process, alternated:
- ``dpo`` / ``grpo``: the playground's recipe (TRL's trainer + our events, gradient checkpointing off on a CPU)
  against TRL's own ``DPOTrainer`` / ``GRPOTrainer`` with TRL's defaults and the same hyperparameters (goal ≥ 1.0);
- ``sft``: the project's own SFT loop (playground/train/recipe.py) against TRL's ``SFTTrainer`` on the same
  rows (prompt/completion, completion-only loss), both with and without TRL's default gradient checkpointing:
  whether keeping our loop is still worth it.

Prints one JSON object per measurement; the load average is in each (2 cores: above ~2 means a share).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the trainer sets it: spinning threads inflate CPU-seconds
BLUEPRINTS = {
    "sft": "smollm2-135m-lora-kubectl",
    "dpo": "smollm2-135m-dpo-kubectl",
    "grpo": "smollm2-135m-grpo-kubectl",
}
BARS = {"dpo": 300.0, "grpo": 600.0}  # seconds of training each may take


def _load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps({**record, "load": _load_avg()}), flush=True)


# --- bars ------------------------------------------------------------------------------------------------


def bars(method: str, sets: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / method
        args = [sys.executable, "-m", "playground.train", "--blueprint", BLUEPRINTS[method], "--output", str(out)]
        args += [x for s in sets for x in ("--set", s)]
        started = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
        if proc.returncode:
            sys.exit(f"training failed:\n{proc.stderr[-3000:]}")
        metrics = json.loads((out / "metrics.json").read_text())
        samples = [line for line in proc.stdout.splitlines() if line.startswith("sample (step ")]
    figures = ("eval_exact_match", "eval_mean_reward", "eval_preference_accuracy", "eval_unasked_changes")
    table = {
        stage: {name: metrics.get(f"{prefix}{name}") for name in figures if f"{prefix}{name}" in metrics}
        for stage, prefix in (("base", "base_"), ("warm start", "warm_start_"), ("trained", ""))
    }
    windows = [
        {"step": entry["step"], **{k: v for k, v in entry.items() if k.startswith(("eval_", "base_", "warm_"))}}
        for entry in metrics.get("history", [])
    ]
    _emit(
        {
            "method": method,
            "blueprint": BLUEPRINTS[method],
            "sets": sets,
            "held_out": {stage: values for stage, values in table.items() if values},
            "eval_reward_margin": metrics.get("eval_reward_margin"),
            "train_seconds": metrics["train_seconds"],
            "train_cpu_seconds": metrics["train_cpu_seconds"],
            "wall_seconds": metrics["wall_seconds"],
            "within_time_bar": metrics["train_seconds"] <= BARS[method],
            "peak_rss_gb": round(metrics["peak_memory_bytes"] / 2**30, 2),
            "history": windows,
            "last_samples": samples[-3:],
            "process_seconds": round(time.perf_counter() - started, 1),
        }
    )


# --- rates -----------------------------------------------------------------------------------------------


def _spec(method: str, steps: int, output: Path) -> Any:
    from playground.blueprints import get_blueprint
    from playground.train.settings import TrainSpec

    blueprint = get_blueprint(BLUEPRINTS[method])
    # GRPO from the base model (no warm start): the same sampling and update work on both sides
    sets = {"max_steps": steps, "log_every": steps, "num_eval_examples": 10}
    if method == "grpo":
        sets["warm_start_steps"] = 0
    params = blueprint.resolve_params(sets)
    return TrainSpec(blueprint, params, output, blueprint.model.source, blueprint.dataset.source)


def _timed(train: Any) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        train()
    return time.perf_counter() - wall, time.process_time() - cpu


def _trl_recipe(method: str, steps: int, tmp: Path) -> tuple[float, float]:
    """The playground's recipe: its trainer's ``train()`` only (no evals, no save)."""
    from playground.train.dpo import DpoRecipe
    from playground.train.grpo import GrpoRecipe
    from playground.train.reporting import Reporter

    cls = {"dpo": DpoRecipe, "grpo": GrpoRecipe}[method]
    spec = _spec(method, steps, tmp / f"ours-{time.monotonic_ns()}")
    recipe = cls(spec, Reporter(stream=io.StringIO()))
    recipe.setup()
    return _timed(recipe.trainer.train)


def _trl_own(method: str, steps: int, tmp: Path) -> tuple[float, float]:
    """TRL's own trainer, its defaults, the same rows, model, LoRA and hyperparameters."""
    from datasets import Dataset
    from peft import LoraConfig

    from playground.train.dpo import DpoRecipe
    from playground.train.grpo import GrpoRecipe
    from playground.train.reporting import Reporter

    spec = _spec(method, steps, tmp / f"theirs-{time.monotonic_ns()}")
    recipe = {"dpo": DpoRecipe, "grpo": GrpoRecipe}[method](spec, Reporter(stream=io.StringIO()))
    recipe.setup()  # only for its rows, tokenizer and settings
    s, lora = recipe.settings, spec.blueprint.method
    common = {
        "output_dir": str(spec.output / "trl"),
        "max_steps": steps,
        "learning_rate": s.learning_rate,
        "warmup_steps": s.warmup_steps,
        "report_to": [],
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": s.seed,
        "logging_steps": steps,
    }
    peft = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules), task_type="CAUSAL_LM"
    )
    model = _plain_model(recipe)
    if method == "dpo":
        from trl import DPOConfig, DPOTrainer

        losses = ["sigmoid", "sft"] if s.sft_weight else ["sigmoid"]
        config = DPOConfig(
            **common,
            per_device_train_batch_size=s.batch_size,
            beta=s.beta,
            loss_type=losses,
            loss_weights=[1.0, s.sft_weight] if s.sft_weight else None,
            max_length=s.max_seq_length,
        )
        trainer = DPOTrainer(
            model=model,
            args=config,
            train_dataset=Dataset.from_list(recipe.train_rows),
            processing_class=recipe.tokenizer,
            peft_config=peft,
        )
    else:
        from trl import GRPOConfig, GRPOTrainer

        config = GRPOConfig(
            **common,
            per_device_train_batch_size=s.batch_size * s.num_generations,
            num_generations=s.num_generations,
            max_completion_length=s.max_completion_length,
            beta=s.beta,
        )
        trainer = GRPOTrainer(
            model=model,
            args=config,
            reward_funcs=[recipe.reward],
            train_dataset=Dataset.from_list(recipe.train_rows),
            processing_class=recipe.tokenizer,
            peft_config=peft,
        )
        recipe.trainer = trainer  # the reward reads the step from it
    return _timed(trainer.train)


def _plain_model(recipe: Any) -> Any:
    """The blueprint's base model without LoRA (TRL's trainer wraps it itself from ``peft_config``)."""
    import torch

    from playground.train import model as models

    kind, ref = models.parse_source(recipe.spec.model_source)
    model = models.build_model(
        kind, ref, recipe.spec.blueprint.model, recipe.tokenizer, dtype=torch.float32, seed=recipe.settings.seed
    )
    models.configure_generation(model, recipe.tokenizer, recipe.spec.blueprint.serving.max_new_tokens)
    return model


def _sft_ours(steps: int, tmp: Path) -> tuple[float, float]:
    from playground.train.recipe import Recipe, train_loop
    from playground.train.reporting import Reporter

    recipe = Recipe(_spec("sft", steps, tmp / f"sft-{time.monotonic_ns()}"), Reporter(stream=io.StringIO()))
    recipe.setup()
    return _timed(lambda: train_loop(recipe))


def _sft_trl(steps: int, tmp: Path, *, checkpointing: bool) -> tuple[float, float]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from playground.train.recipe import Recipe, setup_data, setup_distributed
    from playground.train.reporting import Reporter

    spec = _spec("sft", steps, tmp / f"sft-trl-{time.monotonic_ns()}")
    recipe = Recipe(spec, Reporter(stream=io.StringIO()))
    recipe.runtime = setup_distributed(recipe)
    recipe.data = setup_data(recipe)
    rows = [
        {"prompt": s.prompt_messages(), "completion": [{"role": "assistant", "content": s.answer}]}
        for s in recipe.data.train_set.samples
    ]
    s, lora = recipe.settings, spec.blueprint.method
    config = SFTConfig(
        output_dir=str(spec.output / "trl"),
        max_steps=steps,
        learning_rate=s.learning_rate,
        per_device_train_batch_size=s.batch_size,
        warmup_steps=s.warmup_steps,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=s.seed,
        logging_steps=steps,
        max_length=s.max_seq_length,
        activation_checkpointing=checkpointing,
    )
    from playground.train import model as models

    kind, ref = models.parse_source(spec.model_source)
    model = models.build_model(kind, ref, spec.blueprint.model, recipe.data.tokenizer, dtype=torch.float32, seed=s.seed)
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=recipe.data.tokenizer,
        peft_config=LoraConfig(
            r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules), task_type="CAUSAL_LM"
        ),
    )
    return _timed(trainer.train)


def rates(method: str, steps: int, repeats: int) -> None:
    import torch

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if method in ("sft", "all"):
            contenders = {
                "playground SFT loop": lambda: _sft_ours(steps, tmp),
                "TRL SFTTrainer (defaults: gradient checkpointing)": lambda: _sft_trl(steps, tmp, checkpointing=True),
                "TRL SFTTrainer (no gradient checkpointing)": lambda: _sft_trl(steps, tmp, checkpointing=False),
            }
            _race("sft", contenders, steps, repeats)
        for name in ("dpo", "grpo"):
            if method in (name, "all"):
                contenders = {
                    f"playground {name.upper()} recipe": lambda n=name: _trl_recipe(n, steps, tmp),
                    f"TRL {name.upper()}Trainer (its defaults)": lambda n=name: _trl_own(n, steps, tmp),
                }
                _race(name, contenders, steps, repeats)


def _race(method: str, contenders: dict[str, Any], steps: int, repeats: int) -> None:
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, run in contenders.items():
            results[name].append(run())
    first = next(iter(contenders))
    per_cpu = {name: steps / min(cpu for _, cpu in runs) for name, runs in results.items()}
    per_wall = {name: steps / min(wall for wall, _ in runs) for name, runs in results.items()}
    _emit(
        {
            "rates": method,
            "steps": steps,
            "repeats": repeats,
            "steps_per_cpu_second": {k: round(v, 4) for k, v in per_cpu.items()},
            "steps_per_second": {k: round(v, 4) for k, v in per_wall.items()},
            f"ratio_of_{first.replace(' ', '_')}_per_cpu_second": {
                name: round(per_cpu[first] / value, 3) for name, value in per_cpu.items() if name != first
            },
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bar = sub.add_parser("bars", help="the CPU blueprints against their bars")
    bar.add_argument("--method", choices=("dpo", "grpo", "both"), default="both")
    bar.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    rate = sub.add_parser("rates", help="steps per CPU-second: our recipes and loop against TRL's trainers")
    rate.add_argument("--method", choices=("sft", "dpo", "grpo", "all"), default="all")
    rate.add_argument("--steps", type=int, default=8)
    rate.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.command == "bars":
        for method in ("dpo", "grpo") if args.method == "both" else (args.method,):
            bars(method, args.sets)
    else:
        rates(args.method, args.steps, args.repeats)


if __name__ == "__main__":
    main()
