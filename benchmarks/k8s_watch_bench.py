"""Kubernetes backend watch cost, on the kmock-based emulator (tests/_k8s_sim.py) in a child process.

1. API requests per watching session per minute in steady state (goal <= 2), counted by the API
   server, against the kubeflow SDK's ``wait_for_job_status`` polling the same kind of job.
2. N concurrent sessions (default 200), each submitting a job and following it to the end with
   ``KubernetesBackend.events(follow=True)``: errors, jobs that ended Succeeded, and the memory
   (RSS) and threads the sessions take in this process.

    python benchmarks/k8s_watch_bench.py [--sessions 200] [--window 60] [--sdk-sessions 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def counts(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/debug/counts", timeout=30) as resp:
        return json.loads(resp.read())


def kubeconfig(url: str, path: Path) -> Path:
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "sim", "cluster": {"server": url}}],
                "users": [{"name": "dev", "user": {"token": "bench"}}],
                "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "dev", "namespace": "bench"}}],
                "current-context": "sim",
            }
        )
    )
    return path


def start_cluster(steps: int, line_delay: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "_k8s_sim.py"), "--steps", str(steps), "--line-delay", str(line_delay)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit(f"the emulator did not start: {url!r}")
    return proc, url


def requests_between(url: str, before: dict[str, int], after: dict[str, int]) -> int:
    return after.get("total", 0) - before.get("total", 0)


def sdk_polling_rate(url: str, kc: Path, window: float, sessions: int) -> float:
    """Requests per session per minute of the SDK's wait_for_job_status (polling_interval=2)."""
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    from playground.api import make_request
    from playground.backends.kubernetes import KubernetesBackend

    backend = KubernetesBackend(kubeconfig=str(kc))
    names = [backend.submit(make_request("tiny-llama-cpu")).id for _ in range(sessions)]
    clients = [TrainerClient(KubernetesBackendConfig(namespace="bench", config_file=str(kc))) for _ in names]
    stop = threading.Event()

    failures: list[str] = []

    def poll(client, name: str) -> None:
        try:
            client.wait_for_job_status(name, timeout=int(window) + 30, polling_interval=2)
        except TimeoutError:
            pass
        except Exception as exc:  # reported: the figure is only valid if the SDK kept polling
            failures.append(f"{type(exc).__name__}: {exc} ({exc.__cause__!r})")

    time.sleep(3)
    before = counts(url)
    threads = [threading.Thread(target=poll, args=(c, n), daemon=True) for c, n in zip(clients, names, strict=True)]
    for t in threads:
        t.start()
    time.sleep(window)
    after = counts(url)
    stop.set()
    for failure in failures[:3]:
        print("  SDK polling failed: " + failure[:300])
    return requests_between(url, before, after) / sessions / (window / 60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--window", type=float, default=60.0, help="steady-state measuring window (s)")
    parser.add_argument("--sdk-sessions", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1000, help="steps per simulated job (a progress line every 5)")
    parser.add_argument("--line-delay", type=float, default=1.0, help="seconds between a job's log lines")
    args = parser.parse_args()

    import logging

    logging.disable(logging.WARNING)
    from playground.api import make_request
    from playground.backends.kubernetes import KubernetesBackend
    from playground.events import JobPhase, Phase

    # a job lasts steps/5 * line_delay seconds: long enough to cover setup + the window
    proc, url = start_cluster(args.steps, args.line_delay)
    tmp = Path(tempfile.mkdtemp())
    kc = kubeconfig(url, tmp / "kubeconfig")
    try:
        print(f"emulator: {url}  sessions: {args.sessions}  window: {args.window:.0f}s  (2 shared cores: noisy)")
        warm = KubernetesBackend(kubeconfig=str(kc))
        warm.list()  # imports and the first connection out of the way
        rss0, threads0 = rss_mib(), threading.active_count()

        results: dict[int, list] = {}
        errors: list[str] = []
        backends = [KubernetesBackend(kubeconfig=str(kc), drain_timeout=30) for _ in range(args.sessions)]
        streaming = threading.Semaphore(0)

        def session(i: int) -> None:
            try:
                backend = backends[i]
                job = backend.submit(make_request("tiny-llama-cpu", labels={"session": f"s{i}"}))
                events = []
                for n, event in enumerate(backend.events(job.id, follow=True)):
                    events.append(event)
                    if n == 0:
                        streaming.release()
                results[i] = events
            except Exception as exc:  # counted and printed
                errors.append(f"session {i}: {type(exc).__name__}: {exc}")
                streaming.release()

        t0 = time.monotonic()
        threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(args.sessions)]
        for t in threads:
            t.start()
        for _ in threads:
            streaming.acquire()
        time.sleep(5)  # every session has its watches and log stream open
        setup = time.monotonic() - t0
        rss1, threads1 = rss_mib(), threading.active_count()
        c0 = counts(url)
        time.sleep(args.window)
        c1 = counts(url)
        rss2 = rss_mib()
        steady = requests_between(url, c0, c1) / args.sessions / (args.window / 60)
        for t in threads:
            t.join(args.steps / 5 * args.line_delay + 600)
        total = time.monotonic() - t0
        succeeded = sum(
            1 for ev in results.values() if ev and isinstance(ev[-1], Phase) and ev[-1].phase == JobPhase.SUCCEEDED
        )
        c2 = counts(url)
        per_session_total = requests_between(url, {}, c2) / args.sessions
        print(f"sessions started and streaming in {setup:.1f}s; all finished in {total:.1f}s")
        print(f"steady state: {steady:.2f} API requests per session per minute (window {args.window:.0f}s)")
        by_kind = {k: v - c0.get(k, 0) for k, v in c1.items() if k != "total" and v - c0.get(k, 0)}
        print(f"  requests in the window by (verb|resource|kind): {by_kind or 'none'}")
        print(f"whole job per session (submit, follow to the end): {per_session_total:.1f} requests")
        print(f"sessions: {args.sessions}, succeeded: {succeeded}, errors: {len(errors)}")
        for line in errors[:5]:
            print("  " + line)
        print(
            f"memory: {rss1 - rss0:.1f} MiB for {args.sessions} following sessions "
            f"({(rss1 - rss0) / args.sessions * 1024:.0f} KiB each; {rss2 - rss0:.1f} MiB after the window); "
            f"threads: {threads1 - threads0} ({(threads1 - threads0) / args.sessions:.1f} per session)"
        )
        sdk = sdk_polling_rate(url, kc, min(args.window, 30), args.sdk_sessions)
        print(f"kubeflow SDK wait_for_job_status(polling_interval=2): {sdk:.1f} requests per session per minute")
    finally:
        proc.stdin.close()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
