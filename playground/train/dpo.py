"""The DPO recipe: preference pairs, TRL's ``DPOTrainer``.

The model learns to prefer the ``chosen`` answer over the ``rejected`` one, measured against a reference
model (with LoRA: the same weights with the adapter off). ``beta`` sets how far it may move from the
reference; ``sft_weight`` adds TRL's SFT loss on the chosen answer (``loss_type: [sigmoid, sft]``), without
which a model that answers in prose learns to rank the command first but still does not say it (measured in
benchmarks/README.md). Data: ``synthetic://kubectl`` becomes the project's own pairs (a near miss of four
kinds, playground/train/preferences.py); a file of your own needs ``prompt``/``chosen``/``rejected`` columns.

Figures: loss, reward margin, chosen and rejected rewards, preference accuracy (training windows);
held-out preference accuracy and margin beside exact match and the kubectl reward (evaluations).
"""

from __future__ import annotations

from typing import Any, ClassVar

from playground.train.data import Sample, load_rows
from playground.train.preferences import (
    METHOD_SYNTHETIC,
    PreferencePair,
    check_rows,
    preference_splits,
)
from playground.train.trl_recipe import TrlRecipe


def pair_row(pair: PreferencePair) -> dict[str, Any]:
    """A conversational preference row in TRL's format."""
    return {
        "prompt": [{"role": "user", "content": pair.prompt}],
        "chosen": [{"role": "assistant", "content": pair.chosen}],
        "rejected": [{"role": "assistant", "content": pair.rejected}],
    }


def pairs_from_rows(rows: list[dict[str, Any]], source: str) -> list[PreferencePair]:
    """Preference pairs from a file's rows (text columns ``prompt``, ``chosen``, ``rejected``)."""
    check_rows("dpo", rows, source)
    return [PreferencePair(str(r["prompt"]), str(r["chosen"]), str(r["rejected"]), "file") for r in rows]


class DpoRecipe(TrlRecipe):
    objective = "dpo"
    METRICS: ClassVar[dict[str, str]] = {
        "rewards/margins": "reward_margin",
        "rewards/accuracies": "preference_accuracy",
        "rewards/chosen": "chosen_reward",
        "rewards/rejected": "rejected_reward",
    }

    def build_data(self) -> tuple[list[dict[str, Any]], list[Sample]]:
        spec, settings = self.spec, self.settings
        num_eval = int(settings.num_eval_examples or 50)
        if spec.dataset_source == METHOD_SYNTHETIC:
            train, held = preference_splits(
                spec.blueprint.dataset.options, num_train=self.synthetic_rows(), num_eval=num_eval, seed=settings.seed
            )
        else:
            pairs = pairs_from_rows(load_rows(spec.dataset_source, spec.blueprint.dataset.split), spec.dataset_source)
            cut = max(1, int(len(pairs) * spec.blueprint.dataset.eval_fraction))
            held, train = pairs[:cut][:num_eval], pairs[cut:]
        self.eval_pairs = held
        return [pair_row(p) for p in train], [Sample(p.prompt, p.chosen) for p in held]

    def build_trainer(self) -> Any:
        from datasets import Dataset
        from trl import DPOConfig, DPOTrainer

        settings = self.settings
        losses, weights = ["sigmoid"], [1.0]
        if settings.sft_weight > 0:
            losses, weights = ["sigmoid", "sft"], [1.0, settings.sft_weight]
        config = DPOConfig(
            **self.training_arguments(),
            beta=settings.beta,
            loss_type=losses,
            loss_weights=weights,
            max_length=settings.max_seq_length,
            per_device_eval_batch_size=max(8, self.plan.micro_batch),
        )
        return DPOTrainer(
            model=self.model,
            args=config,
            train_dataset=Dataset.from_list(self.train_rows),
            eval_dataset=Dataset.from_list([pair_row(p) for p in self.eval_pairs]),
            processing_class=self.tokenizer,
            peft_config=self.peft_config,
        )

    def extra_eval(self, model: Any, *, base: bool) -> dict[str, float]:
        """Held-out preference accuracy: the share of pairs whose chosen answer the model finds likelier
        per token than the rejected one (mean log-probability, no reference, so the base model has a figure
        too; per token, so a long prose answer is not rejected for its length alone); after training also
        TRL's reward margin on the held-out pairs."""
        chosen, rejected = (
            answer_logprobs(model, self.tokenizer, samples, self.settings.max_seq_length, self.runtime.device)
            for samples in (
                [Sample(p.prompt, p.chosen) for p in self.eval_pairs],
                [Sample(p.prompt, p.rejected) for p in self.eval_pairs],
            )
        )
        wins = sum(c > r for c, r in zip(chosen, rejected, strict=True))
        figures = {"eval_preference_accuracy": wins / max(1, len(chosen))}
        if not base:
            figures["eval_reward_margin"] = float(self.trainer.evaluate()["eval_rewards/margins"])
        return figures


def answer_logprobs(model: Any, tokenizer: Any, samples: list[Sample], max_len: int, device: Any) -> list[float]:
    """Each sample's mean log-probability per answer token under ``model`` (the chat template applied)."""
    import torch

    from playground.train.data import tokenize

    data = tokenize(samples, tokenizer, max_len)
    totals: list[float] = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(data), 16):
            ids = data.input_ids[start : start + 16].to(device)
            labels = data.labels[start : start + 16].to(device)
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, :-1].float()
            targets = labels[:, 1:]
            picked = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            mask = targets != -100
            totals += ((picked * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    model.train(was_training)
    return totals


run = DpoRecipe.run  # the entrypoint's hook (playground/train/__main__.py)
