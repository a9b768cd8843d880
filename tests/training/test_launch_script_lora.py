"""examples/pretrain_llama3_endprompt.sh: ``LORA_*`` become the ``--endprompt-lora-*`` flags,
only when ``LORA_RANK`` is set, and Megatron's parser with ours reads them."""

from __future__ import annotations

import argparse

from megatron_endprompt.training.args import add_endprompt_args
from tests.training.test_launch_script import _captured_argv


def _lora_flags(argv: list[str]) -> list[str]:
    start = argv.index("megatron_endprompt.training.pretrain") + 1
    parser = add_endprompt_args(argparse.ArgumentParser())
    known, _ = parser.parse_known_args(argv[start:])
    return [known.endprompt_lora_rank, known.endprompt_lora_alpha, known.endprompt_lora_dropout,
            known.endprompt_lora_targets, known.endprompt_lora_adapters_only]


def test_lora_variables_reach_the_entry(tmp_path):
    argv = _captured_argv(tmp_path, LORA_RANK="16", LORA_ALPHA="32", LORA_DROPOUT="0.05",
                          LORA_TARGETS="linear_qkv linear_proj", LORA_ADAPTERS_ONLY="1")
    assert _lora_flags(argv) == [16, 32.0, 0.05, ["linear_qkv", "linear_proj"], True]


def test_no_lora_flags_without_lora_rank(tmp_path):
    argv = _captured_argv(tmp_path, LORA_ALPHA="32")
    assert not any(a.startswith("--endprompt-lora") for a in argv)
