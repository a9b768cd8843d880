"""From conversion to launch: hf-to-megatron's closing line names what the launcher needs,
``CHECKPOINT_IN=<output>``, and that line pasted into the launcher's environment dry-runs the
converted model (its shape from the conversion record, no model flag). Before, the closing line
printed the raw Megatron flags of another way to launch."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest
import torch
from launch_fixtures import REPO, launch_env

pytestmark = pytest.mark.process  # the launcher's dry run as a subprocess

SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")


def test_conversion_ends_with_the_launchers_checkpoint_in(run_tool, tmp_path):
    from transformers import LlamaForCausalLM

    from megatron_endprompt.cli.convert import main
    from megatron_endprompt.demo_train import TINY_LLAMA
    from tests.support.hf_configs import llama_config_from_flags

    torch.manual_seed(0)
    LlamaForCausalLM(llama_config_from_flags(TINY_LLAMA, vocab_size=1000,
                                             max_position_embeddings=8192)
                     ).save_pretrained(str(tmp_path / "hf"))
    out = str(tmp_path / "converted dir")  # a space: the line quotes it
    rc, stdout, err = run_tool(main, ["hf-to-megatron", "--hf-dir", tmp_path / "hf",
                                      "--output", out, "--no-progress"])
    assert rc == 0, err
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("train from it: CHECKPOINT_IN="), stdout
    assert "--num-layers" not in last and "--pretrained-checkpoint" not in last
    words = shlex.split(last.removeprefix("train from it: "))
    assignment = words[0]
    assert assignment == f"CHECKPOINT_IN={out}"
    assert words[1:3] == ["bash", "examples/pretrain_llama3_endprompt.sh"]
    env = {**launch_env(tmp_path), "CHECKPOINT_IN": assignment.split("=", 1)[1],
           "TP": "1", "GPUS_PER_NODE": "1", "GLOBAL_BATCH": "8"}
    proc = subprocess.run(["bash", SCRIPT, "--dry-run"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    cmd = shlex.split(proc.stdout)
    assert cmd[cmd.index("--num-layers") + 1] == "4"  # the converted model's, not Llama-3 8B
