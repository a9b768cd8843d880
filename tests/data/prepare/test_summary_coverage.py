"""The text summaries of preprocessing and of the sidecar tool show the layout coverage (share
of samples with a position jump, share of tokens used), not only ``--summary-json`` (the
lines a user reads); the figures are the JSON summary's counts."""

from __future__ import annotations

import json


from megatron_endprompt.cli import build_sidecar as sidecar_cli
from megatron_endprompt.cli import preprocess as preprocess_cli
from tests.support.token_corpus import write_random_corpus


def _expected(prefix: str, doc: dict) -> str:
    jumped = 1 - doc["samples_contiguous_positions"] / doc["samples_written"]
    used = 1 - (doc["tokens_unused_middle"] + doc["tokens_left_over_at_end"]) / doc["tokens_in"]
    return (f"layout coverage: {prefix}: {100 * jumped:.1f}% of {doc['samples_written']:,} "
            f"samples have a position jump, {100 * used:.1f}% of {doc['tokens_in']:,} tokens "
            "used")


def _text_and_json(run_tool, main, argv, again):
    rc, text, err = run_tool(main, argv)
    assert rc == 0, err
    rc, out, err = run_tool(main, [*again, "--summary-json"])
    assert rc == 0, err
    return text, json.loads(out[out.index("{"):])


def test_preprocess_text_summary_shows_coverage(run_tool, spm_args, tmp_path):
    flags = ("--terminal-source", "document-tail")
    text, doc = _text_and_json(run_tool, preprocess_cli.main, spm_args(tmp_path / "a", *flags),
                               spm_args(tmp_path / "b", *flags))
    assert doc["tokens_unused_middle"] > 0  # not every token used: the share is not 100%
    assert _expected(str(tmp_path / "a"), doc) in text.splitlines()


def test_sidecar_tool_text_summary_shows_coverage(run_tool, tmp_path):
    prefix = str(tmp_path / "megatron")
    write_random_corpus(prefix, 60)

    def argv(name):
        return ["--data-prefix", prefix, "--seq-length", "32", "--target-length", "256",
                "--terminal-length", "8", "--terminal-source", "document-tail", "--no-progress",
                "--name", name]

    text, doc = _text_and_json(run_tool, sidecar_cli.main, argv("a"), argv("b"))
    assert doc["samples_contiguous_positions"] > 0
    assert _expected(prefix, doc) in text.splitlines()
