"""The planner's ready-to-paste launch line builds the planned model: for a model other than the
script's own (Llama-3 8B) it names CHECKPOINT_IN, the converted checkpoint the launcher takes the
model from (megatron_endprompt.model_record). Before, the line for ``--hf-config`` (a tied 0.13B
model, sized right) had no model in it, so pasting it launched Llama-3 8B's shape."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

from megatron_endprompt.cli.plan import main
from megatron_endprompt.conversion.hf_config import megatron_flags, read_hf_config
from megatron_endprompt.conversion.hf_to_megatron import CONVERSION_RECORD

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")
sys.path.insert(0, os.path.join(REPO, "tests", "examples"))
from launch_fixtures import launch_env  # noqa: E402

SMOL = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "vocab_size": 49152,
        "tie_word_embeddings": True, "hidden_act": "silu"}


def test_pasted_line_builds_the_planned_model(run_tool, tmp_path):
    hf = tmp_path / "smol"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(SMOL))
    rc, out, err = run_tool(main, ["--hf-config", hf, "--gpus", "8"])
    assert rc == 0, err
    lines = out.split("EndPrompt plan):\n", 1)[1].splitlines()
    line = lines[0].strip()
    assert line.startswith("CHECKPOINT_IN=") and "hf-to-megatron" in lines[1]
    given = dict(v.split("=", 1) for v in shlex.split(line))
    # the user converts the model (hf-to-megatron writes this record) and sets CHECKPOINT_IN
    env = launch_env(tmp_path / "run")
    with open(os.path.join(env["CHECKPOINT_IN"], CONVERSION_RECORD), "w") as f:
        json.dump({"megatron_flags": megatron_flags(read_hf_config(str(hf))),
                   "vocab_size": 49152, "padded_vocab_size": 49152}, f)
    env.update({k: v for k, v in given.items() if k != "CHECKPOINT_IN"})
    proc = subprocess.run(["bash", SCRIPT, "--dry-run"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    got = {f: words[words.index(f) + 1] for f in ("--num-layers", "--hidden-size",
                                                   "--num-attention-heads", "--num-query-groups",
                                                   "--ffn-hidden-size", "--rotary-base")}
    assert got == {"--num-layers": "30", "--hidden-size": "576", "--num-attention-heads": "9",
                   "--num-query-groups": "3", "--ffn-hidden-size": "1536",
                   "--rotary-base": "100000"}
    assert "--untie-embeddings-and-output-weights" not in words


def test_llama3_8b_line_needs_no_checkpoint_hint(run_tool):
    rc, out, err = run_tool(main, ["--model", "llama3-8b", "--gpus", "8"])
    assert rc == 0, err
    lines = out.split("EndPrompt plan):\n", 1)[1].splitlines()
    assert lines[0].strip().startswith("TP=") and not lines[1].startswith("  model:")
