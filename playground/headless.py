"""The headless path now lives in :mod:`playground.e2e.headless`; this module keeps ``playground.headless``
importable for notebooks written before the move (``from playground.headless import run_blueprint``)."""

from __future__ import annotations

import sys

from playground.e2e.headless import (
    FROM_CONFIG,
    FROM_CONFIG_ROWS,
    RESULT_FILE,
    STANDIN,
    STANDIN_ROWS,
    HeadlessResult,
    QualityCheck,
    ask,
    build_standins,
    needs_local_build,
    run_blueprint,
    run_headless,
    standin_arch,
    write_result,
)

__all__ = [
    "FROM_CONFIG",
    "FROM_CONFIG_ROWS",
    "RESULT_FILE",
    "STANDIN",
    "STANDIN_ROWS",
    "HeadlessResult",
    "QualityCheck",
    "ask",
    "build_standins",
    "needs_local_build",
    "run_blueprint",
    "run_headless",
    "standin_arch",
    "write_result",
]

if __name__ == "__main__":  # pragma: no cover - convenience: python -m playground.headless ID [OUT_DIR]
    run_blueprint(sys.argv[1], out_dir=sys.argv[2] if len(sys.argv) > 2 else ".")
