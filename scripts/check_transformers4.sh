#!/usr/bin/env bash
# Check that model directories give token-identical greedy answers on the installed transformers (5.x) and
# on transformers 4.57.x (the 4.x line KServe's HuggingFace runtime images still ship), loaded as KServe
# loads them; exits 1 naming the directory, the prompt and the first differing token.
# Usage: bash scripts/check_transformers4.sh MODEL_DIR [MODEL_DIR ...] [--prompt TEXT ...] [--max-new-tokens N]
# transformers 4.57.x is installed once (pip --target, this interpreter's torch reused) into a cache
# ($PLAYGROUND_TF4_CACHE, default ~/.cache/blueprint-playground/transformers4) and reused afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" -m playground.models.fidelity "$@"
