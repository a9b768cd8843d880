"""The pretrain start-up check (``check_sidecars``) on Megatron's own argument namespace:
tokenizer identity, named sidecars, explicit replay, verification once (each a way training
once read the wrong data)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.sidecar.sidecar import sidecar_path
from megatron_endprompt.errors import UserError, run_cli

SPM_P, SPM_L = 64, 512  # the layout of the session fixture ``spm_args`` (tests/conftest.py)


@pytest.fixture(scope="module")
def prefix(spm_args, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cs") / "ep")
    assert run_cli(preprocess_cli.main, spm_args(out)) == 0
    return out


def _args(monkeypatch, *argv):
    from megatron.training.arguments import parse_args

    from megatron_endprompt.training.args import add_endprompt_args

    monkeypatch.setattr(sys, "argv", ["pretrain", *map(str, argv)])
    return parse_args(add_endprompt_args)


def check_sidecars(args):
    """The start-up check as ``pretrain.main`` calls it: on the run built from ``args``."""
    from megatron_endprompt.training.args import check_sidecars as check
    from megatron_endprompt.training.run import build_run
    from megatron_endprompt.window import EndPromptWindow

    window = EndPromptWindow(target_length=args.endprompt_target_length,
                             seq_length=args.seq_length, original_length=args.seq_length)
    return check(args, build_run(args, window=window))


def _base(prefix, cache, tok, *extra):
    return ["--seq-length", SPM_P, "--endprompt-target-length", SPM_L, "--data-path", prefix,
            "--data-cache-path", cache, *tok, *extra]


def test_matching_tokenizer_passes_and_verifies_once(prefix, spm_corpus, tmp_path, monkeypatch):
    from megatron_endprompt.data.sidecar import trust

    tok = ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", spm_corpus.model]
    args = _args(monkeypatch, *_base(prefix, tmp_path / "c", tok))
    calls = []
    real = trust.verify_sidecar
    monkeypatch.setattr(trust, "verify_sidecar", lambda *a: calls.append(a) or real(*a))
    assert list(check_sidecars(args)) == [prefix]
    assert len(calls) == 1
    monkeypatch.setenv("RANK", "3")  # another rank/restart: key + header checksum only
    check_sidecars(args)
    assert len(calls) == 1
    # a copy of the same tokenizer elsewhere is the same tokenizer
    copy = tmp_path / "copy.model"
    shutil.copyfile(spm_corpus.model, copy)
    check_sidecars(_args(monkeypatch, *_base(prefix, tmp_path / "c", [
        "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", copy])))


@pytest.mark.parametrize("other", ["null", "other_spm"])
def test_other_tokenizer_is_refused_naming_both(prefix, spm_corpus, tmp_path, monkeypatch, other):

    if other == "null":
        tok = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "400"]
    else:
        from megatron_endprompt.data.prepare.synthetic import train_sentencepiece

        model = train_sentencepiece(spm_corpus.path, str(tmp_path / "spm2"), vocab_size=420)
        tok = ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", model]
    args = _args(monkeypatch, *_base(prefix, tmp_path / "c", tok))
    with pytest.raises(UserError) as info:
        check_sidecars(args)
    msg = str(info.value)
    assert "\n" not in msg and sidecar_path(prefix) in msg
    assert f"GPTSentencePieceTokenizer {os.path.abspath(spm_corpus.model)}" in msg
    assert tok[1] in msg.split("training uses")[1], msg


def test_replay_and_sidecar_name_flags(prefix, spm_corpus, tmp_path, monkeypatch):

    tok = ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", spm_corpus.model]
    plain = str(tmp_path / "plain")
    for ext in (".bin", ".idx"):
        shutil.copyfile(prefix + ext, plain + ext)
    blend = ["--data-path", "0.5", prefix, "0.5", plain]
    with pytest.raises(UserError,
                       match=r"plain: no EndPrompt sidecar .*--endprompt-replay-prefixes"):
        check_sidecars(_args(monkeypatch, *_base(prefix, tmp_path / "c", tok, *blend)))
    ok = _args(monkeypatch, *_base(prefix, tmp_path / "c", tok, *blend,
                                    "--endprompt-replay-prefixes", plain))
    assert list(check_sidecars(ok)) == [prefix]
    with pytest.raises(UserError, match="--endprompt-replay-prefixes nope: not one of the data"):
        check_sidecars(_args(monkeypatch, *_base(prefix, tmp_path / "c", tok,
                                                 "--endprompt-replay-prefixes", "nope")))
    with pytest.raises(UserError, match=r"ep\.L512\.endprompt"):
        check_sidecars(_args(monkeypatch, *_base(prefix, tmp_path / "c", tok,
                                                 "--endprompt-sidecar-name", "L512")))
    with pytest.raises(UserError, match="--endprompt-sidecar-name"):
        check_sidecars(_args(monkeypatch, *_base(prefix, tmp_path / "c", tok,
                                                 "--endprompt-sidecar-name", "a/b")))
