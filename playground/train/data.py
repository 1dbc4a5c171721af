"""Training data: synthetic tasks the project generates itself, and Alpaca-format datasets.

Every dataset becomes a list of :class:`~playground.train.sample.Sample` (a chat ``prompt`` and the ``answer``),
split into train and held-out eval rows that never overlap, then tokenized through the tokenizer's chat
template into one padded tensor. Batches are drawn from a per-epoch permutation that depends only
on the seed, so a batch is a pure function of the step: resuming needs nothing but the step.
"""

from __future__ import annotations

import os
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.errors import UserError
from playground.kubectl.generator import kubectl_sample
from playground.train.perf import computed_positions, padded_width
from playground.train.sample import Sample

EVAL_SEED_OFFSET = 1_000_003  # the held-out set is the same whatever the training seed


# --- synthetic tasks ---------------------------------------------------------------------


def _word(rng: random.Random, options: dict[str, Any]) -> str:
    alphabet = str(options.get("alphabet", string.ascii_lowercase))
    length = rng.randint(int(options.get("min_len", 3)), int(options.get("max_len", 6)))
    return "".join(rng.choice(alphabet) for _ in range(length))


def _reverse(rng: random.Random, options: dict[str, Any], held_out: bool = False) -> Sample:
    word = _word(rng, options)
    return Sample(f"reverse: {word}", word[::-1])


def _sort(rng: random.Random, options: dict[str, Any], held_out: bool = False) -> Sample:
    word = _word(rng, options)
    return Sample(f"sort: {word}", "".join(sorted(word)))


def _add(rng: random.Random, options: dict[str, Any], held_out: bool = False) -> Sample:
    high = int(options.get("max_value", 99))
    a, b = rng.randint(0, high), rng.randint(0, high)
    return Sample(f"add: {a}+{b}", str(a + b))


SYNTHETIC_TASKS: dict[str, Callable[..., Sample]] = {
    "reverse": _reverse,
    "sort": _sort,
    "add": _add,
    "kubectl": kubectl_sample,  # playground/kubectl: a plain-English request → the exact kubectl command
}


def synthetic_splits(
    task: str, options: dict[str, Any], *, num_train: int, num_eval: int, seed: int
) -> tuple[list[Sample], list[Sample]]:
    """Unique held-out prompts first (fixed seed), then training samples that never repeat one.

    Generators draw the held-out rows with ``held_out=True`` (tasks such as ``kubectl`` then use
    names and phrasings that training never sees)."""
    make = SYNTHETIC_TASKS[task]
    eval_rng = random.Random(EVAL_SEED_OFFSET)
    eval_samples: dict[str, Sample] = {}
    attempts = 0
    while len(eval_samples) < num_eval and attempts < num_eval * 100:
        sample = make(eval_rng, options, held_out=True)
        eval_samples.setdefault(sample.prompt, sample)
        attempts += 1
    held_out = set(eval_samples)
    rng = random.Random(seed)
    train: list[Sample] = []
    while len(train) < num_train:
        sample = make(rng, options)
        if sample.prompt not in held_out:
            train.append(sample)
    return train, list(eval_samples.values())


# --- your own data: local files, hub datasets, directories --------------------------------
# Rows become conversations through playground.userdata (the same functions the pre-launch check runs),
# so a file that passed the check trains exactly as it was checked.


def conversation_sample(conversation: list[dict[str, str]]) -> Sample:
    """A conversation (optional system, user/assistant alternating, ending with assistant) → a Sample."""
    *context, user, answer = conversation
    return Sample(user["content"], answer["content"], tuple((m["role"], m["content"]) for m in context))


def alpaca_sample(row: dict[str, Any]) -> Sample:
    """Alpaca row (instruction, input, output) → one chat turn; the input follows the instruction."""
    instruction = str(row.get("instruction") or "").strip()
    extra = str(row.get("input") or "").strip()
    prompt = f"{instruction}\n\n{extra}" if extra else instruction
    return Sample(prompt, str(row.get("output") or "").strip())


