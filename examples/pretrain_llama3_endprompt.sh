#!/usr/bin/env bash
# EndPrompt: extend Llama-3 8B from 8K to 64K while training on 8K physical sequences.
#
#   [VAR=value ...] bash examples/pretrain_llama3_endprompt.sh [--dry-run] [--help] [MEGATRON FLAGS...]
#
# Run it once per node (torchrun starts GPUS_PER_NODE ranks); on SLURM use
# examples/slurm/pretrain_llama3_endprompt.sbatch, which does that with srun. `--help` lists every
# variable; `--dry-run` prints the resolved torchrun command and exits 0.
#
# Restarts: `--load $CHECKPOINT_OUT --pretrained-checkpoint $CHECKPOINT_IN --save $CHECKPOINT_OUT`.
# The first launch finds no checkpoint in CHECKPOINT_OUT and starts from the converted base
# (weights only, iteration 0); every later launch resumes from CHECKPOINT_OUT's latest save: model,
# optimizer, LR schedule, data position and RNG. Never pass `--load $CHECKPOINT_IN --finetune`:
# that restarts from the base at iteration 1 on every launch.
# Preemption: `--exit-signal-handler --exit-signal $EXIT_SIGNAL` makes Megatron save a checkpoint
# and exit cleanly at the next iteration boundary after the signal; this script forwards
# EXIT_SIGNAL to the workers (torchrun ignores it) and exits 0 once they have saved and exited.
#
# - A named layout (preprocessed with --name L64K -> PREFIX.L64K.endprompt): append
#   --endprompt-sidecar-name L64K. Short-context replay data must be named explicitly
#   (REPLAY_PREFIXES, passed as --endprompt-replay-prefixes): a prefix of DATA_BLEND without
#   the sidecar and not listed is refused.
#
# Sizing notes
# - Target 32K: TARGET_LENGTH=32768 PI_FACTOR=4 (s = ceil(L / L0) with L0 = 8192).
#   Target 128K: TARGET_LENGTH=131072 PI_FACTOR=16. Preprocess with the same --target-length.
#   Training memory and step time do not change with L: the physical length stays SEQ_LENGTH.
# - CP at evaluation lengths: training at P = 8192 needs no CP (CP=1). Evaluating (or
#   validating full-length text) at L does: attention activations grow with L. Split the sequence
#   with CP so that L / CP stays near the trained physical length, e.g. 64K: CP=8 (8K per rank)
#   or CP=4 (16K); 128K: CP=16 (or CP=8 with TP=8). CP needs TE attention on GPUs
#   (--transformer-impl transformer_engine), L divisible by 2*CP, and DP*TP*PP*CP = world size.
#   Without a GPU (append --transformer-impl local) CP runs on the CPU runtime's CP attention.
# - Llama-2 7B (4K window, RoPE base 10000, 32 heads, no GQA, vocab 32000, FFN 11008):
#   SEQ_LENGTH=4096 ORIGINAL_LENGTH=4096 TARGET_LENGTH=32768 PI_FACTOR=8 ROPE_BASE=10000 NUM_QUERY_GROUPS=32
#   FFN_HIDDEN=11008 TOKENIZER_TYPE=Llama2Tokenizer TOKENIZER=/models/llama2/tokenizer.model.
# - Mistral 7B v0.1 (8 KV heads, FFN 14336, vocab 32000, RoPE base 10000, 8K window):
#   FFN_HIDDEN=14336 NUM_QUERY_GROUPS=8 ROPE_BASE=10000, tokenizer as Llama-2.
# - TP>1 turns on --sequence-parallel when Transformer Engine is importable (SEQUENCE_PARALLEL=auto).
#   ~1B tokens at GBS 128 x 8192 = ~950 iterations.
# - Start-up checks (megatron_endprompt.training.launch_check) run before torchrun, for a real
#   launch and for --dry-run alike: bad values, missing paths/sidecars or a SPLIT that leaves a
#   split of the corpus empty end in one `error:` line, exit 2.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: [VAR=value ...] bash examples/pretrain_llama3_endprompt.sh [--dry-run] [--help] [FLAGS...]

