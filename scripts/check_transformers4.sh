#!/usr/bin/env bash
# Load a model directory with transformers 4.57.6 (the 4.x line KServe's HuggingFace runtime images
# still ship) exactly as KServe does, and chat with it: scripts/kserve_style_load.py in a venv that
# shares this environment's packages but has transformers 4.57.6 (+ the hub and tokenizers it pins).
# Usage: bash scripts/check_transformers4.sh MODEL_DIR [PROMPT ...]    (venv kept in $TF4_VENV)
set -euo pipefail
venv="${TF4_VENV:-${TMPDIR:-/tmp}/playground-transformers4}"
if [ ! -x "$venv/bin/python" ]; then
  python -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    transformers==4.57.6 huggingface-hub==0.36.2 tokenizers==0.22.2
fi
exec "$venv/bin/python" "$(dirname "$0")/kserve_style_load.py" "$@"
