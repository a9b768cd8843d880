"""A ``HybridModel`` checkpoint saved by the real trainer (``--hybrid-layer-pattern "*-*-*-"``,
and ``"*-*-|*-*-"`` under PP=2; EndPrompt data, CPU + gloo) exports to HF as the Llama it equals:
the HF model's logits at EndPrompt positions (a mixed-layout batch) equal the Megatron hybrid
model's from the same checkpoint. A checkpoint whose saved pattern has a Mamba layer is refused in
one line, with no output written."""

from __future__ import annotations

import argparse
import os

import pytest
import torch
from conversion_helpers import endprompt_positions, hf_model, read_config

from megatron_endprompt.demo_train import run_pretrain
from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix
from tests.support.checkpoint_model import causal_logits, checkpoint_model
from tests.support.megatron_flags import tiny_llama_flags

pytestmark = pytest.mark.process

P, L, VOCAB = 64, 512, 1000
MODEL = tiny_llama_flags(layers=None, seq_length=P, vocab_size=VOCAB)  # layers: the pattern


@pytest.fixture(scope="module")
def data_prefix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hybrid_data")
    return write_motif_prefix(str(tmp), seq_length=P, target_length=L, vocab=VOCAB,
                              placement="random", pose_chunks=2, terminal_loss_weight=0.3)


def _train(tmp, prefix, pattern, pp):
    os.makedirs(tmp, exist_ok=True)
    save = str(tmp / "ckpt")
    rc, log = run_pretrain(
        [*MODEL, "--hybrid-layer-pattern", pattern, "--pipeline-model-parallel-size", str(pp),
         "--data-path", prefix, "--split", "90,5,5", "--data-cache-path",
         str(tmp / "cache"), "--endprompt-target-length", str(L), "--micro-batch-size", "2",
         "--global-batch-size", "4", "--lr", "3e-3", "--min-lr", "3e-3", "--lr-decay-style",
         "constant", "--seed", "1234", "--calculate-per-token-loss", "--log-interval", "1",
         "--eval-iters", "0", "--eval-interval", "1000", "--num-workers", "0",
         "--ckpt-format", "torch_dist", "--train-iters", "2", "--save", save,
         "--save-interval", "2"], log_path=str(tmp / "train.log"), nproc=pp)
    assert rc == 0, log[-3000:]
    return save


@pytest.fixture(scope="module")
def hybrid_ckpt(tmp_path_factory, data_prefix):
    return _train(tmp_path_factory.mktemp("hybrid"), data_prefix, "*-*-*-", 1)


@pytest.fixture(scope="module")
def hybrid_ckpt_pp2(tmp_path_factory, data_prefix):
    return _train(tmp_path_factory.mktemp("hybrid_pp2"), data_prefix, "*-*-|*-*-", 2)


def _megatron_logits(ckpt_path, input_ids, position_ids, pi_factor, pattern):
    from megatron_endprompt.conversion.megatron_ckpt import build_hybrid_model

    def build(args):
        assert args.hybrid_layer_pattern == pattern
        return build_hybrid_model(args, pi_factor=pi_factor)

    with checkpoint_model(ckpt_path, build) as model:
        return causal_logits(model, input_ids, position_ids)


@pytest.mark.parametrize("ckpt_fixture, pattern, layers", [
    ("hybrid_ckpt", "*-*-*-", 3), ("hybrid_ckpt_pp2", "*-*-|*-*-", 4)])
def test_hybrid_checkpoint_exports_as_llama(ckpt_fixture, pattern, layers, request, tmp_path,
                                            run_tool):
    from megatron_endprompt.cli.convert import main

    ckpt = request.getfixturevalue(ckpt_fixture)
    out = str(tmp_path / "hf")
    rc, stdout, err = run_tool(main, ["megatron-to-hf", "--checkpoint", ckpt,
                                      "--output", out, "--no-progress"])
    assert rc == 0, err
    cfg = read_config(out)
    assert cfg["num_hidden_layers"] == layers and cfg["max_position_embeddings"] == L
    assert cfg["rope_parameters"]["factor"] == 8.0 and cfg["vocab_size"] == VOCAB
    hf = hf_model(out)
    # two rows with different EndPrompt layouts in one batch ([S, B, 1, D] RoPE in Megatron)
    ids = torch.randint(0, VOCAB, (2, P), generator=torch.Generator().manual_seed(3))
    pos = torch.cat((endprompt_positions(P, 50, L), endprompt_positions(P, 20, 300)))
    mg = _megatron_logits(ckpt, ids, pos, 8.0, pattern)
    with torch.no_grad():
        ref = hf(input_ids=ids, position_ids=pos).logits
    diff = (mg[..., :VOCAB] - ref).abs().max().item()
    print(f"hybrid {pattern} checkpoint: max |logit diff| HF vs Megatron = {diff:.3e}")
    assert diff <= 1e-4
    assert ref.abs().max().item() > 0.1  # not a trivially small output


def test_non_llama_pattern_is_refused(hybrid_ckpt, tmp_path, run_tool):
    """The same weights saved with a Mamba layer in the recorded pattern: one line naming the
    pattern, nothing written."""
    from megatron_endprompt.cli.convert import main
    from megatron_endprompt.conversion.megatron_ckpt import (
        build_hybrid_model,
        find_checkpoint,
        load_common_state,
        save_release_checkpoint,
        single_process_group,
    )

    bad = str(tmp_path / "mamba")
    with single_process_group():
        args = load_common_state(find_checkpoint(hybrid_ckpt))["args"]
        model = build_hybrid_model(args)
        saved = argparse.Namespace(**{**vars(args), "hybrid_layer_pattern": "M*-*-*-"})
        save_release_checkpoint(model, saved, bad)
    out = str(tmp_path / "hf_bad")
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", bad, "--output", out,
                                 "--no-progress"])
    assert rc != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "--hybrid-layer-pattern 'M*-*-*-'" in lines[0] and "Mamba" in lines[0]
    assert not os.path.exists(out)