Launches `torchrun -m megatron_endprompt.training.pretrain`, 8K -> 64K EndPrompt, for the model
CHECKPOINT_IN holds (Llama-3 8B when it has no conversion record).
Run once per node (examples/slurm/pretrain_llama3_endprompt.sbatch does it on SLURM). FLAGS are
extra Megatron flags appended last (they override the script's).

  --dry-run   run the start-up checks, print the resolved torchrun command (environment
              included) and exit 0; on a problem print one error line and exit 2
  The transformer implementation is the machine's: transformer_engine with a CUDA GPU and
  Transformer Engine, else local (a CPU runs as written); one note line says which.
  --help      this text

Required
  CHECKPOINT_IN     converted base model (tools/convert_checkpoint.py hf-to-megatron); used by
                    the first launch only (--pretrained-checkpoint)
  CHECKPOINT_OUT    save directory; every later launch resumes from it (--load, --save)
  TOKENIZER         HF tokenizer directory (or a SentencePiece .model, see TOKENIZER_TYPE)
  DATA_PREFIX       one preprocessed prefix (PREFIX.bin/.idx/.endprompt), or instead
  DATA_BLEND        a Megatron blend "W1 PREFIX1 W2 PREFIX2 ..." e.g.
                    "0.8 /data/ep_prefix 0.2 /data/replay_prefix" (replay = plain Megatron data)

Data and model
  REPLAY_PREFIXES   prefixes of DATA_BLEND that are plain replay data, passed as
                    --endprompt-replay-prefixes (default: none)
  TOKENIZER_TYPE    Megatron tokenizer type (HuggingFaceTokenizer)
  SEQ_LENGTH        P, physical length; usually L0, may be below it (8192)
  ORIGINAL_LENGTH   L0, the model's original window (--max-position-embeddings) (the
                    checkpoint's, else 8192)
  TARGET_LENGTH     L, the window trained for; >= ORIGINAL_LENGTH (L = L0: s = 1, the model's
                    own window); must match the sidecars (65536)
  PI_FACTOR         s, RoPE positions divided by s (unset: ceil(L / L0); PI_FACTOR x L0 >= L)
  SIDECAR_NAME      named layout: read PREFIX.NAME.endprompt (unset: PREFIX.endprompt)
  SPLIT             Megatron --split train,valid,test (998,1,1); small corpora need e.g. 90,5,5
  SEED              --seed (1234)
  The model (layers, hidden, heads, KV groups, FFN, norm epsilon, RoPE base, tied embeddings)
  is CHECKPOINT_IN's: hf-to-megatron records it beside the checkpoint
  (endprompt_conversion.json) and no model flag is needed; a variable or extra flag that
  contradicts it is refused. Without that record, Llama-3 8B with:
  ROPE_BASE         RoPE base; Llama-3 keeps 500000 (500000)
  NUM_QUERY_GROUPS  KV heads (8)            FFN_HIDDEN   FFN size (14336)
  PRECISION         bf16, fp16 or fp32 (fp32: no --bf16/--fp16) (bf16)

Parallelism and launch (torchrun)
  NNODES (SLURM_NNODES or 1)   NODE_RANK (SLURM_NODEID or 0)   GPUS_PER_NODE (8)
  MASTER_ADDR (localhost)      MASTER_PORT (6000)
  TP (4)  PP (1)  CP (1)       CP>1 needs Transformer Engine on GPUs (on CPU: the runtime's)
  SEQUENCE_PARALLEL (auto)     1/0; auto: on when TP>1 and Transformer Engine is importable
  PYTHON (torchrun's python)   interpreter that runs the start-up checks

Optimisation
  MICRO_BATCH (1)  GLOBAL_BATCH (128)  TRAIN_ITERS (950, ~1B tokens)  LR (2e-5)
  WARMUP_ITERS (20, below TRAIN_ITERS)

LoRA (unset LORA_RANK: full fine-tuning)
  LORA_RANK           adapters of this rank on the linears; the base is frozen
  LORA_ALPHA          the adapters add (alpha / rank) B A x (LORA_RANK)
  LORA_DROPOUT        dropout on the adapters' input (0)
  LORA_TARGETS        linears with adapters (linear_qkv linear_proj linear_fc1 linear_fc2)
  LORA_ADAPTERS_ONLY  1: checkpoints hold the adapters only; resumes read the base from
                      CHECKPOINT_IN (0)

Checkpoints, logging, preemption
  SAVE_INTERVAL       iterations between saves (200)
  EVAL_INTERVAL (200)  EVAL_ITERS (8)  LOG_INTERVAL (1)
  TENSORBOARD_DIR     TensorBoard logs ($CHECKPOINT_OUT/tensorboard)
  LOG_DIR             the launch log, every rank's output with Megatron's argument table and
                      the library warnings kept off the console ($CHECKPOINT_OUT/logs)
  WANDB_PROJECT       W&B project; unset: no W&B. WANDB_EXP_NAME (basename of CHECKPOINT_OUT)
  EXIT_DURATION_MINS  save and exit after this many minutes (unset: no limit); set it a little
                      under the job's time limit
  EXIT_SIGNAL         signal on which Megatron saves and exits (SIGTERM; the sbatch uses SIGUSR1)
                      (forwarded by this script to the workers; after their save: exit 0)
  STOP_POLL_SECONDS   after a stop request, how often a worker still starting up is checked
                      for Megatron's handler, to get the signal once it has one (2)
  STOP_GRACE          seconds after the last worker got EXIT_SIGNAL (or after the request,
                      while a worker is still starting) before torchrun is shut down if it
                      still runs; the launch then exits non-zero (1800: a save and teardown
                      may take minutes)
  SHUTDOWN_TIMEOUT    seconds torchrun waits for workers after forwarding another signal (600)
EOF
}

DRY_RUN=0
EXTRA=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) EXTRA+=("$arg") ;;
  esac
done

missing=()
for var in CHECKPOINT_IN CHECKPOINT_OUT TOKENIZER; do
  case "${!var:-}" in   # a planner's paste line holds CHECKPOINT_IN='<...>' until it is filled in
    "") missing+=("$var") ;;
    "<"*">") missing+=("$var (a placeholder: ${!var})") ;;
  esac
