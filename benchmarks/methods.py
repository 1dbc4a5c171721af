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

``--gpu-config`` (both commands): the GPU blueprints (``qwen2.5-1.5b-dpo-kubectl``, ``llama-3.2-1b-grpo-kubectl``) on
their architectures at full size built from config (random init, a tokenizer built here that also learned the
kubectl task's words: ``playground e2e --profile gpu-config``'s models), on the GPU in bf16. ``bars`` then trains with
that profile's parameters (100 steps, lr 1e-3), both methods at once (``--parallel``); ``rates`` times steps per
second (the GPU's work; CPU-seconds mean little there). ``--tiny`` shrinks those models to run on a CPU (its figures
mean nothing: it proves the script). ``--out DIR`` also writes every record to ``DIR/methods.jsonl``.

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
from dataclasses import dataclass, field
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
BARS = {"dpo": 300.0, "grpo": 600.0}  # seconds of training each may take (the CPU blueprints)
GPU_BLUEPRINTS = {"dpo": "qwen2.5-1.5b-dpo-kubectl", "grpo": "llama-3.2-1b-grpo-kubectl"}
RECORDS: list[Path] = []  # --out: where every record is appended too


@dataclass
class Target:
    """Which blueprints run, from which weights, on which device."""

    blueprints: dict[str, str]
    model_sources: dict[str, str] = field(default_factory=dict)  # method -> weights (default: the blueprint's)
    cpu: bool = True

    def model_source(self, method: str) -> str | None:
        return self.model_sources.get(method)


def _load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def _emit(record: dict[str, Any]) -> None:
    line = json.dumps({**record, "load": _load_avg()})
    print(line, flush=True)
    for path in RECORDS:
        with path.open("a") as out:
            out.write(line + "\n")


def _gpu_config_target(methods: list[str], workdir: Path, *, tiny: bool) -> Target:
    """The GPU blueprints on the e2e gpu-config profile's models: full size (``tiny``: shrunk), random init. Models
    already in ``workdir`` are used again (``--models`` shares them between commands)."""
    from gpu_blueprints import TINY_OVERRIDES  # benchmarks/, beside this script

    from playground.blueprints import get_blueprint
    from playground.e2e.headless import FROM_CONFIG, build_standins, standin_arch

    sources = {}
    for method in methods:
        blueprint = get_blueprint(GPU_BLUEPRINTS[method])
        overrides = TINY_OVERRIDES[standin_arch(blueprint)] if tiny else None  # the same architectures, tiny
        built = sorted((workdir / method).glob("config-*/config.json"))
        if built:
            sources[method] = str(built[0].parent)
            continue
        started = time.perf_counter()
        source, _ = build_standins(blueprint, FROM_CONFIG, None, workdir / method, config_overrides=overrides)
        print(f"{method}: built {source} in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
        sources[method] = str(source)
    return Target(GPU_BLUEPRINTS, sources, cpu=tiny)


# --- bars ------------------------------------------------------------------------------------------------


GPU_CONFIG_SETS = ("max_steps", "learning_rate", "checkpoint_every", "log_every")  # the profile's training parameters


def gpu_config_sets() -> list[str]:
    """``playground e2e --profile gpu-config``'s training parameters for a hub blueprint, as ``--set`` values."""
    from playground.e2e.profiles import GPU_CONFIG

    return [f"{key}={GPU_CONFIG.hub[key]}" for key in GPU_CONFIG_SETS]


def bars(methods: list[str], sets: list[str], target: Target, *, parallel: bool = False, extra: list[str] = ()) -> None:
    """Train each method's blueprint through the entrypoint (at once with ``parallel``) and emit its figures;
    ``extra`` (``METHOD:KEY=VALUE[,KEY=VALUE]``): one more run of that method with those settings on top."""
    runs_wanted = [(method, sets) for method in methods]
    for spec in extra:
        method, _, more = spec.partition(":")
        runs_wanted.append((method, sets + [item for item in more.split(",") if item]))
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for index, (method, run_sets) in enumerate(runs_wanted):
            out = Path(tmp) / f"{method}-{index}"
            args = [sys.executable, "-m", "playground.train", "--blueprint", target.blueprints[method]]
            args += ["--output", str(out)] + [x for s in run_sets for x in ("--set", s)]
            if target.model_source(method):
                args += ["--model-source", target.model_source(method)]
            log = ((RECORDS[0].parent if RECORDS else Path(tmp)) / f"{method}-{index}.log").open("w+")  # --out: kept
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=REPO)
            runs.append((method, run_sets, proc, log, out))
            if not parallel:
                _bar_record(*runs[-1], target)
        if parallel:
            for run in runs:
                _bar_record(*run, target)