def load_rows(source: str, split: str) -> list[dict[str, Any]]:
    """Rows of ``hf://org/name`` (``datasets.load_dataset``; token from ``HF_TOKEN``), a local
    ``.jsonl``/``.json``/``.csv``/``.parquet`` file, a ``save_to_disk`` directory, a directory of json files,
    or a downloaded hub dataset repo (e.g. parquet under ``data/``, as Kubeflow's dataset initializer leaves it)."""
    from playground.userdata.rows import is_local_file

    if is_local_file(source):
        from playground.userdata.rows import read_rows

        rows = [row.data for row in read_rows(source)]
        return _slice(rows, split)
    import datasets

    datasets.disable_progress_bars()
    token = os.environ.get("HF_TOKEN") or None
    if source.startswith("hf://"):
        dataset = datasets.load_dataset(source.removeprefix("hf://"), split=split, token=token)
    else:
        path = Path(source).expanduser()
        if path.is_dir() and (path / "dataset_info.json").exists():
            loaded = datasets.load_from_disk(str(path))
            dataset = loaded[split.split("[")[0]] if isinstance(loaded, datasets.DatasetDict) else loaded
        elif path.is_dir() and any(p.suffix in (".json", ".jsonl") for p in path.iterdir()):
            files = sorted(str(p) for p in path.iterdir() if p.suffix in (".json", ".jsonl"))
            dataset = datasets.load_dataset("json", data_files=files, split=_local_split(split))
        elif path.is_dir():  # a downloaded hub repo (what Kubeflow's dataset initializer writes): its own splits
            dataset = datasets.load_dataset(str(path), split=split)
        else:
            dataset = datasets.load_dataset("json", data_files=str(path), split=_local_split(split))
    return [dict(row) for row in dataset]


def _slice(rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    """A file has one split; keep a slice such as ``train[:1000]`` or ``train[10:20]``."""
    _, bracket, rest = split.partition("[")
    if not bracket:
        return rows
    start, _, stop = rest.rstrip("]").partition(":")
    return rows[int(start) if start else None : int(stop) if stop else None]


def _local_split(split: str) -> str:
    """A json file has one split, ``train``; keep a slice such as ``[:1000]``."""
    _, bracket, rest = split.partition("[")
    return "train" + (bracket + rest if bracket else "")


def rows_to_samples(
    rows: list[dict[str, Any]], source: str, *, fmt: str, columns: dict[str, str] | None = None, strict: bool
) -> list[Sample]:
    """Rows → samples through the shared shape mapping. ``strict`` (a local file the person brought): the
    first bad row is a one-line error; else (a public hub dataset) bad rows are skipped and counted."""
    from playground.userdata.rows import DatasetError
    from playground.userdata.shapes import check_columns, detect_shape, rows_from_records, to_conversation

    numbered = rows_from_records(rows)
    mapping = check_columns(columns)
    shape = detect_shape(numbered, mapping, source, fmt if fmt in ("alpaca", "chat") else "auto")
    samples: list[Sample] = []
    skipped: list[str] = []
    for row in numbered:
        try:
            samples.append(conversation_sample(to_conversation(row, shape, mapping, source)))
        except DatasetError as exc:
            if strict:
                raise
            skipped.append(str(exc))
    if skipped:
        print(f"skipped {len(skipped)} of {len(rows)} rows that are not a trainable conversation (first: {skipped[0]})")
    return samples


def split_samples(
    samples: list[Sample],
    eval_samples: list[Sample] | None,
    *,
    eval_fraction: float,
    num_train: int | None,
    num_eval: int | None,
    where: str | None = None,
) -> tuple[list[Sample], list[Sample]]:
    """Train and held-out samples. Without given eval samples, a seeded ``eval_fraction`` of the rows is
    held out; training rows whose prompt (with its earlier turns) equals a held-out one are dropped."""
    if eval_samples is not None:
        train, held = samples, list(eval_samples)
    else:
        order = list(range(len(samples)))
        random.Random(EVAL_SEED_OFFSET).shuffle(order)
        n_eval = max(1, round(len(samples) * eval_fraction)) if len(samples) > 1 else 0
        held = [samples[i] for i in order[:n_eval]]
        train = [samples[i] for i in sorted(order[n_eval:])]
    if num_eval is not None:
        held = held[: int(num_eval)]
    prompts = {s.key for s in held}
    train = [s for s in train if s.key not in prompts]
    if num_train is not None:
        train = train[: int(num_train)]
    if not train:
        raise UserError(
            f"dataset{' ' + where if where else ''}: no training rows left after holding out the eval split "
            "(every training prompt is also a held-out one)",
            field="dataset.source",
        )
    return train, held


def file_splits(
    rows: list[dict[str, Any]],
    eval_rows: list[dict[str, Any]] | None,
    *,
    fmt: str,
    eval_fraction: float,
    num_train: int | None,
    num_eval: int | None,
    seed: int,
    source: str = "dataset",
    columns: dict[str, str] | None = None,
    strict: bool = False,
) -> tuple[list[Sample], list[Sample]]:
    """Samples for train and eval from rows (see :func:`rows_to_samples` and :func:`split_samples`)."""
    samples = rows_to_samples(rows, source, fmt=fmt, columns=columns, strict=strict)
    held = (
        rows_to_samples(eval_rows, source, fmt=fmt, columns=columns, strict=strict) if eval_rows is not None else None
    )
    return split_samples(samples, held, eval_fraction=eval_fraction, num_train=num_train, num_eval=num_eval)


# --- tokenization and batching ------------------------------------------------------------


@dataclass
class TokenizedSet:
    """``input_ids``/``labels`` as [N, L] tensors (right-padded), ``lengths`` [N], prompts kept for
    generation-based evaluation. Labels are -100 on the prompt and on padding."""

    input_ids: Any
    labels: Any
    lengths: Any
    prompt_ids: list[list[int]]
    samples: list[Sample]

    def __len__(self) -> int:
        return len(self.samples)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def _earlier_turns(sample: Sample, tokenizer: Any, full_text: str, full_ids: list[int]) -> list[tuple[int, int]]:
    """Token spans of the assistant turns before the last one. Empty when the template renders earlier turns
    differently inside the whole conversation (then only the last answer is trained, as the check says)."""
    messages = sample.messages()
    spans = []
    for j, message in enumerate(messages[:-1]):
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:j], tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[: j + 1], tokenize=False)
        if not (full_text.startswith(upto) and upto.startswith(before)):
            return []
        ids = tokenizer([before, upto], add_special_tokens=False)["input_ids"]
        spans.append((_common_prefix(ids[0], full_ids), _common_prefix(ids[1], full_ids)))
    return spans