done
if [ -z "${DATA_PREFIX:-}" ] && [ -z "${DATA_BLEND:-}" ]; then missing+=("DATA_PREFIX or DATA_BLEND"); fi
if [ -n "${DATA_PREFIX:-}" ] && [ -n "${DATA_BLEND:-}" ]; then
  echo "error: set DATA_PREFIX or DATA_BLEND, not both" >&2; exit 2
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$DRY_RUN" = 1 ]; then
    shape=
    case "${missing[*]}" in CHECKPOINT_IN*) shape="; the model shown is the script's Llama-3 8B \
until CHECKPOINT_IN names a converted checkpoint" ;; esac
    (IFS=,; echo "note: not set: ${missing[*]} (shown as <NAME>)$shape" >&2)
  else
    (IFS=,; echo "error: set ${missing[*]} (see --help)" >&2); exit 2
  fi
fi
CHECKPOINT_IN=${CHECKPOINT_IN:-<CHECKPOINT_IN>}
CHECKPOINT_OUT=${CHECKPOINT_OUT:-<CHECKPOINT_OUT>}
TOKENIZER=${TOKENIZER:-<TOKENIZER>}
[ -n "${DATA_BLEND:-}" ] || DATA_PREFIX=${DATA_PREFIX:-<DATA_PREFIX>}

# the model's shape: taken from CHECKPOINT_IN's conversion record when it has one (the checks
# refuse a given value that contradicts it); these defaults (Llama-3 8B) apply otherwise
MODEL_VARS_GIVEN=
for var in ROPE_BASE NUM_QUERY_GROUPS FFN_HIDDEN ORIGINAL_LENGTH; do
  [ -z "${!var:-}" ] || MODEL_VARS_GIVEN+=" $var"
done

