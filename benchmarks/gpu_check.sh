#!/usr/bin/env bash
# The one prepared GPU check (one CUDA GPU with Transformer Engine, e.g. an H200):
#   1. `pytest -m gpu -q` (TE fused RoPE vs unfused, TE EndPrompt model at bf16);
#   2. benchmarks/bench_step_time.py at bf16 with the TE layer spec on a ~1B Llama
#      (Llama-3.2-1B shape: h 2048, 16 layers, 32 heads / 8 KV groups, SwiGLU 8192, vocab
#      128256, tied embeddings): EndPrompt at P=8192 vs stock at P (overhead), and vs full-length
#      training at L=32768 (ratio 4): tokens/s, MFU (989 TFLOP/s bf16 dense), peak memory.
# Uses the Python environment already on the machine (torch + TE + megatron-core 0.19) and only
# installs this package into it. Run from anywhere:  bash benchmarks/gpu_check.sh
# Logs and JSON go to $OUT (the device tool's output folder) or benchmarks/out.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python || command -v python3)}
OUTDIR=${OUT:-benchmarks/out}
mkdir -p "$OUTDIR"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -m pip install -q -e . --no-deps || exit 1
"$PY" -c "import torch, transformer_engine as te, megatron.core as mc; \
print('torch', torch.__version__, 'TE', te.__version__, 'mcore', mc.__version__, \
torch.cuda.get_device_name())" || exit 1

timeout 240 "$PY" -m pytest -m gpu -q 2>&1 | tee "$OUTDIR/pytest_gpu.log"
rc_test=${PIPESTATUS[0]}

timeout 420 "$PY" benchmarks/bench_step_time.py --device cuda \
    --hidden 2048 --layers 16 --heads 32 --groups 8 --ffn 8192 --vocab 128256 --tie-embeddings \
    --seq-length 8192 --ratio 4 --micro-batch 2 --long-micro-batch 1 \
    --iters 10 --warmup 3 --iters-long 3 --peak-tflops 989 \
    --out "$OUTDIR/step_time_gpu.json" 2>&1 | grep -v -i "warn" | tee "$OUTDIR/step_time_gpu.log"
rc_bench=${PIPESTATUS[0]}

echo "pytest -m gpu rc=$rc_test  bench_step_time rc=$rc_bench"
[ "$rc_test" -eq 0 ] && [ "$rc_bench" -eq 0 ]