def _bar_record(method: str, sets: list[str], proc: Any, log: Any, out: Path, target: Target) -> None:
    from playground.events import Progress, parse_line

    started = time.perf_counter()
    returncode = proc.wait()
    log.seek(0)
    output = log.read()
    if returncode:
        _emit({"method": method, "blueprint": target.blueprints[method], "failed": returncode, "log": output[-3000:]})
        return
    metrics = json.loads((out / "metrics.json").read_text())
    samples = [line for line in output.splitlines() if line.startswith("sample (step ")]
    figures = ("eval_exact_match", "eval_mean_reward", "eval_preference_accuracy", "eval_unasked_changes")
    table = {
        stage: {name: metrics.get(f"{prefix}{name}") for name in figures if f"{prefix}{name}" in metrics}
        for stage, prefix in (("base", "base_"), ("warm start", "warm_start_"), ("trained", ""))
    }
    windows = [
        {"step": entry["step"], **{k: v for k, v in entry.items() if k.startswith(("eval_", "base_", "warm_"))}}
        for entry in metrics.get("history", [])
    ]
    progress = []  # the method's own figures per log window, from the job's Progress events
    for line in output.splitlines():
        event = parse_line(line)
        if isinstance(event, Progress):
            figures = {k: round(v, 4) for k, v in event.metrics.items()}
            progress.append({"step": event.step, "loss": round(event.loss or 0.0, 4), **figures})
    bar = BARS.get(method) if target.blueprints is BLUEPRINTS else None  # the CPU blueprints' time bars
    _emit(
        {
            "method": method,
            "blueprint": target.blueprints[method],
            "model_source": target.model_source(method) or "the blueprint's",
            "sets": sets,
            "held_out": {stage: values for stage, values in table.items() if values},
            "eval_reward_margin": metrics.get("eval_reward_margin"),
            "train_seconds": metrics["train_seconds"],
            "train_cpu_seconds": metrics["train_cpu_seconds"],
            "wall_seconds": metrics["wall_seconds"],
            **({"within_time_bar": metrics["train_seconds"] <= bar} if bar else {}),
            "peak_memory_gb": round(metrics["peak_memory_bytes"] / 2**30, 2),
            "peak_memory_kind": metrics.get("peak_memory_kind"),
            "history": windows,
            "progress": progress,
            "last_samples": samples[-6:],
            "waited_seconds": round(time.perf_counter() - started, 1),
        }
    )


# --- rates -----------------------------------------------------------------------------------------------


def _spec(method: str, steps: int, output: Path, target: Target) -> Any:
    from playground.blueprints import get_blueprint
    from playground.train.settings import TrainSpec

    blueprint = get_blueprint(target.blueprints[method])
    # GRPO from the base model (no warm start): the same sampling and update work on both sides
    sets = {"max_steps": steps, "log_every": steps, "num_eval_examples": 10}
    if method == "grpo":
        sets["warm_start_steps"] = 0
    params = blueprint.resolve_params(sets)
    model_source = target.model_source(method) or blueprint.model.source
    return TrainSpec(blueprint, params, output, model_source, blueprint.dataset.source)


def _timed(train: Any) -> tuple[float, float]:
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    sync()
    wall, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        train()
    sync()
    return time.perf_counter() - wall, time.process_time() - cpu


def _trl_recipe(method: str, steps: int, tmp: Path, target: Target) -> tuple[float, float]:
    """The playground's recipe: its trainer's ``train()`` only (no evals, no save)."""
    from playground.train.dpo import DpoRecipe
    from playground.train.grpo import GrpoRecipe
    from playground.train.reporting import Reporter

    cls = {"dpo": DpoRecipe, "grpo": GrpoRecipe}[method]
    spec = _spec(method, steps, tmp / f"ours-{time.monotonic_ns()}", target)
    recipe = cls(spec, Reporter(stream=io.StringIO()))
    recipe.setup()
    return _timed(recipe.trainer.train)


def _trl_own(method: str, steps: int, tmp: Path, target: Target) -> tuple[float, float]:
    """TRL's own trainer, its defaults, the same rows, model, LoRA and hyperparameters."""
    from datasets import Dataset
    from peft import LoraConfig

    from playground.train.dpo import DpoRecipe
    from playground.train.grpo import GrpoRecipe
    from playground.train.reporting import Reporter

    spec = _spec(method, steps, tmp / f"theirs-{time.monotonic_ns()}", target)
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
        "use_cpu": target.cpu,
        "bf16": recipe.runtime.bf16,  # as ours: bf16 on a GPU
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
            temperature=s.temperature,
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
    from playground.train import model as models

    kind, ref = models.parse_source(recipe.spec.model_source)
    model = models.build_model(
        kind, ref, recipe.spec.blueprint.model, recipe.tokenizer, dtype=recipe.weights_dtype, seed=recipe.settings.seed
    )
    models.configure_generation(model, recipe.tokenizer, recipe.spec.blueprint.serving.max_new_tokens)
    return model


