"""Helpers of the conversion tests: a tiny random HF Llama built locally (no hub), EndPrompt
positions, HF model loading, CPU forward for Megatron."""

from __future__ import annotations

import json
import os

import torch

from tests.support.hf_configs import tiny_llama_config

#: Tiny Llama-3-style model: GQA (4 heads, 2 KV heads), RoPE base 500000, vocabulary not a
#: multiple of 128 (padding exercised), untied embeddings, 4 layers.
VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, THETA, EPS, WINDOW = (
    1000, 64, 176, 4, 4, 2, 500000.0, 1e-5, 64)


def make_hf_model(out_dir: str, *, seed: int = 0, **overrides) -> str:
    """Random ``LlamaForCausalLM`` saved (sharded safetensors) in ``out_dir``."""
    from transformers import LlamaForCausalLM

    fields = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                  num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, max_position_embeddings=WINDOW,
                  rms_norm_eps=EPS, rope_parameters={"rope_type": "default", "rope_theta": THETA},
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    fields.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(**fields))
    with torch.no_grad():
        for p in model.parameters():  # O(1) logits so that a wrong mapping shows
            p.normal_(0.0, 0.1)
        for layer in model.model.layers:  # norms away from 1 so a swapped norm shows
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    model.save_pretrained(out_dir, max_shard_size="200KB")
    return out_dir


def endprompt_positions(seq: int, a: int, target_length: int) -> torch.Tensor:
    """``[1, seq]``: context ``0..a-1`` then a terminal ending at ``L-1``."""
    return torch.cat((torch.arange(a), torch.arange(target_length - (seq - a),
                                                    target_length)))[None]


def cpu_forward_patches():
    """Megatron forward on the CPU: the runtime's scoped
    :func:`~megatron_endprompt.runtime.cpu_forward` (no-op RNG tracker fork, dropout is 0 here;
    ``current_device`` -> CPU)."""
    from megatron_endprompt.runtime import cpu_forward

    return cpu_forward()


def hf_model(hf_dir: str, **config_overrides):
    """``AutoModelForCausalLM`` from ``hf_dir`` in fp32, eval mode, eager attention."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager", **config_overrides).eval()


def assert_matches_linear_pi_hf(logits: torch.Tensor, hf_dir: str, ids: torch.Tensor,
                                pos: torch.Tensor, *, pi_factor: float, theta: float,
                                label: str) -> None:
    """Megatron ``logits`` ``[B, S, V_padded]`` of ``ids`` at ``pos`` (``[B, S]``, EndPrompt
    positions) match the HF model of ``hf_dir`` with linear RoPE scaling ``pi_factor`` at the same
    positions (max |diff| <= 1e-4), and those positions matter: contiguous ones give other HF
    logits (a wrong RoPE, or biases/norms before it, would not show on contiguous positions)."""
    hf = hf_model(hf_dir, rope_parameters={"rope_type": "linear", "factor": pi_factor,
                                           "rope_theta": theta})
    with torch.no_grad():
        ref = hf(input_ids=ids, position_ids=pos).logits
        contiguous = torch.arange(ids.shape[1])[None].repeat(ids.shape[0], 1)
        plain = hf(input_ids=ids, position_ids=contiguous).logits
    diff = (logits[..., :VOCAB] - ref).abs().max().item()
    print(f"{label}: max |logit diff| = {diff:.3e}")
    assert diff <= 1e-4
    assert (plain - ref).abs().max() > 1e-2


def hf_tensors(hf_dir: str) -> dict[str, torch.Tensor]:
    """Every tensor of an HF safetensors directory (sharded with an index)."""
    from safetensors import safe_open

    with open(os.path.join(hf_dir, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for name, file in weight_map.items():
        with safe_open(os.path.join(hf_dir, file), framework="pt") as f:
            out[name] = f.get_tensor(name)
    return out


def read_config(hf_dir: str) -> dict:
    with open(os.path.join(hf_dir, "config.json")) as f:
        return json.load(f)


LLAMA3_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>")


def make_llama3_tokenizer(out_dir: str, texts: list[str]) -> str:
    """A Llama-3-like HF tokenizer built offline with ``tokenizers``: byte-level BPE,
    ``<|begin_of_text|>`` (added before every encoded text, as Llama-3's post-processor does)
    and ``<|end_of_text|>`` as special tokens, saved by the installed transformers (5.x writes
    ``tokenizer_class: TokenizersBackend``), ``model_max_length`` 8192 as Llama-3's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(LLAMA3_SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    bos = LLAMA3_SPECIAL[0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, tok.token_to_id(bos))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos,
                                   eos_token=LLAMA3_SPECIAL[1], model_max_length=8192)
    fast.save_pretrained(out_dir)
    return out_dir


def train_converted(converted: str, data_prefix: str, out_dir, name: str, *flags: str,
                    seq_length: int = 64, target_length: int = 512) -> str:
    """Train the Megatron checkpoint ``converted`` (``--load ... --finetune``) with the real
    ``pretrain`` under torchrun, 2 ranks, CPU, on the EndPrompt prefix ``data_prefix``; the
    parallel layout, iterations, LR and save interval come in ``flags``. Returns the save
    directory ``out_dir/name``."""
    from megatron_endprompt.demo_train import run_pretrain

    with open(os.path.join(converted, "endprompt_conversion.json")) as f:
        model_flags = json.load(f)["megatron_flags"]
    for parallel in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size"):
        i = model_flags.index(parallel)
        del model_flags[i:i + 2]
    save = os.path.join(str(out_dir), name)
    args = [*model_flags, "--seq-length", str(seq_length), "--attention-dropout", "0",
            "--hidden-dropout", "0", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", str(VOCAB), "--data-path", data_prefix, "--split", "90,5,5",
            "--data-cache-path", os.path.join(str(out_dir), "cache"),
            "--endprompt-target-length", str(target_length),
            "--micro-batch-size", "2", "--global-batch-size", "4", "--seed", "1234",
            "--calculate-per-token-loss", "--log-interval", "1", "--num-workers", "0",
            "--ckpt-format", "torch_dist", "--load", converted, "--finetune",
            "--save", save, *flags]
    rc, log = run_pretrain(args, log_path=os.path.join(str(out_dir), f"{name}.log"), nproc=2)
    assert rc == 0, log[-3000:]
    return save
