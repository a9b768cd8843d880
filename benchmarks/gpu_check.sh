#!/usr/bin/env bash
# The one prepared GPU check: one CUDA GPU (e.g. an H200), at most 8 minutes, one JSON.
#
#   bash benchmarks/gpu_check.sh                  # on the GPU machine
#   bash benchmarks/gpu_check.sh --dry-run        # anywhere: prepare, print every command, JSON
#   bash benchmarks/gpu_check.sh --fetch-wheels   # here (registry access): wheels into .whl/
#
# Stages (benchmarks/gpu/check.py; each recorded in the JSON whether or not the others fail):
#   env          versions; runtime.install() on the GPU: wheel fixes + TE RoPE router, no CPU layer
#   pytest_gpu   pytest -m gpu tests/gpu
#   bench        ~1B Llama (Llama-3.2-1B shape), TE spec, bf16, fused RoPE, recompute: EndPrompt at
#                P=8192 vs full-length at L=65536: step time and max_memory_allocated ratios, FLOP ideal
#   train_shared / train_mixed
#                20 iterations of python -m megatron_endprompt.training.pretrain (torchrun, NCCL,
#                TE spec, bf16, TE fused RoPE) on fixed- and random-placement EndPrompt prefixes
#   plan         benchmarks/step_time/plan_vs_measured.py: the run planner's activation/peak
#                prediction beside the measured max_memory_allocated (P=8192 and L=32768), to
#                calibrate it
# Output: $OUT/gpu_check.json (the device tool's folder) or benchmarks/out/gpu_check.json, plus
# one log per stage and step_time_gpu.json beside it.
#
# The machine's own Python is used (torch with CUDA; Transformer Engine if it has it). This
# checkout's package is put on PYTHONPATH (no install step). A missing megatron-core (or pytest)
# is installed from wheels carried in .whl/ (see --fetch-wheels) into a scratch folder.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python)}
OUTDIR=${OUT:-benchmarks/out}
mkdir -p "$OUTDIR"

if [ "${1:-}" = "--fetch-wheels" ]; then
  # Wheels for an x86-64 Python 3.12 GPU machine without megatron-core; carry .whl with the run.
  EXCLUDE=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$EXCLUDE")"
  grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "${WHEEL_DIR:-.whl}" \
      megatron-core==0.19.2 pytest==9.2.0 pluggy iniconfig packaging tqdm psutil
  exit $?
fi

if [ "${1:-}" != "--dry-run" ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
SITE=/tmp/gpu_check_site
if ! "$PY" -c "import megatron.core, pytest" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  echo "installing carried wheels from .whl/ into $SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl \
    && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_DEVICE_MAX_CONNECTIONS=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

# 470 s for the stages (their own limits fit inside), a hard stop just under 8 minutes in all.
timeout -k 5 475 "$PY" -m benchmarks.gpu.check --out-dir "$OUTDIR" "$@"
rc=$?
[ "$rc" -eq 124 ] && echo "gpu_check: hard time limit reached; see $OUTDIR/gpu_check.json"
exit "$rc"
