"""examples/pretrain_llama3_endprompt.sh: the flags it passes are Megatron's (plus ours) and
describe Llama-3 8B, 8K -> 64K, launched restart-safe (``--load OUT --pretrained-checkpoint IN``);
``--help`` documents every variable, ``--dry-run`` prints the command and exits 0."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")
PATHS = {"CHECKPOINT_IN": "/ckpt/in", "CHECKPOINT_OUT": "/ckpt/out", "DATA_PREFIX": "/data/ep",
         "TOKENIZER": "/models/llama3"}


def _clean_env(**env) -> dict[str, str]:
    """PATH, and the interpreter/checkout the script's start-up checks run with."""
    return {"PATH": os.environ["PATH"], "PYTHON": sys.executable,
            "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}


def _skip_path_checks(tmp_path) -> dict[str, str]:
    """A stub checker (PYTHON) for the flag tests: the paths above are not real files (the
    checks themselves are tested in tests/examples/test_launch_checks.py)."""
    stub = tmp_path / "stub_python"
    stub.write_text("#!/usr/bin/env bash\necho PI_FACTOR=8\necho SEQUENCE_PARALLEL=1\n"
                    "echo TRANSFORMER_IMPL=transformer_engine\n")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return {"PYTHON": str(stub)}


def _captured_argv(tmp_path, **env) -> list[str]:
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > \"$ARGV_OUT\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "argv.txt"
    full_env = _clean_env(**{**PATHS, "ARGV_OUT": str(out), **_skip_path_checks(tmp_path),
                             "LOG_DIR": str(tmp_path / "logs"), **env})
    full_env["PATH"] = f"{fake.parent}:{full_env['PATH']}"
    subprocess.run(["bash", SCRIPT], env=full_env, check=True)
    return out.read_text().splitlines()


@pytest.mark.process
def test_launch_script_flags_parse_with_megatron(tmp_path):
    argv = _captured_argv(tmp_path, NNODES="2", NODE_RANK="1", TP="4", PP="2", CP="2",
                          DATA_PREFIX="", DATA_BLEND="0.8 /data/ep 0.2 /data/replay",
                          TENSORBOARD_DIR="/tb", WANDB_PROJECT="ep", EXIT_DURATION_MINS="230")
    assert argv[:4] == ["--nnodes", "2", "--node_rank", "1"]
    start = argv.index("megatron_endprompt.training.pretrain") + 1
    code = (
        "import sys\n"
        "from megatron.training.arguments import parse_args\n"
        "from megatron_endprompt.training.args import add_endprompt_args\n"
        "sys.argv = ['x'] + sys.argv[1:]\n"
        "a = parse_args(add_endprompt_args)\n"
        "print(a.num_layers, a.hidden_size, a.ffn_hidden_size, a.num_attention_heads,"
        " a.num_query_groups, a.rotary_base,"
        " a.seq_length, a.endprompt_target_length, a.endprompt_pi_factor,"
        " a.tensor_model_parallel_size, a.pipeline_model_parallel_size,"
        " a.context_parallel_size, a.bf16, a.use_distributed_optimizer,"
        " a.calculate_per_token_loss, a.finetune, a.lr, a.lr_warmup_iters,"
        " a.load, a.pretrained_checkpoint, a.save, a.exit_signal_handler, int(a.exit_signal),"
        " a.exit_duration_in_mins, a.log_throughput, a.tensorboard_dir, a.wandb_project,"
        " a.wandb_exp_name, '|'.join(a.data_path))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, *argv[start:]], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fields = proc.stdout.split()
    assert fields == ["32", "4096", "14336", "32", "8", "500000", "8192", "65536", "8.0",
                      "4", "2", "2", "True", "True", "True", "False", "2e-05", "20",
                      "/ckpt/out", "/ckpt/in", "/ckpt/out", "True", "15", "230", "True", "/tb",
                      "ep", "out", "0.8|/data/ep|0.2|/data/replay"]


def test_replay_prefixes_are_passed_only_when_set(tmp_path):
    blend = {"DATA_PREFIX": "", "DATA_BLEND": "0.8 /data/ep 0.2 /data/r1 0.1 /data/r2"}
    with_replay = _captured_argv(tmp_path, **blend, REPLAY_PREFIXES="/data/r1 /data/r2")
    i = with_replay.index("--endprompt-replay-prefixes")
    assert with_replay[i + 1:i + 3] == ["/data/r1", "/data/r2"]
    (tmp_path / "bin" / "torchrun").unlink()
    (tmp_path / "bin").rmdir()
    assert "--endprompt-replay-prefixes" not in _captured_argv(tmp_path, **blend)


def test_launch_script_requires_paths():
    proc = subprocess.run(["bash", SCRIPT], env=_clean_env(), capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: set CHECKPOINT_IN,CHECKPOINT_OUT,TOKENIZER,DATA_PREFIX or DATA_BLEND (see --help)"]


def test_dry_run_prints_the_command_and_exits_0(tmp_path):
    env = _clean_env(**PATHS, **_skip_path_checks(tmp_path))
    proc = subprocess.run(["bash", SCRIPT, "--dry-run", "--seed", "3"], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    assert words[0] == "env" and "torchrun" in words
    assert words[-2:] == ["--seed", "3"]
    assert "--pretrained-checkpoint" in words and "--finetune" not in words
    # without the paths it still prints (placeholders) and says what is missing
    bare = subprocess.run(["bash", SCRIPT, "--dry-run"], env=_clean_env(), capture_output=True,
                          text=True)
    assert bare.returncode == 0 and "<CHECKPOINT_IN>" in shlex.split(bare.stdout)
    assert "not set: CHECKPOINT_IN" in bare.stderr


def test_help_documents_every_variable():
    proc = subprocess.run(["bash", SCRIPT, "--help"], env=_clean_env(), capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "Usage:" in proc.stdout
    text = open(SCRIPT).read()
    variables = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)(?::-|:\?|\})", text))
    variables -= {"SLURM_NNODES", "SLURM_NODEID", "FORWARDED", "DATA_PATH", "CHECK_VARS", "var",
                  "SEQ_PARALLEL", "MODEL_ARGS", "ENDPROMPT_ARGS", "TRAIN_ARGS", "PARALLEL_ARGS",
                  "DATA_ARGS", "CKPT_ARGS", "LOG_ARGS", "EXTRA", "ENV", "CMD", "DRY_RUN",
                  "TRANSFORMER_IMPL_WHY"}
    undocumented = sorted(v for v in variables if v not in proc.stdout)
    assert not undocumented, undocumented
    assert "REPO" not in text and "VOCAB_ARGS" not in text
