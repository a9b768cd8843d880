"""The launcher's warm-up against the run's length: ``TRAIN_ITERS=4`` (the README's CPU trial
line) under the default ``WARMUP_ITERS=20`` used to pass ``--dry-run`` and then die after the
model build in Megatron's ``OptimizerParamScheduler`` (``assert lr_warmup_steps <
lr_decay_steps``, under a torchrun traceback). Now it is one ``error:`` line at ``--dry-run``
naming both variables; extra flags that lengthen the decay are read as the launch reads them."""

from __future__ import annotations

import os
import subprocess

from launch_fixtures import REPO, launch_env

SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")


def _dry(env, *args):
    return subprocess.run(["bash", SCRIPT, "--dry-run", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_warmup_not_below_train_iters_is_one_line_at_dry_run(tmp_path):
    env = {**launch_env(tmp_path), "TRAIN_ITERS": "4", "GLOBAL_BATCH": "1", "TP": "1",
           "GPUS_PER_NODE": "1"}
    proc = _dry(env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: WARMUP_ITERS=20 is not below "
                                                   "TRAIN_ITERS=4"), proc.stderr
    assert "WARMUP_ITERS=0" in lines[0]
    assert _dry({**env, "WARMUP_ITERS": "3"}).returncode == 0
    # an extra --lr-decay-iters decides the decay, as in Megatron: 20 warm-up of 100 is fine
    assert _dry(env, "--lr-decay-iters", "100").returncode == 0
    flagged = _dry(env, "--lr-warmup-iters", "9")
    assert flagged.returncode == 2
    assert flagged.stderr.startswith("error: --lr-warmup-iters 9 leaves no iteration after the "
                                     "warm-up (--train-iters 4)"), flagged.stderr
