"""The real ``megatron.training.pretrain`` with a Qwen3-layout model (``--qk-layernorm``) and
``--endprompt-rope-scaling yarn``, then the export: the flags reach the model (the saved args
record them), training runs, and the exported HF model (``Qwen3ForCausalLM``, ``rope_type:
yarn``) gives the trained Megatron model's logits at EndPrompt positions."""

from __future__ import annotations

import pytest
import torch

from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix

from megatron_endprompt.demo_train import parse_losses, run_pretrain

pytestmark = pytest.mark.slow

P, L, VOCAB = 64, 512, 1000
MODEL = ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
         "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
         "--kv-channels", "32", "--qk-layernorm", "--position-embedding-type", "rope",
         "--rotary-base", "1000000", "--normalization", "RMSNorm", "--swiglu",
         "--disable-bias-linear", "--untie-embeddings-and-output-weights",
         "--attention-dropout", "0", "--hidden-dropout", "0",
         "--seq-length", str(P), "--max-position-embeddings", str(P),
         "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB)]


def test_qwen3_yarn_run_trains_and_exports(tmp_path, run_tool):
    from transformers import AutoModelForCausalLM

    from megatron_endprompt.cli.convert import main
    from megatron_endprompt.conversion.megatron_ckpt import (
        build_gpt_model,
        find_checkpoint,
        load_common_state,
        load_model_weights,
        single_process_group,
    )
    from megatron_endprompt.model import EndPromptGPTModel, YarnScaling
    from megatron_endprompt.runtime import cpu_forward

    prefix = write_motif_prefix(str(tmp_path), seq_length=P, target_length=L,
                                vocab=VOCAB, placement="random", pose_chunks=2,
                                terminal_loss_weight=0.3)
    save = str(tmp_path / "ckpt")
    args = [*MODEL, "--data-path", prefix, "--split", "90,5,5",
            "--data-cache-path", str(tmp_path / "cache"), "--endprompt-target-length", str(L),
            "--endprompt-rope-scaling", "yarn", "--micro-batch-size", "2",
            "--global-batch-size", "4", "--lr", "1e-3", "--min-lr", "1e-3",
            "--lr-decay-style", "constant", "--seed", "1234", "--calculate-per-token-loss",
            "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000",
            "--num-workers", "0", "--ckpt-format", "torch_dist", "--train-iters", "3",
            "--save", save, "--save-interval", "3"]
    rc, log = run_pretrain(args, log_path=str(tmp_path / "train.log"), nproc=1)
    assert rc == 0, log[-3000:]
    assert "s=8 RoPE=yarn;" in log  # the start-up banner: the flag reached the run
    losses = parse_losses(log)
    assert sorted(losses) == [1, 2, 3] and all(v == v for v in losses.values())

    out = tmp_path / "hf"
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", save, "--output", out,
                                 "--no-progress"])
    assert rc == 0, err
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    rope = model.config.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == (
        "yarn", 8.0, P)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, P), generator=gen)
    pos = torch.stack([torch.cat((torch.arange(a), torch.arange(L - (P - a), L)))
                       for a in (40, 10)])
    with torch.no_grad():
        ref = model(input_ids=ids, position_ids=pos).logits
    ckpt = find_checkpoint(save)
    with single_process_group(), cpu_forward():
        saved = load_common_state(ckpt)["args"]
        assert saved.qk_layernorm and saved.endprompt_rope_scaling == "yarn"
        mg = build_gpt_model(saved, cls=EndPromptGPTModel, pi_factor=1.0,
                             yarn=YarnScaling(factor=8.0, original_max_position_embeddings=P))
        load_model_weights(mg.eval(), ckpt)
        mask = torch.triu(torch.ones(1, 1, P, P, dtype=torch.bool), diagonal=1)
        with torch.no_grad():
            logits = mg(ids, pos, mask).float()
    assert (logits[..., :VOCAB] - ref).abs().max().item() <= 1e-4
