"""The frame of the recipes TRL runs (DPO: playground/train/dpo.py; GRPO: playground/train/grpo.py).

TRL owns the method: the losses, sampling, the reference model (with LoRA, the same weights with the
adapter switched off; no second copy), the optimizer and its schedule, checkpoints and ``--resume``
(``checkpoints/checkpoint-N``, Hugging Face's layout; the run's settings are written beside them and
checked on resume as for SFT). This frame gives both methods what every playground run has: the same
model loading and LoRA (playground/train/model.py), ``@@playground`` events at the ``log_every`` cadence
(and the last step) with the method's own figures in ``Progress.metrics``, the MLflow run and
``trainerStatus`` through the Reporter, held-out evaluation by greedy generation (exact match and, for the
kubectl task, the mean verifiable reward) of the base model before training and of the result after, and
the servable ``model/`` directory and ``metrics.json`` written atomically.

A method subclasses :class:`TrlRecipe`: ``build_data`` (its rows), ``build_trainer`` (its TRL trainer and
config), ``METRICS`` (TRL's log keys → the event's names, headline first) and, if it has any,
``extra_eval`` (held-out figures only that method has). The stages run as ``setup() → train() → cleanup()``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from playground.events import JobPhase, Progress
from playground.kubectl import reward as kubectl_reward
from playground.stopping import NotedReporter, StopRequest, StopWatch, answer_in_time
from playground.train import checkpoint, evaluate
from playground.train import model as models
from playground.train.data import Sample
from playground.train.eta import EtaSmoother, LoadRecorder
from playground.train.finish import FinishReporter, earlier_finish_seconds, make_eta, planned_finish
from playground.train.recipe import (
    MAX_SYNTHETIC_ROWS,
    MIN_LR_RATIO,
    Clock,
    _finite_json,
    cpu_threads,
    peak_memory,
    setup_distributed,
    stop_requested,
    stopped_record,
    teardown,
    write_metrics,
)
from playground.train.reporting import Reporter
from playground.train.save import save_model_dir, unwrap
from playground.train.settings import TrainSpec


def _checkpointing_argument() -> str:
    """transformers' name for activation (gradient) checkpointing: ``activation_checkpointing`` since 5.2x, whose
    old alias warns."""
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


class TrlRecipe:
    """One run of a TRL-backed method: ``setup()`` (device, tokenizer, model + LoRA, rows, the trainer)
    → ``train()`` (base eval, TRL's loop, final eval, save) → ``cleanup()``."""

    objective: ClassVar[str]
    # TRL's logged names → the names in Progress.metrics (the first is the chart's headline)
    METRICS: ClassVar[dict[str, str]]

    def __init__(self, spec: TrainSpec, reporter: Reporter) -> None:
        self.wall_start = time.perf_counter()
        self.spec, self.reporter = spec, reporter
        self.settings = spec.settings
        self.history: list[dict[str, Any]] = []
        self.clock = Clock()
        self.last_loss = math.nan
        self.evaluate_base = True  # GRPO with a warm start evaluates the base before it
        self.finish = FinishReporter(reporter)  # the Evaluating and Saving phases after the last step
        self.finish_estimate = 0.0  # seconds they took last time (setup finds out), added to the ETA
        self.eta = EtaSmoother(self.settings.max_steps)  # smoothed; setup adds the finish (earlier run's or plan's)
        self.load = LoadRecorder(cpu_threads())  # the machine's load while training: metrics.json's load_factor
        self.stop_watch = StopWatch.from_env()  # a stop request (a booth deadline): checked at every step boundary
        self.stopped: StopRequest | None = None  # set when one ended training before max_steps
        self.stopped_step: int | None = None
        self.eval_finish_by: float | None = None  # the final evaluation answers only what fits before this
        self.eval_answered: int | None = None  # held-out requests it answered, when fewer than all

    # --- setup ---------------------------------------------------------------------------------

    def setup(self) -> None:
        self.runtime = setup_distributed(self)  # ranks, threads, device, bf16, seed: as the SFT recipe
        self.plan = self.settings.plan(self.runtime.dist.world_size)
        kind, ref = models.parse_source(self.spec.model_source)
        self.tokenizer = models.load_tokenizer(kind, ref, self.spec.blueprint.model)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.train_rows, self.eval_samples = self.build_data()
        self.source = self.start_source()
        self.model = self.build_model(self.source)
        method = self.spec.blueprint.method
        # LoRA: TRL wraps the model itself from this config, and then takes the reference by switching the adapter
        # off. A model wrapped beforehand makes TRL copy the adapter as a second, "ref" one: 0.55× the step rate.
        self.peft_config = models.lora_config(method, self.spec.params) if method.kind == "lora" else None
        import datasets
        from transformers import PrinterCallback
        from transformers.integrations import KubeflowCallback

        datasets.disable_progress_bars()  # TRL tokenizes through datasets.map: no bars in the job's log
        self.trainer = self.build_trainer()
        self.trainer.remove_callback(PrinterCallback)  # TRL's raw log dicts: our Progress events say it
        # transformers adds its own trainerStatus writer whenever KUBEFLOW_TRAINER_SERVER_URL is set (report_to
        # or not): its updates (TRL's raw keys) would race ours and could land after the final 100 % one
        self.trainer.remove_callback(KubeflowCallback)
        self.trainer.add_callback(_Events(self))
        self.finish_estimate = earlier_finish_seconds(self.spec.output, self.spec.blueprint.id, len(self.eval_samples))
        planned = planned_finish(self.spec) if self.runtime.dist.main else None
        self.eta = make_eta(self.settings.max_steps, self.finish_estimate, planned, self.finish)
        n_params = sum(p.numel() for p in self.trainer.model.parameters())
        n_trainable = sum(p.numel() for p in self.trainer.model.parameters() if p.requires_grad)
        self.reporter.log(
            f"{self.objective}: {len(self.train_rows)} training rows, {len(self.eval_samples)} held-out requests; "
            f"model {self.source} ({n_params / 1e6:.2f}M parameters, {n_trainable / 1e6:.2f}M trainable); "
            f"global batch {self.plan.global_batch} on {self.runtime.device} (TRL)"
        )

    def start_source(self) -> str:
        """The weights training starts from (GRPO: after its warm start)."""
        return self.spec.model_source

    def build_model(self, source: str) -> Any:
        """The causal LM from ``source`` with the serving generation settings (LoRA: targets checked; the trainer
        adds the adapters from ``peft_config``)."""
        import torch

        kind, ref = models.parse_source(source)
        dtype = torch.bfloat16 if (self.runtime.bf16 and kind != "scratch") else torch.float32
        self.weights_dtype = dtype
        model = models.build_model(
            kind, ref, self.spec.blueprint.model, self.tokenizer, dtype=dtype, seed=self.settings.seed
        )
        models.configure_generation(model, self.tokenizer, self.spec.blueprint.serving.max_new_tokens)
        if self.spec.blueprint.method.kind == "lora":
            models.check_lora_targets(model, self.spec.blueprint.method)
        return model

    def training_arguments(self) -> dict[str, Any]:
        """The Hugging Face TrainingArguments every method shares: the run's settings, our schedule
        (linear warmup, cosine to 10 % of the peak), checkpoints on the run's cadence, no reporting of
        TRL's own (the Reporter does it)."""
        settings = self.settings
        return {
            "output_dir": str(self.spec.output / "checkpoints"),
            "max_steps": settings.max_steps,
            "per_device_train_batch_size": self.plan.micro_batch,
            "gradient_accumulation_steps": self.plan.micro_steps,
            "learning_rate": settings.learning_rate,
            "warmup_steps": settings.warmup_steps,
            "weight_decay": settings.weight_decay,
            "lr_scheduler_type": "cosine_with_min_lr",
            "lr_scheduler_kwargs": {"min_lr_rate": MIN_LR_RATIO},
            "adam_beta2": 0.95,
            "max_grad_norm": 1.0,
            "logging_steps": settings.log_every,
            "save_strategy": "steps" if settings.checkpoint_every else "no",
            "save_steps": settings.checkpoint_every or 500,
            "save_total_limit": 2,
            "seed": settings.seed,
            "data_seed": settings.seed,
            "bf16": self.runtime.bf16,
            "use_cpu": not self.runtime.cuda,
            "report_to": [],
            "disable_tqdm": True,
            "log_level": "error",
            "eval_strategy": "no",
            "dataloader_num_workers": 0,
            # TRL turns it on by default; on a CPU it only costs time (about a third more per step)
            _checkpointing_argument(): self.runtime.cuda,
        }

    # --- train ---------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        resume = checkpoint.latest_trl_checkpoint(self.spec.output) if self.spec.resume else None
        if resume is None and self.evaluate_base:
            self.evaluate_model(self.trainer.model, step=0, prefix="base_")  # the headline's "before"
        elif resume is not None:
            saved = json.loads((resume / checkpoint.TRL_SETTINGS_FILE).read_text())
            self.history = list(saved.get("history", []))
            self.clock.wall, self.clock.cpu = float(saved.get("train_seconds", 0)), float(saved.get("train_cpu", 0))
            self.reporter.log(f"resume: continuing from checkpoints/{resume.name}")
        self.reporter.phase(JobPhase.TRAINING)
        self.clock.restart()
        self.trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        self.clock.lap()
        request = self.stopped or self.stop_watch.requested()  # asked during the last step: the time limit holds
        self.eval_finish_by = request.eval_finish_by() if request is not None else None
        if self.stopped is not None:  # Evaluating and Saving say where training stopped
            self.finish.reporter = NotedReporter(
                self.reporter, self.stopped.describe(self.steps_done, self.settings.max_steps)
            )
        self.finish.evaluating(len(self.eval_samples))
        final = self.evaluate_model(self.trainer.model, step=self.steps_done, on_answered=self.finish.answered)
        return self.save(final)

    @property
    def steps_done(self) -> int:
        """The steps trained: ``max_steps``, or where a stop request ended training."""
        return self.settings.max_steps if self.stopped_step is None else self.stopped_step

    def evaluate_model(
        self, model: Any, *, step: int, prefix: str = "", on_answered: Callable[[int, int], None] | None = None
    ) -> dict[str, float]:
        """Held-out figures by greedy generation (prompted like a chat request): exact match; for the kubectl
        task the mean verifiable reward and the share of answers that would change the cluster unasked; and the
        method's own (``extra_eval``). ``prefix="base_"``: the model before training (LoRA switched off)."""
        import contextlib

        model = unwrap(model)
        base = prefix == "base_"
        off = model.disable_adapter() if base and hasattr(model, "disable_adapter") else contextlib.nullcontext()
        results: dict[str, float] = {}
        with off:
            samples = self.eval_samples
            prompt_ids = [
                list(
                    self.tokenizer.apply_chat_template(
                        s.prompt_messages(), add_generation_prompt=True, tokenize=True, return_dict=True
                    )["input_ids"]
                )
                for s in samples
            ]
            longest = max((len(self.tokenizer(s.answer)["input_ids"]) for s in samples), default=1)
            max_new = min(self.spec.blueprint.serving.max_new_tokens, longest + 8)
            with self.runtime.autocast():
                answers = answer_in_time(
                    lambda ids, progress: evaluate.generate_answers(
                        model, self.tokenizer, ids, max_new_tokens=max_new, device=self.runtime.device,
                        on_progress=progress,
                    ),
                    prompt_ids, finish_by=None if base else self.eval_finish_by,
                    on_progress=self.runtime.sharing_cpu(self.reporter, on_answered),
                )  # fmt: skip
            if len(answers) < len(samples):  # stopped early with little time left: fewer requests, still a score
                self.eval_answered, samples = len(answers), samples[: len(answers)]
                self.reporter.log(f"evaluation: {len(answers)} of {len(prompt_ids)} held-out requests answered in time")
            results["eval_exact_match"] = evaluate.exact_match(answers, [s.answer for s in samples])
            if self.spec.blueprint.task == "english-to-kubectl":
                rewards = [kubectl_reward.score(a, s.answer) for a, s in zip(answers, samples, strict=True)]
                results["eval_mean_reward"] = sum(rewards) / max(1, len(rewards))
                unasked = [kubectl_reward.changes_unasked(a, s.answer) for a, s in zip(answers, samples, strict=True)]
                results["eval_unasked_changes"] = sum(unasked) / max(1, len(unasked))  # share of answers
            results.update(self.extra_eval(model, base=base))
        results = {f"{prefix}{name}": value for name, value in results.items()}
        for name, value in results.items():
            self.reporter.metric(name, value)
        self.history.append({"step": step, "train_seconds": round(self.clock.wall_total(), 3), **results})
        return results

    def extra_eval(self, model: Any, *, base: bool) -> dict[str, float]:
        """Held-out figures only this method has (DPO: preference accuracy and margin)."""
        return {}

    def save(self, final: dict[str, float]) -> dict[str, Any]:
        """The servable ``model/`` (LoRA on the job's base model: the PEFT adapter) and ``metrics.json``, both
        written atomically."""
        import torch

        self.finish.saving()
        metrics: dict[str, Any] = {}
        runtime = self.runtime
        if not runtime.dist.main:
            return metrics
        save_dtype = torch.bfloat16 if self.weights_dtype == torch.bfloat16 else None
        # LoRA on weights that are not the job's base model (a GRPO warm start's, a scratch model's random ones,
        # saved nowhere here) is merged: an adapter alone would be served on the wrong base
        merge = self.source != self.spec.model_source or self.source.startswith("scratch://")
        save_model_dir(self.trainer.model, self.tokenizer, self.spec.output / "model", dtype=save_dtype, merge=merge)

        metrics = {
            **final,
            **{
                name: value
                for entry in self.history
                if entry["step"] == 0
                for name, value in entry.items()
                if name.startswith(("base_", "warm_start_"))
            },
            "objective": self.objective,
            "train_loss": self.last_loss,
            "steps": self.steps_done,
            "train_seconds": round(self.clock.wall, 3),
            "train_cpu_seconds": round(self.clock.cpu, 3),
            "wall_seconds": round(time.perf_counter() - self.wall_start, 3),
            "num_train_examples": len(self.train_rows),
            "num_eval_examples": len(self.eval_samples),
            "parameters": sum(p.numel() for p in unwrap(self.trainer.model).parameters()),
            "device": str(runtime.device),
            "world_size": runtime.dist.world_size,
            "strategy": "ddp" if runtime.dist.world_size > 1 else "single",
            "global_batch_size": self.plan.global_batch,
            "compute_dtype": runtime.compute_dtype,
            "history": self.history,
            **peak_memory(runtime),
            "finish_seconds": self.finish.seconds,  # the final evaluation and the save: the next run's ETA has it
            "evaluate_seconds": self.finish.evaluate_seconds,  # the evaluation alone: the plan's breakdown has it
            # the load it trained under (the CPU it got): the plan scales its times back to an idle machine by it
            "load_factor": self.load.measured(self.clock.wall, self.clock.cpu, gpu=runtime.cuda),
            "load_average_factor": self.load.factor,  # what the load average said it would be
        }
        if self.stopped is not None:  # a stop request (a booth deadline) ended training early
            metrics["stopped"] = stopped_record(
                self.stopped, self.steps_done, self.settings.max_steps, self.eval_answered, len(self.eval_samples)
            )
        write_metrics(self.spec.output, metrics)
        return metrics

    def cleanup(self) -> None:
        teardown(self)

    @classmethod
    def run(cls, spec: TrainSpec, reporter: Reporter) -> dict[str, Any]:
        """Train, evaluate and save; returns the final metrics (also written to metrics.json)."""
        recipe = cls(spec, reporter)
        recipe.setup()
        metrics = recipe.train()
        recipe.cleanup()
        return metrics

    def synthetic_rows(self) -> int:
        """Generated training rows: ``num_train_examples``, else one per example of every step (capped)."""
        settings = self.settings
        return int(settings.num_train_examples or min(settings.max_steps * self.plan.global_batch, MAX_SYNTHETIC_ROWS))

    # --- what a method provides ----------------------------------------------------------------

    def build_data(self) -> tuple[list[Any], list[Sample]]:
        """The training rows (TRL's format) and the held-out requests with their answers."""
        raise NotImplementedError

    def build_trainer(self) -> Any:
        raise NotImplementedError

    def method_metrics(self, logs: dict[str, float]) -> dict[str, float]:
        """The method's figures from one of TRL's log records, renamed, headline first."""
        return {ours: float(logs[theirs]) for theirs, ours in self.METRICS.items() if theirs in logs}


class _Events:
    """A ``transformers.TrainerCallback`` (duck-typed: the module imports no torch) that turns TRL's logs
    into Progress events, keeps the last step's figures and writes the run's settings into each checkpoint."""

    def __init__(self, recipe: TrlRecipe) -> None:
        self.recipe = recipe
        self.window_start = time.perf_counter()
        self.window_step = 0
        self.tokens = 0.0

    def __getattr__(self, name: str) -> Any:  # every other TrainerCallback hook: nothing to do
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recipe.runtime.watch_cpu()
        self.window_start, self.window_step = time.perf_counter(), state.global_step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recipe.runtime.share_cpu(self.recipe.reporter)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= state.max_steps:
            control.should_log = True  # the last step always reports
        elif stop_requested(self.recipe, state.global_step):  # a stop request (a deadline): the last step
            recipe = self.recipe
            recipe.stopped = recipe.stop_watch.requested() or StopRequest("stop", time.time())
            recipe.stopped_step = state.global_step
            control.should_training_stop = True
            control.should_log = True  # its progress point
            recipe.reporter.log(f"{recipe.stopped.describe(state.global_step, state.max_steps)}: evaluating and saving")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        if "loss" not in logs or state.global_step == self.window_step:
            return  # an eval record, or a second record for the same step
        recipe = self.recipe
        now = time.perf_counter()
        steps = state.global_step - self.window_step
        elapsed = now - self.window_start
        tokens = float(logs.get("num_tokens", 0.0))
        rate = (tokens - self.tokens) / elapsed if tokens and self.tokens and elapsed > 0 else None
        self.tokens = tokens
        recipe.last_loss = float(logs["loss"])
        if not recipe.runtime.cuda:
            import torch

            recipe.load.sample(elapsed, torch.get_num_threads())
        recipe.reporter.progress(
            Progress(
                step=state.global_step,
                total_steps=state.max_steps,
                epoch=round(float(state.epoch or 0.0), 4),
                loss=recipe.last_loss,
                learning_rate=logs.get("learning_rate"),
                tokens_per_second=rate,
                eta_seconds=recipe.eta.update(state.global_step, steps, elapsed),  # smoothed, with the finish
                metrics=recipe.method_metrics(logs),
            )
        )
        self.window_start, self.window_step = now, state.global_step
        if not math.isfinite(recipe.last_loss):
            raise FloatingPointError(
                f"loss became {recipe.last_loss} at step {state.global_step}; try a lower learning_rate"
            )

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        recipe = self.recipe
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if recipe.runtime.dist.main and folder.is_dir():
            info = {
                "config": recipe.settings.resume_config(),
                "objective": recipe.objective,
                "history": recipe.history,
                "train_seconds": recipe.clock.wall_total(),
                "train_cpu": recipe.clock.cpu_total(),
            }
            (folder / checkpoint.TRL_SETTINGS_FILE).write_text(json.dumps(_finite_json(info), default=str))