def tokenize(samples: list[Sample], tokenizer: Any, max_seq_length: int) -> TokenizedSet:
    """Render each sample with the chat template; train only on the assistant turns (each with its end token)."""
    import torch

    prompt_texts = [
        tokenizer.apply_chat_template(s.prompt_messages(), tokenize=False, add_generation_prompt=True) for s in samples
    ]
    full_texts = [tokenizer.apply_chat_template(s.messages(), tokenize=False) for s in samples]
    prompts = tokenizer(prompt_texts, add_special_tokens=False)["input_ids"]
    fulls = tokenizer(full_texts, add_special_tokens=False)["input_ids"]
    # The prompt is a prefix of the full conversation for sane templates; be robust if not.
    spans = [[(_common_prefix(p, f), len(f))] for p, f in zip(prompts, fulls, strict=True)]
    for i, sample in enumerate(samples):
        if any(role == "assistant" for role, _ in sample.context):
            spans[i] = _earlier_turns(sample, tokenizer, full_texts[i], fulls[i]) + spans[i]
    # An example whose prompt fills the whole window has no answer token to learn from: its loss
    # would be 0/0 (NaN). Drop it, and fail clearly when nothing is left.
    keep = [i for i in range(len(samples)) if spans[i][0][0] < max_seq_length]
    if not keep:
        raise ValueError(
            f"max_seq_length={max_seq_length}: every prompt is at least that long, so no answer token "
            "is left to train on; raise max_seq_length"
        )
    if len(keep) < len(samples):
        print(
            f"dropped {len(samples) - len(keep)} of {len(samples)} examples whose prompt is longer than "
            f"max_seq_length={max_seq_length}",
            flush=True,
        )
        samples = [samples[i] for i in keep]
        prompts = [prompts[i] for i in keep]
        fulls = [fulls[i] for i in keep]
        spans = [spans[i] for i in keep]
    width = min(max_seq_length, max(len(f) for f in fulls))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(samples), width), -100, dtype=torch.long)
    lengths = torch.zeros(len(samples), dtype=torch.long)
    for i, full in enumerate(fulls):
        full = full[:width]
        n = len(full)
        row = torch.tensor(full)
        input_ids[i, :n] = row
        for start, end in spans[i]:
            end = min(end, n)
            if start < end:
                labels[i, start:end] = row[start:end]
        lengths[i] = n
    return TokenizedSet(input_ids, labels, lengths, prompts, samples)


