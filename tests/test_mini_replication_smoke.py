"""The mini-replication (``benchmarks/mini_replication.py``) in its CI form: ``--smoke`` runs the
whole pipeline -- generated data, a tokenizer, our preprocessing, base pretraining and one
EndPrompt fine-tuning under torchrun (2 CPU ranks), export, evaluation -- at the tiniest sizes.
The full form (the README table) is run by hand: ``make replicate``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "mini_replication.py")


def _module():
    spec = importlib.util.spec_from_file_location("mini_replication", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_method_layouts_are_the_documented_ones():
    mod = _module()
    c = mod.SIZES["full"]
    fixed = mod.layout_flags("c", c, 1.0)
    assert fixed[:2] == ["--placement", "fixed"] and "document-tail" in fixed
    assert mod.layout_flags("d", c, 0.5)[:2] == ["--placement", "random"]
    pose = mod.layout_flags("e", c, 0.5)  # PoSE: no anchored tail, uniform weight
    assert "continuation" in pose and pose[pose.index("--terminal-length") + 1] == "1"
    assert pose[pose.index("--terminal-loss-weight") + 1] == "1"
    et = mod.layout_flags("f", c, 0.5)
    assert et[et.index("--pose-chunks") + 1] == "2" and "document-tail" in et
    assert et[et.index("--terminal-loss-weight") + 1] == "0.5"
    # equal token budget per step: (b) 2 x L tokens, the others 2 * ratio x L0
    assert 2 * c["L0"] * c["ratio"] == 2 * c["ratio"] * c["L0"]


def test_table_is_relative_to_full_length_finetuning():
    mod = _module()
    ev = {"passkey": {"256": 1.0, "512": 0.5}, "ppl": {"256": 3.0, "512": None}}
    results = {
        "config": {"lengths": "256,512", "tasks": "passkey,ppl", "L0": 128, "L": 512,
                   "P": 128, "ratio": 4, "ft_iters": 2, "gbs_full_length": 2, "gbs_short": 8,
                   "terminal": 16, "terminal_loss_weight": 1.0, "samples": 1, "depths": "0.5",
                   "ppl_windows": 1, "base_iters": 2},
        "methods": {
            "a": {"name": "PI only", "tokens_trained": 0, "eval": ev},
            "b": {"name": "full", "tokens_trained": 2048, "step_ms": 200.0,
                  "peak_rss_mib": 1000.0, "eval": ev},
            "c": {"name": "EndPrompt fixed", "tokens_trained": 2048, "step_ms": 50.0,
                  "peak_rss_mib": 900.0, "eval": ev},
        },
        "timings_s": {"total_s": 60.0},
    }
    table = mod.markdown(results)
    lines = table.splitlines()
    assert lines[0].startswith("| method | tokens | step ms | step vs (b)")
    row_c = next(line for line in lines if line.startswith("| (c)"))
    assert "| 0.25x |" in row_c and "| 0.90x |" in row_c
    assert "| 100 | 50 | 3.00 | n/a |" in row_c
    row_a = next(line for line in lines if line.startswith("| (a)"))
    assert "| - | - | - | - |" in row_a


@pytest.mark.slow
def test_smoke_run_end_to_end(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--workdir", str(tmp_path / "work"),
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    cfg = res["config"]
    assert set(res["methods"]) == {"a", "c"}
    assert res["base"]["step_ms"] > 0 and res["base"]["peak_rss_mib"] > 100
    c = res["methods"]["c"]
    assert c["tokens_trained"] == cfg["ft_iters"] * cfg["gbs_short"] * cfg["P"]
    assert c["step_ms"] > 0 and c["peak_rss_mib"] > 100 and c["losses"]
    for m in ("a", "c"):
        ev = res["methods"][m]["eval"]
        assert 0.0 <= ev["passkey"]["256"] <= 1.0
        assert ev["ppl"]["256"] > 1.0
        assert os.path.isfile(tmp_path / "work" / f"hf_{m}" / "config.json")
    hf_cfg = json.loads((tmp_path / "work" / "hf_c" / "config.json").read_text())
    assert hf_cfg["max_position_embeddings"] == cfg["L"]
    table = (tmp_path / "result.md").read_text()
    assert "| (c) EndPrompt fixed |" in table and "| (a) PI only (no training) |" in table
