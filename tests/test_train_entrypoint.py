"""The training entrypoint, run for real as a child process on the tiny CPU blueprint (few steps).

The accuracy bar itself (≥ 0.9 exact match with the default settings) is asserted once, by the
local-backend test that trains ``tiny-llama-cpu`` end to end; here we check the contract around it.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _fixtures import tiny_held_out
from _train_helpers import REPO_ROOT, describe, run_trainer, trainer_status_server

from playground.events import EVENT_PREFIX, JobPhase, parse_line
from playground.train.__main__ import main

STEPS, CKPT, LOG = 40, 20, 1  # a progress line every step: many more events than status updates
FEW = ["--set", f"max_steps={STEPS}", "--set", f"checkpoint_every={CKPT}", "--set", f"log_every={LOG}"]
FEW += ["--set", "num_eval_examples=20"]


@pytest.fixture(scope="module")
def status_posts(tmp_path_factory: pytest.TempPathFactory):
    """The TrainJob status requests of the ``tiny_run`` (filled while it runs)."""
    with trainer_status_server(tmp_path_factory.mktemp("sa") / "token") as (env, received):
        yield env, received


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, status_posts):
    """One short run, as inside a TrainJob pod (the status URL points at a local test endpoint)."""
    out = tmp_path_factory.mktemp("tiny") / "out"
    run = run_trainer("--blueprint", "tiny-llama-cpu", *FEW, "--output", str(out), env=status_posts[0])
    assert run.returncode == 0, describe(run)
    return run, out


def test_output_layout_and_events(tiny_run) -> None:
    run, out = tiny_run
    assert run.phases == ["Initializing", "Training", "Evaluating", "Saving", "Succeeded"]
    # every event line parses back into a typed event; everything else is a readable log line
    for line in run.stdout.splitlines():
        assert (EVENT_PREFIX in line) == (type(parse_line(line)).__name__ != "Log"), line
    steps = [p.step for p in run.progress]
    assert steps == list(range(LOG, STEPS + 1, LOG))
    last = run.progress[-1]
    assert last.total_steps == STEPS and last.eta_seconds > 0  # the evaluation and the save are still ahead
    assert all(math.isfinite(p.loss) and p.tokens_per_second > 0 and p.learning_rate > 0 for p in run.progress)
    assert run.progress[-1].loss < run.progress[0].loss  # it learns
    assert set(run.metrics) == {"base_eval_exact_match", "eval_loss", "eval_exact_match"}  # base: before training

    for name in ("model", "base-model"):
        files = {p.name for p in (out / name).iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files, files
        assert "generation_config.json" in files
        assert not any(f.startswith("adapter_") for f in files)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step-{CKPT}", f"step-{STEPS}"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == STEPS and metrics["eval_loss"] == pytest.approx(run.metrics["eval_loss"])
    assert not list(out.glob(".*tmp*"))  # no temporary leftovers


def test_the_finish_is_a_phase_with_progress_and_the_next_runs_eta_includes_it(tiny_run, tmp_path: Path) -> None:
    """After the last step: Evaluating (the held-out answers, with progress), then Saving; metrics.json records how
    long that took, and a later run of the same blueprint with as many held-out requests on the same machine adds it
    to every ETA (issue 20: "ETA 0:00" then 129 s of nothing)."""
    from playground.events import Phase
    from playground.train.finish import FinishReporter, earlier_finish_seconds

    run, out = tiny_run
    evaluating = [e for e in run.events if isinstance(e, Phase) and e.phase == JobPhase.EVALUATING]
    metrics = json.loads((out / "metrics.json").read_text())
    assert evaluating[0].reason.startswith(f"answering {metrics['num_eval_examples']} held-out requests · ~")
    assert evaluating[0].reason.endswith(" left")  # the planned evaluation and save: never "0:00" mid-finish
    assert 0 < metrics["finish_seconds"] < metrics["wall_seconds"]

    class Said:  # what a Reporter is asked to say
        def __init__(self) -> None:
            self.phases: list[tuple[JobPhase, str]] = []

        def phase(self, phase: JobPhase, reason: str = "") -> None:
            self.phases.append((phase, reason))

    said = Said()
    finish = FinishReporter(said, every=0)
    finish.evaluating(40)
    finish.answered(10, 40)
    finish.answered(40, 40)  # all answered: Saving says what comes next
    finish.saving()
    assert [p for p, _ in said.phases] == [JobPhase.EVALUATING] * 2 + [JobPhase.SAVING]
    assert said.phases[1][1].startswith("answered 10/40 held-out requests · ~") and said.phases[1][1].endswith(" left")
    assert finish.seconds >= 0

    home = tmp_path / "home"  # the run as a finished local job, beside the job about to start
    earlier = home / "jobs" / "earlier"
    shutil.copytree(out, earlier / "output", ignore=shutil.ignore_patterns("checkpoints", "*model"))
    (earlier / "spec.json").write_text(json.dumps({"id": "earlier", "blueprint_id": "tiny-llama-cpu"}))
    upcoming, n_eval = home / "jobs" / "next" / "output", metrics["num_eval_examples"]
    assert earlier_finish_seconds(upcoming, "tiny-llama-cpu", n_eval) == metrics["finish_seconds"]
    assert earlier_finish_seconds(upcoming, "tiny-llama-cpu", n_eval + 1) == 0  # another held-out size
    assert earlier_finish_seconds(upcoming, "smollm2-135m-lora-kubectl", n_eval) == 0  # another blueprint


def test_trainjob_status_updates(tiny_run, status_posts) -> None:
    """kubeflow's update_trainjob_status reached the controller URL: authenticated, the last update
    says 100% with the eval metrics, and throttled to one update per THROTTLE_SECONDS (a reporter
    that posted every progress event would send one per step)."""
    from datetime import datetime

    from playground.train.reporting import THROTTLE_SECONDS

    run, _ = tiny_run
    received = status_posts[1]
    assert received and all(r["auth"] == "Bearer test-token" for r in received)
    assert len(run.progress) == STEPS
    assert len(received) <= 1 + run.seconds / THROTTLE_SECONDS, (len(received), run.seconds)
    sent = [datetime.fromisoformat(r["body"]["trainerStatus"]["lastUpdatedTime"]) for r in received]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(sent)]
    assert all(gap >= THROTTLE_SECONDS - 0.05 for gap in gaps), gaps  # the SDK's send times, not arrival
    last = received[-1]["body"]["trainerStatus"]
    assert last["progressPercentage"] == 100 and last["estimatedRemainingSeconds"] == 0
    values = {m["name"]: m["value"] for m in last["metrics"]}
    assert {"eval_loss", "eval_exact_match"} <= set(values)
    # the step it reached, so a reader merges this summary with the log lines step for step
    assert (values["step"], values["total_steps"]) == (str(STEPS), str(STEPS))


def test_model_dir_loads_plain_and_stops_at_eos(tiny_run) -> None:
    """The model dir is a plain HF dir: Auto classes, chat template, greedy generation ends at EOS."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, out = tiny_run
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert model.config.model_type == "llama"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|end|>")
    assert model.generation_config.do_sample is False
    messages = [{"role": "user", "content": "reverse: kube"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|user|>reverse: kube<|assistant|>"
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    new = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=30)[0, ids.shape[1] :]
    assert len(new) < 30 and new[-1] == tokenizer.eos_token_id, tokenizer.decode(new)
    config = json.loads((out / "model" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == (out / "model" / "chat_template.jinja").read_text()


def test_model_dir_loads_as_kserve_loads_it(tiny_run) -> None:
    """What KServe's HuggingFace runtime needs, also on the transformers 4.x of its images: files a
    server under another uid can read, no token_type_ids for generate, the model's own context as
    the tokenizer's limit; then a KServe-style load and chat in a separate process answers every
    example, ending at EOS (tests/test_model_fidelity.py compares these answers under transformers 4.57)."""
    from playground.blueprints import get_blueprint

    _, out = tiny_run
    for name in ("model", "base-model"):
        directory = out / name
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755
        modes = {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in directory.iterdir()}
        assert set(modes.values()) == {"0o644"}, modes
        tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
        context = json.loads((directory / "config.json").read_text())["max_position_embeddings"]
        assert tokenizer_config["model_input_names"] == ["input_ids", "attention_mask"]
        assert tokenizer_config["model_max_length"] == context == 256
    prompts = [example.prompt for example in get_blueprint("tiny-llama-cpu").examples]
    script = REPO_ROOT / "scripts" / "kserve_style_load.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(out / "model"), *prompts], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert [a["prompt"] for a in report["answers"]] == prompts
    assert all(a["text"].strip() and a["inputs"] == ["attention_mask", "input_ids"] for a in report["answers"])
    eos = report["read"]["eos_token_id"]
    assert any(a["token_ids"][-1] == eos for a in report["answers"])  # generation_config.json's EOS stops it
    assert report["read"]["model_max_length"] == report["read"]["context"] == 256


def test_untrained_model_scores_near_zero(tiny_run) -> None:
    """base-model/ (the initial weights) fails the held-out task, as a visitor sees in side-by-side chat."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from playground.train import data, evaluate

    _, out = tiny_run
    tokenizer = AutoTokenizer.from_pretrained(out / "base-model")
    model = AutoModelForCausalLM.from_pretrained(out / "base-model")
    held = tiny_held_out(100)
    prompts = data.tokenize(held, tokenizer, 64).prompt_ids
    answers = evaluate.generate_answers(model, tokenizer, prompts, max_new_tokens=10, device="cpu")
    assert evaluate.exact_match(answers, [s.answer for s in held]) <= 0.02


def test_resume_continues_step_count_and_loss(tiny_run, tmp_path: Path) -> None:
    """Drop the last checkpoint and the model, resume: steps continue after the checkpoint and the
    loss matches the uninterrupted run's (same batches, same RNG), far below the untrained loss."""
    first, out = tiny_run
    resumed_out = tmp_path / "out"
    shutil.copytree(out, resumed_out)
    shutil.rmtree(resumed_out / "model")
    shutil.rmtree(resumed_out / "checkpoints" / f"step-{STEPS}")
    (resumed_out / "metrics.json").unlink()

    run = run_trainer("--blueprint", "tiny-llama-cpu", *FEW, "--output", str(resumed_out), "--resume")
    assert run.returncode == 0, describe(run)
    assert [p.step for p in run.progress] == list(range(CKPT + LOG, STEPS + 1, LOG))
    assert any(f"step-{CKPT}" in line for line in run.logs)
    before = {p.step: p.loss for p in first.progress}
    for p in run.progress:  # exact: same weights, optimizer state, batches and RNG as the uninterrupted run
        assert p.loss == before[p.step], (p.step, p.loss, before[p.step])
    assert run.progress[0].loss < 0.8 * first.progress[0].loss
    assert (resumed_out / "model" / "model.safetensors").exists()
    assert json.loads((resumed_out / "metrics.json").read_text())["resumed_from_step"] == CKPT


def test_crash_leaves_no_model_and_reports(tmp_path: Path) -> None:
    """A corrupt checkpoint makes the run fail: Phase Failed with the reason, the error as the last
    log line, a non-zero exit, and no model/ directory."""
    out = tmp_path / "out"
    (out / "checkpoints" / "step-5").mkdir(parents=True)
    (out / "checkpoints" / "step-5" / "state.pt").write_bytes(b"not a checkpoint")
    run = run_trainer("--blueprint", "tiny-llama-cpu", "--set", "max_steps=10", "--output", str(out), "--resume")
    assert run.returncode == 1, describe(run)
    assert run.phases[0] == "Initializing" and run.phases[-1] == "Failed"
    failed = next(e for e in run.events if getattr(e, "phase", None) == JobPhase.FAILED)
    assert failed.reason
    assert run.logs[-1].startswith("playground.train: error:") and failed.reason in run.logs[-1]
    assert not (out / "model").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--blueprint", "nope"], ["'nope'", "tiny-llama-cpu"]),
        (["--blueprint", "tiny-llama-cpu", "--set", "max_steps=0"], ["max_steps", "from 1 to 5000"]),
        (["--blueprint", "tiny-llama-cpu", "--set", "max_steps=abc"], ["max_steps", "an integer"]),
        (["--blueprint", "tiny-llama-cpu", "--set", "lora_rank=4"], ["lora_rank", "learning_rate"]),
        (["--blueprint", "tiny-llama-cpu", "--set", "max_steps"], ["--set", "KEY=VALUE"]),
        (["--blueprint", "tiny-llama-cpu", "--model-source", "ftp://x"], ["model source", "hf://"]),
        (["--blueprint", "tiny-llama-cpu", "--dataset-source", "synthetic://nope"], ["nope", "reverse"]),
        (["--blueprint", "llama-3.2-1b-lora-alpaca"], ["needs 1 GPU and this machine has none", "tiny-llama-cpu"]),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(
    args, expected, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    monkeypatch.setenv("PLAYGROUND_GPU_COUNT", "0")  # the GPU blueprint is refused on a GPU machine too
    assert main([*args, "--output", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("playground.train: error:"), lines
    for text in expected:
        assert text in lines[0]
    assert not out.exists()


def test_bad_input_exit_code_from_the_command_line(tmp_path: Path) -> None:
    run = run_trainer("--blueprint", "tiny-llama-cpu", "--set", "batch_size=100000", "--output", str(tmp_path / "o"))
    assert run.returncode == 2 and run.stdout == ""
    assert "batch_size" in run.stderr and "from 1 to 512" in run.stderr
    assert not (tmp_path / "o").exists()


def test_unwritable_output_is_bad_input(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["--blueprint", "tiny-llama-cpu", "--output", str(blocker / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "output directory" in err and "not writable" in err


def test_examples_with_no_answer_token_in_the_window_are_dropped_not_nan(capsys) -> None:
    """A prompt as long as max_seq_length leaves no label to learn from (0/0 loss): drop it."""
    from playground.train.data import Sample, tokenize
    from playground.train.tokenizer import build_char_tokenizer, render

    tokenizer = build_char_tokenizer()
    short, long = Sample("reverse: abc", "cba"), Sample("reverse: " + "abcdef" * 8, "x")
    window = len(render(tokenizer, [{"role": "user", "content": short.prompt}], add_generation_prompt=True))
    window += 4  # room for the short example's answer, far too little for the long prompt
    data = tokenize([short, long, short], tokenizer, max_seq_length=window)
    assert len(data) == 2 and all(s is short for s in data.samples)
    assert (data.labels != -100).sum(dim=1).min() > 0  # every kept row has answer tokens
    assert "dropped 1 of 3 examples" in capsys.readouterr().out
    with pytest.raises(ValueError, match="max_seq_length=4"):
        tokenize([long], tokenizer, max_seq_length=4)


def test_trainjob_status_is_reported_after_an_import_race(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's import on the status thread can race another thread's imports (the MLflow worker's: it failed once
    beside a CPU hog, and no status was posted); a failed import is retried and the updates still arrive."""
    import importlib.abc
    import io

    from playground.events import JobPhase, Progress
    from playground.train.reporting import Reporter

    class FailsOnce(importlib.abc.MetaPathFinder):
        failures = 0

        def find_spec(self, name, path=None, target=None):
            if name == "kubeflow.trainer" and not self.failures:
                self.failures += 1
                raise ImportError("cannot import name 'x' from partially initialized module 'kubeflow.trainer'")
            return None

    finder = FailsOnce()
    monkeypatch.delitem(sys.modules, "kubeflow.trainer", raising=False)
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    with trainer_status_server(tmp_path / "token") as (env, received):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        reporter = Reporter(stream=io.StringIO())
        reporter.progress(Progress(step=1, total_steps=2, loss=1.5))
        reporter.phase(JobPhase.SUCCEEDED)
        reporter.close()
    assert finder.failures == 1
    final = received[-1]["body"]["trainerStatus"]
    assert final["progressPercentage"] == 100 and {"name": "step", "value": "1"} in final["metrics"]


def test_weight_average_is_the_mean_of_the_last_steps_and_a_resume_keeps_it(tmp_path: Path) -> None:
    """``average_last: 0.5`` over 6 steps: the model saved holds the mean of steps 4-6's weights (each step's
    checkpoint has them), not the last step's, and the final evaluation scores it; a run resumed from step 5 (the
    average of steps 4-5 in its checkpoint) saves the same model to the bit."""
    import torch
    from _fixtures import catalog_variant
    from safetensors.torch import load_file

    variant = catalog_variant(tmp_path / "bp", "tiny-llama-cpu", {"id": "tiny-averaged", "training.average_last": 0.5})
    args = ["--blueprint", str(variant), "--set", "max_steps=6", "--set", "checkpoint_every=1"]
    args += ["--set", "num_eval_examples=10", "--set", "log_every=1"]
    out = tmp_path / "out"
    run = run_trainer(*args, "--output", str(out))
    assert run.returncode == 0, describe(run)
    assert any(line.startswith("weights: the mean of steps 4-6 (3 steps") for line in run.logs), run.logs
    states = {s: torch.load(out / "checkpoints" / f"step-{s}" / "state.pt", weights_only=False) for s in (4, 5, 6)}
    assert [states[s]["average"]["steps"] for s in (4, 5, 6)] == [1, 2, 3]
    weights = states[6]["model"]
    mean = {name: torch.stack([states[s]["model"][name] for s in (4, 5, 6)]).mean(0) for name in weights}
    for name, value in mean.items():
        torch.testing.assert_close(states[6]["average"]["weights"][name], value)
    saved = load_file(out / "model" / "model.safetensors")
    assert set(mean) <= set(saved), set(mean) - set(saved)
    for name, value in mean.items():
        torch.testing.assert_close(saved[name], value)
    assert any(not torch.allclose(saved[name], weights[name]) for name in weights)  # not the last step's weights
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["averaged_steps"] == 3 and metrics["history"][-1]["step"] == 6

    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    for done in ("model", "checkpoints/step-6", "metrics.json"):
        path = resumed / done
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    run = run_trainer(*args, "--output", str(resumed), "--resume")
    assert run.returncode == 0, describe(run)
    again = load_file(resumed / "model" / "model.safetensors")
    assert all(torch.equal(again[name], saved[name]) for name in saved)
    assert json.loads((resumed / "metrics.json").read_text())["eval_exact_match"] == metrics["eval_exact_match"]


def test_a_weight_average_outside_0_to_1_is_refused(tmp_path: Path) -> None:
    from _fixtures import catalog_variant

    from playground.errors import UserError
    from playground.train.__main__ import prepare

    for value in (1.5, -0.1, "half"):
        variant = catalog_variant(tmp_path / "bp", "tiny-llama-cpu", {"training.average_last": value})
        with pytest.raises(UserError, match=r"^training setting 'average_last': .* allowed: a fraction of the steps"):
            prepare(["--blueprint", str(variant), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