class Batches:
    """Deterministic batches, the same examples per optimizer step whatever the world size.

    Optimizer step ``s`` takes the next ``global_batch = batch_size × world_size × grad_accum``
    examples of its epoch's permutation (epoch ``e``: ``randperm(N)`` seeded by ``seed`` and ``e``);
    its ``grad_accum`` micro-batches are consecutive slices of that, and rank ``r`` of ``w`` takes
    every ``w``-th example of each slice. ``batch(micro_step)`` needs no state at all. A micro-batch is as wide
    as its longest row, rounded up to ``width_multiple`` (few distinct shapes: oneDNN keeps a bf16 matmul for each);
    with ``packing`` the trainer computes its rows as one (:meth:`computed_width`)."""

    def __init__(
        self,
        data: TokenizedSet,
        *,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        grad_accum: int = 1,
        width_multiple: int = 1,
        packing: bool = False,
    ):
        self.data = data
        self.width_multiple = max(1, width_multiple)
        self.packing = packing
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.grad_accum = grad_accum
        self.micro_global = batch_size * world_size  # examples in one micro-step, all ranks together
        self.global_batch = self.micro_global * grad_accum  # examples per optimizer step
        self.per_epoch = max(1, len(data) // self.global_batch)  # optimizer steps per epoch
        self._label_counts = (data.labels[:, 1:] != -100).sum(1).cpu()  # what the loss averages over
        self._perm_epoch = -1
        self._perm: Any = None

    def position(self, micro_step: int) -> tuple[int, int]:
        """(epoch, optimizer step within the epoch) of the ``micro_step``-th micro-batch."""
        return divmod(micro_step // self.grad_accum, self.per_epoch)

    def epoch_float(self, micro_step: int) -> float:
        return micro_step * self.micro_global / max(1, len(self.data))

    def label_tokens(self, step: int) -> int:
        """Answer tokens the loss counts in optimizer step ``step`` (0-based), over all ranks and micro-batches."""
        return int(self._label_counts[self._step_rows(step)].sum())

    def batch(self, micro_step: int) -> tuple[Any, Any, int]:
        """``(input_ids, labels, n_tokens)`` of one micro-batch, trimmed to :meth:`width`."""
        rows = self._rows(micro_step)
        lengths = self.data.lengths[rows]
        width = self.width(lengths)
        return self.data.input_ids[rows, :width], self.data.labels[rows, :width], int(lengths.sum())

    def width(self, lengths: Any) -> int:
        """A micro-batch's padded width: its longest row, rounded up to ``width_multiple`` (at most the set's)."""
        return padded_width(int(lengths.max()), self.width_multiple, self.data.input_ids.shape[1])

    def computed_width(self, lengths: Any) -> float:
        """Positions the forward computes per example: the padded width, or with ``packing`` (and some padding)
        the packed row (every real token, rounded up to ``width_multiple``) over the rows."""
        rows = lengths.tolist()
        cap = self.data.input_ids.shape[1]
        return computed_positions(rows, self.width_multiple, cap, packing=self.packing) / len(rows)

    def lengths(self, micro_step: int) -> Any:
        """Token counts of the rows of one micro-batch (what the FLOP counter needs)."""
        return self.data.lengths[self._rows(micro_step)]

    def _rows(self, micro_step: int) -> Any:
        step, micro = divmod(micro_step, self.grad_accum)
        rows = self._step_rows(step)[micro * self.micro_global : (micro + 1) * self.micro_global]
        return rows[self.rank :: self.world_size]

    def _step_rows(self, step: int) -> Any:
        import torch

        epoch, index = divmod(step, self.per_epoch)
        if epoch != self._perm_epoch:
            gen = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._perm = torch.randperm(len(self.data), generator=gen)
            self._perm_epoch = epoch
        if len(self.data) < self.global_batch:  # tiny datasets: wrap around
            return self._perm.repeat(self.global_batch // len(self.data) + 1)[: self.global_batch]
        return self._perm[index * self.global_batch : (index + 1) * self.global_batch]

    def __iter__(self) -> Iterator[tuple[Any, Any, int]]:
        step = 0
        while True:
            yield self.batch(step)
            step += 1
