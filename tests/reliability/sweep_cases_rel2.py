"""The sweep's table, part 4 (issue 27, second round): the index cache after a prefix is
re-preprocessed, a split that gets no sample, Megatron's own reader after a commit killed
between its renames, and the launcher/planner/evaluator start-up checks (run through their
entry points, so the sweep report counts them)."""

from __future__ import annotations

import contextlib
import io
import json
import os

from sweep import Case
from sweep_fixtures import null_argv, quiet_cli
from sweep_pretrain import base


def null_corpus(d: str, n_docs: int, name: str = "c.jsonl", tokens: int = 90) -> str:
    path = os.path.join(d, name)
    with open(path, "w") as f:
        for doc in range(n_docs):
            f.write(json.dumps({"text": " ".join(str((doc * 7 + i) % 997)
                                                 for i in range(tokens))}) + "\n")
    return path


def null_prefix(d: str, n_docs: int, name: str = "small") -> str:
    from megatron_endprompt.cli import preprocess as preprocess_cli

    prefix = os.path.join(d, name)
    quiet_cli(preprocess_cli.main, null_argv(prefix, null_corpus(d, n_docs, f"{name}.jsonl")))
    return prefix


def _small_prefix_split(fx, d):
    """20 documents -> 28 samples: ``--split 90,5,5`` gives the valid split none."""
    return base(fx, d, data=["--data-path", null_prefix(d, 20)])


PRETRAIN = [
    Case("pt_valid_split_gets_no_sample", "pretrain", _small_prefix_split, item="27",
         needle="--split"),
]
CASES = [*PRETRAIN]
