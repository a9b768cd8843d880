"""The planner (``tools/plan_endprompt_run.py``) on a config it must not guess from and outputs
it must not write: one ``error:`` line, exit 2, nothing written, the inputs byte-identical; and
the legal ``L = L0`` planned, not refused by the planner's own default sweep."""

from __future__ import annotations

import json
import shutil

import pytest

from megatron_endprompt.cli.plan import main
from megatron_endprompt.planning.launch_vars import LAUNCH_SCRIPT
from tests.support.refusal import assert_refused

#: A small dense Llama-layout config.json (the planner reads only the shape and L0).
CONFIG = dict(model_type="llama", num_hidden_layers=4, hidden_size=256, intermediate_size=512,
              num_attention_heads=8, num_key_value_heads=4, vocab_size=1000,
              max_position_embeddings=8192)


def _model_dir(tmp_path, name="model", **changes):
    """``tmp_path/name/config.json`` with ``changes`` applied (``None`` removes a field)."""
    d = tmp_path / name
    d.mkdir()
    cfg = {k: v for k, v in {**CONFIG, **changes}.items() if v is not None}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("window", [None, 0], ids=["missing", "zero"])
def test_config_without_original_window_asks_for_it(run_tool, tmp_path, window):
    """``L0`` is read from the config only: a 4096 guess would put s = 16 in the launch line."""
    d = _model_dir(tmp_path, max_position_embeddings=window)
    assert_refused(run_tool, main, ["--hf-config", d], "--hf-config", "max_position_embeddings",
                   "add it", watch=[tmp_path])


@pytest.mark.parametrize("where", ["top", "rope_scaling"])
def test_nan_window_is_one_line_with_the_fix(run_tool, tmp_path, where):
    """``NaN`` (Python's json reads it) is not a window: named, with what to write instead."""
    if where == "top":
        d = _model_dir(tmp_path, max_position_embeddings=float("nan"))
        key = "max_position_embeddings"
    else:
        d = _model_dir(tmp_path, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                               "original_max_position_embeddings": float("nan")})
        key = "original_max_position_embeddings"
    line = assert_refused(run_tool, main, ["--hf-config", d], f"{key} nan",
                          "set it to the model's original context window", watch=[tmp_path])
    assert "cannot convert" not in line


def test_hidden_size_not_divisible_by_heads(run_tool, tmp_path):
    d = _model_dir(tmp_path, hidden_size=4100, num_attention_heads=32, num_key_value_heads=8)
    assert_refused(run_tool, main, ["--hf-config", d], "hidden_size 4100",
                   "num_attention_heads 32", watch=[tmp_path])


def test_head_dim_given_needs_no_divisible_hidden_size(run_tool, tmp_path):
    """Megatron asserts divisibility only without ``kv_channels`` (head_dim): still planned."""
    d = _model_dir(tmp_path, hidden_size=4100, num_attention_heads=32, num_key_value_heads=8,
                   head_dim=128)
    rc, _, err = run_tool(main, ["--hf-config", d, "--json"])
    assert rc == 0, err


def test_target_equal_to_original_window_is_planned(run_tool, tmp_path):
    """``L = L0`` (s = 1) is legal for the trainer; the default sweep (from 32K) held lengths
    below L0 = 65536 and refused the run blaming --sweep, a flag never given."""
    d = _model_dir(tmp_path, max_position_embeddings=65536)
    rc, out, err = run_tool(main, ["--hf-config", d, "--target-length", "65536"])
    assert rc == 0, err
    assert "ORIGINAL_LENGTH=65536 TARGET_LENGTH=65536" in out
    rc, out, err = run_tool(main, ["--hf-config", d, "--target-length", "65536", "--json"])
    assert rc == 0, err
    assert [r["target_length"] for r in json.loads(out)["sweep"]] == [65536, 98304, 131072]


def test_explicit_sweep_below_original_window_names_sweep(run_tool, tmp_path):
    d = _model_dir(tmp_path, max_position_embeddings=65536)
    assert_refused(run_tool, main, ["--hf-config", d, "--target-length", "65536", "--sweep",
                                    "32768"], "--sweep 32768", "raise --sweep to 65536",
                   watch=[tmp_path],
                   absent=["(--target-length)", "--endprompt-original-length"])


def test_plot_inside_the_model_directory(run_tool, tmp_path):
    d = _model_dir(tmp_path)
    assert_refused(run_tool, main, ["--hf-config", d, "--plot", d / "plan.png"],
                   "--plot", "lies inside the input --hf-config", watch=[tmp_path])


def test_plot_that_is_the_config(run_tool, tmp_path):
    """A config saved under a plot's name: writing the plot would replace it."""
    cfg = tmp_path / "model.svg"
    cfg.write_text(json.dumps(CONFIG))
    assert_refused(run_tool, main, ["--hf-config", cfg, "--plot", cfg],
                   "--plot", "is the input --hf-config", watch=[tmp_path])


def test_plot_through_a_symlink_to_the_model_directory(run_tool, tmp_path):
    d = _model_dir(tmp_path)
    (tmp_path / "alias").symlink_to(d)
    assert_refused(run_tool, main, ["--hf-config", d, "--plot", tmp_path / "alias" / "p.png"],
                   "lies inside the input --hf-config", watch=[tmp_path])


def test_plot_that_is_the_launch_script(run_tool, tmp_path):
    """The launch script (an input: the defaults come from it) saved under a plot's name."""
    script = tmp_path / "launch.svg"
    shutil.copyfile(LAUNCH_SCRIPT, script)
    assert_refused(run_tool, main, ["--model", "llama3-8b", "--launch-script", script,
                                    "--plot", script], "is the input --launch-script",
                   watch=[tmp_path])


def test_nan_default_in_the_launch_script_names_the_variable_and_the_fix(run_tool, tmp_path):
    """``SEQ_LENGTH=${SEQ_LENGTH:-nan}``: the variable, its value and what to write instead,
    not Python's ``invalid literal for int()``."""
    script = tmp_path / "launch.sh"
    with open(LAUNCH_SCRIPT, encoding="utf-8") as f:
        script.write_text(f.read().replace("SEQ_LENGTH=${SEQ_LENGTH:-8192}",
                                           "SEQ_LENGTH=${SEQ_LENGTH:-nan}"))
    line = assert_refused(run_tool, main, ["--model", "llama3-8b", "--launch-script", script],
                          "SEQ_LENGTH's default 'nan' is not an integer", "--seq-length",
                          watch=[tmp_path])
    assert "invalid literal" not in line
