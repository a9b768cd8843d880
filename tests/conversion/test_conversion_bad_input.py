"""Bad input to ``convert_checkpoint.py``: one ``error:`` line, exit 2, no output left behind
(neither the output directory nor a hidden partial sibling)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conversion_helpers import make_hf_model

from megatron_endprompt.cli.convert import main


def _assert_refused(run_tool, argv, out, match):
    rc, stdout, err = run_tool(main, argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (stdout, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert match in lines[0], lines[0]
    parent = os.path.dirname(os.path.abspath(out))
    assert not any(n.startswith(f".{os.path.basename(out)}.partial-")
                   for n in os.listdir(parent)), "partial output left behind"
    return lines[0]


def _h2m(hf_dir, out, *extra):
    return ["hf-to-megatron", "--hf-dir", hf_dir, "--output", out, "--no-progress", *extra]


def _copy(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def _copy_with_config(src, dst, **changes):
    """A copy of the HF model ``src`` whose ``config.json`` has ``changes`` applied."""
    hf = _copy(src, dst)
    with open(os.path.join(hf, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(cfg, f)
    return hf


def test_missing_hf_dir(run_tool, tmp_path):
    out = str(tmp_path / "out")
    _assert_refused(run_tool, _h2m(str(tmp_path / "nope"), out), out, "no such directory")
    assert not os.path.exists(out)


def test_partial_hf_dir(run_tool, tiny_hf, tmp_path):
    out = str(tmp_path / "out")
    hf = _copy(tiny_hf, tmp_path / "partial")
    shards = sorted(n for n in os.listdir(hf) if n.endswith(".safetensors"))
    os.remove(os.path.join(hf, shards[-1]))
    _assert_refused(run_tool, _h2m(hf, out), out, "incomplete download")
    assert not os.path.exists(out)
    os.remove(os.path.join(hf, "config.json"))
    _assert_refused(run_tool, _h2m(hf, out), out, "config.json not found")


def test_missing_tensor(run_tool, tiny_hf, tmp_path):
    """The config implies a tensor the files do not have (one layer more)."""
    out = str(tmp_path / "out")
    hf = _copy_with_config(tiny_hf, tmp_path / "cut", num_hidden_layers=5)
    _assert_refused(run_tool, _h2m(hf, out), out, "model.layers.4.")


def test_non_llama_architecture(run_tool, tiny_hf, tmp_path):
    out = str(tmp_path / "out")
    hf = _copy_with_config(tiny_hf, tmp_path / "gpt2", model_type="gpt2",
                           architectures=["GPT2LMHeadModel"])
    _assert_refused(run_tool, _h2m(hf, out), out, "model_type 'gpt2'")


def test_wrong_num_key_value_heads(run_tool, tiny_hf, tmp_path):
    """Config says 4 KV heads (MHA), the weights have 2: refused, naming the tensor."""
    out = str(tmp_path / "out")
    hf = _copy_with_config(tiny_hf, tmp_path / "gqa", num_key_value_heads=4)
    line = _assert_refused(run_tool, _h2m(hf, out), out, "k_proj.weight has shape [32, 64]")
    assert "num_key_value_heads=4" in line


def test_output_exists(run_tool, tiny_hf, converted, tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    _assert_refused(run_tool, _h2m(tiny_hf, str(out)), str(out), "--overwrite")
    _assert_refused(run_tool, ["megatron-to-hf", "--checkpoint", converted, "--output",
                               str(out)], str(out), "--overwrite")
    assert (out / "keep.txt").read_text() == "x"


def test_overwrite_replaces(run_tool, converted, tmp_path):
    out = tmp_path / "again"
    out.mkdir()
    (out / "stale.txt").write_text("x")
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", converted, "--output",
                                 str(out), "--overwrite", "--no-progress"])
    assert rc == 0, err
    assert not (out / "stale.txt").exists() and (out / "config.json").exists()


def test_no_checkpoint(run_tool, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = str(tmp_path / "out")
    _assert_refused(run_tool, ["megatron-to-hf", "--checkpoint", str(empty), "--output", out],
                    out, "no Megatron checkpoint there")
    (empty / "latest_checkpointed_iteration.txt").write_text("100")
    _assert_refused(run_tool, ["megatron-to-hf", "--checkpoint", str(empty), "--output", out],
                    out, "iter_0000100, which does not exist")
    assert not os.path.exists(out)


@pytest.mark.parametrize("length", [63, 32])
def test_target_length_below_window(run_tool, converted, tmp_path, length):
    out = str(tmp_path / "out")
    _assert_refused(run_tool, ["megatron-to-hf", "--checkpoint", converted, "--output", out,
                               "--target-length", str(length)], out,
                    f"L={length} (--target-length) is below the original context window 64")
    assert not os.path.exists(out)


def test_target_length_equal_to_window_exports_plain_rope(run_tool, converted, tmp_path):
    """``L = L0`` is ``s = 1``: the model's own window, default RoPE, no scaling written."""
    out = tmp_path / "out"
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", converted, "--output",
                                 str(out), "--target-length", "64", "--no-progress"])
    assert rc == 0, err
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == 64
    assert config["rope_parameters"]["rope_type"] == "default" and "rope_scaling" not in config


def test_bad_parallel_sizes(run_tool, tiny_hf, tmp_path):
    out = str(tmp_path / "out")
    _assert_refused(run_tool, _h2m(tiny_hf, out, "--tensor-parallel-size", "4"), out,
                    "must divide num_attention_heads")
    _assert_refused(run_tool, _h2m(tiny_hf, out, "--pipeline-parallel-size", "3"), out,
                    "must divide num_hidden_layers 4")


def test_sliding_window_and_biases_refused(run_tool, tmp_path):
    out = str(tmp_path / "out")
    hf = make_hf_model(str(tmp_path / "bias"), num_hidden_layers=1, attention_bias=True)
    _assert_refused(run_tool, _h2m(hf, out), out, "attention_bias=true")


def test_heads_not_multiple_of_kv_heads(run_tool, tiny_hf, tmp_path):
    """4 query heads, 3 KV heads: the shape's own check (megatron_endprompt.shape) refuses it as
    one line naming config.json, not a ValueError traceback."""
    out = str(tmp_path / "out")
    hf = _copy_with_config(tiny_hf, tmp_path / "bad_groups", num_key_value_heads=3)
    line = _assert_refused(run_tool, _h2m(hf, out), out, "config.json")
    assert "not a multiple of the number of KV heads 3" in line
