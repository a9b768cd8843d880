"""``inspect --json`` shows what training sees: for a sample, its ``tokens``, ``labels``,
``loss_mask``, ``position_ids`` and ``terminal_mask`` equal ``EndPromptGPTDataset.__getitem__``'s
for the same stored sample, with and without ``--eod-mask-loss``, on a prefix whose samples hold
EOD inside the context and end in a prompt terminal (itself ending in EOD)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder

from megatron_endprompt.cli import inspect as inspect_cli
from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
from megatron_endprompt.errors import run_cli

P, L = 64, 512  # as in tests/conftest.py (spm_args)
KEYS = ("tokens", "labels", "loss_mask", "position_ids", "terminal_mask")


@pytest.fixture(scope="module")
def prompt_prefix(spm_args, tmp_path_factory):
    """Prompt terminals (EP1-EP3, each ending in EOD), random placement, PoSE, documents
    joined by EOD (``--append-eod``), non-default weights."""
    prefix = str(tmp_path_factory.mktemp("inspect_vs_dataset") / "ep")
    assert run_cli(preprocess_cli.main, spm_args(
        prefix, "--terminal-source", "prompt", "--terminal-prompts", "ep1-3",
        "--placement", "random", "--pose-chunks", 2,
        "--terminal-loss-weight", 0.25, "--context-loss-weight", 0.5)) == 0
    return prefix


@pytest.mark.parametrize("eod_mask_loss", [True, False])
def test_inspect_json_equals_dataset_getitem(prompt_prefix, spm_tokenizer, run_tool, tmp_path,
                                             eod_mask_loss):
    context_eods, terminal_eods = _compare(prompt_prefix, spm_tokenizer, run_tool, tmp_path,
                                           eod_mask_loss)
    # the cases the two used to differ on are present: EOD inputs in the context (masked under
    # --eod-mask-loss) and in the prompt terminal (kept)
    assert context_eods > 0 and terminal_eods > 0


@pytest.mark.parametrize("flags", [["--terminal-length", 1],
                                   ["--terminal-source", "prompt", "--terminal-prompts", "ep1-3",
                                    "--terminal-loss-weight", 0.25]], ids=["pose", "et_pose"])
def test_inspect_json_equals_dataset_getitem_for_pose(flags, spm_args, spm_tokenizer, run_tool,
                                                      tmp_path):
    """PoSE's law (``--placement pose``): its two chunks and text skip reach training as
    inspect shows them."""
    prefix = str(tmp_path / "pose")
    assert run_cli(preprocess_cli.main, spm_args(prefix, "--placement", "pose", *flags)) == 0
    _compare(prefix, spm_tokenizer, run_tool, tmp_path, True)


def _compare(prefix, spm_tokenizer, run_tool, tmp_path, eod_mask_loss) -> tuple[int, int]:
    """Every sample of a 12-sample train split: inspect's arrays equal the dataset's; returns
    the EOD inputs counted in contexts and in terminals."""
    prompt_prefix = prefix
    config = EndPromptDatasetConfig(
        random_seed=3, sequence_length=P, blend=([prompt_prefix], [1.0]), split="100,0,0",
        tokenizer=spm_tokenizer, reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=eod_mask_loss, create_attention_mask=False,
        path_to_cache=str(tmp_path / "cache"), endprompt_target_length=L)
    built = BlendedMegatronDatasetBuilder(EndPromptGPTDataset, [12, 0, 0], lambda: True,
                                          config).build()[0]
    inner = list(getattr(built, "datasets", [built]))[0]
    records = np.asarray(read_sidecar(sidecar_path(prompt_prefix)).records)
    eod = spm_tokenizer.eod
    context_eods = terminal_eods = 0
    for i in range(len(inner)):
        want = inner[i]
        doc = int(inner.document_index[i])
        argv = [prompt_prefix, "--index", doc, "--json", "--no-text"]
        rc, out, err = run_tool(inspect_cli.main, argv + ["--eod-mask-loss"] * eod_mask_loss)
        assert rc == 0, err
        got = json.loads(out)["sample"]
        for key in KEYS:
            assert got[key] == want[key].tolist(), (key, i, doc)
        a = int(records[doc][0])
        tokens = want["tokens"].numpy()
        context_eods += int(np.sum(tokens[: a - 1] == eod))
        terminal_eods += int(np.sum(tokens[a - 1:] == eod))
    return context_eods, terminal_eods
