"""``--endprompt-rope-scaling``: linear PI (default), YaRN or NTK-by-parts, resolved from the
window (factor s, L0) into the model's RoPE keywords; conflicting flags refused by name."""

from __future__ import annotations

import argparse

import pytest

from megatron_endprompt.errors import UserError
from megatron_endprompt.model import YarnScaling
from megatron_endprompt.training.args import add_endprompt_args
from megatron_endprompt.training.run import build_run, resolve_endprompt_args


def parse(*argv, **megatron):
    ns = add_endprompt_args(argparse.ArgumentParser()).parse_args(
        ["--endprompt-target-length", "65536", *map(str, argv)])
    ns.seq_length, ns.max_position_embeddings = 4096, 8192
    ns.rotary_seq_len_interpolation_factor = None
    ns.load = ns.pretrained_checkpoint = None
    defaults = dict(yarn_beta_fast=None, yarn_beta_slow=None,
                    yarn_correction_range_round_to_int=None, use_rope_scaling=False,
                    rotary_interleaved=False)
    for k, v in {**defaults, **megatron}.items():
        setattr(ns, k, v)
    return ns


def test_linear_is_the_default():
    args = parse()
    run = build_run(args, window=resolve_endprompt_args(args))
    assert run.rope_scaling == "linear"
    assert run.model_rope_kwargs() == {"pi_factor": 8.0}


@pytest.mark.parametrize("kind, scaled", [("yarn", True), ("ntk-by-parts", False)])
def test_yarn_takes_s_as_its_factor(kind, scaled):
    args = parse("--endprompt-rope-scaling", kind, yarn_beta_fast=16.0)
    window = resolve_endprompt_args(args)
    assert window.pi_factor == 8.0
    assert build_run(args, window=window).model_rope_kwargs() == {
        "pi_factor": 1.0,
        "yarn": YarnScaling(factor=8.0, original_max_position_embeddings=8192, beta_fast=16.0,
                            attention_scaling=scaled)}


@pytest.mark.parametrize("flag, match", [("use_rope_scaling", "drop --use-rope-scaling"),
                                         ("rotary_interleaved", "drop --rotary-interleaved")])
def test_conflicts_refused_at_start_up(flag, match):
    with pytest.raises(UserError, match=match):
        resolve_endprompt_args(parse("--endprompt-rope-scaling", "yarn", **{flag: True}))


def test_unknown_scaling_is_a_parse_error(capsys):
    with pytest.raises(SystemExit):
        parse("--endprompt-rope-scaling", "dynamic")
    assert "invalid choice" in capsys.readouterr().err
