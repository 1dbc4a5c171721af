#!/usr/bin/env bash
# DPO and GRPO on one GPU (issue 22), in one bounded call: the GPU blueprints on the e2e gpu-config profile's
# models (full-size architectures, random init) trained with that profile's parameters (benchmarks/methods.py
# bars --gpu-config: the figures a bar for that profile must be set from), then the step rates of the
# playground's recipes against TRL's own DPOTrainer / GRPOTrainer on the same models (methods.py rates).
# Everything lands in $OUT (methods.jsonl: one JSON record per measurement).
#
#   OUT=gpu-out bash benchmarks/gpu_methods.sh
#   TINY=1 OUT=/tmp/gm bash benchmarks/gpu_methods.sh      # the same steps on tiny models, on a CPU (proves it)
#   BARS_ARGS="--extra grpo:warm_start_steps=100" ...       # more runs beside the blueprints' defaults
# Wheels a GPU image lacks (trl, datasets, dill, multiprocess, pydantic, platformdirs, pyarrow...) go under the
# interpreter's prefix, not /tmp: dill pickles packages outside it by value and datasets then fails to fingerprint
# (benchmarks/README.md, "DPO and GRPO on a GPU"):
#   T=$(python3 -c 'import sys; print(sys.prefix)')/carried; python3 -m pip install --no-deps --target $T w/*.whl
#   PYTHONPATH=$T bash benchmarks/gpu_methods.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PLAYGROUND_MLFLOW=0 # no run tracking: nothing to compare it with here
PY=${PYTHON:-python3}
MODELS=${MODELS:-$(mktemp -d)/models}
TINY_ARG=()
[ -n "${TINY:-}" ] && TINY_ARG=(--tiny)

{
  date -u
  nvidia-smi -L 2>&1 || echo "no nvidia-smi"
  $PY -c "import sys, torch, transformers, peft, trl, datasets; print(sys.version.split()[0], 'torch', torch.__version__,
'cuda' if torch.cuda.is_available() else 'cpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else '',
'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__, 'datasets',
datasets.__version__)"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

smi=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,nounits -lms 1000 >"$OUT/smi.csv" &
  smi=$!
fi
# shellcheck disable=SC2086  # BARS_ARGS / RATES_ARGS: several arguments
timeout -k 10 "${BARS_BUDGET:-330}" $PY benchmarks/methods.py bars --gpu-config "${TINY_ARG[@]}" --parallel \
  --models "$MODELS" --out "$OUT" ${BARS_ARGS:-} 2>"$OUT/bars.err"
echo "bars exit code: $? (${SECONDS}s)"
# shellcheck disable=SC2086
timeout -k 10 "${RATES_BUDGET:-180}" $PY benchmarks/methods.py rates --gpu-config "${TINY_ARG[@]}" --method all \
  --steps "${STEPS:-6}" --repeats "${REPEATS:-2}" --models "$MODELS" --out "$OUT" ${RATES_ARGS:-} 2>"$OUT/rates.err"
echo "rates exit code: $? (${SECONDS}s)"
[ -n "$smi" ] && kill "$smi"
echo "session: ${SECONDS}s"
