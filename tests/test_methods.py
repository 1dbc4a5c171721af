"""DPO and GRPO (playground/train/dpo.py, grpo.py on TRL): the verifiable kubectl reward, the generated
preference pairs, and each method's run and ``--resume`` through the real entrypoint on a tiny stand-in
model (the SmolLM2 blueprints themselves run end to end in tests/test_notebooks.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _train_helpers import threads_asked_back, trainer_status_server

from playground.events import Log, Metric, Phase, Progress, parse_line
from playground.kubectl.reward import (
    EQUIVALENT,
    RIGHT_VERB_AND_RESOURCE,
    changes_unasked,
    is_destructive,
    score,
)
from playground.train import cpu_share
from playground.train.preferences import NEAR_MISSES, preference_splits

OPTIONS = {"held_out_phrasing": 0.5, "namespace_fraction": 0.5}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("kubectl scale deploy/web --replicas 3", "kubectl scale deployment web --replicas=3"),
        ("kubectl scale --replicas=3 deployment web", "kubectl scale deployment web --replicas=3"),
        ("kubectl get pod --namespace=staging", "kubectl get pods -n staging"),
        ("kubectl -n staging get po", "kubectl get pods -n staging"),
        ("kubectl get pods --namespace staging", "kubectl get pods -n staging"),
        ("kubectl get pods -n default", "kubectl get pods"),
        ("```bash\nkubectl drain node-1 --ignore-daemonsets\n```", "kubectl drain node-1 --ignore-daemonsets"),
        ("`kubectl cordon edge-3`", "kubectl cordon edge-3"),
        ("$ kubectl rollout restart deploy api", "kubectl rollout restart deployment api"),
        ("kubectl set image deployment web web=web:v2", "kubectl set image deployment/web web=web:v2"),
        ("kubectl delete svc media -n qa", "kubectl delete service media -n qa"),  # a delete that was asked for
    ],
)
def test_equivalent_commands_earn_the_full_reward(answer: str, expected: str) -> None:
    assert score(answer, expected) == EQUIVALENT


@pytest.mark.parametrize(
    ("answer", "expected", "reward"),
    [
        ("kubectl get pods -n prod", "kubectl get pods -n staging", RIGHT_VERB_AND_RESOURCE),  # wrong namespace
        ("kubectl scale deployment web --replicas=4", "kubectl scale deployment web --replicas=3", 0.5),  # number
        ("kubectl get services", "kubectl get pods", 0.0),  # another kind
        ("kubectl describe pod web-1", "kubectl logs web-1", 0.0),  # reads, but the wrong verb: no safe harbour
        ("kubectl delete deployment api", "kubectl rollout restart deployment api", 0.0),  # destructive, unasked
        ("kubectl drain edge-3 --ignore-daemonsets", "kubectl cordon edge-3", 0.0),  # drains a node asked to cordon
        ("kubectl expose deployment api --port=80", "kubectl get pods", 0.0),  # changes the cluster, unasked
        ("To restart it, run `kubectl rollout restart deployment api`.", "kubectl rollout restart deployment api",
         0.5),  # the right command wrapped in prose: half
        ("You can use kubectl to list the pods.", "kubectl get pods", 0.0),  # prose, no command
        ("kubectl", "kubectl get pods", 0.0),
        ("helm list", "kubectl get pods", 0.0),
        ("kubectl get pods 'unterminated", "kubectl get pods", 0.0),
    ],
)  # fmt: skip
def test_near_misses_prose_and_dangerous_answers_score_less(answer: str, expected: str, reward: float) -> None:
    assert score(answer, expected) == pytest.approx(reward)


def test_destructive_answers_are_flagged() -> None:
    assert is_destructive("kubectl delete pod web-1") and is_destructive("run `kubectl drain node-1`")
    assert not is_destructive("kubectl get pods") and not is_destructive("I would not delete anything")
    # what the held-out eval counts: a cluster change the request did not ask for
    assert changes_unasked("kubectl delete deployment api", "kubectl rollout restart deployment api")
    assert changes_unasked("kubectl scale deployment api --replicas=0", "kubectl get pods")
    assert not changes_unasked("kubectl delete pod web-1 -n qa", "kubectl delete pod web-1")  # asked (wrong ns)
    assert not changes_unasked("kubectl describe pod web-1", "kubectl delete pod web-1")  # reads only


def test_preference_pairs_pit_the_exact_command_against_each_kind_of_near_miss() -> None:
    train, held = preference_splits(OPTIONS, num_train=400, num_eval=50, seed=3)
    assert {p.near_miss for p in train} == set(NEAR_MISSES)
    for pair in train + held:
        assert pair.chosen.startswith("kubectl ") and pair.rejected != pair.chosen
        assert score(pair.chosen, pair.chosen) == EQUIVALENT
        assert score(pair.rejected, pair.chosen) < EQUIVALENT  # the checker agrees the rejected one is worse
        if pair.near_miss == "prose":
            assert "kubectl " not in pair.rejected.replace("kubectl command", "").replace("kubectl can", "")
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert preference_splits(OPTIONS, num_train=400, num_eval=50, seed=3) == (train, held)  # a pure function of seed


# --- the recipes, end to end on a tiny stand-in --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from playground.train.standins import build_standin

    return build_standin("qwen2", tmp_path_factory.mktemp("standin") / "qwen2")


def _train(
    blueprint: str, model: Path, output: Path, *sets: str, resume: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "playground.train", "--blueprint", blueprint, "--model-source", str(model)]
    args += ["--output", str(output), *(x for s in sets for x in ("--set", s))] + (["--resume"] if resume else [])
    env = {**os.environ, "PLAYGROUND_TRAIN_THREADS": "1", **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)


def _events(stdout: str) -> list:
    return [parse_line(line) for line in stdout.splitlines()]


def _check_resume(
    blueprint: str, model: Path, output: Path, sets: tuple[str, ...], first: list, *, weights: str
) -> list:
    """Drop the last checkpoint and the results, resume: training continues from step 2, only what is left runs;
    ``model/`` holds ``weights`` (a LoRA job's PEFT adapter, or merged weights: a GRPO warm start's policy)."""
    shutil.rmtree(output / "checkpoints" / "checkpoint-4")
    shutil.rmtree(output / "model")
    (output / "metrics.json").unlink()
    changed = _train(blueprint, model, output, *sets, "beta=0.5", resume=True)
    assert changed.returncode == 2 and "beta=0.5 differs from" in changed.stderr, changed.stderr
    assert not (output / "model").exists()  # refused before anything was written
    resumed = _train(blueprint, model, output, *sets, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    events = _events(resumed.stdout)
    assert any(isinstance(e, Log) and "resume: continuing from checkpoints/checkpoint-2" in e.line for e in events)
    steps = [e.step for e in events if isinstance(e, Progress)]
    assert steps == [3, 4]  # steps 1-2 came from the checkpoint
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["steps"] == 4 and (output / "model" / weights).is_file()
    other = {"adapter_model.safetensors": "model.safetensors", "model.safetensors": "adapter_model.safetensors"}
    assert not (output / "model" / other[weights]).exists()
    # the base figures of the first run survive the resume (kept in the checkpoint)
    first_base = {e.name: e.value for e in first if isinstance(e, Metric) and e.name.startswith("base_")}
    assert {k: metrics[k] for k in first_base} == pytest.approx(first_base)
    return events


def test_dpo_trains_reports_its_figures_and_resumes(tiny_qwen: Path, tmp_path: Path, mlflow_store: str) -> None:
    from mlflow import MlflowClient

    from playground.runs.settings import JOB_ID_ENV, TAG_JOB

    sets = ("max_steps=4", "batch_size=4", "checkpoint_every=2", "log_every=1", "num_eval_examples=10")
    tracked = {"PLAYGROUND_MLFLOW": "1", JOB_ID_ENV: "dpo-tiny"}  # an MLflow run, as a job's trainer logs it
    with trainer_status_server(tmp_path / "token") as (status_env, received):  # as inside a TrainJob pod
        run = _train("smollm2-135m-dpo-kubectl", tiny_qwen, tmp_path / "out", *sets, env={**status_env, **tracked})
    assert run.returncode == 0, run.stderr[-3000:]
    updates = [{m["name"]: m["value"] for m in r["body"]["trainerStatus"]["metrics"]} for r in received]
    # every update is the Reporter's (transformers' own KubeflowCallback would post TRL's raw keys and race it)
    assert updates and all({"step", "total_steps", "reward_margin"} <= set(update) for update in updates), updates
    final = updates[-1]
    assert {"reward_margin", "preference_accuracy", "eval_preference_accuracy", "eval_exact_match"} <= set(final)
    client = MlflowClient(tracking_uri=mlflow_store)
    experiment = client.get_experiment_by_name("smollm2-135m-dpo-kubectl")
    (mlflow_run,) = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{TAG_JOB}` = 'dpo-tiny'")
    margins = client.get_metric_history(mlflow_run.info.run_id, "train_reward_margin")
    assert [m.step for m in margins] == [1, 2, 3, 4]  # every window, at its step
    assert {"base_eval_preference_accuracy", "eval_preference_accuracy"} <= set(mlflow_run.data.metrics)
    events = _events(run.stdout)
    phases = [e.phase.value for e in events if isinstance(e, Phase)]
    assert dict.fromkeys(phases) == dict.fromkeys(["Initializing", "Training", "Evaluating", "Saving", "Succeeded"])
    points = [e for e in events if isinstance(e, Progress)]
    assert [p.step for p in points] == [1, 2, 3, 4]
    for point in points:  # the method's own figures, the headline first
        assert list(point.metrics) == ["reward_margin", "preference_accuracy", "chosen_reward", "rejected_reward"]
    # after the first update the policy has moved from the reference: chosen answers gain on rejected ones
    assert points[0].metrics["reward_margin"] == 0.0 and points[-1].metrics["reward_margin"] > 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["objective"] == "dpo"
    for name in ("eval_exact_match", "eval_mean_reward", "eval_preference_accuracy", "eval_reward_margin",
                 "base_eval_preference_accuracy", "base_eval_mean_reward"):  # fmt: skip
        assert isinstance(metrics[name], float), name
    assert metrics["eval_reward_margin"] > 0
    assert "{'loss'" not in run.stdout and "Tokenizing" not in run.stdout + run.stderr  # no raw TRL output
    _check_resume(
        "smollm2-135m-dpo-kubectl", tiny_qwen, tmp_path / "out", sets, events, weights="adapter_model.safetensors"
    )


def test_grpo_warm_starts_samples_and_resumes(tiny_qwen: Path, tmp_path: Path) -> None:
    import torch

    sets = ("max_steps=4", "batch_size=2", "num_generations=2", "warm_start_steps=3", "checkpoint_every=2",
            "log_every=1", "sample_every=2", "num_eval_examples=10", "temperature=0.5", "beta=0.04")  # fmt: skip
    run = _train("smollm2-135m-grpo-kubectl", tiny_qwen, tmp_path / "out", *sets)
    assert run.returncode == 0, run.stderr[-3000:]
    trainer_args = torch.load(
        tmp_path / "out" / "checkpoints" / "checkpoint-2" / "training_args.bin", weights_only=False
    )
    assert trainer_args.temperature == 0.5  # the run's sampling temperature is TRL's
    events = _events(run.stdout)
    lines = [e.line for e in events if isinstance(e, Log)]
    assert "warm start: step 3/3" in " ".join(lines)  # the warm start's steps are log lines, not chart points
    assert (tmp_path / "out" / "warm-start" / "model" / "config.json").is_file()
    samples = [line for line in lines if line.startswith("sample (step ")]
    assert samples and all("→ reward" in line and "(asked: kubectl " in line for line in samples)
    points = [e for e in events if isinstance(e, Progress)]
    assert [p.step for p in points] == [1, 2, 3, 4]
    for point in points:
        assert list(point.metrics) == ["mean_reward", "reward_std", "kl", "completion_length"]  # β > 0: a KL
        assert 0.0 <= point.metrics["mean_reward"] <= 1.0 and point.metrics["completion_length"] > 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["objective"] == "grpo"
    for name in ("base_eval_mean_reward", "warm_start_eval_mean_reward", "eval_mean_reward", "eval_exact_match"):
        assert isinstance(metrics[name], float), name
    # LoRA on the warm start's merged weights, not on the job's base model: merged as well (never the wrong base)
    resumed = _check_resume(
        "smollm2-135m-grpo-kubectl", tiny_qwen, tmp_path / "out", sets, events, weights="model.safetensors"
    )
    assert not any(isinstance(e, Log) and e.line.startswith("warm start") for e in resumed)  # not trained again


@pytest.mark.skipif(cpu_share.pressure_avg10() is None, reason="no Linux PSI (/proc/pressure/cpu): the guard is off")
def test_a_methods_held_out_answers_give_cpu_threads_back(tiny_qwen: Path, tmp_path: Path) -> None:
    """DPO's and GRPO's evaluation (``TrlRecipe.evaluate_model``: greedy answers, a minute on 2 cores) applies the
    thread guard's ask between its batches, as their training steps do."""
    import io

    import torch

    from playground.blueprints import get_blueprint
    from playground.run_request import RunParameters
    from playground.train.dpo import DpoRecipe
    from playground.train.reporting import Reporter
    from playground.train.settings import TrainSpec

    blueprint = get_blueprint("smollm2-135m-dpo-kubectl")
    params = RunParameters.of(blueprint, {"max_steps": 2, "batch_size": 2, "num_eval_examples": 10})
    stream = io.StringIO()
    run = DpoRecipe(
        TrainSpec(blueprint, params, tmp_path / "out", str(tiny_qwen), blueprint.dataset.source),
        Reporter(enabled=True, stream=stream),
    )
    run.setup()
    answered: list[tuple[int, int]] = []
    try:
        with threads_asked_back(run) as full:
            figures = run.evaluate_model(run.trainer.model, step=0, on_answered=lambda *done: answered.append(done))
            assert torch.get_num_threads() == full // 2 == run.runtime.thread_guard.threads
    finally:
        run.cleanup()
    assert f"CPU threads {full} → {full // 2}: other processes wait for the CPU" in stream.getvalue()
    assert answered and answered[-1] == (10, 10) and "eval_exact_match" in figures  # the caller's progress too


