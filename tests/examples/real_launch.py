"""The launch script with the real trainer on CPU: a converted toy base (the demo-size Llama,
random weights, with its conversion record, so no model flag is given), a NullTokenizer motif
corpus preprocessed at P = 64 -> L = 512, and the environment that launches
examples/pretrain_llama3_endprompt.sh on ``nproc`` CPU ranks with this interpreter and
checkout (torchrun as ``python -m torch.distributed.run`` through a PATH shim)."""

from __future__ import annotations

import os
import stat
import sys

import torch

from launch_fixtures import REPO
from megatron_endprompt.demo_train import TINY_LLAMA
from megatron_endprompt.launch import free_port

SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")
P, L, VOCAB = 64, 512, 1000

#: Extra flags of a CPU toy launch: the NullTokenizer's vocabulary, no data-loader workers.
CPU_FLAGS = ["--vocab-size", str(VOCAB), "--num-workers", "0"]

_TORCHRUN = """#!/usr/bin/env bash
exec "$REAL_PYTHON" -m torch.distributed.run "$@"
"""


def toy_base(root: str) -> str:
    """``root/megatron``: the demo-size Llama as a random HF model (window P), converted by
    hf-to-megatron (with its conversion record)."""
    from transformers import LlamaForCausalLM

    from megatron_endprompt.conversion import HFToMegatronOptions, convert_hf_to_megatron
    from tests.support.hf_configs import llama_config_from_flags

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config_from_flags(TINY_LLAMA, vocab_size=VOCAB,
                                                     max_position_embeddings=P))
    model.save_pretrained(os.path.join(root, "hf"))
    out = os.path.join(root, "megatron")
    convert_hf_to_megatron(HFToMegatronOptions(hf_dir=os.path.join(root, "hf"), output=out,
                                               progress=False))
    return out


def toy_prefix(root: str) -> str:
    """A motif corpus preprocessed at P = 64, L = 512 (NullTokenizer)."""
    from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix

    return write_motif_prefix(root, seq_length=P, target_length=L, vocab=VOCAB, docs=60,
                              placement="random")


def launch_env(base: str, prefix: str, tmp: str, *, nproc: int = 2, **over: str) -> dict:
    """The script's environment for a CPU launch of ``nproc`` ranks (fp32, a constant LR, no
    evaluation); ``over`` replaces any variable."""
    bin_dir = os.path.join(tmp, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    shim = os.path.join(bin_dir, "torchrun")
    with open(shim, "w") as f:
        f.write(_TORCHRUN)
    os.chmod(shim, os.stat(shim).st_mode | stat.S_IEXEC)
    os.makedirs(os.path.join(tmp, "tok"), exist_ok=True)  # NullTokenizer: any existing path
    env = {"PATH": bin_dir + os.pathsep + os.environ["PATH"], "PYTHON": sys.executable,
           "REAL_PYTHON": sys.executable, "HOME": os.environ.get("HOME", tmp),
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "CHECKPOINT_IN": base, "CHECKPOINT_OUT": os.path.join(tmp, "out"),
           "TOKENIZER": os.path.join(tmp, "tok"), "TOKENIZER_TYPE": "NullTokenizer",
           "DATA_PREFIX": prefix, "GPUS_PER_NODE": str(nproc), "TP": "1",
           "MICRO_BATCH": "1", "GLOBAL_BATCH": str(nproc), "TRAIN_ITERS": "4", "LR": "1e-4",
           "WARMUP_ITERS": "0", "SEQ_LENGTH": str(P), "TARGET_LENGTH": str(L),
           "SPLIT": "90,5,5", "EVAL_ITERS": "0", "EVAL_INTERVAL": "1000",
           "SAVE_INTERVAL": "1000", "PRECISION": "fp32", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    if "MEGATRON_ENDPROMPT_CACHE" in os.environ:
        env["MEGATRON_ENDPROMPT_CACHE"] = os.environ["MEGATRON_ENDPROMPT_CACHE"]
    return {**env, **over}
