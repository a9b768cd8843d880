"""EndPromptHybridModel (Megatron-Core's HybridModel, Llama-style ``*-*-``) vs EndPromptGPTModel:
the RoPE angles actually applied are the jumped EndPrompt positions, and with the same weights
both train to the same losses (tiny CPU model, gloo world size 1)."""

from __future__ import annotations

import pytest
import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

from megatron_endprompt.model import EndPromptGPTModel, EndPromptHybridModel
from tests.model.test_model_gpt import (
    VOCAB,
    B,
    S,
    assert_stage_uses_position_ids,
    batch,
    endprompt_positions,
    tiny_config,
)

LAYERS = 2
L = 4096


def spec():
    return get_gpt_layer_local_spec(normalization="RMSNorm")


def build_gpt(**kwargs) -> EndPromptGPTModel:
    torch.manual_seed(1234)
    return EndPromptGPTModel(config=tiny_config(num_layers=LAYERS), transformer_layer_spec=spec(),
                             vocab_size=VOCAB, max_sequence_length=S,
                             position_embedding_type="rope", rotary_base=500000,
                             share_embeddings_and_output_weights=False, **kwargs)


def build_hybrid(**kwargs) -> EndPromptHybridModel:
    torch.manual_seed(4321)
    kwargs.setdefault("position_embedding_type", "rope")
    return EndPromptHybridModel(config=tiny_config(num_layers=2 * LAYERS), hybrid_stack_spec=spec(),
                                vocab_size=VOCAB, max_sequence_length=S,
                                hybrid_layer_pattern="*-" * LAYERS, rotary_base=500000,
                                share_embeddings_and_output_weights=False, **kwargs)


def gpt_to_hybrid_state(gpt_state: dict) -> dict:
    """GPT layer ``i``'s attention half -> hybrid layer ``2i``, its MLP half -> ``2i+1``."""
    out = {}
    for key, value in gpt_state.items():
        if key.startswith("decoder.layers."):
            _, _, index, rest = key.split(".", 3)
            mlp = rest.startswith(("pre_mlp_layernorm.", "mlp."))
            key = f"decoder.layers.{2 * int(index) + int(mlp)}.{rest}"
        elif key.startswith("decoder.final_layernorm."):
            key = key.replace("final_layernorm", "final_norm")
        out[key] = value
    return out


def jumped() -> torch.Tensor:
    """Two rows with different layouts (context 10 resp. 6, terminal ending at L-1)."""
    return torch.stack([endprompt_positions(10, L), endprompt_positions(6, L)])


def applied_freqs(model, *inputs) -> torch.Tensor:
    """The ``rotary_pos_emb`` the model's decoder actually received in one forward."""
    seen = []

    def grab(_module, _args, kwargs):
        seen.append(kwargs["rotary_pos_emb"])

    handle = model.decoder.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        handle.remove()
    assert len(seen) == 1
    return seen[0]


@pytest.fixture
def pair(cpu_forward):
    gpt, hybrid = build_gpt(pi_factor=4.0), build_hybrid(pi_factor=4.0)
    hybrid.load_state_dict(gpt_to_hybrid_state(gpt.state_dict()), strict=True)
    return gpt, hybrid


def test_state_dict_keys_are_stock_hybrid(cpu_forward) -> None:
    from megatron.core.models.hybrid.hybrid_model import HybridModel

    from megatron_endprompt.model import hybrid_stack_spec_from_layer_spec

    ours = build_hybrid(pi_factor=8.0)
    torch.manual_seed(0)
    stock = HybridModel(config=tiny_config(num_layers=2 * LAYERS),
                        hybrid_stack_spec=hybrid_stack_spec_from_layer_spec(spec()),
                        vocab_size=VOCAB, max_sequence_length=S, hybrid_layer_pattern="*-" * LAYERS,
                        position_embedding_type="rope", rotary_base=500000,
                        share_embeddings_and_output_weights=False)
    assert list(ours.state_dict()) == list(stock.state_dict())
    assert "decoder.final_norm.weight" in ours.state_dict()
    assert not any("rotary" in k for k in ours.state_dict())


