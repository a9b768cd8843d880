"""Fixtures for the conversion tests: a tiny random HF Llama, its Megatron conversion, the
suite's one trained checkpoint, and an in-process Megatron forward (EndPromptGPTModel on the
CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conversion_helpers import VOCAB, cpu_forward_patches, make_hf_model, train_converted

#: The trained checkpoint's window and EndPrompt target length (s = L / P = 8).
TRAINED_P, TRAINED_L = 64, 512


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory) -> str:
    return make_hf_model(str(tmp_path_factory.mktemp("hf") / "tiny"))


@pytest.fixture(scope="session")
def converted(tiny_hf, tmp_path_factory) -> str:
    """``tiny_hf`` converted with ``hf-to-megatron --tensor-parallel-size 2``."""
    from megatron_endprompt.conversion import HFToMegatronOptions, convert_hf_to_megatron

    out = str(tmp_path_factory.mktemp("mg") / "converted")
    convert_hf_to_megatron(HFToMegatronOptions(hf_dir=tiny_hf, output=out,
                                               tensor_parallel_size=2, progress=False))
    return out


@pytest.fixture(scope="session")
def data_prefix(tmp_path_factory) -> str:
    """An EndPrompt prefix of motif documents (fixed placement, ``w = 0.5``) for ``VOCAB``."""
    from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix

    return write_motif_prefix(str(tmp_path_factory.mktemp("ep_data")), seq_length=TRAINED_P,
                              target_length=TRAINED_L, vocab=VOCAB, docs=120, placement="fixed",
                              terminal_loss_weight=0.5)


@pytest.fixture(scope="session")
def trained_checkpoint(converted, data_prefix, tmp_path_factory) -> str:
    """The one checkpoint *saved by the trainer* that tests share (read only; a test that needs
    a particular run trains its own): ``converted`` (source config ids bos 1 / eos 2) trained
    3 iterations by ``pretrain`` under torchrun at PP=2 on ``data_prefix`` (L=512, s=8, lr
    1e-3, one validation iteration), saved at iteration 3. Returns the save directory."""
    return train_converted(converted, data_prefix, tmp_path_factory.mktemp("trained"), "pp2",
                           "--pipeline-model-parallel-size", "2", "--train-iters", "3",
                           "--lr", "1e-3", "--min-lr", "1e-3", "--lr-decay-style", "constant",
                           "--save-interval", "3", "--eval-iters", "1", "--eval-interval", "3",
                           seq_length=TRAINED_P, target_length=TRAINED_L)


@pytest.fixture(scope="session")
def megatron_forward():
    """``megatron_forward(ckpt_path, input_ids, position_ids, pi_factor, labels=None, **kw)`` ->
    ``SimpleNamespace(logits [B, S, Vp], losses [B, S] | None, args)``: the checkpoint loaded
    into ``EndPromptGPTModel`` (TP=PP=1, local spec, CPU; ``kw`` such as ``yarn`` go to it) in
    this process."""
    from megatron_endprompt.conversion.megatron_ckpt import (
        build_gpt_model,
        find_checkpoint,
        load_common_state,
        load_model_weights,
        single_process_group,
    )
    from megatron_endprompt.model import EndPromptGPTModel

    def run(path, input_ids, position_ids, pi_factor, labels=None, **model_kwargs):
        ckpt = find_checkpoint(path)
        with single_process_group(), cpu_forward_patches():
            args = load_common_state(ckpt)["args"]
            model = build_gpt_model(args, cls=EndPromptGPTModel, pi_factor=pi_factor,
                                    **model_kwargs).eval()
            load_model_weights(model, ckpt)
            S = input_ids.shape[1]
            mask = torch.triu(torch.ones(1, 1, S, S, dtype=torch.bool), diagonal=1)
            with torch.no_grad():
                logits = model(input_ids, position_ids, mask)
                losses = (model(input_ids, position_ids, mask, labels=labels)
                          if labels is not None else None)
        return SimpleNamespace(logits=logits.float(), losses=losses, args=args)

    return run




@pytest.fixture(scope="session")
def llama3_tokenizer(spm_corpus, tmp_path_factory) -> str:
    """Directory of a Llama-3-like HF tokenizer (see ``make_llama3_tokenizer``)."""
    from conversion_helpers import make_llama3_tokenizer

    return make_llama3_tokenizer(str(tmp_path_factory.mktemp("llama3_tok")), spm_corpus.texts)
