"""The GRPO recipe: a verifiable reward, TRL's ``GRPOTrainer``.

For each request the model samples ``num_generations`` answers; the project's checker
(playground/kubectl/reward.py) scores each; answers better than their group's mean are made likelier.
``beta`` keeps the policy near the reference (with LoRA: the same weights, adapter off); the KL is reported.

A model that never produces a command gets reward 0 on every sample, every group has zero spread and GRPO
has nothing to learn from (measured on SmolLM2-135M-Instruct: benchmarks/README.md). So a run may start
with ``warm_start_steps`` of supervised training on the task (the project's own SFT loop,
playground/train/recipe.py, into ``warm-start/``); its result becomes both the policy's start and the
reference. Figures: base → warm start → GRPO on the held-out requests (exact match, mean reward), and per
window mean reward, reward spread, KL and completion length, with a few sampled answers and their rewards
in the log every ``sample_every`` steps.
"""

from __future__ import annotations

from typing import Any, ClassVar

from playground.events import Progress
from playground.kubectl import reward as kubectl_reward
from playground.train.checkpoint import latest_trl_checkpoint
from playground.train.data import Sample, load_rows
from playground.train.preferences import METHOD_SYNTHETIC, check_rows, kubectl_requests
from playground.train.recipe import Recipe, save, train_loop
from playground.train.reporting import Reporter
from playground.train.settings import TrainSpec
from playground.train.trl_recipe import TrlRecipe

# the warm start trains as the SFT blueprint (smollm2-135m-lora-kubectl) does: its peak learning rate and batch
WARM_START_LEARNING_RATE = 2e-3
WARM_START_BATCH = 8
SAMPLES_SHOWN = 3


class GrpoRecipe(TrlRecipe):
    objective = "grpo"
    METRICS: ClassVar[dict[str, str]] = {
        "reward": "mean_reward",
        "reward_std": "reward_std",
        "kl": "kl",
        "completions/mean_length": "completion_length",
    }

    def build_data(self) -> tuple[list[dict[str, Any]], list[Sample]]:
        spec, settings = self.spec, self.settings
        num_eval = int(settings.num_eval_examples or 50)
        if spec.dataset_source == METHOD_SYNTHETIC:
            train, held = kubectl_requests(
                spec.blueprint.dataset.options, num_train=self.synthetic_rows(), num_eval=num_eval, seed=settings.seed
            )
        else:
            rows = load_rows(spec.dataset_source, spec.blueprint.dataset.split)
            check_rows("grpo", rows, spec.dataset_source)
            samples = [Sample(str(r["prompt"]), str(r["answer"])) for r in rows]
            cut = max(1, int(len(samples) * spec.blueprint.dataset.eval_fraction))
            held, train = samples[:cut][:num_eval], samples[cut:]
        rows = [{"prompt": [{"role": "user", "content": s.prompt}], "answer": s.answer} for s in train]
        return rows, held

    # --- the warm start ------------------------------------------------------------------------

    def start_source(self) -> str:
        """The base model, or with ``warm_start_steps`` the warm start's ``model/`` (trained first when missing)."""
        if not self.settings.warm_start_steps:
            return self.spec.model_source
        warm = self.spec.output / "warm-start"
        self.evaluate_base = False  # the base is evaluated here, before the warm start, once
        if not (warm / "model").is_dir():
            base = self.build_model(self.spec.model_source)
            self.evaluate_model(base, step=0, prefix="base_")
            del base
            self.reporter.log(f"warm start: {self.settings.warm_start_steps} supervised steps on the task first")
            params = self.spec.params.model_copy(
                update={
                    "max_steps": self.settings.warm_start_steps,
                    "learning_rate": WARM_START_LEARNING_RATE,
                    "batch_size": WARM_START_BATCH,
                    "checkpoint_every": 0,
                    "eval_every": 0,
                }
            )
            method = self.spec.blueprint.method.model_copy(update={"objective": "sft"})
            sft = self.spec.blueprint.model_copy(update={"method": method})
            warm_spec = TrainSpec(sft, params, warm, self.spec.model_source, self.spec.dataset_source)
            recipe = Recipe(warm_spec, _WarmStartReporter(self.reporter))
            recipe.setup()
            train_loop(recipe)
            save(recipe, {}, merge=True)  # merged: GRPO starts from it; held-out figures: next (warm_start_…)
            recipe.cleanup()
        return str(warm / "model")

    def train(self) -> dict[str, Any]:
        if self.settings.warm_start_steps and not latest_trl_checkpoint(self.spec.output):
            self.evaluate_model(self.trainer.model, step=0, prefix="warm_start_")
        return super().train()

    # --- the trainer and its reward ------------------------------------------------------------

    def build_trainer(self) -> Any:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        settings = self.settings
        arguments = self.training_arguments()
        # batch_size counts requests; each brings num_generations sampled answers
        arguments["per_device_train_batch_size"] = self.plan.micro_batch * settings.num_generations
        config = GRPOConfig(
            **arguments,
            num_generations=settings.num_generations,
            max_completion_length=settings.max_completion_length,
            beta=settings.beta,
            temperature=settings.temperature,
            log_completions=False,
            disable_dropout=True,
        )
        self._shown_step = -1
        return GRPOTrainer(
            model=self.model,
            args=config,
            reward_funcs=[self.reward],
            train_dataset=Dataset.from_list(self.train_rows),
            processing_class=self.tokenizer,
            peft_config=self.peft_config,
        )

    def reward(self, prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        """The verifiable reward of each sampled answer; every ``sample_every`` steps a few are logged."""
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        rewards = [kubectl_reward.score(text, want) for text, want in zip(texts, answer, strict=True)]
        step = self.trainer.state.global_step + 1  # the step these samples train
        every = self.settings.sample_every
        if every and (step == 1 or step % every == 0) and step != self._shown_step:
            self._shown_step = step
            for text, want, value in list(zip(texts, answer, rewards, strict=True))[:SAMPLES_SHOWN]:
                shown = " ".join(text.split())[:80]
                self.reporter.log(f"sample (step {step}): {shown!r} → reward {value:.2f} (asked: {want})")
        return rewards


class _WarmStartReporter(Reporter):
    """The warm start's events as plain log lines of the GRPO run: its own steps and phases would confuse the
    chart (its held-out figures come from the GRPO recipe's evaluation, as ``warm_start_…`` metrics)."""

    def __init__(self, outer: Reporter) -> None:
        super().__init__(enabled=outer.enabled, stream=outer.stream)
        self.outer = outer

    def phase(self, phase: Any, reason: str = "") -> None:
        pass

    def progress(self, progress: Progress) -> None:
        loss = "–" if progress.loss is None else f"{progress.loss:.4f}"
        self.outer.log(f"warm start: step {progress.step}/{progress.total_steps} loss {loss}")

    def metric(self, name: str, value: float) -> None:
        self.outer.log(f"warm start: {name} {value:.4g}")


run = GrpoRecipe.run  # the entrypoint's hook (playground/train/__main__.py)