NNODES=${NNODES:-${SLURM_NNODES:-1}}
NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-0}}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
TP=${TP:-4}
PP=${PP:-1}
CP=${CP:-1}

TOKENIZER_TYPE=${TOKENIZER_TYPE:-HuggingFaceTokenizer}
SEQ_LENGTH=${SEQ_LENGTH:-8192}          # P: physical length (may be below L0, e.g. 4096)
ORIGINAL_LENGTH=${ORIGINAL_LENGTH:-8192} # L0: the model's original window (Llama-3: 8192)
TARGET_LENGTH=${TARGET_LENGTH:-65536}   # L
PI_FACTOR=${PI_FACTOR:-}                # s; unset: ceil(L / L0) (derived by the checks)
SIDECAR_NAME=${SIDECAR_NAME:-}
SPLIT=${SPLIT:-998,1,1}
SEED=${SEED:-1234}
SEQUENCE_PARALLEL=${SEQUENCE_PARALLEL:-auto}
if [ -z "${PYTHON:-}" ]; then   # the interpreter torchrun belongs to (the one with the package)
  TORCHRUN_BIN=$(command -v torchrun || true)
  PYTHON=python3
  if [ -n "$TORCHRUN_BIN" ] && [ -x "$(dirname "$TORCHRUN_BIN")/python" ]; then
    PYTHON="$(dirname "$TORCHRUN_BIN")/python"
  fi
fi
ROPE_BASE=${ROPE_BASE:-500000}          # Llama-3: keep 500000 (losing it breaks the model)
NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-8}
FFN_HIDDEN=${FFN_HIDDEN:-14336}
MICRO_BATCH=${MICRO_BATCH:-1}
GLOBAL_BATCH=${GLOBAL_BATCH:-128}
TRAIN_ITERS=${TRAIN_ITERS:-950}         # ~1B tokens at 128 x 8192 per step
LR=${LR:-2e-5}
WARMUP_ITERS=${WARMUP_ITERS:-20}
# the learning-rate schedule: the checks compare it with a run CHECKPOINT_OUT already holds
SCHEDULE_ARGS=(
  --train-iters "$TRAIN_ITERS" --global-batch-size "$GLOBAL_BATCH"
  --lr "$LR" --min-lr "$LR" --lr-decay-style constant --lr-warmup-iters "$WARMUP_ITERS"
  --weight-decay 0.0
)
SAVE_INTERVAL=${SAVE_INTERVAL:-200}
EVAL_INTERVAL=${EVAL_INTERVAL:-200}
EVAL_ITERS=${EVAL_ITERS:-8}
LOG_INTERVAL=${LOG_INTERVAL:-1}
TENSORBOARD_DIR=${TENSORBOARD_DIR:-$CHECKPOINT_OUT/tensorboard}
LOG_DIR=${LOG_DIR:-$CHECKPOINT_OUT/logs}
STOP_POLL_SECONDS=${STOP_POLL_SECONDS:-2}
STOP_GRACE=${STOP_GRACE:-1800}
EXIT_SIGNAL=${EXIT_SIGNAL:-SIGTERM}
SHUTDOWN_TIMEOUT=${SHUTDOWN_TIMEOUT:-600}
PRECISION=${PRECISION:-bf16}
case "$PRECISION" in
  bf16) PRECISION_ARGS=(--bf16) ;;
  fp16) PRECISION_ARGS=(--fp16) ;;
  fp32) PRECISION_ARGS=() ;;
  *) echo "error: PRECISION=$PRECISION: give bf16, fp16 or fp32" >&2; exit 2 ;;
esac

EXIT_SIGNAL=SIG${EXIT_SIGNAL#SIG}
if ! kill -l "$EXIT_SIGNAL" >/dev/null 2>&1; then
  echo "error: EXIT_SIGNAL=$EXIT_SIGNAL is not a signal name (e.g. SIGTERM, SIGUSR1)" >&2; exit 2
fi
case "$EXIT_SIGNAL" in   # no handler can catch these: Megatron could never save on them
  SIGKILL|SIGSTOP) echo "error: EXIT_SIGNAL=$EXIT_SIGNAL cannot be caught, so Megatron cannot save on it; use SIGTERM or SIGUSR1" >&2; exit 2 ;;
