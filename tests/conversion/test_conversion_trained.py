"""Checkpoints saved by the real trainer (``pretrain`` under torchrun, CPU + gloo) convert to HF.

* TP=2: the converted checkpoint loaded with ``--finetune`` at TP=2, one iteration at lr 0, saved
  again; its export equals the original HF model bit for bit (TP resharding, vocabulary padding
  for TP=2, QKV/fc1 layouts all undone exactly).
* PP=2: three training iterations (EndPrompt data, L=512, s=8); the export's config carries the
  run's L and s, its logits equal the Megatron model's at EndPrompt positions, and its loss on a
  validation batch reproduces Megatron's.
"""

from __future__ import annotations


import pytest
import torch
from conversion_helpers import VOCAB, endprompt_positions, hf_model, hf_tensors, read_config, \
    train_converted

pytestmark = pytest.mark.process

P, L = 64, 512


def _export(run_tool, ckpt, out, *flags):
    from megatron_endprompt.cli.convert import main

    rc, stdout, err = run_tool(main, ["megatron-to-hf", "--checkpoint", ckpt, "--output", out,
                                      "--no-progress", *flags])
    assert rc == 0, err
    return stdout


def test_tp2_checkpoint_exports_bit_exact(tiny_hf, converted, data_prefix, tmp_path, run_tool):
    save = train_converted(converted, data_prefix, tmp_path, "tp2",
                           "--tensor-model-parallel-size", "2", "--train-iters", "1", "--lr", "0",
                           "--min-lr", "0", "--save-interval", "1", "--eval-iters", "0",
                           "--eval-interval", "1000", seq_length=P, target_length=L)
    out = str(tmp_path / "hf_tp2")
    stdout = _export(run_tool, save, out)
    assert "iter_0000001" in stdout
    src, dst = hf_tensors(tiny_hf), hf_tensors(out)
    assert sorted(src) == sorted(dst)
    for name in src:
        assert torch.equal(src[name], dst[name]), name
    cfg = read_config(out)  # the run's EndPrompt L and s=ceil(512/64)
    assert cfg["max_position_embeddings"] == L and cfg["rope_parameters"]["factor"] == 8.0
    assert cfg["vocab_size"] == VOCAB  # Megatron's NullTokenizer size, padding removed


def _valid_batch(data_prefix, tmp):
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder

    from megatron_endprompt.compat import build_megatron_tokenizer
    from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset

    config = EndPromptDatasetConfig(
        random_seed=1234, sequence_length=P, split="90,5,5",
        tokenizer=build_megatron_tokenizer("NullTokenizer", None, VOCAB),
        blend=([data_prefix], None), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False, path_to_cache=str(tmp / "cache_b"),
        endprompt_target_length=L)
    _, valid, _ = BlendedMegatronDatasetBuilder(EndPromptGPTDataset, [8, 4, 4], lambda: True,
                                                config).build()
    samples = [valid[i] for i in range(4)]
    return {k: torch.stack([s[k] for s in samples])
            for k in ("tokens", "labels", "position_ids", "loss_mask")}


def test_pp2_trained_checkpoint_reproduces_megatron(trained_checkpoint, data_prefix, tmp_path,
                                                    run_tool, megatron_forward):
    """``trained_checkpoint``: 3 iterations at PP=2 (see tests/conversion/conftest.py)."""
    from megatron_endprompt.training.loss import weighted_loss_terms

    save = trained_checkpoint
    out = str(tmp_path / "hf_pp2")
    _export(run_tool, save, out)  # the save dir: follows latest_checkpointed_iteration.txt
    cfg = read_config(out)
    assert cfg["max_position_embeddings"] == L
    assert cfg["rope_parameters"] == {"rope_type": "linear", "factor": 8.0,
                                      "rope_theta": 500000.0}
    hf = hf_model(out)

    # logits at EndPrompt positions (terminal ending at L-1)
    ids = torch.randint(0, VOCAB, (1, P), generator=torch.Generator().manual_seed(1))
    pos = endprompt_positions(P, 50, L)
    mg = megatron_forward(save, ids, pos, 8.0)
    with torch.no_grad():
        ref = hf(input_ids=ids, position_ids=pos).logits
    diff = (mg.logits[..., :VOCAB] - ref).abs().max().item()
    print(f"PP=2 trained checkpoint: max |logit diff| = {diff:.3e}")
    assert diff <= 1e-4

    # the weighted loss on a validation batch of our dataset
    batch = _valid_batch(data_prefix, tmp_path)
    mg = megatron_forward(save, batch["tokens"], batch["position_ids"], 8.0,
                          labels=batch["labels"])
    mg_sum, count, _ = weighted_loss_terms(mg.losses, batch["loss_mask"], None)
    mg_loss = (mg_sum / count).item()
    with torch.no_grad():
        logits = hf(input_ids=batch["tokens"], position_ids=batch["position_ids"]).logits
    hf_tok = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["labels"],
                                               reduction="none")
    hf_sum, count, _ = weighted_loss_terms(hf_tok, batch["loss_mask"], None)
    hf_loss = (hf_sum / count).item()
    # Megatron's softmax also spans the 24 padding rows of its vocabulary (1024); the same
    # logits restricted to the real vocabulary give HF's loss exactly.
    real = torch.nn.functional.cross_entropy(mg.logits[..., :VOCAB].transpose(1, 2),
                                             batch["labels"], reduction="none")
    real_sum, _, _ = weighted_loss_terms(real, batch["loss_mask"], None)
    real_loss = (real_sum / count).item()
    print(f"validation batch loss: Megatron {mg_loss:.6f}, Megatron on the real vocabulary "
          f"{real_loss:.6f}, HF {hf_loss:.6f}")
    assert abs(hf_loss - real_loss) <= 1e-5 * abs(real_loss)
    assert abs(hf_loss - mg_loss) <= 0.02 * abs(mg_loss)
