"""Training flags -> the resolved window (``training/run.py`` over ``window.EndPromptWindow``)."""

from __future__ import annotations

import argparse

import pytest

from megatron_endprompt.errors import UserError
from megatron_endprompt.training.args import add_endprompt_args, loaded_checkpoint_args
from megatron_endprompt.training.run import resolve_endprompt_args


def parse(*argv, seq_length=8192, max_position_embeddings=8192, interp=None):
    ns = add_endprompt_args(argparse.ArgumentParser()).parse_args([str(a) for a in argv])
    ns.seq_length = seq_length
    ns.max_position_embeddings = max_position_embeddings
    ns.rotary_seq_len_interpolation_factor = interp
    ns.load = ns.pretrained_checkpoint = None
    return ns


def test_llama3_8b_trained_at_4k_gets_s8_not_16():
    """Defect 4: L0 is the model's window (--max-position-embeddings 8192), not P=4096."""
    args = parse("--endprompt-target-length", 65536, seq_length=4096, max_position_embeddings=8192)
    window = resolve_endprompt_args(args)
    assert (window.target_length, window.original_length, window.pi_factor) == (65536, 8192, 8.0)
    assert (args.endprompt_original_length, args.endprompt_pi_factor) == (8192, 8.0)
    assert window.banner() == "L=65536 L0=8192 (--max-position-embeddings) s=8"


def test_l0_from_the_loaded_checkpoint():
    """The checkpoint's own window wins over the flag; a resumed EndPrompt run's recorded L0
    wins over the checkpoint's max_position_embeddings; the explicit flag wins over both."""
    ckpt = argparse.Namespace(max_position_embeddings=8192)
    args = parse("--endprompt-target-length", 65536, seq_length=4096, max_position_embeddings=4096)
    window = resolve_endprompt_args(args, ckpt)
    assert window.pi_factor == 8.0 and "checkpoint's max_position_embeddings" in window.banner()
    resumed = argparse.Namespace(max_position_embeddings=4096, endprompt_original_length=8192)
    assert resolve_endprompt_args(parse("--endprompt-target-length", 65536, seq_length=4096),
                                  resumed).original_length == 8192
    explicit = parse("--endprompt-target-length", 65536, "--endprompt-original-length", 4096,
                     seq_length=2048)
    assert resolve_endprompt_args(explicit, ckpt).pi_factor == 16.0


def test_pi_factor_defaults_and_conflicts():
    a = parse("--endprompt-target-length", 40000)
    assert resolve_endprompt_args(a).pi_factor == 5.0, "ceil(L / L0)"
    a = parse("--endprompt-target-length", 65536, interp=4)
    assert resolve_endprompt_args(a).pi_factor == 4.0, "Megatron's own flag is honoured"
    with pytest.raises(UserError, match="disagrees"):
        resolve_endprompt_args(parse("--endprompt-target-length", 65536,
                                     "--endprompt-pi-factor", 8, interp=4))
    with pytest.raises(UserError, match="must be larger than seq length P=8192; raise "
                                        "--endprompt-target-length or lower --seq-length"):
        resolve_endprompt_args(parse("--endprompt-target-length", 8192))
    with pytest.raises(UserError, match="--endprompt-terminal-loss-weight"):
        resolve_endprompt_args(parse("--endprompt-target-length", 65536,
                                     "--endprompt-terminal-loss-weight", 0))
    with pytest.raises(UserError, match="--endprompt-context-loss-weight"):
        resolve_endprompt_args(parse("--endprompt-target-length", 65536,
                                     "--endprompt-context-loss-weight", -1))
    with pytest.raises(UserError, match="--endprompt-pi-factor"):
        resolve_endprompt_args(parse("--endprompt-target-length", 65536,
                                     "--endprompt-pi-factor", 0.5))
    with pytest.raises(UserError, match="--endprompt-target-length L is required"):
        resolve_endprompt_args(parse())
    # --max-position-embeddings above L (set by mistake): named, with the way out
    with pytest.raises(UserError, match="L=65536 .*is below the original context window 131072 "
                                        ".*--max-position-emb"):
        resolve_endprompt_args(parse("--endprompt-target-length", 65536,
                                     max_position_embeddings=131072))


def test_target_length_equal_to_the_original_window_is_s_1():
    """``L = L0``: fine-tuning at the model's own window, no interpolation; the banner says so."""
    window = resolve_endprompt_args(parse("--endprompt-target-length", 8192, seq_length=4096))
    assert (window.target_length, window.original_length, window.pi_factor) == (8192, 8192, 1.0)
    assert window.banner() == "L=8192 L0=8192 (--max-position-embeddings) s=1"


def test_loaded_checkpoint_args_reads_torch_dist_common_state(tmp_path):
    """No checkpoint -> None; a save dir whose tracker names a torch_dist iteration -> its args
    (``--load`` before ``--pretrained-checkpoint``, as Megatron loads)."""
    args = parse("--endprompt-target-length", 65536)
    assert loaded_checkpoint_args(args) is None
    args.load = str(tmp_path / "missing")
    args.pretrained_checkpoint = str(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    # tracker points nowhere: one line at start-up (Megatron's traceback later, before)
    with pytest.raises(UserError, match="latest_checkpointed_iteration.txt points to"):
        loaded_checkpoint_args(args)


def test_l0_read_from_a_torch_dist_checkpoint(tmp_path):
    """End to end: a torch_dist checkpoint whose saved args say max_position_embeddings=8192
    (as ``hf-to-megatron`` writes for Llama-3 8B) gives s=8 for a run at P=4096."""
    from megatron.core import dist_checkpointing

    from megatron_endprompt.launch import single_process_group
    from megatron_endprompt.runtime import cpu_checkpoint_io

    ckpt = tmp_path / "iter_0000000"
    ckpt.mkdir()
    with single_process_group(), cpu_checkpoint_io():
        dist_checkpointing.save({"args": argparse.Namespace(max_position_embeddings=8192),
                                 "iteration": 0}, str(ckpt))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("0")
    args = parse("--endprompt-target-length", 65536, seq_length=4096, max_position_embeddings=4096)
    args.pretrained_checkpoint = str(tmp_path)
    saved = loaded_checkpoint_args(args)
    assert saved.max_position_embeddings == 8192
    assert resolve_endprompt_args(args, saved).pi_factor == 8.0


def test_retired_require_sidecar_flag_warns_once_and_is_not_kept(capsys, monkeypatch):
    """``--endprompt-require-sidecar`` asked for what always happens now: an old launch line
    still starts, with one ``warning:`` line on rank 0 (none on the others), and the flag
    leaves nothing in ``args`` (so nothing in a checkpoint)."""
    monkeypatch.setenv("RANK", "0")
    args = parse("--endprompt-target-length", 65536, "--endprompt-require-sidecar")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: --endprompt-require-sidecar")
    assert "drop it" in err and not hasattr(args, "endprompt_require_sidecar")
    monkeypatch.setenv("RANK", "1")
    parse("--endprompt-target-length", 65536, "--endprompt-require-sidecar")
    assert capsys.readouterr().err == ""
    assert not hasattr(parse("--endprompt-target-length", 65536), "endprompt_require_sidecar")