@pytest.mark.parametrize("kind", ["gpt", "hybrid"])
def test_applied_rope_angles_are_the_jumped_positions(pair, kind) -> None:
    """The freqs reaching the decoder are ``position_ids * inv_freq / s`` per row — not the
    contiguous ``0..S-1`` stock would apply (this fails if positions silently fall back)."""
    model = dict(zip(("gpt", "hybrid"), pair))[kind].eval()
    input_ids, mask = batch()
    positions = jumped()
    freqs = applied_freqs(model, input_ids, positions, mask)
    rope = model.rotary_pos_emb
    half = rope.inv_freq.numel()
    assert freqs.shape == (S, B, 1, 2 * half)
    expected = positions.to(torch.float32)[..., None] * (rope.inv_freq / 4.0)  # [B, S, D/2]
    assert torch.equal(freqs[:, :, 0, :half], expected.transpose(0, 1))
    contiguous = torch.arange(S, dtype=torch.float32)[:, None] * (rope.inv_freq / 4.0)
    assert not torch.allclose(freqs[:, 0, 0, :half], contiguous)
    # shared layout -> one row [S, 1, 1, D], the shape TE's fused RoPE takes
    shared = applied_freqs(model, input_ids, positions[:1].repeat(B, 1), mask)
    assert shared.shape == (S, 1, 1, 2 * half)
    assert torch.equal(shared[:, 0], freqs[:, 0])


def test_hybrid_trains_like_gpt_with_endprompt_positions(pair) -> None:
    """Same weights, same EndPrompt batch: the Llama-style HybridModel's token losses equal
    GPTModel's bit for bit at every step of a few SGD steps, and differ from a
    contiguous-position run."""
    gpt, hybrid = pair
    gpt.train(), hybrid.train()
    input_ids, mask = batch()
    labels = torch.roll(input_ids, -1, dims=1)
    positions = jumped()
    optims = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (gpt, hybrid)]
    for _ in range(3):
        losses = []
        for model, opt in zip((gpt, hybrid), optims):
            opt.zero_grad()
            loss = model(input_ids, positions, mask, labels=labels)
            loss.mean().backward()
            opt.step()
            losses.append(loss.detach())
        assert losses[0].shape == (B, S)
        assert torch.equal(losses[1], losses[0])  # bit-exact: the same ops in the same order
    with torch.no_grad():
        trained = hybrid(input_ids, positions, mask, labels=labels)
        flat = hybrid(input_ids, torch.arange(S)[None].repeat(B, 1), mask, labels=labels)
    assert losses[1].mean() > trained.mean()  # it trained
    assert (trained[:, 6:] - flat[:, 6:]).abs().max() > 1e-4  # positions matter after the jump


def test_hybrid_non_first_stage_needs_and_uses_position_ids(cpu_forward) -> None:
    stage = build_hybrid(pre_process=False, pi_factor=2.0).eval()
    assert_stage_uses_position_ids(stage, jumped())


def test_rope_call_outside_forward_is_refused(pair) -> None:
    """A length-only RoPE call that bypasses the model's forward (how stock code calls it) must
    not silently use contiguous positions."""
    for model in pair:
        with pytest.raises(RuntimeError, match="without the batch's position_ids"):
            model.rotary_pos_emb(S)
        with model.rotary_pos_emb.call_positions(None, contiguous=True):  # inference: stock
            assert torch.equal(model.rotary_pos_emb(S), model.rotary_pos_emb.get_emb(S))


def test_hybrid_refuses_what_it_cannot_serve(cpu_forward) -> None:
    with pytest.raises(ValueError, match="rope"):
        build_hybrid(position_embedding_type="none")
    with pytest.raises(ValueError, match="disagrees"):
        build_hybrid(pi_factor=8.0, seq_len_interpolation_factor=4.0)


@pytest.mark.process
def test_model_package_does_not_import_the_runtime() -> None:
    """The model provides modules only; process-wide changes live in ``runtime/`` (old code:
    ``model/gpt.py`` imported the version gate and the installed-layer table from it)."""
    import subprocess
    import sys

    code = ("import sys, megatron_endprompt.model; "
            "print(sorted(m for m in sys.modules if m.startswith('megatron_endprompt.runtime')"
            " or m == 'megatron_endprompt.compat'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
