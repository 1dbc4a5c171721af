"""The recipe's stages, each called on its own in this process (tiny-llama-cpu, a few steps), and the
torch-free settings they read."""

from __future__ import annotations

import copy
import io
import math
from dataclasses import MISSING, fields, replace
from pathlib import Path

import pytest
from _train_helpers import threads_asked_back

from playground.blueprints import TRAINING_DEFAULTS, get_blueprint
from playground.events import Progress, parse_line
from playground.run_request import RunParameters
from playground.train import cpu_share, recipe
from playground.train.__main__ import prepare
from playground.train.reporting import Reporter
from playground.train.save import unwrap
from playground.train.settings import Settings, TrainSpec, resolve_setting

STEPS = 6


def _spec(out: Path, *sets: str, resume: bool = False) -> TrainSpec:
    args = ["--blueprint", "tiny-llama-cpu", "--output", str(out), "--set", f"max_steps={STEPS}"]
    args += ["--set", "num_eval_examples=10", "--set", "batch_size=8", "--set", "checkpoint_every=0"]
    for item in sets:
        args += ["--set", item]
    return prepare([*args, *(["--resume"] if resume else [])])


def _reporter() -> tuple[Reporter, io.StringIO]:
    stream = io.StringIO()
    return Reporter(enabled=True, stream=stream), stream


