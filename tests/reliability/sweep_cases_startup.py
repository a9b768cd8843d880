"""The sweep's table, part 4: the index cache after a prefix is re-preprocessed, a split that gets
no sample, Megatron's own reader after a commit killed between its renames, and the
launcher/planner/evaluator start-up checks (run through their entry points, so the sweep report
counts them)."""

from __future__ import annotations

import contextlib
import gc
import io
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

    # a half-built IndexedDataset's __del__ complains on stderr when freed: here, not inside
    # a later case's captured stderr
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            ds = IndexedDataset(prefix, mmap=True)
            return [np.asarray(ds[i]).tolist() for i in range(len(ds))]
        except Exception as exc:  # noqa: BLE001 - what a stock reader meets is the outcome
            failure = RuntimeError(f"{type(exc).__name__}: {exc}")
        gc.collect()
    return failure


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
        from megatron_endprompt.data.prepare.atomic_output import FAULT_ENV, PrefixWriter

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
    from megatron_endprompt.data.prepare.atomic_output import COMMIT_STEPS

    return [Case(f"pp_kill_after_{step.replace(' ', '_').replace('.', '')}_stock_reader",
                 "preprocess", _pp_over_old, rc=0, item="27", run=_killed_commit_stock_reader(k),
                 check=_stock_reader_ok, extra={"allow_changed": True})
            for k, step in enumerate(COMMIT_STEPS)]


# -- launcher, planner, evaluator start-up checks ----------------------------------------------
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")


def _launch_env(d: str) -> dict[str, str]:
    sys.path.insert(0, os.path.join(REPO, "tests", "examples"))
    from launch_fixtures import launch_env

    env = launch_env(os.path.join(d, "run"))
    fake = os.path.join(d, "bin", "torchrun")  # a launch that gets this far "trains"
    os.makedirs(os.path.dirname(fake), exist_ok=True)
    with open(fake, "w") as f:
        f.write('#!/usr/bin/env bash\ntouch "$TORCHRUN_REACHED"\n')
    os.chmod(fake, 0o755)
    env["PATH"] = f"{os.path.dirname(fake)}:{env['PATH']}"
    return env


def launch(dry_run=True, **over):
    """The launcher (bash) with the fixture's valid variables, ``over`` replacing them
    (a value ``"{d}/..."`` is formatted with the case directory)."""
    def build(fx, d):
        env = _launch_env(d)
        env.update({k: v.format(d=d, prefix=env["DATA_PREFIX"]) for k, v in over.items()})
        for k in [k for k, v in env.items() if v == ""]:  # "" unsets the variable
            del env[k]
        fx.__dict__.setdefault("rel2_launch", {})[d] = env
        return ["--dry-run"] if dry_run else []

    def run(fx, d, argv):
        env = {**fx.rel2_launch[d], "TORCHRUN_REACHED": os.path.join(os.path.dirname(d),
                                                                       os.path.basename(d)
                                                                       + ".torchrun")}
        proc = subprocess.run(["bash", SCRIPT, *argv], env=env, capture_output=True, text=True,
                              timeout=120)
        return proc.returncode, proc.stderr
    return build, run


def _torchrun_reached(fx, d, res) -> list[str]:
    return ["wrong_success"] if os.path.exists(d + ".torchrun") else []


def _launch_case(name, needle, dry_run=True, **over) -> Case:
    build, run = launch(dry_run, **over)
    return Case(name, "launch", build, needle=needle, run=run, check=_torchrun_reached,
                item="27")


LAUNCH_PLAN_EVAL = [
    _launch_case("launch_tp_not_an_integer", "TP='abc' is not an integer", TP="abc"),
    _launch_case("launch_tp_0", "TP=0", TP="0"),
    _launch_case("launch_tp_3_of_8_gpus_32_heads", "TP=3", TP="3"),
    _launch_case("launch_pi_factor_below_ceil", "PI_FACTOR=16", TARGET_LENGTH="131072",
                 PI_FACTOR="8"),
    _launch_case("launch_seq_length_above_target", "larger than seq length",
                 SEQ_LENGTH="131072"),
    _launch_case("launch_blend_odd_count", "3 values", DATA_PREFIX="",
                 DATA_BLEND="0.8 {prefix} 0.2"),
    _launch_case("launch_replay_not_in_blend", "not a prefix of DATA_BLEND", DATA_PREFIX="",
                 DATA_BLEND="1 {prefix}", REPLAY_PREFIXES="{d}/other"),
    _launch_case("launch_blend_glob", "glob", DATA_PREFIX="", DATA_BLEND="1 {d}/run/e*"),
    _launch_case("launch_node_rank_not_below_nnodes", "NODE_RANK=4 must be below NNODES=4",
                 NODE_RANK="4", NNODES="4"),
    _launch_case("launch_real_missing_tokenizer", "TOKENIZER=", dry_run=False,
                 TOKENIZER="{d}/nope"),
    _launch_case("launch_real_missing_prefix", ".bin not found", dry_run=False,
                 DATA_PREFIX="{d}/nope"),
    # the planner's refusals and the unused --haystack: their tools' own tests
    # (tests/planning/test_launch_vars.py, tests/evaluation/test_eval_cli.py)
]