esac

# Validate every value (integers, layout, window, blend, paths, sidecars, split) before torchrun;
# prints the derived PI_FACTOR and SEQUENCE_PARALLEL as shell assignments.
CHECK_VARS=()
for var in NNODES NODE_RANK GPUS_PER_NODE MASTER_PORT TP PP CP SEQUENCE_PARALLEL MICRO_BATCH \
           GLOBAL_BATCH TRAIN_ITERS SEQ_LENGTH ORIGINAL_LENGTH TARGET_LENGTH PI_FACTOR \
           NUM_QUERY_GROUPS WARMUP_ITERS SAVE_INTERVAL EVAL_INTERVAL EVAL_ITERS LOG_INTERVAL SEED \
           SPLIT SIDECAR_NAME DATA_PREFIX DATA_BLEND REPLAY_PREFIXES TOKENIZER CHECKPOINT_IN \
           ROPE_BASE FFN_HIDDEN MODEL_VARS_GIVEN CHECKPOINT_OUT LR STOP_GRACE SHUTDOWN_TIMEOUT \
           STOP_POLL_SECONDS; do
  CHECK_VARS+=("$var=${!var:-}")
done
CHECK_VARS+=("SCHEDULE_FLAGS=${SCHEDULE_ARGS[*]}")
TRANSFORMER_IMPL=   # set by the checks: transformer_engine with a CUDA GPU and TE, else local
MODEL_FLAGS=()   # set by the checks from CHECKPOINT_IN's conversion record, if it has one
derived=$("$PYTHON" -m megatron_endprompt.cli.launch_check "${CHECK_VARS[@]}" -- "${EXTRA[@]}") \
  || exit 2   # EXTRA: unknown options (e.g. --dryrun) and flags contradicting the checkpoint refused
eval "$derived"
echo "note: --transformer-impl $TRANSFORMER_IMPL (${TRANSFORMER_IMPL_WHY:-})" >&2
if [ "${#MODEL_FLAGS[@]}" = 0 ]; then   # no record: Llama-3 8B
  MODEL_FLAGS=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size "$FFN_HIDDEN"
    --num-attention-heads 32 --group-query-attention --num-query-groups "$NUM_QUERY_GROUPS"
    --position-embedding-type rope --rotary-base "$ROPE_BASE"
    --normalization RMSNorm --norm-epsilon 1e-5 --swiglu --disable-bias-linear
    --untie-embeddings-and-output-weights --make-vocab-size-divisible-by 128
  )
fi

SEQ_PARALLEL=()
if [ "$SEQUENCE_PARALLEL" = 1 ]; then SEQ_PARALLEL=(--sequence-parallel); fi

MODEL_ARGS=(
  "${MODEL_FLAGS[@]}"
  --seq-length "$SEQ_LENGTH" --max-position-embeddings "$ORIGINAL_LENGTH"
  --attention-dropout 0 --hidden-dropout 0
  --tokenizer-type "$TOKENIZER_TYPE" --tokenizer-model "$TOKENIZER"
)
ENDPROMPT_ARGS=(
  --endprompt-target-length "$TARGET_LENGTH"
  --endprompt-original-length "$ORIGINAL_LENGTH"
  --endprompt-pi-factor "$PI_FACTOR"
)
if [ -n "$SIDECAR_NAME" ]; then ENDPROMPT_ARGS+=(--endprompt-sidecar-name "$SIDECAR_NAME"); fi
if [ -n "${REPLAY_PREFIXES:-}" ]; then
  # shellcheck disable=SC2206  # word splitting intended: a list of prefixes
  ENDPROMPT_ARGS+=(--endprompt-replay-prefixes $REPLAY_PREFIXES)
