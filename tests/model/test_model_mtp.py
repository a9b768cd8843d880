"""Multi-token prediction (``--mtp-num-layers``) on EndPromptGPTModel: the MTP block runs on the
EndPrompt RoPE and its loss is weighted by the ``loss_mask`` the forward step passes."""

from __future__ import annotations

import torch
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from test_model_gpt import VOCAB, B, S, batch, tiny_config

from megatron_endprompt.model import EndPromptGPTModel


def build_mtp():
    config = tiny_config(mtp_num_layers=1, calculate_per_token_loss=True)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    torch.manual_seed(1234)
    return EndPromptGPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=S,
        position_embedding_type="rope", rotary_base=500000, pi_factor=4.0,
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False))


def mtp_grad_norm(model, input_ids, positions, mask, loss_mask):
    model.zero_grad(set_to_none=True)
    losses = model(input_ids, positions, mask, labels=torch.roll(input_ids, -1, 1),
                   loss_mask=loss_mask)
    (losses * (loss_mask if loss_mask is not None else 1.0)).sum().backward()
    grads = [p.grad.norm() for p in model.mtp.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


def test_mtp_loss_follows_the_endprompt_weights(cpu_forward):
    model = build_mtp()
    input_ids, mask = batch()
    positions = torch.cat((torch.arange(10), torch.arange(64 - 6, 64)))[None].repeat(B, 1)
    zero = torch.zeros(B, S)
    weights = torch.ones(B, S)
    weights[:, 9:] = 0.25         # terminal weight w
    weights[1] = 0.0              # a padding sample
    g_none = mtp_grad_norm(model, input_ids, positions, mask, None)
    g_zero = mtp_grad_norm(model, input_ids, positions, mask, zero)
    g_w = mtp_grad_norm(model, input_ids, positions, mask, weights)
    assert g_none > 0 and g_w > 0
    assert g_zero == 0.0, "weights 0 everywhere: the MTP loss must not train"
    assert abs(g_w - g_none) > 1e-6 * g_none, "the MTP loss ignored the weights"
