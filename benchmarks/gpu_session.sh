#!/usr/bin/env bash
# One bounded GPU session (how the GPU figures in benchmarks/README.md were taken): the environment,
# `playground e2e --profile gpu-config` with nvidia-smi sampling beside it (then NVML vs nvidia-smi),
# and benchmarks/gpu_blueprints.py with whatever time is left. Everything lands in $OUT.
#
#   OUT=gpu-out TOTAL_BUDGET=570 E2E_BUDGET=260 bash benchmarks/gpu_session.sh [gpu_blueprints.py args...]
#   E2E_ARGS="--jobs 3" E2E_NB_TIMEOUT=230 ...                 # the three notebooks at once, each <= 230 s
#   RUN_E2E=0 bash benchmarks/gpu_session.sh --arch llama      # the benchmark only
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TOTAL_BUDGET=${TOTAL_BUDGET:-570}
E2E_BUDGET=${E2E_BUDGET:-260}
PY=${PYTHON:-python3}

{
  date -u
  nvidia-smi
  $PY -c "import sys, torch, transformers, peft; print(sys.version); print('torch', torch.__version__, \
'cuda', torch.version.cuda, torch.cuda.get_device_name(0)); print('transformers', transformers.__version__, \
'peft', peft.__version__)"
  $PY -c "import playground; print('playground from', playground.__file__)"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ "${RUN_E2E:-1}" = 1 ]; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,nounits -lms 200 >"$OUT/smi.csv" &
  smi=$!
  timeout -k 10 "$E2E_BUDGET" $PY -m playground.cli e2e --profile gpu-config --out "$OUT/e2e" \
    --timeout "${E2E_NB_TIMEOUT:-$((E2E_BUDGET / 2))}" --timeout-cell "${E2E_NB_TIMEOUT:-$((E2E_BUDGET / 2))}" \
    ${E2E_ARGS:-}
  echo "e2e exit code: $?"
  kill "$smi"
  wait "$smi" 2>/dev/null
  $PY benchmarks/nvml_vs_smi.py "$OUT/e2e/metrics.json" "$OUT/smi.csv" --json "$OUT/nvml_vs_smi.json"
fi

if [ "${RUN_BENCH:-1}" = 1 ]; then
  left=$((TOTAL_BUDGET - SECONDS))
  echo "benchmark: ${left}s left"
  if [ "$left" -gt 90 ]; then
    timeout -k 10 "$left" $PY benchmarks/gpu_blueprints.py --out "$OUT/bench" --time-budget "$((left - 75))" "$@"
    echo "benchmark exit code: $?"
  fi
fi
echo "session: ${SECONDS}s"
