"""Megatron features that cannot carry EndPrompt's positions are refused by ``check_startup`` in
one line naming the flag (not a traceback at the first step): the combined-1F1B schedule of
``--overlap-moe-expert-parallel-comm`` and CUDA graphs compute or freeze RoPE outside the model's
forward (they raised a ``RuntimeError`` at the first step), and multi-token prediction with
``--hybrid-layer-pattern`` raised a ``ValueError`` traceback inside the model provider.

The namespaces come from Megatron's own argument parser, so the flag spellings are the real ones.
"""

from __future__ import annotations

import argparse

import pytest

from megatron_endprompt.errors import UserError
from megatron_endprompt.training.checks import check_startup


@pytest.fixture(scope="module")
def megatron_args():
    """``parse(*flags)``: Megatron's argument namespace for ``flags`` (no validation), with
    ``--transformer-impl local`` (this CPU machine refuses Megatron's default TE)."""
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    return lambda *flags: parser.parse_args(["--transformer-impl", "local", *flags])


def _refusal(args) -> str:
    with pytest.raises(UserError) as err:
        check_startup(args)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_defaults_pass(megatron_args):
    check_startup(megatron_args())
    check_startup(megatron_args("--hybrid-layer-pattern", "*-*-"))
    check_startup(megatron_args("--mtp-num-layers", "1"))  # GPTModel's MTP block is served


def test_overlap_moe_expert_parallel_comm_is_refused(megatron_args):
    msg = _refusal(megatron_args("--overlap-moe-expert-parallel-comm"))
    assert msg.startswith("--overlap-moe-expert-parallel-comm is not supported with EndPrompt")
    assert "outside the model's forward" in msg and "drop the flag" in msg


@pytest.mark.parametrize("flags, named", [
    (("--cuda-graph-impl", "transformer_engine"),
     "--cuda-graph-impl transformer_engine (or --external-cuda-graph)"),
    (("--cuda-graph-impl", "local"), "--cuda-graph-impl local (or --enable-cuda-graph)"),
    (("--cuda-graph-impl", "full_iteration"), "--cuda-graph-impl full_iteration"),
    (("--enable-cuda-graph",), "--enable-cuda-graph"),
    (("--external-cuda-graph",), "--external-cuda-graph"),
])
def test_cuda_graphs_are_refused(megatron_args, flags, named):
    msg = _refusal(megatron_args(*flags))
    assert msg.startswith(f"{named} is not supported with EndPrompt: ")
    assert "RoPE" in msg and "drop the flag" in msg


def test_deprecated_flag_mapped_by_megatron_is_named(megatron_args):
    """After ``validate_args`` (what the pretrain entry runs first) ``--enable-cuda-graph`` is
    gone and ``cuda_graph_impl`` is ``local``: the line names both spellings."""
    args = megatron_args("--enable-cuda-graph")
    del args.enable_cuda_graph
    args.cuda_graph_impl = "local"
    assert "--enable-cuda-graph" in _refusal(args)


def test_te_graph_capture_reason_names_contiguous_positions(megatron_args):
    msg = _refusal(megatron_args("--cuda-graph-impl", "transformer_engine"))
    assert "outside the model's forward" in msg and "contiguous positions" in msg


@pytest.mark.parametrize("flags, named", [
    (("--hybrid-layer-pattern", "*-*-", "--mtp-num-layers", "1"), "--mtp-num-layers 1"),
    (("--hybrid-layer-pattern", "*-*-/*-"), "'/' multi-token-prediction part"),
    # validate_args sets --mtp-num-layers from the '/' part: the line still names the pattern
    (("--hybrid-layer-pattern", "*-*-/*-", "--mtp-num-layers", "1"),
     "'/' multi-token-prediction part"),
])
def test_hybrid_pattern_with_mtp_is_refused(megatron_args, flags, named):
    msg = _refusal(megatron_args(*flags))
    assert msg.startswith(f"--hybrid-layer-pattern {flags[1]} with ")
    assert named in msg and "drop the MTP layers" in msg
