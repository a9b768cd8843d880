"""The sweep's table: bad inputs and faults for every tool, as a new user meets them.

Every preprocessing case writes over a copy of a good dataset in its own directory, every
conversion case next to (or over) a previous export: the harness checks those stay
byte-identical and that nothing new appears (see :mod:`sweep`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys

from sweep import HERE, Case, classify, snapshot
from sweep_fixtures import SUFFIXES, bin_on_full_disk, null_argv, preprocess_argv

PY = sys.executable


# -- helpers ---------------------------------------------------------------------------------
def prev(fx, d, name="data") -> str:
    """A copy of the good dataset at ``d/name``: the previous output that must survive."""
    prefix = os.path.join(d, name)
    for s in SUFFIXES:
        shutil.copyfile(fx.good + s, prefix + s)
    return prefix


def jsonl(d, name, lines) -> str:
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        for line in lines:
            f.write((line.encode("utf-8") if isinstance(line, str) else line) + b"\n")
    return path


GOOD_LINE = json.dumps({"text": "The pass key of Alder is 12345. The river crosses the bridge."})


def pp(*extra, inputs=None):
    """Preprocess over the previous dataset with ``extra`` flags last (they override)."""
    return lambda fx, d: preprocess_argv(prev(fx, d), inputs(fx, d) if inputs else fx.corpus,
                                         fx.spm, *map(str, extra))


def pp_lines(*lines, extra=()):
    return pp(*extra, inputs=lambda fx, d: jsonl(d, "in.jsonl", [GOOD_LINE, *lines]))


def pp_out(out):
    """Preprocess to a chosen ``--output-prefix`` (``out(fx, d)``), previous data beside it."""
    def build(fx, d):
        prev(fx, d)
        return preprocess_argv(out(fx, d), fx.corpus, fx.spm)
    return build


def mkdir(d, *parts) -> str:
    path = os.path.join(d, *parts)
    os.makedirs(path, exist_ok=True)
    return path


def file_in(d, name, text="x\n") -> str:
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def loads_as_old_or_new(fx, d, res) -> list[str]:
    """After an interrupted commit the prefix must be the complete old or the complete new
    dataset (inspect reads it and its sidecar matches its files)."""
    from sweep import run_in_process

    prefix = os.path.join(d, "data")
    rc, err = run_in_process("inspect", [prefix, "--no-text"])
    return [] if rc == 0 else ["data_lost"]


@contextlib.contextmanager
def interrupt_at_rename(k):
    original, calls = os.replace, {"n": 0}

    def replace(src, dst):
        calls["n"] += 1
        if calls["n"] == k:
            raise KeyboardInterrupt
        return original(src, dst)

    os.replace = replace
    try:
        yield
    finally:
        os.replace = original


@contextlib.contextmanager
def lock_held(prefix):
    """Another run holding the prefix (an open file description with the flock)."""
    fd = os.open(prefix + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"4242\n")
    try:
        yield
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(prefix + ".lock")


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# -- the table -------------------------------------------------------------------------------
CASES: list[Case] = [
    # item 3: weights
    Case("pp_terminal_weight_inf", "preprocess", pp("--terminal-loss-weight", "inf"), item="3",
         needle="terminal-loss-weight"),
    Case("pp_terminal_weight_nan", "preprocess", pp("--terminal-loss-weight", "nan"), item="3"),
    Case("pp_terminal_weight_0", "preprocess", pp("--terminal-loss-weight", "0"), item="3"),
    Case("pp_context_weight_inf", "preprocess", pp("--context-loss-weight", "inf"), item="3",
         needle="context-loss-weight"),
    Case("pp_context_weight_neg", "preprocess", pp("--context-loss-weight", "-1"), item="3"),
    # item 11: layout flags
    Case("pp_target_length_int32", "preprocess", pp("--target-length", "3000000000"),
         item="11", needle="target"),
    Case("pp_random_seed_negative", "preprocess", pp("--placement", "random", "--seed", "-1"),
         item="11", needle="--seed"),
    Case("pp_seq_length_1", "preprocess", pp("--seq-length", "1"), item="11"),
    Case("pp_target_not_above_seq", "preprocess", pp("--target-length", "64"), item="11"),
    Case("pp_terminal_length_ge_P", "preprocess", pp("--terminal-length", "64"), item="11"),
    Case("pp_terminal_length_0", "preprocess", pp("--terminal-length", "0"), item="11"),
    Case("pp_pose_chunks_0", "preprocess", pp("--pose-chunks", "0"), item="11"),
    Case("pp_workers_0", "preprocess", pp("--workers", "0"), item="11"),
    # item 5 / 11: output locations
    Case("pp_output_prefix_trailing_slash", "preprocess",
         pp_out(lambda fx, d: mkdir(d, "sub") + "/"), item="5", needle="directory"),
    Case("pp_output_prefix_is_dir", "preprocess", pp_out(lambda fx, d: mkdir(d, "sub")),
         item="5", needle="directory"),
    Case("pp_output_readonly", "preprocess", pp_out(lambda fx, d: "/sys/endprompt_out/data"),
         item="11", needle="--output-prefix"),
    Case("pp_output_under_file", "preprocess",
         pp_out(lambda fx, d: os.path.join(file_in(d, "afile"), "data")), item="11"),
    Case("pp_full_disk", "preprocess", pp(), item="11",
         patch=lambda fx, d: bin_on_full_disk(os.path.join(d, "data")), needle="space"),
    # input problems
    Case("pp_input_missing", "preprocess", pp(inputs=lambda fx, d: os.path.join(d, "no.jsonl")),
         needle="--input"),
    Case("pp_input_glob_nothing", "preprocess", pp(inputs=lambda fx, d: os.path.join(d, "*.zz")),
         needle="--input"),
    Case("pp_malformed_json", "preprocess", pp_lines("{not json"), needle="in.jsonl:2"),
    Case("pp_not_utf8", "preprocess", pp_lines(b'{"text": "caf\xe9"}'), needle="UTF-8"),
    Case("pp_lone_surrogate", "preprocess", pp_lines('{"text": "broken \\ud800 pair"}'),
         item="11", needle="in.jsonl:2: lone surrogate"),
    Case("pp_missing_key", "preprocess", pp_lines('{"body": "x"}'), needle="text"),
    Case("pp_key_not_string", "preprocess", pp_lines('{"text": 5}'), needle="text"),
    Case("pp_json_array_line", "preprocess", pp_lines("[1, 2]"), needle="in.jsonl:2"),
    Case("pp_tokenizer_model_missing", "preprocess",
         pp("--tokenizer-model", "/nonexistent/spm.model"), needle="tokenizer"),
    Case("pp_tokenizer_type_bogus", "preprocess", pp("--tokenizer-type", "BogusTokenizer"),
         needle="BogusTokenizer"),
    Case("pp_prompts_file_missing", "preprocess",
         pp("--terminal-source", "prompt", "--terminal-prompts", "/nonexistent/p.txt"),
         needle="prompts"),
    Case("pp_too_little_data", "preprocess",
         pp(inputs=lambda fx, d: jsonl(d, "in.jsonl", [GOOD_LINE])), needle="--input"),
    Case("pp_null_token_over_vocab", "preprocess",
         lambda fx, d: null_argv(prev(fx, d), jsonl(d, "in.jsonl", ['{"text": "5 2000 7"}'])),
         needle="vocab"),
    # items 6-8: faults while writing
    Case("pp_interrupt_journal_rename", "preprocess",
         pp(inputs=lambda fx, d: fx.small_corpus), rc=130, item="6",
         patch=lambda fx, d: interrupt_at_rename(1), check=loads_as_old_or_new),
    Case("pp_interrupt_second_rename", "preprocess",
         pp(inputs=lambda fx, d: fx.small_corpus), rc=130, item="6",
         patch=lambda fx, d: interrupt_at_rename(2), check=loads_as_old_or_new,
         extra={"allow_changed": True}),
    Case("pp_interrupt_third_rename", "preprocess",
         pp(inputs=lambda fx, d: fx.small_corpus), rc=130, item="6",
         patch=lambda fx, d: interrupt_at_rename(3), check=loads_as_old_or_new,
         extra={"allow_changed": True}),
    Case("pp_concurrent_run", "preprocess", pp(), item="7", needle="another run",
         patch=lambda fx, d: lock_held(os.path.join(d, "data")), transient=("data.lock",)),
    Case("pp_sigterm", "preprocess", pp("--workers", "2"), rc=143, item="8", needle="SIGTERM",
         run=lambda fx, d, argv: sigterm_subprocess(
             "preprocess", "megatron_endprompt.data.prepare.samples", "SampleMaker.add_document",
             at_call=5)(fx, d, argv)),
    Case("pp_stale_temporaries_removed", "preprocess", lambda fx, d: _stale_tmp(fx, d), rc=0,
         item="8", check=lambda fx, d, res: _no_stale(d)),
]




def _stale_tmp(fx, d):
    prefix = prev(fx, d)
    pid = dead_pid()
    for s in SUFFIXES:
        file_in(d, f"data{s}.tmp-{pid}", "stale\n")
    return preprocess_argv(prefix, fx.small_corpus, fx.spm)


def _no_stale(d):
    return ["partial"] if any(".tmp-" in n for n in os.listdir(d)) else []


from sweep_cases_more import CASES as _MORE, sigterm_subprocess, run_pretrain_cases  # noqa: E402

CASES += _MORE
__all__ = ["CASES", "run_pretrain_cases", "classify", "snapshot", "HERE"]
