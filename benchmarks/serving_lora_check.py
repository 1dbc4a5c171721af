"""The LoRA base server's speed and batch answers, one configuration at a time (issue 59 item 7; the batch bug of
docs/guide/serving.md):

    python benchmarks/serving_lora_check.py [--without-plugin] [--without-target-modules] [--arg=--flag ...]

Starts the base server as ``playground.serving.vllm_server.command`` makes it (LoRA on, a cap of ``--max-adapters``
adapters, so ``--max-loras`` the same up to 4), then: 2 warm-up chats; the 20 chats of ``serving_bench.py`` on the
base (5 visitor requests × 4, ``max_tokens`` 64, greedy); 20 chats round-robin over ``--adapters`` random adapters
(``serving_bench.make_adapters``); ``--rounds`` rounds of the base and every adapter asked the same request at once,
each answer compared with that model's answer alone. ``--without-plugin`` starts vLLM without the playground's CPU
LoRA plugin (``VLLM_PLUGINS`` empty), ``--without-target-modules`` without ``--lora-target-modules``: vLLM as it was.
Prints one JSON line with the 1-min load average beside each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_bench import SMOLLM2, burst, make_adapters, stop_group, visitor_prompts, wait_ready

QUESTION = "list the pods in the default namespace"


def server_argv(python: Path, model_dir: str, port: int, args: argparse.Namespace) -> list[str]:
    from playground.serving import vllm_server

    argv = vllm_server.command(
        python, model_dir, port, "127.0.0.1", served_name="base", lora=True, max_adapters=args.max_adapters
    )
    if args.without_target_modules:
        start = argv.index("--lora-target-modules")
        end = next(i for i in range(start + 1, len(argv)) if argv[i].startswith("--"))
        del argv[start:end]
    return argv + list(args.arg or [])


def batch_rounds(url: str, models: list[str], rounds: int) -> dict[str, Any]:
    """Each model asked ``QUESTION`` alone, then all at once ``rounds`` times: per round, the models that answered
    otherwise, and the rounds where the first (the base) answered word for word as another model alone."""
    alone = {model: burst(url, [model], [QUESTION], 64)[1][0] for model in models}
    differing, as_another = [], 0
    for _ in range(rounds):
        _latencies, together, _wall = burst(url, models, [QUESTION] * len(models), 64)
        differing.append([m for m, answer in zip(models, together, strict=True) if answer != alone[m]])
        as_another += any(together[0] == alone[m] for m in models[1:])
    return {
        "rounds": rounds,
        "rounds_differing": sum(bool(d) for d in differing),
        "first_as_another_alone": as_another,
        "differing": differing,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", help="the converted SmolLM2 directory (default: prepared from its package)")
    parser.add_argument("--max-adapters", type=int, default=2)
    parser.add_argument("--adapters", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--without-plugin", action="store_true")
    parser.add_argument("--without-target-modules", action="store_true")
    parser.add_argument("--arg", action="append", help="one more vLLM argument (repeatable: --arg=--flag --arg=value)")
    args = parser.parse_args()

    from playground.models.packaged import prepare_in_subprocess
    from playground.processes import child_env
    from playground.serving import vllm_server
    from playground.serving.local import MAX_BODY_BYTES, free_port
    from playground.serving.vllm_env import ensure_environment

    model_dir = args.model_dir or str(prepare_in_subprocess(SMOLLM2))
    prompts = visitor_prompts(5, 4)
    result: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "model_dir"}}
    with tempfile.TemporaryDirectory(prefix="lora-check-") as tmp:
        work = Path(tmp)
        adapters = make_adapters(model_dir, args.adapters, work)
        env = child_env(server=True)
        env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
        env = vllm_server.environment(
            env, guard=vllm_server.guard_dir(work), usage_dir=work / "usage", max_body_bytes=MAX_BODY_BYTES
        )
        if args.without_plugin:
            env["VLLM_PLUGINS"] = ""  # an allow-list naming no plugin
        port = free_port()
        url = f"http://127.0.0.1:{port}/v1"
        started = time.perf_counter()
        with open(work / "server.log", "wb") as log:
            argv = server_argv(ensure_environment(gpu=False), model_dir, port, args)
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            wait_ready(url, proc)
            result["ready_s"] = round(time.perf_counter() - started, 1)
            burst(url, ["base"] * 2, prompts[:2], 64)  # warm-up
            load = round(os.getloadavg()[0], 2)
            _latencies, _answers, wall = burst(url, ["base"] * len(prompts), prompts, 64)
            result["base_chats"] = {"wall_s": round(wall, 2), "load1": load}
            import httpx

            names = [f"adapter-{i}" for i in range(len(adapters))]
            for name, path in zip(names, adapters, strict=True):
                body = {"lora_name": name, "lora_path": str(path)}
                httpx.post(url + "/load_lora_adapter", json=body, timeout=60).raise_for_status()
            load = round(os.getloadavg()[0], 2)
            models = [names[i % len(names)] for i in range(len(prompts))]
            _latencies, _answers, wall = burst(url, models, prompts, 64)
            result["adapter_chats"] = {"wall_s": round(wall, 2), "load1": load}
            result["batch"] = batch_rounds(url, ["base", *names], args.rounds)
        finally:
            stop_group(proc)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