fi
if [ -n "${LORA_RANK:-}" ]; then   # LoRA: values checked by the entry (one error line)
  ENDPROMPT_ARGS+=(--endprompt-lora-rank "$LORA_RANK")
  if [ -n "${LORA_ALPHA:-}" ]; then ENDPROMPT_ARGS+=(--endprompt-lora-alpha "$LORA_ALPHA"); fi
  if [ -n "${LORA_DROPOUT:-}" ]; then ENDPROMPT_ARGS+=(--endprompt-lora-dropout "$LORA_DROPOUT"); fi
  # shellcheck disable=SC2206  # word splitting intended: a list of linears
  if [ -n "${LORA_TARGETS:-}" ]; then ENDPROMPT_ARGS+=(--endprompt-lora-targets $LORA_TARGETS); fi
  if [ "${LORA_ADAPTERS_ONLY:-0}" = 1 ]; then ENDPROMPT_ARGS+=(--endprompt-lora-adapters-only); fi
fi
TRAIN_ARGS=(
  --micro-batch-size "$MICRO_BATCH" "${SCHEDULE_ARGS[@]}" --seed "$SEED"
  --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95
  "${PRECISION_ARGS[@]}" --calculate-per-token-loss
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
  --transformer-impl "$TRANSFORMER_IMPL" --attention-backend auto
  --recompute-granularity selective
)
PARALLEL_ARGS=(
  --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP"
  --context-parallel-size "$CP" "${SEQ_PARALLEL[@]}"
)
if [ -n "${DATA_BLEND:-}" ]; then
  # shellcheck disable=SC2206  # word splitting intended: "W1 PREFIX1 W2 PREFIX2 ..."
  DATA_PATH=($DATA_BLEND)
else
  DATA_PATH=("$DATA_PREFIX")
fi
DATA_ARGS=(
  --data-path "${DATA_PATH[@]}" --split "$SPLIT" --num-workers 2
  --data-cache-path "$CHECKPOINT_OUT/data_cache"
)
CKPT_ARGS=(
  --load "$CHECKPOINT_OUT" --pretrained-checkpoint "$CHECKPOINT_IN"
  --save "$CHECKPOINT_OUT" --save-interval "$SAVE_INTERVAL" --ckpt-format torch_dist
  --exit-signal-handler --exit-signal "$EXIT_SIGNAL"
)
if [ -n "${EXIT_DURATION_MINS:-}" ]; then CKPT_ARGS+=(--exit-duration-in-mins "$EXIT_DURATION_MINS"); fi
LOG_ARGS=(
  --log-interval "$LOG_INTERVAL" --log-throughput --eval-interval "$EVAL_INTERVAL"
  --eval-iters "$EVAL_ITERS" --tensorboard-dir "$TENSORBOARD_DIR"
  --log-timers-to-tensorboard --log-validation-ppl-to-tensorboard
)
if [ -n "${WANDB_PROJECT:-}" ]; then
  LOG_ARGS+=(--wandb-project "$WANDB_PROJECT"
             --wandb-exp-name "${WANDB_EXP_NAME:-$(basename "$CHECKPOINT_OUT")}"
             --wandb-save-dir "$CHECKPOINT_OUT/wandb")
fi

# torchrun's own handling of a signal is a shutdown: it forwards the signal, waits, then raises
# (a traceback, exit 1) even when every worker saved and exited 0. So EXIT_SIGNAL is not
# torchrun's: torchrun ignores it, and this script forwards it to the workers (below) and exits
# with torchrun's status, 0 after Megatron's save. The other signals stay torchrun's.
FORWARDED=
for sig in SIGTERM SIGINT SIGHUP SIGQUIT; do   # torchrun's defaults
  [ "$sig" = "$EXIT_SIGNAL" ] || FORWARDED+="${FORWARDED:+,}$sig"
done
ENV=(
  CUDA_DEVICE_MAX_CONNECTIONS=1
  "PET_SIGNALS_TO_HANDLE=$FORWARDED"
  "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=$SHUTDOWN_TIMEOUT"
)
CMD=(
  torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$GPUS_PER_NODE"
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
  --tee 3 --log-dir "$LOG_DIR/torchrun" --log-line-prefix-template '[rank${rank}]: '
  -m megatron_endprompt.training.pretrain
  "${MODEL_ARGS[@]}" "${ENDPROMPT_ARGS[@]}" "${TRAIN_ARGS[@]}" "${PARALLEL_ARGS[@]}"
  "${DATA_ARGS[@]}" "${CKPT_ARGS[@]}" "${LOG_ARGS[@]}" "${EXTRA[@]}"
)

