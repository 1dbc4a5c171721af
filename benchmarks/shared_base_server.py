"""The booth's shared base server (issue 20, item 1): concurrent visitors' chats, one after another vs batched,
and the memory of LoRA adapters on one shared base vs one merged server per visitor.

    python benchmarks/shared_base_server.py batching [--clients 20] [--batch-tokens 4096] [--max-tokens 64]
    python benchmarks/shared_base_server.py adapters [--visitors 16]

``batching``: the SmolLM2 base model (the default blueprint's, converted from its package) behind two real local
servers, started as the booth starts its shared base server: ``--batch-tokens 0`` (requests one after another)
and ``--batch-tokens N`` (transformers' continuous batching). ``--clients`` chats arrive at once (the visitor-style
requests of benchmarks/data/visitor_requests.jsonl, the blueprint's max_tokens, greedy); per mode: latency
p50/p95, the burst's wall time, the server's peak memory (VmHWM), and how many answers are the same in both.

``adapters``: the default blueprint's LoRA (rank 16 on all 7 projections) as N adapters loaded on one base model
in one process (peft; the adapters' values do not change their memory), against N merged fine-tuned servers
(one process each, as the booth runs today): resident memory measured, not estimated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
VISITOR_SET = Path(__file__).with_name("data") / "visitor_requests.jsonl"
MB = 1 << 20


def base_model_dir() -> str:
    from playground.api import DEFAULT_BLUEPRINT
    from playground.blueprints import get_blueprint
    from playground.models.packaged import prepare_in_subprocess

    return str(prepare_in_subprocess(get_blueprint(DEFAULT_BLUEPRINT).model.source))


def visitor_prompts(n: int) -> list[str]:
    rows = [json.loads(line) for line in VISITOR_SET.read_text().splitlines() if line.strip()]
    prompts = [row["request"] for row in rows]
    return [prompts[i % len(prompts)] for i in range(n)]


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def burst(endpoint, prompts: list[str], max_tokens: int) -> tuple[list[float], list[str], float]:
    """Every prompt at once (one thread each): (latencies, answers, wall seconds of the whole burst)."""
    from playground.serving.client import chat

    def ask(prompt: str) -> tuple[float, str]:
        started = time.perf_counter()
        answer = chat(endpoint, [{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.0)
        return time.perf_counter() - started, answer

    started = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(ask, prompts))
    return [r[0] for r in results], [r[1] for r in results], time.perf_counter() - started


def batching(args: argparse.Namespace) -> None:
    from playground.serving.local import LocalServers

    model = base_model_dir()
    prompts = visitor_prompts(args.clients)
    answers: dict[int, list[str]] = {}
    with tempfile.TemporaryDirectory() as home:
        servers = LocalServers(Path(home))
        for tokens in (0, args.batch_tokens):
            endpoint = servers.start(model, name=f"base-{tokens}", kind="base", batch_tokens=tokens)
            (record,) = [r for r in servers.records() if r["name"] == endpoint.name]
            try:
                burst(endpoint, prompts[:2], args.max_tokens)  # warm: the first request sets up generation
                latencies, answers[tokens], wall = burst(endpoint, prompts, args.max_tokens)
                latencies.sort()
                p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
                print(
                    json.dumps(
                        {
                            "batch_tokens": tokens,
                            "clients": len(prompts),
                            "p50_s": round(statistics.median(latencies), 2),
                            "p95_s": round(p95, 2),
                            "burst_s": round(wall, 2),
                            "peak_rss_mb": round(peak_rss(record["pid"]) / MB),
                        }
                    ),
                    flush=True,
                )
            finally:
                servers.stop(endpoint.name)
    same = sum(a == b for a, b in zip(answers[0], answers[args.batch_tokens], strict=True))
    print(json.dumps({"same_answers": same, "of": len(prompts)}))


_ADAPTERS = r"""
import json, sys
from pathlib import Path
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
def rss():
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) * 1024
model_dir, n, rank, alpha, targets = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
out = {"base": rss()}
config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets.split(","), task_type="CAUSAL_LM")
model = get_peft_model(base, config, adapter_name="visitor-0")
for i in range(1, n):
    model.add_adapter(f"visitor-{i}", config)
model.eval()
out["with_adapters"] = rss()
out["adapter_params"] = sum(p.numel() for name, p in model.named_parameters() if "visitor-0" in name)
print(json.dumps(out))
"""


def adapters(args: argparse.Namespace) -> None:
    from playground.api import DEFAULT_BLUEPRINT
    from playground.blueprints import get_blueprint
    from playground.serving.local import LocalServers

    model = base_model_dir()
    blueprint = get_blueprint(DEFAULT_BLUEPRINT)
    method, defaults = blueprint.method, blueprint.defaults()
    rank, alpha = defaults.get("lora_rank", method.rank), defaults.get("lora_alpha", method.alpha)
    targets = ",".join(method.target_modules)
    command = [sys.executable, "-c", _ADAPTERS, model, str(args.visitors), str(rank), str(alpha), targets]
    shared = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    with tempfile.TemporaryDirectory() as home:  # one real server, as each visitor's merged model runs today
        servers = LocalServers(Path(home))
        endpoint = servers.start(model, name="one-merged", kind="fine-tuned")
        (record,) = [r for r in servers.records() if r["name"] == endpoint.name]
        try:
            burst(endpoint, visitor_prompts(2), 64)
            per_server = peak_rss(record["pid"])
        finally:
            servers.stop(endpoint.name)
    n = args.visitors
    print(
        json.dumps(
            {
                "visitors": n,
                "lora": f"rank {rank} on {targets}",
                "adapter_params": shared["adapter_params"],
                "one_base_mb": round(shared["base"] / MB),
                "one_base_plus_adapters_mb": round(shared["with_adapters"] / MB),
                "per_adapter_mb": round((shared["with_adapters"] - shared["base"]) / n / MB, 1),
                "one_merged_server_mb": round(per_server / MB),
                "merged_servers_mb": round(n * per_server / MB),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    b = sub.add_parser("batching")
    b.add_argument("--clients", type=int, default=20)
    b.add_argument("--batch-tokens", type=int, default=4096)
    b.add_argument("--max-tokens", type=int, default=64)
    a = sub.add_parser("adapters")
    a.add_argument("--visitors", type=int, default=16)
    args = parser.parse_args()
    batching(args) if args.what == "batching" else adapters(args)


if __name__ == "__main__":
    main()