def test_a_method_refuses_data_it_cannot_use(tiny_qwen: Path, tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "list pods", "chosen": "kubectl get pods"}) + "\n")
    args = [sys.executable, "-m", "playground.train", "--blueprint", "smollm2-135m-dpo-kubectl", "--model-source",
            str(tiny_qwen), "--dataset-source", str(rows), "--output", str(tmp_path / "out")]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "field 'rejected' is missing" in proc.stdout + proc.stderr
    assert not (tmp_path / "out" / "model").exists()


@pytest.mark.parametrize(
    ("blueprint", "setting", "error"),
    [
        ("smollm2-135m-dpo-kubectl", {"training.distributed": "fsdp"},
         r"'fsdp' is not wired for DPO .* allowed: auto, ddp"),
        ("smollm2-135m-grpo-kubectl", {"training.cpu_bf16": True},
         r"'cpu_bf16' is not wired for GRPO .* allowed: false$"),
        ("smollm2-135m-dpo-kubectl", {"training.average_last": 0.5},
         r"'average_last' is not wired for DPO .* allowed: 0$"),
        ("smollm2-135m-grpo-kubectl", {"parameters.temperature.min": 0.0, "parameters.temperature.default": 0.0},
         r"^training setting 'temperature': 0.0 is not allowed; allowed: a number above 0"),
    ],
)  # fmt: skip
def test_settings_a_trl_method_cannot_use_are_refused(
    blueprint: str, setting: dict, error: str, tmp_path: Path
) -> None:
    from _fixtures import catalog_variant

    from playground.errors import UserError
    from playground.train.__main__ import prepare

    variant = catalog_variant(tmp_path, blueprint, setting)
    with pytest.raises(UserError, match=error):
        prepare(["--blueprint", str(variant), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_e2e_profiles_keep_the_methods_own_data(tmp_path: Path) -> None:
    """A DPO/GRPO blueprint's data is generated by the project: no stand-in replaces it; on random-init
    full-size models (gpu-config) the SFT eval_loss bar does not apply: DPO's bar is on preference accuracy,
    GRPO has none."""
    from playground.blueprints import get_blueprint
    from playground.e2e.headless import build_standins
    from playground.e2e.profiles import CONFIG_QUALITY_THRESHOLD, get_profile

    params = get_profile("gpu-config").parameters("qwen2.5-1.5b-dpo-kubectl", backend="local")
    assert params["model_source"] == "config" and params["dataset_source"] is None
    assert params["assert_quality"] is True and params["quality_metric"] == "eval_preference_accuracy"
    params = get_profile("gpu-config").parameters("llama-3.2-1b-grpo-kubectl", backend="local")
    assert params["model_source"] == "config" and params["dataset_source"] is None
    assert params["assert_quality"] is False and params["quality_threshold"] is None
    sft = get_profile("gpu-config").parameters("qwen2.5-1.5b-lora-alpaca", backend="local")
    assert sft["dataset_source"] == "standin" and sft["quality_threshold"] == CONFIG_QUALITY_THRESHOLD
    blueprint = get_blueprint("smollm2-135m-grpo-kubectl")
    assert build_standins(blueprint, None, "standin", tmp_path) == (None, None)
    assert list(tmp_path.iterdir()) == []  # nothing built


def test_a_headless_bar_on_another_metric_takes_that_metrics_direction_and_bad_ones_are_refused() -> None:
    """``quality_metric`` (what gpu-config asserts for DPO): the bar moves to that held-out metric in its own
    direction with the given threshold; an unknown metric, one without a threshold, or a threshold that is not a
    finite number is a one-line error naming the field and what is allowed."""
    from playground.blueprints import get_blueprint
    from playground.e2e.headless import QUALITY_METRICS, quality_bar
    from playground.errors import UserError

    dpo = get_blueprint("qwen2.5-1.5b-dpo-kubectl")
    assert quality_bar(dpo) == dpo.quality
    bar = quality_bar(dpo, "eval_preference_accuracy", 0.75)
    assert (bar.metric, bar.threshold, bar.higher_is_better) == ("eval_preference_accuracy", 0.75, True)
    assert bar.passed(0.86) and not bar.passed(0.46)  # the H100 run's trained and base figures
    loss = quality_bar(dpo, "eval_loss", 2.0)
    assert loss.higher_is_better is False and loss.passed(1.5) and not loss.passed(2.5)
    same = quality_bar(dpo, dpo.quality.metric)  # the blueprint's own metric needs no threshold
    assert same == dpo.quality
    refused = {
        ("eval_accuracy", 0.5): r"^quality_metric 'eval_accuracy' is not a held-out metric; allowed: eval_loss, ",
        ("eval_preference_accuracy", None): r"^quality_metric eval_preference_accuracy needs a quality_threshold",
        (None, float("nan")): r"^quality_threshold nan: allowed: a finite number$",
        (None, "0.5"): r"^quality_threshold '0.5': allowed: a finite number$",
        (None, True): r"^quality_threshold True: allowed: a finite number$",
    }
    for (metric, threshold), message in refused.items():
        with pytest.raises(UserError, match=message) as caught:
            quality_bar(dpo, metric, threshold)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)
        assert caught.value.field == ("quality_metric" if "is not" in message else "quality_threshold")
    assert set(QUALITY_METRICS) >= {"eval_loss", "eval_exact_match", "eval_mean_reward", "eval_preference_accuracy"}
