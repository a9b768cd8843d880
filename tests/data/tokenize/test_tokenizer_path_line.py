"""The line saying which tokenizer path preprocessing runs, and why, is printed with
``--no-progress`` too (the README says it always is); ``--no-progress`` hid it."""

from __future__ import annotations

from megatron_endprompt.cli import preprocess as preprocess_cli


def test_no_progress_keeps_the_tokenizer_path_line(llama3_args, run_tool, tmp_path):
    argv = llama3_args(tmp_path / "x")
    assert "--no-progress" in argv
    rc, out, err = run_tool(preprocess_cli.main, argv)
    assert rc == 0, err
    lines = [line for line in out.splitlines() if line.startswith("tokenizer path: ")]
    assert len(lines) == 1 and "(" in lines[0], out
    assert "tokenizer path: " not in err  # stderr: progress and errors only