if [ "$DRY_RUN" = 1 ]; then
  printf '%q ' env "${ENV[@]}" "${CMD[@]}"
  echo
  exit 0
fi

# The console: torchrun tees each rank's output as whole lines tagged [rankN]: (no two ranks'
# text on one line) through megatron_endprompt.cli.launch_console, which writes everything to
# LOG_FILE and keeps Megatron's argument table and known library warnings off the console. A
# rank's one-line refusal (error: ...) ends the launch with that line and exit 2; torchrun's
# report of the failed ranks goes to the log only.
OUT_EXISTED=0; [ ! -d "$CHECKPOINT_OUT" ] || OUT_EXISTED=1
TB_EXISTED=0; [ ! -d "$TENSORBOARD_DIR" ] || TB_EXISTED=1
LOG_FILE="$LOG_DIR/train-$(date -u +%Y%m%dT%H%M%SZ)-node$NODE_RANK.log"
mkdir -p "$LOG_DIR"
PIPE_DIR=$(mktemp -d)
mkfifo "$PIPE_DIR/console"
echo "launch log (every rank's output, Megatron's arguments, library warnings): $LOG_FILE" >&2
(trap '' INT TERM HUP QUIT USR1 USR2
 "$PYTHON" -m megatron_endprompt.cli.launch_console "$LOG_FILE" && exit 0 || rc=$?
 [ "$rc" = 3 ] || cat   # the filter failed: the output still flows, unfiltered
 exit "$rc") < "$PIPE_DIR/console" &
CONSOLE_PID=$!

