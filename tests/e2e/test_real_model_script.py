"""``benchmarks/gpu/real_model.sh``: its ``--dry-run`` (every stage planned, one JSON, no torch
child: fast tier) and its CPU smoke form (a tiny random Llama with SmolLM2's tokenizer, every
stage for real: ``e2e``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
from megatron_endprompt.training.loss import read_loss_log

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "gpu", "real_model.sh")
STAGES = ["convert", "preprocess", "pi_data", "train_endprompt", "export_endprompt",
          "train_pi", "export_pi", "eval_endprompt", "eval_pi", "export_base", "eval_base"]


def _env(tmp_path, **extra) -> dict:
    return {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
            "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def test_dry_run_plans_every_stage_at_equal_tokens(tmp_path):
    proc = subprocess.run(["bash", SCRIPT, "--dry-run", "--work-dir", str(tmp_path / "w")],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "out" / "real_model.json").read_text())
    assert list(doc["stages"]) == STAGES
    assert {s["status"] for s in doc["stages"].values()} == {"planned"}
    assert doc["pi_factor"] == 4 and doc["sizes"]["eval_lengths"] == [8192, 16384, 32768]
    st = doc["stages"]
    ep, pi = st["train_endprompt"]["env"], st["train_pi"]["env"]
    # equal tokens: the two trainings differ only in their data prefix and output
    same = {k: v for k, v in ep.items() if k not in ("DATA_PREFIX", "CHECKPOINT_OUT")}
    assert same == {k: v for k, v in pi.items() if k not in ("DATA_PREFIX", "CHECKPOINT_OUT")}
    assert ep["PRECISION"] == "bf16" and ep["TARGET_LENGTH"] == "32768"
    cmd = st["train_endprompt"]["cmd"]
    assert "local" == cmd[cmd.index("--transformer-impl") + 1]
    assert not any(f in cmd for f in ("--num-layers", "--hidden-size", "--untie-embeddings-"
                                      "and-output-weights"))  # the model comes from the record
    ev = st["eval_pi"]["cmd"]
    assert ev[ev.index("--tasks") + 1] == "passkey,niah_single_1"
    assert ev[ev.index("--lengths") + 1] == "8192,16384,32768"
    assert not (tmp_path / "w" / "corpus.jsonl").exists()  # nothing run
    assert "[train_pi]" in proc.stdout


@pytest.mark.process
def test_missing_model_is_one_error_line(tmp_path):
    proc = subprocess.run(["bash", SCRIPT, "--hf-dir", str(tmp_path / "nope"), "--work-dir",
                           str(tmp_path / "w")], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --hf-dir") and "--prepare" in proc.stderr
    assert not (tmp_path / "out" / "real_model.json").exists()


@pytest.mark.e2e
def test_cpu_smoke_runs_every_stage(tmp_path):
    from real_checkpoint import smollm2_hf_dir

    hf = smollm2_hf_dir()  # only its tokenizer and config are used (skips offline)
    proc = subprocess.run(["bash", SCRIPT, "--cpu-smoke", "--work-dir", str(tmp_path / "w")],
                          env=_env(tmp_path, REAL_MODEL_HF=hf, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=600)
    doc = json.loads((tmp_path / "out" / "real_model.json").read_text())
    failed = {k: v.get("tail") for k, v in doc["stages"].items() if v["status"] != "ok"}
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-2000:])
    assert list(doc["stages"]) == STAGES
    for m in ("base", "endprompt", "pi"):
        scores = doc["stages"][f"eval_{m}"]["scores"]
        assert set(scores) == {"passkey", "niah_single_1"}
        assert set(scores["passkey"]) == {"256", "512"}
    # equal tokens: the same iterations; the same samples, contiguous positions for PI
    w = tmp_path / "w"
    assert sorted(read_loss_log(str(w / "loss_endprompt"))) == [1, 2]
    assert sorted(read_loss_log(str(w / "loss_pi"))) == [1, 2]
    ep = np.asarray(read_sidecar(sidecar_path(str(w / "ep"))).records)
    pi = np.asarray(read_sidecar(sidecar_path(str(w / "pi"))).records)
    assert ep.shape == pi.shape and (pi[:, 1] == pi[:, 0]).all()
    assert (ep[:, 1] != ep[:, 0]).any()  # EndPrompt's terminals jump
