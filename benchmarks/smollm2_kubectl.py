"""The embedded default blueprint, ``smollm2-135m-lora-kubectl``, against its bars (issue 10).

    python benchmarks/smollm2_kubectl.py [--eval-every 10] [--num-eval 100] [--seed 0] [--step-rate-steps 20]

1. base model: held-out exact match (the same held-out requests the trainer scores), and whether it
   answers with real text (never empty);
2. training through the real entrypoint with the blueprint's defaults (+ ``eval_every``): the held-out
   exact match over training time, the first eval at or above the bar (0.8) and its training seconds
   (eval time excluded), the final exact match, and the trainer's peak RSS (bar: ≤ 3 GB);
3. general prompts (none of them in the training data) answered by the base and the fine-tuned model,
   side by side: LoRA must not wreck the chat;
4. step rate of the entrypoint vs PEFT + HF ``Trainer`` on the same model and batches, same run
   (benchmarks/train_step_rate.py's contenders, alternated; bar ≥ 1.0);
5. the merged model behind the local server (``transformers serve``): its answers to the blueprint's
   examples, first-token latency and tokens/s, next to in-process ``model.generate``.

Prints one JSON object per section and a summary; the machine's load average is in each, since on a
shared machine the seconds depend on it (the steps do not).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
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
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the trainer and servers set it
BLUEPRINT = "smollm2-135m-lora-kubectl"
GENERAL_PROMPTS = [  # none of these is in playground/kubectl/general_answers.json (the training mix)
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Germany?", "Berlin"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("Give three tips for staying healthy.", None),
    ("What is Kubernetes?", None),
    ("Translate 'good morning' into Spanish.", None),
]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def _model(model_dir: Path, template: str | None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if template:
        tokenizer.chat_template = template
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), tokenizer


def _answers(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
    from playground.train.evaluate import generate_answers
    from playground.train.tokenizer import render

    ids = [render(tokenizer, [{"role": "user", "content": p}], add_generation_prompt=True) for p in prompts]
    return generate_answers(model, tokenizer, ids, max_new_tokens=max_new_tokens, device="cpu")


def held_out(n: int):
    from playground.blueprints import get_blueprint
    from playground.train.data import synthetic_splits

    options = dict(get_blueprint(BLUEPRINT).dataset.options)
    return synthetic_splits("kubectl", options, num_train=0, num_eval=n, seed=0)[1]


def base_model(base_dir: Path, n: int) -> dict[str, Any]:
    """Exact match of the base model (its own chat template, as it is served) on the held-out requests."""
    model, tokenizer = _model(base_dir, None)
    samples = held_out(n)
    started = time.perf_counter()
    answers = _answers(model, tokenizer, [s.prompt for s in samples], 32)
    exact = sum(a.strip() == s.answer for a, s in zip(answers, samples, strict=True)) / len(samples)
    return {
        "section": "base model",
        "held_out": len(samples),
        "exact_match": round(exact, 3),
        "empty_answers": sum(not a.strip() for a in answers),
        "examples": [[s.prompt, s.answer, a] for s, a in list(zip(samples, answers, strict=True))[:5]],
        "seconds": round(time.perf_counter() - started, 1),
        "load": _load_avg(),
    }


def train(out: Path, *, eval_every: int, num_eval: int, seed: int, **overrides: Any) -> dict[str, Any]:
    """The entrypoint with the blueprint's defaults (or ``overrides``); peak RSS of the trainer process (ru_maxrss
    of the child)."""
    from playground.blueprints import get_blueprint

    blueprint = get_blueprint(BLUEPRINT)
    sets = {"eval_every": eval_every, "num_eval_examples": num_eval, "seed": seed, **overrides}
    cmd = [sys.executable, "-m", "playground.train", "--blueprint", BLUEPRINT, "--output", str(out)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    load_before = _load_avg()
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"training failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest child: the trainer
    metrics = json.loads((out / "metrics.json").read_text())
    bar = blueprint.quality.threshold
    reached = next((h for h in metrics["history"] if h.get("eval_exact_match", 0) >= bar), None)
    return {
        "section": "training",
        "defaults": blueprint.defaults(),
        "bar": bar,
        "bar_step": reached["step"] if reached else None,
        "bar_train_seconds": reached["train_seconds"] if reached else None,
        "final_exact_match": metrics["eval_exact_match"],
        "steps": metrics["steps"],
        "train_seconds": metrics["train_seconds"],
        "train_cpu_seconds": metrics["train_cpu_seconds"],
        "seconds_per_step": round(metrics["train_seconds"] / metrics["steps"], 2),
        "process_wall_seconds": round(wall, 1),
        "peak_rss_gb": round(peak_rss / 1e9, 2),
        "history": [(h["step"], h["train_seconds"], h.get("eval_exact_match")) for h in metrics["history"]],
        "load": [load_before, _load_avg()],
    }


def general(base_dir: Path, tuned_dir: Path) -> dict[str, Any]:
    """The general prompts, base vs fine-tuned (each through its own chat template)."""
    prompts = [p for p, _ in GENERAL_PROMPTS]
    rows = [[p] for p in prompts]
    for model_dir in (base_dir, tuned_dir):
        model, tokenizer = _model(model_dir, None)
        for row, answer in zip(rows, _answers(model, tokenizer, prompts, 48), strict=True):
            row.append(answer)
    sensible = []
    for (_, expected), (_, _, tuned) in zip(GENERAL_PROMPTS, rows, strict=True):
        ok = (
            bool(tuned.strip()) and not tuned.lstrip().startswith("kubectl") and (expected is None or expected in tuned)
        )
        sensible.append(ok)
    return {"section": "general prompts", "sensible": f"{sum(sensible)}/{len(sensible)}", "rows": rows}


def step_rate(steps: int, repeats: int) -> dict[str, Any]:
    """benchmarks/train_step_rate.py's entrypoint and HF Trainer contenders, alternated, paired by repeat."""
    rate = _load("train_step_rate")
    runs: dict[str, list[tuple[float, float]]] = {"entrypoint": [], "hf": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            order = ["entrypoint", "hf"] if i % 2 == 0 else ["hf", "entrypoint"]
            for name in order:
                if name == "entrypoint":
                    runs[name].append(rate.entrypoint_rate(BLUEPRINT, steps, Path(tmp) / f"run{i}"))
                else:
                    runs[name].append(rate._child("hf", BLUEPRINT, steps))
    ratio = [[e[k] / h[k] for e, h in zip(runs["entrypoint"], runs["hf"], strict=True)] for k in (0, 1)]
    return {
        "section": "step rate (entrypoint vs PEFT + HF Trainer)",
        "steps": steps,
        "repeats": repeats,
        "entrypoint_steps_per_s": [round(r[0], 3) for r in runs["entrypoint"]],
        "hf_trainer_steps_per_s": [round(r[0], 3) for r in runs["hf"]],
        "ratio_wall_median": round(statistics.median(ratio[0]), 3),
        "ratio_cpu_median": round(statistics.median(ratio[1]), 3),
        "load": _load_avg(),
    }


def serving(tuned_dir: Path, home: Path) -> dict[str, Any]:
    """The merged model served locally: example answers, first-token latency and tokens/s vs in-process."""
    import torch

    from playground.blueprints import get_blueprint
    from playground.serving.client import chat
    from playground.serving.local import LocalServers

    blueprint = get_blueprint(BLUEPRINT)
    bench = _load("serving_bench")
    servers = LocalServers(home)
    started = time.perf_counter()
    endpoint = servers.start(str(tuned_dir), name="smollm2-bench")
    ready = time.perf_counter() - started
    try:
        examples = []
        for ex in blueprint.examples:
            answer = chat(endpoint, [{"role": "user", "content": ex.prompt}], max_tokens=48, temperature=0.0)
            exact = answer.strip() == ex.expected if ex.expected and ex.expected.startswith("kubectl") else None
            examples.append([ex.prompt, ex.expected, answer, exact])
        prompts = [s.prompt for s in held_out(12)]
        first_server, first_local = [], []
        model, tokenizer = _model(tuned_dir, None)
        for prompt in [prompts[0], *prompts]:  # the first round warms both up
            messages = [{"role": "user", "content": prompt}]
            t = time.perf_counter()
            next(iter(chat(endpoint, messages, stream=True, max_tokens=24, temperature=0.0)))
            first_server.append(time.perf_counter() - t)
            enc = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            t = time.perf_counter()
            with torch.no_grad():
                model.generate(**enc, max_new_tokens=1, do_sample=False)
            first_local.append(time.perf_counter() - t)
        short = bench.tokens_per_second(endpoint.url, endpoint.model, str(tuned_dir), prompts, 24, eos=True)
        long = bench.tokens_per_second(endpoint.url, endpoint.model, str(tuned_dir), prompts[:6], 48, eos=False)
    finally:
        servers.stop_all()
    return {
        "section": "serving (fine-tuned model, local server)",
        "serve_to_ready_s": round(ready, 1),
        "examples": examples,
        "examples_exact": f"{sum(e[3] is True for e in examples)}/{sum(e[3] is not None for e in examples)}",
        "first_token_ms_server_p50": round(1000 * statistics.median(first_server[1:]), 1),
        "first_token_ms_inprocess_p50": round(1000 * statistics.median(first_local[1:]), 1),
        "answers_tok_s_server": round(short[0], 1),
        "answers_tok_s_inprocess": round(short[1], 1),
        "answers_ratio": round(short[0] / short[1], 3),
        "tokens_per_answer": round(short[2], 1),
        "fixed48_tok_s_server": round(long[0], 1),
        "fixed48_tok_s_inprocess": round(long[1], 1),
        "fixed48_ratio": round(long[0] / long[1], 3),
        "load": _load_avg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--num-eval", type=int, default=100, help="held-out requests scored")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-rate-steps", type=int, default=20, help="0: skip the step-rate comparison")
    parser.add_argument("--step-rate-repeats", type=int, default=2)
    parser.add_argument("--skip", nargs="*", default=[], choices=["base", "general", "serving"])
    args = parser.parse_args()
    from playground.blueprints import get_blueprint
    from playground.models.packaged import ensure_converted

    base_dir = ensure_converted(get_blueprint(BLUEPRINT).model.source)
    results: dict[str, Any] = {"cpus": len(os.sched_getaffinity(0)), "load_start": _load_avg()}
    with tempfile.TemporaryDirectory(prefix="smollm2-bench-") as tmp:
        out = Path(tmp) / "train"
        sections = []
        if "base" not in args.skip:
            sections.append(base_model(base_dir, args.num_eval))
            print(json.dumps(sections[-1]), flush=True)
        sections.append(train(out, eval_every=args.eval_every, num_eval=args.num_eval, seed=args.seed))
        print(json.dumps(sections[-1]), flush=True)
        if "general" not in args.skip:
            sections.append(general(base_dir, out / "model"))
            print(json.dumps(sections[-1]), flush=True)
        if args.step_rate_steps:
            sections.append(step_rate(args.step_rate_steps, args.step_rate_repeats))
            print(json.dumps(sections[-1]), flush=True)
        if "serving" not in args.skip:
            sections.append(serving(out / "model", Path(tmp) / "home"))
            print(json.dumps(sections[-1]), flush=True)
    by_name = {s["section"].split(" (")[0]: s for s in sections}
    training = by_name["training"]
    results.update(
        base_exact_match=by_name.get("base model", {}).get("exact_match"),
        bar_step=training["bar_step"],
        bar_train_seconds=training["bar_train_seconds"],
        final_exact_match=training["final_exact_match"],
        peak_rss_gb=training["peak_rss_gb"],
        general_sensible=by_name.get("general prompts", {}).get("sensible"),
        step_rate_ratio=by_name.get("step rate", {}).get("ratio_wall_median"),
        step_rate_ratio_cpu=by_name.get("step rate", {}).get("ratio_cpu_median"),
        load_end=_load_avg(),
    )
    print(json.dumps({"summary": results}, indent=2))


if __name__ == "__main__":
    main()