# A requested stop (EXIT_SIGNAL: the sbatch's SIGUSR1 before the time limit, or a kill): the
# workers get it from here (torchrun starts them in their own sessions, so a signal to this
# process group does not reach them), Megatron's --exit-signal-handler saves at the next
# iteration and the workers exit 0, and so does torchrun. Each worker gets it exactly once, when
# Megatron's handler is installed (its SigCgt in /proc): a worker still starting up ignores the
# signal (inherited from this script, as torchrun does), so it is checked again every
# STOP_POLL_SECONDS; a worker whose handler is gone (saved, exiting) is never sent it again,
# which would kill it mid-teardown. Without /proc each worker gets it once. If torchrun still
# runs STOP_GRACE seconds after the last worker got it (or after the request, while a worker
# never set its handler), torchrun is shut down (its own signal). Megatron logs "exiting
# program after receiving SIGTERM." whatever --exit-signal is.
STOP_REQUESTED=0
STOP_SENT_AT=
TORCHRUN_PID=
SENT=" "
SIGNUM=$(kill -l "${EXIT_SIGNAL#SIG}")
request_stop() { [ "$STOP_REQUESTED" != 0 ] || STOP_REQUESTED=1; }
handler_state() {   # PID: caught, ignored, default or unknown (EXIT_SIGNAL's disposition)
  local caught ignored
  caught=$(awk '/^SigCgt:/ {print $2}' "/proc/$1/status" 2>/dev/null) || true
  ignored=$(awk '/^SigIgn:/ {print $2}' "/proc/$1/status" 2>/dev/null) || true
  if [ -z "$caught" ] || [ -z "$ignored" ]; then echo unknown
  elif (( (0x$caught >> (SIGNUM - 1)) & 1 )); then echo caught
  elif (( (0x$ignored >> (SIGNUM - 1)) & 1 )); then echo ignored
  else echo default
  fi
}
send_stop() {
  local workers pid pending=0 sent=0
  workers=$(pgrep -P "$TORCHRUN_PID" 2>/dev/null \
            || ps -o pid= --ppid "$TORCHRUN_PID" 2>/dev/null || true)
  for pid in $workers; do
    case "$SENT" in *" $pid "*) continue ;; esac
    case $(handler_state "$pid") in
      caught|unknown) kill -s "${EXIT_SIGNAL#SIG}" "$pid" 2>/dev/null || true
                      SENT+="$pid "; sent=$((sent + 1)) ;;
      ignored) pending=$((pending + 1)) ;;   # still starting: its handler is not there yet
      default) ;;                              # its handler is gone: it is exiting
    esac
  done
  if [ "$STOP_REQUESTED" = 1 ]; then
    STOP_REQUESTED=2
    local starting=
    [ "$pending" = 0 ] || starting=", $pending still starting: sent once their handler is set"
    echo "$(date -u +%FT%TZ) $EXIT_SIGNAL: stop requested; forwarded to the workers" \
         "($sent$starting); Megatron saves a checkpoint and exits" >&2
  fi
  if [ "$sent" -gt 0 ] || [ -z "$STOP_SENT_AT" ]; then STOP_SENT_AT=$SECONDS; fi
  # a worker still starting counts too: one hung in start-up never sets the handler
  if [ "$STOP_REQUESTED" = 2 ] && [ $((SECONDS - STOP_SENT_AT)) -ge "$STOP_GRACE" ] \
     && [ -n "$FORWARDED" ]; then
    STOP_REQUESTED=3
    local never=
    [ "$pending" = 0 ] || never="; $pending still starting, never sent it"
    echo "$(date -u +%FT%TZ) workers still running ${STOP_GRACE} s after $EXIT_SIGNAL" \
         "(STOP_GRACE$never): shutting torchrun down" >&2
    kill -s "${FORWARDED%%,*}" "$TORCHRUN_PID" 2>/dev/null || true
  fi
}
trap '' "${EXIT_SIGNAL#SIG}"          # torchrun inherits "ignore" (it does not handle it)
env "${ENV[@]}" "${CMD[@]}" > "$PIPE_DIR/console" 2>&1 &
TORCHRUN_PID=$!
trap request_stop "${EXIT_SIGNAL#SIG}"
for sig in ${FORWARDED//,/ }; do   # torchrun's signals, sent to this script: pass them on
  # shellcheck disable=SC2064  # expand $sig now
  trap "kill -s ${sig#SIG} \$TORCHRUN_PID 2>/dev/null || true" "${sig#SIG}"
done
while kill -0 "$TORCHRUN_PID" 2>/dev/null; do
  if [ "$STOP_REQUESTED" = 0 ]; then
    wait "$TORCHRUN_PID" || true   # returns when torchrun exits or a trapped signal arrives
  else
    send_stop
    sleep "$STOP_POLL_SECONDS" & wait $! || true
  fi
done
wait "$TORCHRUN_PID" && rc=0 || rc=$?
wait "$CONSOLE_PID" && console_rc=0 || console_rc=$?   # the rest of the output, to its end
rm -rf "$PIPE_DIR"
if [ "$rc" != 0 ] && [ "$console_rc" = 3 ]; then
  # a rank refused the launch (its error line is above): no tensorboard/ when this launch
  # created it (Megatron's writer leaves an events file without events), and no
  # CHECKPOINT_OUT at all when this launch created it
  if [ "$TB_EXISTED" = 0 ]; then rm -rf "$TENSORBOARD_DIR"; fi
  rm -f "$LOG_FILE"
  if [ "$OUT_EXISTED" = 0 ]; then   # all of it is this launch's
    if [ "$LOG_DIR" = "$CHECKPOINT_OUT/logs" ]; then rm -rf "$LOG_DIR"; fi
    find "$CHECKPOINT_OUT" -depth -type d -empty -delete 2>/dev/null || true
  fi
  exit 2
fi
if [ "$STOP_REQUESTED" != 0 ]; then
  if [ "$rc" = 0 ]; then
    echo "$(date -u +%FT%TZ) stopped as requested ($EXIT_SIGNAL): checkpoint saved, exit 0" >&2
  else
    echo "$(date -u +%FT%TZ) $EXIT_SIGNAL stop: torchrun exited $rc (see $LOG_FILE)" >&2
  fi
fi
exit "$rc"
