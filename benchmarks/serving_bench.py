"""Serving benchmark: serve→ready time, tokens/s through the server vs ``model.generate`` in-process,
and p50/p95 latency with 8 concurrent clients.

    python benchmarks/serving_bench.py                 # trains tiny-llama-cpu first (local backend)
    python benchmarks/serving_bench.py --job JOB_ID    # a finished local job in $PLAYGROUND_HOME
    python benchmarks/serving_bench.py --model-dir DIR [--base-dir DIR]

Both sides generate greedily from the same held-out prompts through the same chat template with the
same ``max_tokens``; the server's token counts come from its ``usage`` field. "short" = the fine-tuned
model's real answers (a few tokens, stops at EOS), so per-request HTTP overhead weighs most; "long" =
the base model generating a fixed 40 tokens (no EOS), so decoding dominates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def held_out_prompts(n: int) -> list[str]:
    from playground.blueprints.loader import get_blueprint
    from playground.train.data import synthetic_splits

    bp = get_blueprint("tiny-llama-cpu")
    _, samples = synthetic_splits("reverse", bp.dataset.options, num_train=0, num_eval=n, seed=0)
    return [s.prompt for s in samples]


def train_tiny(home: Path):
    from playground.api import make_request
    from playground.backends.local import LocalBackend

    backend = LocalBackend(home=home)
    job = backend.submit(make_request("tiny-llama-cpu"))
    print(f"training {job.id} in {home} ...", file=sys.stderr)
    for _ in backend.events(job.id, follow=True):
        pass
    return backend.get(job.id)


def tokens_per_second(url: str, model: str, model_dir: str, prompts: list[str], max_tokens: int, *, eos: bool):
    """(server tok/s, in-process tok/s): each prompt through the server then through ``model.generate``
    in this process, alternating, so both sides see the same (shared, noisy) machine."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    kwargs = {"max_new_tokens": max_tokens, "do_sample": False}
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if not eos:  # a fixed length: decoding dominates
        kwargs.update(min_new_tokens=max_tokens)
        body["generation_config"] = json.dumps({"min_new_tokens": max_tokens, "max_new_tokens": max_tokens})
    server = {"tokens": 0, "seconds": 0.0}
    local = {"tokens": 0, "seconds": 0.0}
    with httpx.Client(timeout=300) as client, torch.no_grad():
        for i, prompt in enumerate([prompts[0], *prompts]):  # the first round warms both up
            messages = [{"role": "user", "content": prompt}]
            started = time.perf_counter()
            r = client.post(url + "/chat/completions", json={**body, "messages": messages})
            r.raise_for_status()
            elapsed = time.perf_counter() - started
            if i:
                server["tokens"] += r.json()["usage"]["completion_tokens"]
                server["seconds"] += elapsed
            enc = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            started = time.perf_counter()
            out = lm.generate(**enc, **kwargs)
            elapsed = time.perf_counter() - started
            if i:
                local["tokens"] += out.shape[1] - enc["input_ids"].shape[1]
                local["seconds"] += elapsed
    assert server["tokens"] == local["tokens"], (server, local)  # same prompts, same greedy tokens
    return server["tokens"] / server["seconds"], local["tokens"] / local["seconds"], server["tokens"] / len(prompts)


def concurrent_latency(url: str, model: str, prompts: list[str], clients: int, per_client: int) -> dict[str, float]:
    import httpx

    def client_run(offset: int) -> list[float]:
        latencies = []
        with httpx.Client(timeout=300) as client:
            for i in range(per_client):
                prompt = prompts[(offset * per_client + i) % len(prompts)]
                started = time.perf_counter()
                r = client.post(
                    url + "/chat/completions",
                    json={
                        "model": model,
                        "max_tokens": 12,
                        "temperature": 0,
                        "messages": [{"role": "user", "content": prompt}],
                    },
                )
                r.raise_for_status()
                latencies.append(time.perf_counter() - started)
        return latencies

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        latencies = sorted(x for run in pool.map(client_run, range(clients)) for x in run)
    wall = time.perf_counter() - started
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "p50_ms": q[49] * 1000,
        "p95_ms": q[94] * 1000,
        "requests": len(latencies),
        "req_per_s": len(latencies) / wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", help="a finished local job id (in $PLAYGROUND_HOME)")
    parser.add_argument("--model-dir", help="fine-tuned model directory")
    parser.add_argument("--base-dir", help="base model directory (long-generation figure)")
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--ready-runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads on both sides (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
        os.environ["PLAYGROUND_SERVE_THREADS"] = str(args.threads)  # the servers inherit it

    from playground.serving.local import LocalServers

    home = Path(tempfile.mkdtemp(prefix="serving-bench-"))
    if args.model_dir:
        model_dir, base_dir = args.model_dir, args.base_dir
    else:
        if args.job:
            from playground.backends.local import LocalBackend

            job = LocalBackend().get(args.job)
        else:
            job = train_tiny(home)
        model_dir, base_dir = job.model_dir, job.base_model
    prompts = held_out_prompts(args.prompts)
    servers = LocalServers(home)
    figures: dict[str, float] = {}
    try:
        ready = []
        for i in range(args.ready_runs):
            started = time.perf_counter()
            ep = servers.start(model_dir, name=f"ready-{i}")
            ready.append(time.perf_counter() - started)
            if i < args.ready_runs - 1:
                servers.stop(ep.url)
        figures["serve_to_ready_s_median"] = statistics.median(ready)
        figures["serve_to_ready_s_min"] = min(ready)

        srv, loc, per_answer = tokens_per_second(ep.url, ep.model, model_dir, prompts, 12, eos=True)
        figures.update(short_server_tok_s=srv, short_inprocess_tok_s=loc, short_ratio=srv / loc)
        figures["short_tokens_per_answer"] = per_answer
        if base_dir:
            base = servers.start(base_dir, name="base")
            n = max(10, len(prompts) // 4)
            srv, loc, _ = tokens_per_second(base.url, base.model, base_dir, prompts[:n], 40, eos=False)
            figures.update(long_server_tok_s=srv, long_inprocess_tok_s=loc, long_ratio=srv / loc)
        conc = concurrent_latency(ep.url, ep.model, prompts, clients=8, per_client=8)
        figures.update({f"c8_{k}": v for k, v in conc.items()})
        seq = concurrent_latency(ep.url, ep.model, prompts, clients=1, per_client=16)
        figures.update({f"c1_{k}": v for k, v in seq.items()})
    finally:
        servers.stop_all()

    threads = args.threads or "default"
    print(f"serving benchmark ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, torch threads {threads})")
    print(f"  model {model_dir}")
    for key, value in figures.items():
        print(f"  {key:28s} {value:10.3f}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