def _bin_bit_flipped_after_verification(fx, d):
    """A copy of the NullTokenizer prefix, verified (the verdict cached in the run's
    ``--data-cache-path``), then one token bit flipped in its ``.bin`` with size and mtime
    kept: it trained silently (Megatron has no ``.bin`` checksum; ours covered the ``.idx``)."""
    import shutil

    from megatron_endprompt.data.sidecar.sidecar import open_sidecar
    from megatron_endprompt.data.sidecar.trust import ensure_verified

    prefix = os.path.join(d, "flip")
    for s in (".bin", ".idx", ".endprompt"):
        shutil.copyfile(fx.null + s, prefix + s)
    ensure_verified(open_sidecar(prefix + ".endprompt"), prefix, os.path.join(d, "cache"))
    st = os.stat(prefix + ".bin")
    with open(prefix + ".bin", "r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([byte[0] ^ 0x04]))
    os.utime(prefix + ".bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    return base(fx, d, data=["--data-path", prefix])


def _pp_hf_workers2(fx, d):
    """Preprocess over the old dataset with the fixture's byte-level BPE HF tokenizer (the
    Llama-3-like one) and ``--workers 2``."""
    from sweep_cases import prev

    return ["--input", fx.corpus, "--output-prefix", prev(fx, d), "--tokenizer-type",
            "HuggingFaceTokenizer", "--tokenizer-model", fx.hf, "--seq-length", "64",
            "--target-length", "512", "--terminal-length", "8", "--append-eod", "--no-progress",
            "--workers", "2"]


def _pp_sigterm_cases() -> list[Case]:
    """SIGTERM to the main pid only (the driver signals itself) at two points of the run:
    while documents are encoded and while samples are made (temporaries were left in half the
    trials with --workers 2)."""
    from sweep_cases_more import sigterm_subprocess

    return [Case(f"pp_sigterm_main_pid_hf_workers2_{where}", "preprocess", _pp_hf_workers2,
                 rc=143, item="27", needle="SIGTERM",
                 run=sigterm_subprocess("preprocess", module, attr, at_call=n))
            for where, module, attr, n in (
                ("encoding", "megatron_endprompt.data.prepare.samples",
                 "SampleMaker.add_document", 3),
                ("late", "megatron_endprompt.data.prepare.samples",
                 "SampleMaker.add_document", 30))]


def _datasets_after_repreprocess(fx, d, argv):
    """Build the datasets (Megatron's builder, our dataset class) over a 60-document prefix,
    re-preprocess the prefix with 15 documents, build again with the same cache directory: the
    second build must follow the new corpus (rc 0) — not the old index (rc 1), not a traceback."""
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder

    from megatron_endprompt.cli import preprocess as preprocess_cli
    from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset
    from megatron_endprompt.data.sidecar.sidecar import open_sidecar
    from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
    from sweep_fixtures import L, P

    prefix = os.path.join(d, "ep")
    tok = build_tokenizer(TokenizerSpec(tokenizer_type="NullTokenizer", vocab_size=1000))

    def build():
        cfg = EndPromptDatasetConfig(
            random_seed=1, sequence_length=P, blend=([prefix], None), split="90,5,5",
            path_to_cache=os.path.join(d, "cache"), tokenizer=tok, endprompt_target_length=L,
            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
            create_attention_mask=False)
        return BlendedMegatronDatasetBuilder(EndPromptGPTDataset, [None, None, None],
                                             lambda: True, cfg).build()

    for n in (60, 15):
        for s in (".bin", ".idx", ".endprompt"):
            if os.path.exists(prefix + s):
                os.unlink(prefix + s)
        quiet_cli(preprocess_cli.main, null_argv(prefix, null_corpus(d, n, f"c{n}.jsonl")))
        train = build()[0]
    samples = open_sidecar(prefix + ".endprompt").header.num_samples
    used = {int(train.document_index[i]) for i in range(len(train))}
    ok = max(used) < samples and len(train) <= samples
    return (0, "") if ok else (1, f"error: stale index: {len(train)} train samples, ids up to "
                                  f"{max(used)}, of a {samples}-sample prefix")


def _no_check(fx, d, res) -> list[str]:
    return []


PRETRAIN = [
    Case("pt_valid_split_gets_no_sample", "pretrain", _small_prefix_split, item="27",
         needle="--split"),
    Case("pt_bin_bit_flipped_after_verification", "pretrain",
         _bin_bit_flipped_after_verification, item="27", needle="fail the CRC-32"),
]
REPREPROCESSED = Case("ds_repreprocessed_prefix_same_cache", "preprocess", lambda fx, d: [],
                      rc=0, item="27", run=_datasets_after_repreprocess, check=_no_check)
CASES = [*PRETRAIN, REPREPROCESSED, *_commit_cases(), *LAUNCH_PLAN_EVAL, *_pp_sigterm_cases()]
