"""examples/pretrain_llama3_endprompt.sh: the flags it passes are Megatron's (plus ours) and
describe Llama-3 8B, 8K -> 64K."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _captured_argv(tmp_path, **env) -> list[str]:
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > \"$ARGV_OUT\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "argv.txt"
    full_env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}",
                "ARGV_OUT": str(out), "CHECKPOINT_IN": "/ckpt/in", "CHECKPOINT_OUT": "/ckpt/out",
                "DATA_PREFIX": "/data/ep", "TOKENIZER": "/models/llama3", **env}
    subprocess.run(["bash", os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")],
                   env=full_env, check=True)
    return out.read_text().splitlines()


def test_launch_script_flags_parse_with_megatron(tmp_path):
    argv = _captured_argv(tmp_path, NNODES="2", NODE_RANK="1", TP="4", PP="2", CP="2")
    assert argv[:4] == ["--nnodes", "2", "--node_rank", "1"]
    start = argv.index("megatron_endprompt.training.pretrain") + 1
    code = (
        "import sys\n"
        "from megatron.training.arguments import parse_args\n"
        "from megatron_endprompt.training.args import add_endprompt_args\n"
        "sys.argv = ['x'] + sys.argv[1:]\n"
        "a = parse_args(add_endprompt_args)\n"
        "print(a.num_layers, a.hidden_size, a.ffn_hidden_size, a.num_attention_heads,"
        " a.num_query_groups, a.rotary_base, a.padded_vocab_size if hasattr(a, 'x') else '',"
        " a.seq_length, a.endprompt_target_length, a.endprompt_pi_factor,"
        " a.tensor_model_parallel_size, a.pipeline_model_parallel_size,"
        " a.context_parallel_size, a.bf16, a.use_distributed_optimizer,"
        " a.calculate_per_token_loss, a.finetune, a.lr, a.lr_warmup_iters)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, *argv[start:]], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fields = proc.stdout.split()
    assert fields == ["32", "4096", "14336", "32", "8", "500000", "8192", "65536", "8.0",
                      "4", "2", "2", "True", "True", "True", "True", "2e-05", "20"]


def test_launch_script_requires_paths(tmp_path):
    proc = subprocess.run(["bash", os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")],
                          env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert proc.returncode != 0 and "CHECKPOINT_IN" in proc.stderr
