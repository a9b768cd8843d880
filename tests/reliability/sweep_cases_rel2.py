"""The sweep's table, part 4 (issue 27, second round): the index cache after a prefix is
re-preprocessed, a split that gets no sample, Megatron's own reader after a commit killed
between its renames, and the launcher/planner/evaluator start-up checks (run through their
entry points, so the sweep report counts them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sweep import Case
from sweep_fixtures import null_argv, preprocess_argv, quiet_cli
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


# -- a commit killed between its steps, read by stock Megatron -------------------------------
def _tokens(prefix: str):
    """Every sequence of ``prefix`` through Megatron-Core's own ``IndexedDataset`` (no journal
    roll-forward), or the exception it stops with."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    try:
        ds = IndexedDataset(prefix, mmap=True)
        return [np.asarray(ds[i]).tolist() for i in range(len(ds))]
    except Exception as exc:  # noqa: BLE001 - what a stock reader meets is the outcome
        return exc


def _other_corpus(fx) -> str:
    """15 documents of the fixture corpus in reverse order: no common leading tokens with the
    old dataset (a mixed pair then reads as neither)."""
    path = os.path.join(fx.root, "rel2_other.jsonl")
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8") as f:
            for t in fx.texts[::-1][:15]:
                f.write(json.dumps({"text": t}) + "\n")
    return path


def _new_reference(fx) -> list:
    """The dataset the killed run was writing, built completely once (fixtures)."""
    from megatron_endprompt.cli import preprocess as preprocess_cli

    if not hasattr(fx, "rel2_new"):
        prefix = os.path.join(fx.root, "rel2_new", "data")
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        quiet_cli(preprocess_cli.main, preprocess_argv(prefix, _other_corpus(fx), fx.spm))
        fx.rel2_new = _tokens(prefix)
    return fx.rel2_new


def _killed_commit_stock_reader(step: int):
    """Preprocess (the real CLI, a subprocess) over an old dataset, killed right after commit
    step ``step`` (``os._exit``, as SIGKILL); then stock Megatron reads the prefix: it must
    see the complete old pair, the complete new pair, or no ``.idx`` at all — never new
    offsets over old tokens. Then our reader (``inspect``) rolls the commit forward and the
    next writer removes what the dead one left (a kill leaves temporaries by nature)."""
    def run(fx, d, argv):
        from sweep import run_in_process
        from megatron_endprompt.data.atomic_output import FAULT_ENV, PrefixWriter

        old, new = _tokens(fx.good), _new_reference(fx)
        env = {**os.environ, FAULT_ENV: str(step), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-m", "megatron_endprompt.cli.preprocess",
                               *argv], env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 137:
            return proc.returncode, proc.stderr + f"\nthe fault at step {step} did not fire"
        seen = _tokens(os.path.join(d, "data"))
        no_idx = not os.path.exists(os.path.join(d, "data.idx"))  # Megatron stops: file missing
        mixed = not ((no_idx and isinstance(seen, Exception)) or seen == old or seen == new)
        rc, err = run_in_process("inspect", [os.path.join(d, "data"), "--no-text"])
        PrefixWriter(os.path.join(d, "data")).close()  # the next run removes dead temporaries
        fx.__dict__.setdefault("rel2_stock", {})[d] = mixed or rc != 0
        if mixed:
            err += (f"\nstock IndexedDataset after step {step}: "
                    + (repr(seen)[:300] if isinstance(seen, Exception) else
                       f"{len(seen)} sequences, neither the old nor the new dataset"))
        return rc, err
    return run


def _stock_reader_ok(fx, d, res) -> list[str]:
    return ["data_lost"] if fx.__dict__.get("rel2_stock", {}).get(d, True) else []


def _pp_over_old(fx, d):
    from sweep_cases import prev

    return preprocess_argv(prev(fx, d), _other_corpus(fx), fx.spm)


def _commit_cases() -> list[Case]:
    from megatron_endprompt.data.atomic_output import COMMIT_STEPS

    return [Case(f"pp_kill_after_{step.replace(' ', '_').replace('.', '')}_stock_reader",
                 "preprocess", _pp_over_old, rc=0, item="27", run=_killed_commit_stock_reader(k),
                 check=_stock_reader_ok, extra={"allow_changed": True})
            for k, step in enumerate(COMMIT_STEPS)]


PRETRAIN = [
    Case("pt_valid_split_gets_no_sample", "pretrain", _small_prefix_split, item="27",
         needle="--split"),
]
CASES = [*PRETRAIN, *_commit_cases()]
