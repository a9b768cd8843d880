"""LoRA through the EndPrompt entry: the real ``megatron.training.pretrain`` under torchrun
(CPU, gloo) from a base checkpoint converted from a tiny HF Llama (in-process, no launch).

One single-rank LoRA run (3 iterations, an adapter-only save after each) is the reference;
TP=2 and DP=2 with the distributed optimizer train from the same base and give its losses (1e-5
relative: the adapters start identical at every layout and change from iteration 2 on); PP=2
resumes its adapter-only iteration-1 checkpoint (adapters and Adam state, resharded; the base
read from ``--pretrained-checkpoint``) and gives iterations 2-3 bit for bit. DP=2's full save
shows that only the adapters changed. (Before the SwiGLU sharding of the base ``linear_fc1``
under the wrapper, TP=2 loaded the gate/up rows shuffled: iteration 1 was off by 1.5e-5.)
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix
from megatron_endprompt.demo_train import run_pretrain
from megatron_endprompt.training.loss import read_loss_log
from tests.support.hf_configs import tiny_llama_config

pytestmark = pytest.mark.process

P, L, VOCAB = 64, 512, 1000
LORA = ["--endprompt-lora-rank", "4", "--endprompt-lora-alpha", "8"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[str, list[str]]:
    """``(checkpoint, model flags)``: a random 4-layer HF Llama converted to Megatron."""
    from transformers import LlamaForCausalLM

    from megatron_endprompt.conversion import HFToMegatronOptions, convert_hf_to_megatron

    root = tmp_path_factory.mktemp("lora_base")
    torch.manual_seed(0)
    hf = LlamaForCausalLM(tiny_llama_config(vocab_size=VOCAB, hidden_size=64,
                                            intermediate_size=128, num_hidden_layers=4,
                                            max_position_embeddings=P))
    hf.save_pretrained(str(root / "hf"))
    out = str(root / "mg")
    convert_hf_to_megatron(HFToMegatronOptions(hf_dir=str(root / "hf"), output=out,
                                               progress=False))
    with open(os.path.join(out, "endprompt_conversion.json")) as f:
        flags = json.load(f)["megatron_flags"]
    for parallel in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size"):
        i = flags.index(parallel)
        del flags[i:i + 2]
    return out, flags


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> str:
    return write_motif_prefix(str(tmp_path_factory.mktemp("lora_data")), seq_length=P,
                              target_length=L, vocab=VOCAB, placement="random", pose_chunks=2,
                              terminal_loss_weight=0.3)


def _train(base, prefix, tmp, name, *flags, nproc=2) -> dict[int, float]:
    """A LoRA run (``flags``: layout, load, iterations, saves); its exact per-iteration
    losses."""
    ckpt, model = base
    logdir = str(tmp / f"{name}_losses")
    args = [*model, "--seq-length", str(P), "--attention-dropout", "0", "--hidden-dropout",
            "0", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
            "--data-path", prefix, "--split", "90,5,5", "--data-cache-path", str(tmp / "cache"),
            "--endprompt-target-length", str(L), "--micro-batch-size", "2",
            "--global-batch-size", "8", "--lr", "1e-2", "--min-lr", "1e-2",
            "--lr-decay-style", "constant", "--clip-grad", "1.0", "--seed", "1234",
            "--calculate-per-token-loss", "--log-interval", "1", "--eval-iters", "0",
            "--eval-interval", "1000", "--num-workers", "0", "--ckpt-format", "torch_dist",
            "--endprompt-loss-log", logdir, *LORA, *flags]
    rc, log = run_pretrain(args, log_path=str(tmp / f"{name}.log"), nproc=nproc)
    assert rc == 0, log[-3000:]
    return read_loss_log(logdir)


@pytest.fixture(scope="module")
def reference(base, prefix, tmp_path_factory) -> tuple[str, dict[int, float]]:
    """``(save dir, losses)`` of the single-rank LoRA run: 3 iterations from the base
    (``--pretrained-checkpoint``, as the launcher passes it), an adapter-only save after each."""
    tmp = tmp_path_factory.mktemp("lora_ref")
    save = str(tmp / "save")
    losses = _train(base, prefix, tmp, "tp1", "--pretrained-checkpoint", base[0],
                    "--load", save, "--save", save, "--save-interval", "1",
                    "--train-iters", "3", "--endprompt-lora-adapters-only", nproc=1)
    return save, losses


def _close(got, want, iterations):
    for i in iterations:
        assert abs(got[i] - want[i]) <= 1e-5 * abs(want[i]), (i, got, want)


def test_adapters_train_and_layouts_agree_with_single_rank(base, prefix, reference, tmp_path):
    save, ref = reference
    assert sorted(ref) == [1, 2, 3], ref
    tp2 = _train(base, prefix, tmp_path, "tp2", "--pretrained-checkpoint", base[0],
                 "--train-iters", "3", "--tensor-model-parallel-size", "2")
    _close(tp2, ref, (1, 2, 3))
    # PP=2 resumes the single-rank run's adapter-only iteration 1 (adapters + Adam state,
    # resharded; the base from --pretrained-checkpoint)
    pp2 = _train(base, prefix, tmp_path, "pp2", "--load", save, "--ckpt-step", "1",
                 "--pretrained-checkpoint", base[0], "--train-iters", "3",
                 "--pipeline-model-parallel-size", "2", "--endprompt-lora-adapters-only")
    assert pp2 == {2: ref[2], 3: ref[3]}, (pp2, ref)


@pytest.fixture(scope="module")
def dp2(base, prefix, tmp_path_factory) -> tuple[str, dict[int, float]]:
    """``(save dir, losses)``: DP=2 with the distributed optimizer, a full save at 3."""
    tmp = tmp_path_factory.mktemp("lora_dp2")
    save = str(tmp / "save")
    losses = _train(base, prefix, tmp, "dp2", "--use-distributed-optimizer", "--train-iters",
                    "3", "--pretrained-checkpoint", base[0], "--save", save,
                    "--save-interval", "3")
    return save, losses


def test_distributed_optimizer_agrees_with_single_rank(reference, dp2):
    """DP=2 with the distributed optimizer (its buffers and Adam state: the adapters only)."""
    _close(dp2[1], reference[1], (1, 2, 3))


def _model_keys(meta):
    return {k for k in meta if not k.startswith(("optimizer.", "rng_state"))}


def test_only_adapters_change(base, dp2, reference):
    """DP=2's full save: the base tensors are bit for bit the converted checkpoint's, every
    ``lora_b`` moved off zero, the distributed optimizer's buffers (main weights, Adam moments)
    hold the adapters' elements only. The single-rank run's adapter-only save holds the
    adapters and their Adam state, no base tensor."""
    from megatron_endprompt.conversion.megatron_ckpt import (
        find_checkpoint,
        read_tensor,
        single_process_group,
        tensor_metadata,
    )

    trained, converted = find_checkpoint(dp2[0]), find_checkpoint(base[0])
    with single_process_group():
        meta, base_meta = tensor_metadata(trained), tensor_metadata(converted)
        adapters = {k for k in _model_keys(meta) if k.endswith((".lora_a", ".lora_b"))}
        assert len(adapters) == 8  # 4 linears x (A, B), layer-stacked
        assert _model_keys(meta) - adapters == set(base_meta)
        for key in base_meta:
            assert torch.equal(read_tensor(trained, key, meta[key]),
                               read_tensor(converted, key, base_meta[key])), key
        for key in adapters:
            if key.endswith(".lora_b"):
                assert read_tensor(trained, key, meta[key]).abs().sum() > 0, key
        # the distributed optimizer's flat buffers: exactly the adapters' elements
        numel = sum(math.prod(meta[k][0]) for k in adapters)
        buckets = {k: meta[k][0] for k in meta if k.startswith("optimizer.distributed.")}
        assert buckets and all(shape == (numel,) for shape in buckets.values()), buckets
        adapter_only = tensor_metadata(find_checkpoint(reference[0]))
        assert _model_keys(adapter_only) == adapters
        optimizer = [k for k in adapter_only if k.startswith("optimizer.state.")]
        assert optimizer and all(k.endswith((".lora_a", ".lora_b")) for k in optimizer)
