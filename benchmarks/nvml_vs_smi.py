"""Check the GPU figures of an e2e run's ``metrics.json`` (NVML, sampled by ``playground e2e`` every second)
against ``nvidia-smi`` sampled independently in the same run:

    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,nounits -lms 200 > smi.csv &
    playground e2e --profile gpu-config --out e2e-out ; kill %1
    python benchmarks/nvml_vs_smi.py e2e-out/metrics.json smi.csv [--json out.json]

For the whole run and for each notebook (its own time window) it prints the GPU utilisation average and
peak and the peak memory used from both sources, and their differences. Both read the same driver counters
(NVML is what nvidia-smi calls), so the figures should agree to within what the different sampling instants
and periods explain: utilisation averages within a few points, peak memory within a few tens of MiB.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any


def read_smi(path: Path) -> list[tuple[float, float, int]]:
    """(epoch seconds, utilisation %, memory used bytes) per sample of every GPU row."""
    rows = []
    with path.open() as fh:
        for record in csv.reader(fh):
            if not record or record[0].strip().startswith("timestamp"):
                continue
            try:
                stamp, util, mem = (x.strip() for x in record[:3])
                clock, _, frac = stamp.partition(".")
                epoch = time.mktime(time.strptime(clock, "%Y/%m/%d %H:%M:%S")) + float(f"0.{frac or 0}")
                rows.append((epoch, float(util.rstrip(" %")), int(float(mem.split()[0]) * 2**20)))
            except ValueError:
                continue  # a partial last line when the sampler was killed
    return rows


def window(rows: list[tuple[float, float, int]], start: float, seconds: float) -> dict[str, Any]:
    inside = [r for r in rows if start <= r[0] <= start + seconds]
    if not inside:
        return {"samples": 0}
    utils = [r[1] for r in inside]
    return {
        "samples": len(inside),
        "gpu_util_avg_percent": round(sum(utils) / len(utils), 2),
        "gpu_util_peak_percent": max(utils),
        "gpu_memory_peak_bytes": max(r[2] for r in inside),
    }


def compare(nvml: dict[str, Any], smi: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"nvml": nvml, "nvidia_smi": smi}
    for key in ("gpu_util_avg_percent", "gpu_util_peak_percent", "gpu_memory_peak_bytes"):
        a, b = nvml.get(key), smi.get(key)
        out[f"diff_{key}"] = None if a is None or b is None else round(a - b, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=Path, help="the e2e run's metrics.json")
    parser.add_argument("smi", type=Path, help="nvidia-smi CSV (timestamp, utilization.gpu, memory.used)")
    parser.add_argument("--json", type=Path, help="also write the comparison here")
    args = parser.parse_args(argv)
    metrics = json.loads(args.metrics.read_text())
    rows = read_smi(args.smi)
    if not rows:
        print(f"{args.smi}: no nvidia-smi samples", file=sys.stderr)
        return 1
    keys = ("gpu_util_avg_percent", "gpu_util_peak_percent", "gpu_memory_peak_bytes", "samples")
    report: dict[str, Any] = {
        "run": compare(
            {k: metrics["resources"].get(k) for k in keys},
            window(rows, metrics["started_at"], metrics["wall_seconds"]),
        ),
        "notebooks": {},
    }
    for nb in metrics["notebooks"]:
        nvml = {k: nb.get(k) for k in keys}
        report["notebooks"][nb["name"]] = compare(nvml, window(rows, nb["started_at"], nb["wall_seconds"]))
    print(f"{'window':32} {'source':10} {'util avg':>8} {'util peak':>9} {'mem peak MiB':>12} {'samples':>7}")
    for name, entry in [("whole run", report["run"]), *report["notebooks"].items()]:
        for source in ("nvml", "nvidia_smi"):
            f = entry[source]
            mem = f.get("gpu_memory_peak_bytes")
            print(
                f"{name:32} {source:10} {f.get('gpu_util_avg_percent') or 0:8.1f} "
                f"{f.get('gpu_util_peak_percent') or 0:9.0f} {(mem or 0) / 2**20:12.0f} {f.get('samples') or 0:7}"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
