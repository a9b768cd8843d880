#!/usr/bin/env bash
# EndPrompt: extend Llama-3 8B from 8K to 64K while training on 8K physical sequences.
#
# Run on every node (multi-node torchrun):
#   NNODES=4 NODE_RANK=0 MASTER_ADDR=node0 GPUS_PER_NODE=8 TP=4 PP=1 CP=1 \
#   CHECKPOINT_IN=/ckpt/llama3-8b-megatron CHECKPOINT_OUT=/ckpt/llama3-8b-endprompt-64k \
#   DATA_PREFIX=/data/slimpajama_endprompt TOKENIZER=/models/Meta-Llama-3-8B \
#   bash examples/pretrain_llama3_endprompt.sh
#
# CHECKPOINT_IN comes from `tools/convert_checkpoint.py hf-to-megatron` (torch_dist format);
# DATA_PREFIX from `tools/preprocess_endprompt.py --seq-length 8192 --target-length 65536 ...`
# (the run refuses a sidecar built for another --seq-length / target length).
# Extra Megatron flags can be appended: bash examples/pretrain_llama3_endprompt.sh --foo bar
# - A named layout (preprocessed with --name L64K -> PREFIX.L64K.endprompt): append
#   --endprompt-sidecar-name L64K. Short-context replay data must be named explicitly:
#   --data-path 0.8 EP_PREFIX 0.2 PLAIN_PREFIX --endprompt-replay-prefixes PLAIN_PREFIX
#   (a prefix without the sidecar and not listed is refused).
#
# Sizing notes
# - Target 32K: TARGET_LENGTH=32768 PI_FACTOR=4 (s = ceil(L / L0) with L0 = 8192).
#   Target 128K: TARGET_LENGTH=131072 PI_FACTOR=16. Preprocess with the same --target-length.
#   The physical length stays 8192, so memory and step time do not change with L.
# - Llama-2 7B (4K window, RoPE base 10000, 32 heads, no GQA, vocab 32000, FFN 11008):
#   SEQ_LENGTH=4096 TARGET_LENGTH=32768 PI_FACTOR=8 ROPE_BASE=10000 NUM_QUERY_GROUPS=32
#   FFN_HIDDEN=11008 VOCAB_ARGS as for a SentencePiece model (--tokenizer-type
#   Llama2Tokenizer --tokenizer-model tokenizer.model).
# - Mistral 7B v0.1 (8 KV heads, FFN 14336, vocab 32000, RoPE base 10000, 8K window):
#   FFN_HIDDEN=14336 NUM_QUERY_GROUPS=8 ROPE_BASE=10000, tokenizer as Llama-2.
# - CP>1 requires Transformer Engine (TE attention); TP>1 with --sequence-parallel is set
#   automatically. ~1B tokens at GBS 128 x 8192 = ~950 iterations (TRAIN_ITERS).
set -euo pipefail

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
TP=${TP:-4}
PP=${PP:-1}
CP=${CP:-1}

SEQ_LENGTH=${SEQ_LENGTH:-8192}          # P: physical length = the model's original window L0
TARGET_LENGTH=${TARGET_LENGTH:-65536}   # L
PI_FACTOR=${PI_FACTOR:-8}               # s = ceil(L / L0)
ROPE_BASE=${ROPE_BASE:-500000}          # Llama-3: keep 500000 (losing it breaks the model)
NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-8}
FFN_HIDDEN=${FFN_HIDDEN:-14336}
MICRO_BATCH=${MICRO_BATCH:-1}
GLOBAL_BATCH=${GLOBAL_BATCH:-128}
TRAIN_ITERS=${TRAIN_ITERS:-950}         # ~1B tokens at 128 x 8192 per step
LR=${LR:-2e-5}

: "${CHECKPOINT_IN:?set CHECKPOINT_IN to a Megatron checkpoint converted from HF}"
: "${CHECKPOINT_OUT:?set CHECKPOINT_OUT}"
: "${DATA_PREFIX:?set DATA_PREFIX to the preprocessed prefix (PREFIX.bin/.idx/.endprompt)}"
: "${TOKENIZER:?set TOKENIZER to the HF tokenizer directory}"

REPO=$(cd "$(dirname "$0")/.." && pwd)
export CUDA_DEVICE_MAX_CONNECTIONS=1

SEQ_PARALLEL=()
if [ "$TP" -gt 1 ]; then SEQ_PARALLEL=(--sequence-parallel); fi

MODEL_ARGS=(
  --num-layers 32 --hidden-size 4096 --ffn-hidden-size "$FFN_HIDDEN"
  --num-attention-heads 32 --group-query-attention --num-query-groups "$NUM_QUERY_GROUPS"
  --seq-length "$SEQ_LENGTH" --max-position-embeddings "$SEQ_LENGTH"
  --position-embedding-type rope --rotary-base "$ROPE_BASE"
  --normalization RMSNorm --norm-epsilon 1e-5 --swiglu --disable-bias-linear
  --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER"
  --make-vocab-size-divisible-by 128
)
ENDPROMPT_ARGS=(
  --endprompt-target-length "$TARGET_LENGTH"
  --endprompt-original-length "$SEQ_LENGTH"
  --endprompt-pi-factor "$PI_FACTOR"
)
TRAIN_ARGS=(
  --micro-batch-size "$MICRO_BATCH" --global-batch-size "$GLOBAL_BATCH"
  --train-iters "$TRAIN_ITERS"
  --lr "$LR" --min-lr "$LR" --lr-decay-style constant --lr-warmup-iters 20
  --weight-decay 0.0 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95
  --bf16 --calculate-per-token-loss
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
  --transformer-impl transformer_engine --attention-backend auto
  --recompute-granularity selective
)
PARALLEL_ARGS=(
  --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP"
  --context-parallel-size "$CP" "${SEQ_PARALLEL[@]}"
)
DATA_ARGS=(
  --data-path "$DATA_PREFIX" --split 998,1,1 --num-workers 2
  --data-cache-path "$CHECKPOINT_OUT/data_cache"
)
CKPT_ARGS=(
  --load "$CHECKPOINT_IN" --finetune --no-load-optim --no-load-rng
  --save "$CHECKPOINT_OUT" --save-interval 200 --ckpt-format torch_dist
  --log-interval 1 --eval-interval 200 --eval-iters 8
)

exec torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$GPUS_PER_NODE" \
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
  -m megatron_endprompt.training.pretrain \
  "${MODEL_ARGS[@]}" "${ENDPROMPT_ARGS[@]}" "${TRAIN_ARGS[@]}" "${PARALLEL_ARGS[@]}" \
  "${DATA_ARGS[@]}" "${CKPT_ARGS[@]}" "$@"
