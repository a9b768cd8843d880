"""Megatron's ``PREFIX_text_document`` naming is accepted where a user passes a prefix (the
sidecar tool, the training start-up; the launch script in tests/examples/test_launch_checks.py),
with one line saying which files are used (a user should not have to rename Megatron's files)."""

from __future__ import annotations

import argparse


from megatron_endprompt.cli import build_sidecar as sidecar_cli
from megatron_endprompt.data.prepare.prefix_name import resolve_prefix
from megatron_endprompt.data.sidecar.sidecar import sidecar_path
from megatron_endprompt.training.checks import check_startup
from megatron_endprompt.training.run import build_run
from megatron_endprompt.window import EndPromptWindow
from tests.support.token_corpus import write_random_corpus


def _corpus(prefix: str) -> str:
    return write_random_corpus(prefix, 40)


def test_resolve_prefix_both_spellings(tmp_path):
    mg = _corpus(str(tmp_path / "mg_text_document"))
    ours = _corpus(str(tmp_path / "ours"))
    assert resolve_prefix(mg) == (mg, None) and resolve_prefix(ours) == (ours, None)
    used, note = resolve_prefix(str(tmp_path / "mg"))
    assert used == mg and note.startswith(f"note: {tmp_path / 'mg'}: ") and "\n" not in note
    assert resolve_prefix(ours + "_text_document")[0] == ours
    missing = str(tmp_path / "nope")
    assert resolve_prefix(missing) == (missing, None)  # the caller's not-found error names it


def test_sidecar_tool_accepts_the_megatron_name(run_tool, tmp_path):
    mg = _corpus(str(tmp_path / "mg_text_document"))
    rc, out, err = run_tool(sidecar_cli.main, [
        "--data-prefix", tmp_path / "mg", "--seq-length", 32, "--target-length", 256,
        "--terminal-length", 8, "--no-progress"])
    assert rc == 0, err
    assert err.strip().splitlines() == [resolve_prefix(str(tmp_path / "mg"))[1]]
    assert f"wrote {sidecar_path(mg)}" in out


def test_training_startup_resolves_data_and_replay_prefixes(tmp_path):
    mg = _corpus(str(tmp_path / "mg_text_document"))
    replay = _corpus(str(tmp_path / "replay"))
    args = argparse.Namespace(
        make_vocab_size_divisible_by=128, endprompt_target_length=None,
        data_path=["0.8", str(tmp_path / "mg"), "0.2", replay + "_text_document"],
        endprompt_replay_prefixes=[replay + "_text_document"], pretrained_checkpoint=None,
        finetune=False, load=None, save=None)
    notes = check_startup(args)
    assert args.data_path == ["0.8", mg, "0.2", replay]
    assert len(notes) == 2 and all(n.startswith("note: ") for n in notes)
    # the replay prefix: resolved where the run is built, not rewritten in Megatron's args
    run = build_run(args, window=EndPromptWindow(target_length=256))
    assert run.replay_prefixes == (replay,)
    assert run.notes == (resolve_prefix(replay + "_text_document")[1],)
    assert args.endprompt_replay_prefixes == [replay + "_text_document"]


def test_inspect_accepts_the_megatron_name_and_lists_sidecars_on_a_typo(run_tool, tmp_path):
    from megatron_endprompt.cli import inspect as inspect_cli

    mg = _corpus(str(tmp_path / "mg_text_document"))
    rc, _, err = run_tool(sidecar_cli.main, [
        "--data-prefix", mg, "--seq-length", 32, "--target-length", 256, "--terminal-length", 8,
        "--no-progress", "--name", "L256"])
    assert rc == 0, err
    rc, out, err = run_tool(inspect_cli.main, [tmp_path / "mg", "--name", "L256", "--index", 0])
    assert rc == 0, err
    assert err.strip().splitlines() == [resolve_prefix(str(tmp_path / "mg"))[1]]
    rc, out, err = run_tool(inspect_cli.main, [mg, "--name", "L265", "--index", 0])
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "mg_text_document.L265.endprompt: EndPrompt sidecar not found (sidecars there: " \
           "mg_text_document.L256.endprompt)" in err
