"""``get_batch`` takes the terminal from the dataset (not from a rule of its own), single rank."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from torch.utils.data import default_collate

from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset
from megatron_endprompt.data.prepare.preprocess import PreprocessOptions, preprocess
from megatron_endprompt.data.sidecar.terminal_spec import TerminalSpec
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.layout import LayoutConfig

P, B, VOCAB = 16, 4, 500
SPEC = TokenizerSpec(tokenizer_type="NullTokenizer", vocab_size=VOCAB)


@pytest.fixture
def one_rank():
    """A real single-rank Megatron (gloo, TP = PP = CP = 1) and its global args, set through
    Megatron's own ``set_args`` (no patching) and cleared afterwards."""
    from megatron.training import global_vars

    from megatron_endprompt.launch import single_process_group

    with single_process_group():
        global_vars.set_args(argparse.Namespace(
            micro_batch_size=4, seq_length=P, create_attention_mask_in_dataloader=False))
        try:
            yield
        finally:
            global_vars.set_args(None)


def test_terminal_mask_comes_from_the_dataset(tmp_path, one_rank):
    """Random placement with L = P + 1 draws T = a for about half the samples: no position
    jump, so the terminal cannot be seen in the positions (the old guess logged those rows'
    terminal as context). The mask must follow each sample's stored ``a``."""
    from megatron_endprompt.training.batch import get_batch

    rng = np.random.default_rng(0)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(
        json.dumps({"text": " ".join(map(str, rng.integers(0, VOCAB - 1, 40)))}) + "\n"
        for _ in range(20)))
    prefix = str(tmp_path / "ep")
    preprocess(PreprocessOptions(
        inputs=[str(corpus)], output_prefix=prefix, tokenizer=SPEC, append_eod=True,
        progress=False, layout=LayoutConfig(seq_length=P, target_length=P + 1, placement="random"),
        terminal=TerminalSpec(source="continuation", length=B, seed=3)))
    config = EndPromptDatasetConfig(
        random_seed=1, sequence_length=P, blend=([prefix], [1.0]), split="100,0,0",
        tokenizer=build_tokenizer(SPEC), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False, path_to_cache=str(tmp_path / "cache"))
    train = BlendedMegatronDatasetBuilder(EndPromptGPTDataset, [40, 0, 0], lambda: True,
                                          config).build()[0]
    records = np.asarray(read_sidecar(sidecar_path(prefix)).records)
    inner = list(getattr(train, "datasets", [train]))[0]
    rows = [inner[i] for i in range(len(inner))]
    no_jump = 0
    for start in range(0, len(rows) - 3, 4):
        batch = get_batch(iter([default_collate(rows[start:start + 4])]), first_stage=True,
                          last_stage=True)
        assert batch["terminal_mask"].dtype == torch.float32
        for r in range(4):
            a, t = records[int(inner.document_index[start + r])][:2]
            no_jump += int(t == a)
            expect = (torch.arange(P) >= a - 1).float()
            assert torch.equal(batch["terminal_mask"][r], expect), (a, t)
    assert no_jump > 0, "the blind-spot layout (T = a) was exercised"


def test_batch_without_terminal_mask_has_no_terminal(one_rank):
    """Megatron's own datasets (mock data) carry no ``terminal_mask``: all context."""
    from megatron_endprompt.training.batch import get_batch

    sample = {"tokens": torch.zeros(4, P, dtype=torch.int64),
              "labels": torch.zeros(4, P, dtype=torch.int64),
              "loss_mask": torch.ones(4, P), "position_ids": torch.arange(P).expand(4, P)}
    batch = get_batch(iter([sample]), first_stage=False, last_stage=True)
    assert torch.equal(batch["terminal_mask"], torch.zeros(4, P))
    assert "tokens" not in batch
