"""The sweep's pretrain-entry cases: refused at start-up, before Megatron initialises (no
training launch). All run in one process (``pretrain_driver.py``); reaching Megatron's
``pretrain()`` on a bad input counts as a wrong success (Megatron would train, or fail late
with a traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sweep import HERE, Case, classify, snapshot
from sweep_fixtures import L, P
from tests.support.megatron_flags import tiny_llama_flags

MODEL = tiny_llama_flags(seq_length=P, gqa=False, untied=False, dropout_off=False)


def base(fx, d, *extra, data=None):
    data = ["--data-path", fx.null] if data is None else data
    return [*MODEL, *data, "--split", "90,5,5", "--data-cache-path", os.path.join(d, "cache"),
            "--endprompt-target-length", str(L), "--micro-batch-size", "2",
            "--global-batch-size", "4", "--train-iters", "1", "--lr", "1e-3",
            "--calculate-per-token-loss", "--eval-iters", "0", "--num-workers", "0",
            "--ckpt-format", "torch_dist", *extra]


LONG_EVAL = ["--eval-iters", "1", "--eval-interval", "1", "--endprompt-long-eval-interval",
             "1", "--endprompt-long-eval-tasks", "ppl", "--endprompt-long-eval-data"]


def _idx_only(fx, d):
    import shutil

    prefix = os.path.join(d, "long")
    shutil.copyfile(fx.null + ".idx", prefix + ".idx")
    return prefix


def _ckpt_missing_shard(fx, d):
    """A copy of the converted checkpoint with one ``.distcp`` shard file removed."""
    import glob
    import shutil

    out = os.path.join(d, "ckpt")
    shutil.copytree(fx.mg, out)
    shards = sorted(glob.glob(os.path.join(out, "*", "*.distcp")))
    os.remove(shards[0])
    return out


def pt(*extra, data=None):
    return lambda fx, d: base(fx, d, *extra, data=data(fx, d) if data else None)


def _file(d, name, text):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    return path


CASES = [
    Case("pt_blend_odd_weights", "pretrain",
         pt(data=lambda fx, d: ["--data-path", "0.5", fx.null, "0.5"]), item="11",
         needle="--data-path"),
    Case("pt_blend_word_weight", "pretrain",
         pt(data=lambda fx, d: ["--data-path", "abc", fx.null]), item="11",
         needle="--data-path"),
    Case("pt_blend_zero_weight", "pretrain",
         pt(data=lambda fx, d: ["--data-path", "0", fx.null, "1", fx.null2]), item="11",
         needle="weight"),
    Case("pt_blend_negative_weight", "pretrain",
         pt(data=lambda fx, d: ["--data-path", "-1", fx.null, "1", fx.null2]), item="11",
         needle="weight"),
    Case("pt_prefix_missing", "pretrain",
         pt(data=lambda fx, d: ["--data-path", os.path.join(d, "nope")]), item="11",
         needle="nope"),
    Case("pt_prefix_with_bin_extension", "pretrain",
         pt(data=lambda fx, d: ["--data-path", fx.null + ".bin"]), item="11",
         needle="--data-path"),
    Case("pt_data_args_path_missing_prefix", "pretrain",
         pt(data=lambda fx, d: ["--data-args-path",
                                _file(d, "blend.txt", os.path.join(d, "nope") + "\n")]),
         item="11", needle="nope"),
    Case("pt_data_args_path_sidecar_mismatch", "pretrain",
         pt(data=lambda fx, d: ["--data-args-path",
                                _file(d, "blend.txt", f"1 {fx.null_other_L}\n")]),
         item="11", needle="1024"),
    Case("pt_per_split_args_missing_prefix", "pretrain",
         pt(data=lambda fx, d: ["--per-split-data-args-path", _file(
             d, "split.json", json.dumps({"train": os.path.join(d, "nope"), "valid": fx.null,
                                          "test": fx.null}))]), item="11", needle="nope"),
    Case("pt_vocab_divisor_0", "pretrain", pt("--make-vocab-size-divisible-by", "0"),
         item="11", needle="--make-vocab-size-divisible-by"),
    Case("pt_load_typo_finetune", "pretrain",
         lambda fx, d: base(fx, d, "--load", os.path.join(d, "typo"), "--finetune"),
         item="5", needle="--load"),
    Case("pt_load_typo_no_save", "pretrain",
         lambda fx, d: base(fx, d, "--load", os.path.join(d, "typo")), item="5",
         needle="--load"),
    Case("pt_pretrained_checkpoint_typo", "pretrain",
         lambda fx, d: base(fx, d, "--load", os.path.join(d, "out"), "--save",
                            os.path.join(d, "out"), "--save-interval", "1",
                            "--pretrained-checkpoint", os.path.join(d, "typo")), item="5",
         needle="--pretrained-checkpoint"),
    Case("pt_save_without_interval", "pretrain",
         lambda fx, d: base(fx, d, "--save", os.path.join(d, "out")), item="11",
         needle="save_interval"),
    Case("pt_terminal_weight_inf", "pretrain", pt("--endprompt-terminal-loss-weight", "inf"),
         item="3", needle="terminal-loss-weight"),
    Case("pt_context_weight_nan", "pretrain", pt("--endprompt-context-loss-weight", "nan"),
         item="3", needle="context-loss-weight"),
    Case("pt_pi_factor_inf", "pretrain", pt("--endprompt-pi-factor", "inf"), item="5",
         needle="pi-factor"),
    Case("pt_target_length_int32", "pretrain", pt("--endprompt-target-length", "3000000000"),
         item="11", needle="target-length"),
    # start-up checks that once ended in a traceback or trained silently
    Case("pt_replay_prefix_trailing_slash", "pretrain",
         lambda fx, d: base(fx, d, "--endprompt-replay-prefixes", fx.null2 + "/",
                            data=["--data-path", "1", fx.null, "1", fx.null2]),
         item="27", needle="--endprompt-replay-prefixes"),
    Case("pt_data_cache_path_is_a_file", "pretrain",
         lambda fx, d: base(fx, d, "--data-cache-path", _file(d, "cache.txt", "x\n")),
         item="27", needle="--data-cache-path"),
    Case("pt_data_cache_path_not_writable", "pretrain",
         pt("--data-cache-path", "/proc/endprompt-cache"), item="27",
         needle="--data-cache-path"),
    Case("pt_long_eval_data_malformed", "pretrain",
         lambda fx, d: base(fx, d, *LONG_EVAL, _file(d, "long.jsonl", "not json\n")),
         item="27", needle="--endprompt-long-eval-data"),
    Case("pt_long_eval_prefix_without_bin", "pretrain",
         lambda fx, d: base(fx, d, *LONG_EVAL, _idx_only(fx, d)), item="27",
         needle=".bin not found"),
    Case("pt_resume_distcp_shard_missing", "pretrain",
         lambda fx, d: base(fx, d, "--load", _ckpt_missing_shard(fx, d), "--finetune"),
         item="27", needle="is missing"),
]
CONTROL = Case("pt_control_good_run", "pretrain", pt(), rc=0)


def run_pretrain_cases(cases, fx, root):
    """Run ``cases`` (+ the control, which must reach Megatron) in one driver process."""
    if not cases:
        return []
    todo, before, dirs = [], {}, {}
    for case in [CONTROL, *cases]:
        d = os.path.join(root, case.name)
        os.makedirs(d)
        dirs[case.name] = d
        todo.append({"name": case.name, "argv": case.build(fx, d),
                     "env": case.extra.get("env", {})})
        before[case.name] = snapshot(d)
    cases_json = os.path.join(root, "pretrain_cases.json")
    out_json = os.path.join(root, "pretrain_results.json")
    with open(cases_json, "w") as f:
        json.dump(todo, f)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "pretrain_driver.py"), cases_json,
                           out_json], env=env, capture_output=True, text=True, timeout=900,
                          cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(f"pretrain driver failed:\n{proc.stderr[-3000:]}")
    got = {r["name"]: r for r in json.load(open(out_json))}
    control = got[CONTROL.name]
    if not control["reached"]:
        raise RuntimeError(f"the good pretrain argv did not reach Megatron: "
                           f"{control['stderr'][-2000:]}")
    results = []
    for case in cases:
        r = got[case.name]
        after = snapshot(dirs[case.name])
        results.append(classify(case, r["rc"], r["stderr"], before[case.name], after,
                                ["wrong_success"] if r["reached"] else []))
    return results
