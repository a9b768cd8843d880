"""Restart semantics of the launch pattern ``--load OUT --pretrained-checkpoint IN --save OUT``
(examples/pretrain_llama3_endprompt.sh, the sbatch), on the demo-size model, CPU, one rank.

IN is a converted HF base (``hf-to-megatron``). The *same* command is launched twice with
``--exit-interval 2`` standing in for preemption: the first launch finds no checkpoint in OUT,
starts from IN at iteration 0 and saves at 2; the second resumes from OUT at 2 (model,
optimizer, cosine LR schedule, data position, RNG) and runs 3-4. Its exact per-iteration losses
(``--endprompt-loss-log``) equal an uninterrupted 4-iteration run's. With ``--load IN
--finetune`` (the old script) every launch would restart at iteration 1 from the base.
"""

from __future__ import annotations

import os

import pytest
import torch

from megatron_endprompt.demo_train import TINY_LLAMA, parse_losses, run_pretrain
from megatron_endprompt.training.loss import read_loss_log
from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix

pytestmark = pytest.mark.slow

P, L, VOCAB = 64, 512, 1000


def _flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    """The demo-size Llama (``TINY_LLAMA``) as a random HF model, converted to Megatron."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from megatron_endprompt.conversion import HFToMegatronOptions, convert_hf_to_megatron

    root = tmp_path_factory.mktemp("restart_base")
    torch.manual_seed(0)
    heads = int(_flag(TINY_LLAMA, "--num-attention-heads"))
    hidden = int(_flag(TINY_LLAMA, "--hidden-size"))
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden,
        intermediate_size=int(_flag(TINY_LLAMA, "--ffn-hidden-size")),
        num_hidden_layers=int(_flag(TINY_LLAMA, "--num-layers")), num_attention_heads=heads,
        num_key_value_heads=int(_flag(TINY_LLAMA, "--num-query-groups")),
        head_dim=hidden // heads, max_position_embeddings=P, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default",
                         "rope_theta": float(_flag(TINY_LLAMA, "--rotary-base"))},
        tie_word_embeddings=False))
    model.save_pretrained(str(root / "hf"))
    out = str(root / "megatron")
    convert_hf_to_megatron(HFToMegatronOptions(hf_dir=str(root / "hf"), output=out,
                                               progress=False))
    return out


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> str:
    return write_motif_prefix(str(tmp_path_factory.mktemp("restart_data")), seq_length=P,
                              target_length=L, vocab=VOCAB, docs=60, placement="random")


def _launch(base, prefix, tmp, out, name, *extra):
    args = [*TINY_LLAMA, "--norm-epsilon", "1e-5", "--seq-length", str(P),
            "--max-position-embeddings", str(P), "--tokenizer-type", "NullTokenizer",
            "--vocab-size", str(VOCAB), "--data-path", prefix, "--split", "90,5,5",
            "--data-cache-path", str(tmp / "cache"), "--endprompt-target-length", str(L),
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4",
            "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
            "--lr-warmup-iters", "1", "--clip-grad", "1.0", "--seed", "1234",
            "--calculate-per-token-loss", "--log-interval", "1", "--eval-iters", "0",
            "--eval-interval", "1000", "--num-workers", "0", "--ckpt-format", "torch_dist",
            "--load", out, "--pretrained-checkpoint", base, "--save", out,
            "--save-interval", "1000", "--exit-signal-handler", *extra]
    logdir = str(tmp / f"{name}_losses")
    rc, log = run_pretrain([*args, "--endprompt-loss-log", logdir],
                           log_path=str(tmp / f"{name}.log"), nproc=1)
    assert rc == 0, log[-3000:]
    return read_loss_log(logdir), log


def _latest(out: str) -> str:
    with open(os.path.join(out, "latest_checkpointed_iteration.txt")) as f:
        return f.read().strip()


def test_second_launch_resumes_where_the_first_stopped(base, prefix, tmp_path):
    full, _ = _launch(base, prefix, tmp_path, str(tmp_path / "out_full"), "full")
    assert sorted(full) == [1, 2, 3, 4]

    out = str(tmp_path / "out")
    first, log1 = _launch(base, prefix, tmp_path, out, "first", "--exit-interval", "2")
    assert "attempting to finetune with checkpoint in " + base in log1  # started from IN
    assert sorted(first) == [1, 2] and _latest(out) == "2"
    second, log2 = _launch(base, prefix, tmp_path, out, "second", "--exit-interval", "2")
    assert "attempting to finetune" not in log2  # resumed from OUT, not from IN
    assert sorted(second) == [3, 4] and _latest(out) == "4"
    assert sorted(parse_losses(log2)) == [3, 4]  # Megatron's own log counts on from 2

    assert [first[i] for i in (1, 2)] == [full[i] for i in (1, 2)]
    assert [second[i] for i in (3, 4)] == [full[i] for i in (3, 4)]