def _progress(stream: io.StringIO) -> list[Progress]:
    events = [parse_line(line) for line in stream.getvalue().splitlines()]
    return [e for e in events if isinstance(e, Progress)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> recipe.Recipe:
    """Distributed setup, data and model of one tiny run (built once)."""
    run = recipe.Recipe(_spec(tmp_path_factory.mktemp("recipe") / "out", "log_every=2"), _reporter()[0])
    run.runtime = recipe.setup_distributed(run)
    run.data = recipe.setup_data(run)
    run.model = recipe.setup_model(run)
    return run


@pytest.fixture
def stages(built: recipe.Recipe) -> recipe.Recipe:
    """The built run for one test: its own state and reporter, the runtime, data and model shared."""
    run = copy.copy(built)
    run.state = recipe.TrainState()
    return run


def test_settings_resolve_parameters_then_training_block_then_defaults(tmp_path: Path) -> None:
    settings = Settings.from_spec(_spec(tmp_path, "learning_rate=0.01"))
    assert settings.learning_rate == 0.01  # a parameter
    assert settings.warmup_steps == 20  # the blueprint's fixed training block
    assert settings.gradient_accumulation_steps == 1 and settings.eval_every == 0  # TRAINING_DEFAULTS
    assert (settings.max_steps, settings.batch_size, settings.log_every) == (STEPS, 8, 5)


def test_every_setting_has_its_default_in_the_one_block() -> None:
    """Settings has a field per TRAINING_DEFAULTS entry and no defaults of its own; a setting no
    parameter or training block gives takes the block's value (warmup None: 5% of max_steps)."""
    assert {f.name for f in fields(Settings)} == set(TRAINING_DEFAULTS)
    assert all(f.default is MISSING and f.default_factory is MISSING for f in fields(Settings))
    blueprint = get_blueprint("tiny-llama-cpu")
    assert resolve_setting(blueprint, {}, "eval_every") == TRAINING_DEFAULTS["eval_every"]
    assert resolve_setting(blueprint, {}, "warmup_steps") == 20  # the training block
    assert resolve_setting(blueprint, {"warmup_steps": 3}, "warmup_steps") == 3  # a parameter
    bare = blueprint.model_copy(update={"training": {}, "parameters": {}})
    settings = Settings.from_spec(
        TrainSpec(bare, RunParameters(), Path("out"), "scratch://llama", "synthetic://reverse")
    )
    expected = {**TRAINING_DEFAULTS, "warmup_steps": 5}  # max_steps 100
    assert {name: getattr(settings, name) for name in TRAINING_DEFAULTS} == expected


def test_setup_data_and_model(stages: recipe.Recipe) -> None:
    spec, settings, runtime, data, model = stages.spec, stages.settings, stages.runtime, stages.data, stages.model
    assert runtime.dist.world_size == 1 and str(runtime.device) == "cpu" and not runtime.bf16
    assert len(data.eval_set) == 10 and len(data.train_set) == STEPS * settings.batch_size
    ids, labels, n_tokens = data.batches.batch(0)
    assert ids.shape[0] == settings.batch_size and labels.shape == ids.shape
    assert n_tokens == int(data.batches.lengths(0).sum())
    assert model.train_model is model.model  # one process: no DDP wrapper
    assert model.n_params == sum(p.numel() for p in model.model.parameters())
    assert model.flops.frozen_matmul_params == 0 and model.flops.layers == 2  # full fine-tune
    assert (spec.output / "base-model" / "model.safetensors").exists()  # the untrained scratch model


def test_loop_checkpoint_restore_and_mfu_after_warmup(stages: recipe.Recipe, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop emits Progress on its cadence; MFU (with a peak given) leaves the warm-up steps out;
    a checkpoint written by the stage restores the same step, weights and history."""
    import torch

    run, model = stages, stages.model
    monkeypatch.setenv("PLAYGROUND_PEAK_FLOPS", "1e12")  # a made-up CPU peak, so MFU is computed
    run.optim = recipe.setup_optimizer(run)
    run.state = state = recipe.restore(run)
    assert state.start_step == 0
    run.reporter, stream = _reporter()
    recipe.train_loop(run)
    progress = _progress(stream)
    assert [p.step for p in progress] == [2, 4, 6] and state.step == STEPS
    assert all(math.isfinite(p.loss) and p.tokens_per_second > 0 for p in progress)
    # warm-up is steps 1-3: the first window is all warm-up, the second is timed from step 4 only
    assert progress[0].mfu is None and all(p.mfu > 0 for p in progress[1:])

    state.history.append({"step": STEPS, "eval_loss": 1.0})
    recipe.save_checkpoint(run)
    weights = {k: v.clone() for k, v in model.model.state_dict().items()}
    with torch.no_grad():
        for p in model.model.parameters():
            p.zero_()
    run.spec = replace(run.spec, resume=True)
    run.optim = fresh = recipe.setup_optimizer(run)
    restored = recipe.restore(run)
    assert (restored.start_step, restored.history) == (STEPS, state.history)
    assert all(torch.equal(weights[k], v) for k, v in model.model.state_dict().items())
    assert fresh.scheduler.last_epoch == STEPS


@pytest.mark.skipif(cpu_share.pressure_avg10() is None, reason="no Linux PSI (/proc/pressure/cpu): the guard is off")
def test_the_loop_gives_cpu_threads_back_while_other_processes_wait(stages: recipe.Recipe) -> None:
    """With more busy processes than cores, the loop drops to half its threads between steps and says so in its log."""
    import torch

    run = stages
    run.optim = recipe.setup_optimizer(run)
    run.state = recipe.restore(run)
    run.reporter, stream = _reporter()
    with threads_asked_back(run) as full:
        recipe.train_loop(run)
        assert torch.get_num_threads() == full // 2 == run.runtime.thread_guard.threads
    assert f"CPU threads {full} → {full // 2}: other processes wait for the CPU" in stream.getvalue()
    assert run.state.step == STEPS


@pytest.mark.skipif(cpu_share.pressure_avg10() is None, reason="no Linux PSI (/proc/pressure/cpu): the guard is off")
def test_the_held_out_answers_give_cpu_threads_back_too(stages: recipe.Recipe) -> None:
    """The final evaluation's generation (a minute on 2 cores) applies the guard's ask between its batches."""
    import torch

    run = stages
    run.reporter, stream = _reporter()
    answered: list[tuple[int, int]] = []
    with threads_asked_back(run) as full:
        recipe.held_out_exact_match(run, unwrap(run.model.model), lambda done, total: answered.append((done, total)))
        assert torch.get_num_threads() == full // 2
    assert f"CPU threads {full} → {full // 2}: other processes wait for the CPU" in stream.getvalue()
    assert answered and answered[-1][0] == answered[-1][1] == len(run.data.eval_set)  # the caller's progress too


def test_final_eval_and_save(stages: recipe.Recipe) -> None:
    run, spec = stages, stages.spec
    run.state = state = recipe.TrainState(start_step=STEPS, step=STEPS, last_loss=1.5)
    run.reporter, stream = _reporter()
    final = recipe.final_eval(run)
    assert set(final) == {"eval_loss", "eval_exact_match"} and state.history[-1]["step"] == STEPS
    assert "eval_loss" in stream.getvalue()  # reported as a Metric event too
    run.wall_start = 0.0
    metrics = recipe.save(run, final)
    assert metrics["steps"] == STEPS and metrics["resumed_from_step"] == STEPS and metrics["train_loss"] == 1.5
    assert (spec.output / "model" / "model.safetensors").exists() and (spec.output / "metrics.json").exists()


def test_base_eval_before_training_reaches_the_events_and_metrics_json(stages: recipe.Recipe) -> None:
    """The untouched model's exact match is measured in Initializing (a log line, a Metric event) and lands in
    metrics.json beside the fine-tuned figure; a ``--resume`` run does not measure it again."""
    import json

    from playground.events import Metric, Phase

    run = stages
    run.reporter, stream = _reporter()
    runtime, guard = run.runtime, cpu_share.ThreadGuard(2, period=0.2, settle=0.0)
    run.runtime = replace(runtime, thread_guard=guard)  # a spinning run's: it samples while the base model answers
    try:
        base = recipe.base_eval(run)
        assert guard.watching  # two runs launched together both spin: the guard must see the other one now
    finally:
        guard.stop()
        run.runtime = runtime
    assert set(base) == {"base_eval_exact_match"} and 0.0 <= base["base_eval_exact_match"] <= 1.0
    events = [parse_line(line) for line in stream.getvalue().splitlines()]
    assert any(isinstance(e, Phase) and "base model" in e.reason for e in events)
    reported = [e for e in events if isinstance(e, Metric)]
    assert [(m.name, m.value) for m in reported] == [("base_eval_exact_match", base["base_eval_exact_match"])]
    assert "base model before training: exact match" in stream.getvalue()
    assert run.state.history == [{"step": 0, "train_seconds": 0.0, **base}]
    run.state.step = run.state.last_loss = STEPS
    run.wall_start = 0.0
    metrics = recipe.save(run, {"eval_exact_match": 1.0})
    saved = json.loads((run.spec.output / "metrics.json").read_text())
    assert saved["base_eval_exact_match"] == metrics["base_eval_exact_match"] == base["base_eval_exact_match"]
    run.spec = replace(run.spec, resume=True)
    run.reporter, stream = _reporter()
    assert recipe.base_eval(run) == {} and stream.getvalue() == ""


@pytest.mark.parametrize(
    ("batch_size", "accum", "world", "expected"),
    [
        (8, 1, 1, (8, 8, 1)),
        (8, 1, 2, (8, 4, 1)),  # the batch splits
        (8, 4, 2, (32, 8, 2)),  # accumulation divides first, nanoGPT style
        (6, 2, 4, (12, 3, 1)),  # then the batch
    ],
)
def test_global_batch_is_fixed_whatever_the_world_size(tmp_path: Path, batch_size, accum, world, expected) -> None:
    settings = Settings.from_spec(_spec(tmp_path))
    settings = replace(settings, batch_size=batch_size, gradient_accumulation_steps=accum)
    plan = settings.plan(world)
    assert (plan.global_batch, plan.micro_batch, plan.micro_steps) == expected
    assert plan.micro_batch * plan.micro_steps * world == settings.global_batch_size


def test_uneven_global_batch_is_refused_naming_the_field(tmp_path: Path) -> None:
    from playground.errors import UserError

    settings = Settings.from_spec(_spec(tmp_path, "batch_size=3"))
    with pytest.raises(UserError, match=r"batch_size=3 .* global batch 3 cannot be split evenly over 2") as err:
        settings.plan(2)
    assert err.value.field == "batch_size"


def test_every_world_size_sees_the_same_examples_per_step(stages: recipe.Recipe) -> None:
    """Batches for 1 process × 4 micro-batches and for 2 ranks × 2 micro-batches cover the same
    rows in every optimizer step, across an epoch boundary; the step's answer-token count too."""
    from playground.train.data import Batches

    train = stages.data.train_set
    one = Batches(train, batch_size=4, seed=3, grad_accum=4)
    ranks = [Batches(train, batch_size=4, seed=3, rank=r, world_size=2, grad_accum=2) for r in (0, 1)]
    for step in range(one.per_epoch + 2):
        rows_one = sorted(int(i) for m in range(4) for i in one._rows(step * 4 + m))
        rows_two = sorted(int(i) for b in ranks for m in range(2) for i in b._rows(step * 2 + m))
        assert rows_one == rows_two and len(rows_one) == 16
        assert one.label_tokens(step) == ranks[1].label_tokens(step) == int((train.labels[rows_one, 1:] != -100).sum())


def test_bf16_batches_come_in_few_widths_with_the_same_tokens(stages: recipe.Recipe) -> None:
    """``width_multiple`` (cpu_bf16): every micro-batch as wide as a multiple of 16 (or the whole set), the same rows
    and real tokens as the unrounded batch, the extra columns padding that no label reads."""
    import torch

    from playground.train.data import Batches

    train = stages.data.train_set
    plain = Batches(train, batch_size=4, seed=3)
    rounded = Batches(train, batch_size=4, seed=3, width_multiple=16)
    widened = 0
    for micro in range(plain.per_epoch):
        ids, labels, tokens = plain.batch(micro)
        wide_ids, wide_labels, wide_tokens = rounded.batch(micro)
        width = wide_ids.shape[1]
        assert width % 16 == 0 or width == train.input_ids.shape[1]
        assert width >= ids.shape[1] and wide_tokens == tokens
        assert torch.equal(wide_ids[:, : ids.shape[1]], ids) and torch.equal(wide_labels[:, : ids.shape[1]], labels)
        assert bool((wide_labels[:, ids.shape[1] :] == -100).all())
        assert rounded.width(rounded.lengths(micro)) == width  # what metrics.json's mean_padded_width counts
        widened += width > ids.shape[1]
    assert widened > 0  # the set's batches are not all of a multiple's width already


def test_packed_batches_count_the_row_the_forward_computes(stages: recipe.Recipe) -> None:
    """With ``packing`` the width a run reports per example (metrics.json's mean_padded_width, what ``playground
    plan`` learns from) is the packed row's: the batch's real tokens rounded up to the multiple, over its rows;
    the row ``model_inputs`` builds is exactly that wide."""
    from playground.train.data import Batches
    from playground.train.perf import model_inputs

    train = stages.data.train_set
    packed = Batches(train, batch_size=4, seed=3, width_multiple=16, packing=True)
    padded = Batches(train, batch_size=4, seed=3, width_multiple=16)
    narrower = 0
    for micro in range(packed.per_epoch):
        ids, labels, _ = packed.batch(micro)
        lengths = packed.lengths(micro)
        row = model_inputs(ids, labels, lengths, packing=True, width_multiple=16)["input_ids"]
        assert packed.computed_width(lengths) * len(lengths) == row.numel()
        assert row.shape[1] % 16 == 0 or row.shape == ids.shape
        narrower += packed.computed_width(lengths) < padded.computed_width(lengths) == padded.width(lengths)
    assert narrower > 0  # some batch computes fewer positions packed than padded


def test_training_clock_counts_laps_but_not_setup_or_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training time: what lies between ``restart()`` (the loop starts) and each ``lap()``, minus pauses
    (eval, checkpoints); the time before the loop (setup, a resume's checkpoint load) never counts."""
    now = {"wall": 100.0, "cpu": 10.0}
    monkeypatch.setattr(recipe.time, "perf_counter", lambda: now["wall"])
    monkeypatch.setattr(recipe.time, "process_time", lambda: now["cpu"])

    def advance(seconds: float) -> None:
        now["wall"] += seconds
        now["cpu"] += seconds / 2

    clock = recipe.Clock()
    advance(30.0)  # setup / checkpoint load
    clock.restart()
    advance(4.0)
    assert clock.lap() == 4.0
    with clock.paused():
        advance(100.0)  # eval
    advance(1.0)
    assert clock.wall_total() == 5.0 and clock.cpu_total() == 2.5
    clock.lap()
    assert (clock.wall, clock.cpu) == (5.0, 2.5)


def test_a_pretrained_base_models_figures_are_kept_by_model_and_questions(tmp_path, monkeypatch) -> None:
    """The base evaluation of a packaged or hub model is kept in the model cache, keyed by the model, the exact
    questions and answers and the token budget; a local directory (it may change) or a model built from config
    (nothing to save) is never cached."""
    from playground.train import evaluate
    from playground.train.recipe import base_eval_cache

    monkeypatch.setenv("PLAYGROUND_MODEL_CACHE", str(tmp_path))
    asked = ([[1, 2, 3], [4, 5]], ["kubectl get pods", "kubectl get nodes"], 24)
    hub = base_eval_cache("hf://org/model", *asked)
    assert hub is not None and hub.parent == tmp_path / "base-evals"
    assert base_eval_cache("hf://org/model", *asked) == hub  # the same key every time
    others = [
        base_eval_cache("hf://org/other", *asked),
        base_eval_cache("hf://org/model", [[1, 2, 3], [4, 6]], asked[1], 24),
        base_eval_cache("hf://org/model", asked[0], ["kubectl get pods", "kubectl get svc"], 24),
        base_eval_cache("hf://org/model", asked[0], asked[1], 32),
    ]
    assert len({hub, *others}) == 5
    assert base_eval_cache(str(tmp_path), *asked) is None and base_eval_cache("scratch://llama", *asked) is None
    assert evaluate.read_cached(hub) is None
    evaluate.write_cached(hub, {"base_eval_exact_match": 0.25})
    assert evaluate.read_cached(hub) == {"base_eval_exact_match": 0.25}
    assert [p.name for p in hub.parent.iterdir()] == [hub.name]  # written atomically: no temporary file left
