"""A visitor kernel's memory while it shows a finished job (issue 62).

Starts a real IPython kernel (jupyter_client, as Voila does), runs the app notebook's cells in it
(notebooks/playground.ipynb: the imports, the request, ``App(...)``) against ``--home`` (a
PLAYGROUND_HOME holding at least one job: the page reattaches the newest), waits until the monitor
has replayed the job and the serve/chat panel is up, then reports the kernel's RSS and USS and
whether torch, transformers or pandas were imported. With ``--visitor`` the page is a booth
visitor's (booth mode, the visitor's signed cookie in the kernel's environment, as Voila gives it):
the job must be that visitor's. Without it, the operator's page.

    python benchmarks/kernel_memory.py --home /path/to/playground-home [--visitor v-0123456789abcdef] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import nbformat
import psutil
from jupyter_client.manager import KernelManager

REPO = Path(__file__).resolve().parents[1]
SETTLE_SECONDS = 5.0  # after the job is shown: the monitor's threads idle, the chart's first draw done

PROBE = """
import gc, json, sys
from widgets.app import App
apps = [o for o in gc.get_objects() if isinstance(o, App)]
shown = bool(apps) and apps[0].monitor.wait(120) and bool(apps[0].monitor.job_id)
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "peft", "vllm", "pandas", "mlflow"})
print(json.dumps({"shown": shown, "job": apps[0].monitor.job_id if apps else "", "heavy": heavy,
                  "chat": apps[0].chat is not None if apps else False}))
"""


def run_cell(client, code: str, timeout: float = 240) -> str:
    """Execute ``code`` in the kernel; its stdout (an error raises)."""
    msg_id = client.execute(code)
    out: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        msg = client.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content["name"] == "stdout":
            out.append(content["text"])
        elif kind == "error":
            raise RuntimeError("\n".join(content["traceback"])[-2000:])
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(out)


def measure(home: Path, visitor: str | None) -> dict:
    env = {**os.environ, "PLAYGROUND_HOME": str(home), "PYTHONPATH": str(REPO), "PLAYGROUND_BOOTH": "0"}
    if visitor:
        from voila_app.identity import COOKIE_NAME, SECRET_ENV, sign

        secret = "kernel-memory-" + "0123456789abcdef" * 2
        env.update(
            {"PLAYGROUND_BOOTH": "1", SECRET_ENV: secret, "HTTP_COOKIE": f"{COOKIE_NAME}={sign(secret, visitor)}"}
        )
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(env=env, cwd=str(REPO / "notebooks"))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        notebook = nbformat.read(REPO / "notebooks" / "playground.ipynb", as_version=4)
        for cell in notebook.cells:
            if cell.cell_type == "code":
                run_cell(client, cell.source)
        probe = json.loads(run_cell(client, PROBE).strip().splitlines()[-1])
        time.sleep(SETTLE_SECONDS)
        kernel = psutil.Process(manager.provisioner.process.pid)
        info = kernel.memory_full_info()
        return {**probe, "rss_mb": info.rss / 2**20, "uss_mb": info.uss / 2**20}
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a PLAYGROUND_HOME holding a finished job")
    parser.add_argument("--visitor", help="a booth visitor id owning a job in --home (default: the operator's page)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = [measure(args.home, args.visitor) for _ in range(args.runs)]
    for result in results:
        print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in result.items()}))
    rss = [r["rss_mb"] for r in results]
    uss = [r["uss_mb"] for r in results]
    print(f"kernel RSS median {statistics.median(rss):.0f} MB (min {min(rss):.0f}, max {max(rss):.0f}); "
          f"USS median {statistics.median(uss):.0f} MB; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    allowed = set() if args.visitor else {"pandas", "mlflow"}  # the operator's page reads MLflow runs
    if any(set(r["heavy"]) - allowed for r in results) or not all(r["shown"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