def _sft_ours(steps: int, tmp: Path, target: Target) -> tuple[float, float]:
    from playground.train.recipe import Recipe, train_loop
    from playground.train.reporting import Reporter

    recipe = Recipe(_spec("sft", steps, tmp / f"sft-{time.monotonic_ns()}", target), Reporter(stream=io.StringIO()))
    recipe.setup()
    return _timed(lambda: train_loop(recipe))


def _sft_trl(steps: int, tmp: Path, target: Target, *, checkpointing: bool) -> tuple[float, float]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from playground.train.recipe import Recipe, setup_data, setup_distributed
    from playground.train.reporting import Reporter

    spec = _spec("sft", steps, tmp / f"sft-trl-{time.monotonic_ns()}", target)
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


def rates(methods: list[str], steps: int, repeats: int, target: Target, tmp: Path) -> None:
    import torch

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    if "sft" in methods:
        contenders = {
            "playground SFT loop": lambda: _sft_ours(steps, tmp, target),
            "TRL SFTTrainer (defaults: gradient checkpointing)": lambda: _sft_trl(
                steps, tmp, target, checkpointing=True
            ),
            "TRL SFTTrainer (no gradient checkpointing)": lambda: _sft_trl(steps, tmp, target, checkpointing=False),
        }
        _race("sft", contenders, steps, repeats, target)
    for name in ("dpo", "grpo"):
        if name in methods:
            contenders = {
                f"playground {name.upper()} recipe": lambda n=name: _trl_recipe(n, steps, tmp, target),
                f"TRL {name.upper()}Trainer (its defaults)": lambda n=name: _trl_own(n, steps, tmp, target),
            }
            _race(name, contenders, steps, repeats, target)


def _race(method: str, contenders: dict[str, Any], steps: int, repeats: int, target: Target) -> None:
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
            "blueprint": target.blueprints[method],
            "device": _device(),
            "steps": steps,
            "repeats": repeats,
            "steps_per_cpu_second": {k: round(v, 4) for k, v in per_cpu.items()},
            "steps_per_second": {k: round(v, 4) for k, v in per_wall.items()},
            f"ratio_of_{first.replace(' ', '_')}_per_cpu_second": {
                name: round(per_cpu[first] / value, 3) for name, value in per_cpu.items() if name != first
            },
            f"ratio_of_{first.replace(' ', '_')}_per_second": {
                name: round(per_wall[first] / value, 3) for name, value in per_wall.items() if name != first
            },
            "seconds": {name: [round(wall, 2) for wall, _ in runs] for name, runs in results.items()},
        }
    )


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{len(os.sched_getaffinity(0))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bar = sub.add_parser("bars", help="the blueprints against their bars")
    bar.add_argument("--method", choices=("dpo", "grpo", "both"), default="both")
    bar.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    bar.add_argument("--parallel", action="store_true", help="train the methods at once")
    bar.add_argument(
        "--extra", action="append", default=[], metavar="METHOD:KEY=VALUE[,...]", help="one more run with these"
    )
    rate = sub.add_parser("rates", help="steps per (CPU-)second: our recipes and loop against TRL's trainers")
    rate.add_argument("--method", choices=("sft", "dpo", "grpo", "all"), default="all")
    rate.add_argument("--steps", type=int, default=8)
    rate.add_argument("--repeats", type=int, default=2)
    for command in (bar, rate):
        command.add_argument("--gpu-config", action="store_true", help="the GPU blueprints on full-size random init")
        command.add_argument("--tiny", action="store_true", help="with --gpu-config: tiny models (a CPU smoke)")
        command.add_argument("--out", type=Path, help="also append every record to OUT/methods.jsonl")
        command.add_argument("--models", type=Path, help="with --gpu-config: where the models are built (or found)")
    args = parser.parse_args()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        RECORDS.append(args.out / "methods.jsonl")
    both = {"bars": ("dpo", "grpo"), "rates": ("sft", "dpo", "grpo")}[args.command]
    methods = list(both) if args.method in ("both", "all") else [args.method]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.gpu_config:
            methods = [m for m in methods if m in GPU_BLUEPRINTS]  # the project's SFT loop on a GPU: gpu_blueprints.py
            target = _gpu_config_target(methods, args.models or tmp / "models", tiny=args.tiny)
        else:
            target = Target(BLUEPRINTS)
        if args.command == "bars":
            sets = (gpu_config_sets() if args.gpu_config else []) + args.sets
            bars(methods, sets, target, parallel=args.parallel, extra=args.extra)
        else:
            rates(methods, args.steps, args.repeats, target, tmp)


if __name__ == "__main__":
    main()
