"""The launcher takes the model from the checkpoint it starts from
(megatron_endprompt.model_record): hf-to-megatron's record beside CHECKPOINT_IN gives the model
flags (a tied model gets no ``--untie-embeddings-and-output-weights``), and a variable or extra flag
contradicting it is one ``error:`` line at ``--dry-run``. Before, the script always passed Llama-3
8B's shape, untied and ``--bf16``: the dry run passed and a tied model's real run died at load with
``KeyError: 'output_layer.weight'``."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest
from launch_fixtures import REPO, launch_env

from megatron_endprompt.conversion.hf_config import megatron_flags, read_hf_config
from megatron_endprompt.conversion.hf_to_megatron import CONVERSION_RECORD

SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")

#: A SmolLM2-135M-shaped config (the real model of tests/e2e): tied, 9 heads / 3 KV groups.
SMOL = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "vocab_size": 49152,
        "tie_word_embeddings": True, "hidden_act": "silu"}


@pytest.fixture
def env(tmp_path):
    """The launcher's valid environment whose CHECKPOINT_IN carries the record hf-to-megatron
    writes for a SmolLM2-shaped config (flags from the converter's own functions)."""
    env = launch_env(tmp_path)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(SMOL))
    record = {"source": str(hf), "megatron_flags": megatron_flags(read_hf_config(str(hf))),
              "vocab_size": 49152, "padded_vocab_size": 49152, "tensor_parallel_size": 1,
              "pipeline_parallel_size": 1, "dtype": "float32"}
    with open(os.path.join(env["CHECKPOINT_IN"], CONVERSION_RECORD), "w") as f:
        json.dump(record, f)
    return {**env, "TP": "1", "GPUS_PER_NODE": "1", "GLOBAL_BATCH": "8", "SPLIT": "90,5,5"}


def _run(env, *args):
    return subprocess.run(["bash", SCRIPT, "--dry-run", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def _refused(env, *args, **over):
    proc = _run({**env, **over}, *args)
    assert proc.returncode == 2, (over, args, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def _value(words: list[str], flag: str) -> str:
    return words[len(words) - 1 - words[::-1].index(flag) + 1]  # the last one given wins


def test_model_comes_from_the_checkpoint(env):
    proc = _run(env)
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    assert "--untie-embeddings-and-output-weights" not in words  # tied, as the checkpoint
    for flag, want in (("--num-layers", "30"), ("--hidden-size", "576"),
                       ("--ffn-hidden-size", "1536"), ("--num-attention-heads", "9"),
                       ("--num-query-groups", "3"), ("--kv-channels", "64"),
                       ("--rotary-base", "100000"), ("--norm-epsilon", "1e-05"),
                       ("--max-position-embeddings", "8192"),
                       ("--endprompt-original-length", "8192")):
        assert words.count(flag) == 1 and _value(words, flag) == want, (flag, words)
    assert "--bf16" in words  # the default precision
    fp32 = shlex.split(_run({**env, "PRECISION": "fp32"}).stdout)
    assert "--bf16" not in fp32 and "--fp16" not in fp32
    # a flag or variable that agrees with the checkpoint is accepted
    assert _run(env, "--num-layers", "30", "--rotary-base=100000").returncode == 0
    assert _run({**env, "ORIGINAL_LENGTH": "8192"}).returncode == 0


@pytest.mark.parametrize("args, over, says", [
    (["--untie-embeddings-and-output-weights"], {}, "--untie-embeddings-and-output-weights "
                                                    "contradicts the checkpoint"),
    (["--num-layers", "32"], {}, "--num-layers 32 contradicts the checkpoint"),
    (["--norm-epsilon=1e-6"], {}, "--norm-epsilon 1e-6 contradicts"),
    ([], {"ROPE_BASE": "500000"}, "ROPE_BASE=500000 contradicts the checkpoint"),
    ([], {"NUM_QUERY_GROUPS": "8"}, "NUM_QUERY_GROUPS=8 contradicts"),
    ([], {"FFN_HIDDEN": "14336"}, "FFN_HIDDEN=14336 contradicts"),
    ([], {"ORIGINAL_LENGTH": "16384"}, "ORIGINAL_LENGTH=16384 contradicts the checkpoint"),
    ([], {"TP": "2", "GPUS_PER_NODE": "2"}, "TP=2 must divide the 9 attention heads"),
    ([], {"PRECISION": "fp8"}, "PRECISION=fp8"),
])
def test_contradicting_the_checkpoint_is_one_line(env, args, over, says):
    assert says in _refused(env, *args, **over)


def test_vocabulary_padding_must_match_the_checkpoint(env):
    """TP=3 pads 49,152 to a multiple of 384 (49,152 itself): accepted; a record converted
    with other padding is refused with the fix."""
    assert _run({**env, "TP": "3", "GPUS_PER_NODE": "3", "GLOBAL_BATCH": "8"}).returncode == 0
    path = os.path.join(env["CHECKPOINT_IN"], CONVERSION_RECORD)
    with open(path) as f:
        record = json.load(f)
    record.update(vocab_size=49153, padded_vocab_size=49280)  # padded at TP=1 (128)
    with open(path, "w") as f:
        json.dump(record, f)
    assert _run(env).returncode == 0
    line = _refused(env, TP="3", GPUS_PER_NODE="3")
    assert "--tensor-parallel-size 3" in line and "49280" in line
