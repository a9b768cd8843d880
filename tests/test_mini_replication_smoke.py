"""The mini-replication (``benchmarks/replication/mini_replication.py``) in its CI form:
``--smoke`` runs the whole pipeline -- generated data, a tokenizer, our preprocessing, base
pretraining and one EndPrompt fine-tuning under torchrun (2 CPU ranks), export, evaluation
(RULER niah_single_1, passkey, PPL), statistics, tables and figure -- at the tiniest sizes. The
full form (the README tables) is run by hand: ``make replicate`` / ``--seeds 3 --sweep``."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from benchmarks.replication import controls
from benchmarks.replication import data
from benchmarks.replication import layouts
from benchmarks.replication import mini_replication as mini
from benchmarks.replication import report
from benchmarks.replication import run
from benchmarks.replication import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_method_layouts_are_the_documented_ones():
    kw = dict(terminal=64, w=1.0, prompt_w=0.1)
    fixed = run.layout_flags("c", **kw)
    assert fixed[:2] == ["--placement", "fixed"] and "document-tail" in fixed
    assert run.layout_flags("d", **kw)[:2] == ["--placement", "random"]
    pose = run.layout_flags("e", **{**kw, "w": 0.5})  # PoSE: no anchored tail, uniform weight
    assert pose[:2] == ["--placement", "pose"] and "continuation" in pose
    assert pose[pose.index("--terminal-length") + 1] == "1"
    assert pose[pose.index("--terminal-loss-weight") + 1] == "1"
    etp = run.layout_flags("etp", **kw)  # the paper's ET(PoSE): PoSE's law + EP1, w = 0.1
    assert etp[:2] == ["--placement", "pose"] and etp[etp.index("--terminal-prompts") + 1] == "ep1"
    assert etp[etp.index("--terminal-loss-weight") + 1] == "0.1"
    et = run.layout_flags("f", **{**kw, "w": 0.5})
    assert et[et.index("--pose-chunks") + 1] == "2" and "document-tail" in et
    assert et[et.index("--terminal-loss-weight") + 1] == "0.5"
    ep = run.layout_flags("g", **kw)
    assert "prompt" in ep and ep[ep.index("--terminal-loss-weight") + 1] == "0.1"


def test_wilson_and_t_intervals():
    lo, hi = stats.wilson(50, 100)
    assert abs(lo - 0.4038) < 1e-3 and abs(hi - 0.5962) < 1e-3  # textbook values
    lo, hi = stats.wilson(0, 100)
    assert lo < 1e-12 and 0.03 < hi < 0.04
    lo, hi = stats.t_interval([0.8, 0.9, 1.0])  # mean 0.9, sd 0.1, t(2) = 4.3027
    assert abs(lo - (0.9 - 4.302653 * 0.1 / 3 ** 0.5)) < 1e-6 and hi == 1.0
    assert stats.t_interval([0.5]) is None
    c = stats.cell([(8, 10), (10, 10)])
    assert c["mean"] == 0.9 and c["k"] == 18 and c["n"] == 20 and c["shown"] == c["t95"]


def test_fine_tuning_documents_hold_the_fact_early_and_the_recall_last():
    count = lambda text: len(text.split())  # noqa: E731 - any monotone counter will do
    rng = random.Random(0)
    for kind in ("passkey", "niah"):
        text = data.document(rng, kind, 400, count, fact_span=60)
        assert count(text) <= 400
        answer = text.rsplit(" ", 1)[1].rstrip(".")
        first = text.find(answer)
        assert first >= 0 and count(text[:first]) <= 60, kind
        assert text.endswith(f" {answer}.")


def test_tables_show_every_cell_with_its_interval():
    cell = {"counts": {"niah_single_1": {"320": [9, 10], "1024": [5, 10]},
                       "passkey": {"320": [10, 10], "1024": [0, 10]}},
            "ppl": {"320": 3.0, "1024": 2.5}}
    results = {
        "config": {"lengths": "320,1024", "L0": 320, "L": 1024, "P": 256, "ratio": 4,
                   "ft_iters": 2, "ft_docs": 8, "ft_lr": 3e-4, "terminal": 64, "w": 1.0,
                   "prompt_w": 0.1, "seeds": 2, "samples": 10, "ppl_docs": 2,
                   "base_iters": 2},
        "methods": {
            "b": {"name": "full", "seeds": {"0": {**cell, "step_ms": 200.0,
                                                  "peak_rss_mib": 1000.0,
                                                  "tokens_per_step": 8192}}},
            "c": {"name": "EndPrompt fixed", "seeds": {
                "0": {**cell, "step_ms": 50.0, "peak_rss_mib": 900.0, "tokens_per_step": 2048},
                "1": {**cell, "step_ms": 50.0, "peak_rss_mib": 900.0,
                      "tokens_per_step": 2048}}},
        },
        "timings_s": {"total_s": 60.0},
    }
    results["summary"] = {m: stats.summarize(e["seeds"], report.TASKS)
                          for m, e in results["methods"].items()}
    results["summary"]["base"] = stats.summarize({"-": cell}, report.TASKS)
    lines = report.main_table(results).splitlines()
    assert lines[0].startswith("| method | tokens/step | step vs (b) | RSS vs (b)")
    row_c = next(line for line in lines if line.startswith("| (c)"))
    # two identical seeds: a zero-width t interval; one seed: the cell's Wilson interval
    assert "| 2,048 | 0.25x | 0.90x | 90 [90-90] | 50 [50-50] |" in row_c
    row_b = next(line for line in lines if line.startswith("| (b)"))
    assert "| 90 [60-98] |" in row_b and "| 0 [0-28] |" in row_b and "| 2.50 |" in row_b


def test_untrained_rows_are_evaluated_once_per_base_and_protocol(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(run, "convert", lambda ckpt, hf, **kw: None)
    monkeypatch.setattr(run, "evaluate", lambda hf, out, c, ppl: calls.append(out) or
                        {"counts": {}, "ppl": {}, "samples": c["samples"]})
    c = dict(mini.SIZES["smoke"])
    rep = mini.Replication(c, str(tmp_path), resume=True)
    first = rep.export_eval("ckpt", "a", target=384, pi=3.0, cache=True)
    assert rep.export_eval("ckpt", "a", target=384, pi=3.0, cache=True) == first
    assert len(calls) == 1
    rep.export_eval("ckpt", "a", target=384, pi=4.0, cache=True)  # another window
    c["samples"] = 7  # another protocol
    assert rep.export_eval("ckpt", "a", target=384, pi=4.0, cache=True)["samples"] == 7
    c["base_iters"] += 1  # another base
    rep.export_eval("ckpt", "a", target=384, pi=4.0, cache=True)
    assert len(calls) == 4
    rep.export_eval("ckpt", "a", target=384, pi=4.0)  # trained rows: never cached
    mini.Replication(c, str(tmp_path), resume=False).export_eval(
        "ckpt", "a", target=384, pi=4.0, cache=True)  # no --resume: evaluated afresh
    assert len(calls) == 6


def test_full_length_fine_tuning_does_not_train_its_padding(tmp_path):
    kw = dict(seq=640, target=1280, pi=2.0, mb=1, gbs=8, iters=10, lr=1e-3, data_prefix="p",
              save="s", load=None, seed=1)
    c = mini.SIZES["full"]
    assert "--eod-mask-loss" not in run.train_argv(c, "m", str(tmp_path), **kw)
    argv = run.train_argv(c, "m", str(tmp_path), eod_mask=True, warmup=30, **kw)
    assert "--eod-mask-loss" in argv and argv[argv.index("--lr-warmup-iters") + 1] == "30"


@pytest.mark.parametrize("flags, names", [
    (["--target-length", "300"], "--target-length"),
    (["--seq-length", "700"], "--target-length"),
    (["--fact-span", "120"], "--fact-span"),
])
def test_inconsistent_windows_are_refused_in_one_line(flags, names, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        mini.main([*flags, "--workdir", str(tmp_path / "w")])
    assert str(exc.value).startswith("error: ") and names in str(exc.value)
    assert not (tmp_path / "w").exists()  # refused before anything is written


@pytest.mark.e2e
def test_smoke_run_end_to_end(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.replication.mini_replication", "--smoke",
         "--workdir", str(tmp_path / "work"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    cfg = res["config"]
    assert set(res["methods"]) == {"f"} and cfg["ratio"] == 3  # s = 384/128
    # every method's training data was built and has its layout; one trains end to end
    assert set(res["layouts"]) == set(mini.METHODS) - {"a"}
    assert "0 jumped" in res["layouts"]["d0"] and "N=2" in res["layouts"]["e"]
    assert res["summary"]["f"]["niah_multikey_2"]["384"]["n"] == cfg["samples"]  # held-out
    assert "MK2 (held-out) 384" in (tmp_path / "result.md").read_text()
    assert res["base"]["train"]["step_ms"] > 0
    f = res["methods"]["f"]["seeds"]["0"]
    assert f["tokens_trained"] == cfg["ft_iters"] * cfg["ft_docs"] * cfg["P"]
    assert f["step_ms"] > 0 and f["peak_rss_mib"] > 100 and f["losses"]
    for m in ("base", "f"):
        cell = res["summary"][m]["niah_single_1"]["384"]
        assert cell["n"] == cfg["samples"] and 0.0 <= cell["mean"] <= 1.0
        assert cell["shown"][0] <= cell["mean"] <= cell["shown"][1]
        assert res["summary"][m]["ppl"]["384"]["mean"] > 1.0
        assert res["summary"][m]["passkey"]["384"]["n"] > 0
    hf_cfg = json.loads((tmp_path / "work" / "hf_f_seed0" / "config.json").read_text())
    assert hf_cfg["max_position_embeddings"] == cfg["L"]
    table = (tmp_path / "result.md").read_text()
    # (f) is named for what it is: the project's chunks, not the paper's ET(PoSE) (that is etp)
    assert "| (f) (d) + the project's two-piece chunks |" in table and "ET(PoSE)" not in table
    assert "| base, s=1 (no PI) |" in table
    assert (tmp_path / "result.png").stat().st_size > 1000


# -- controls, held-out columns, paired differences -------------------------------------------


def test_d0_is_d_with_contiguous_positions(run_tool, spm_args, tmp_path):
    """(d0): the very samples of (d) (same seed, tokens and loss weights), T = a."""
    import numpy as np

    from megatron_endprompt.cli import preprocess as preprocess_cli
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.data.sidecar.spans import sample_reader
    from megatron_endprompt.layout import positions_from_record

    assert controls.layout_flags("d0", terminal=8, w=1.0, prompt_w=0.1) == \
        run.layout_flags("d", terminal=8, w=1.0, prompt_w=0.1)
    prefix = str(tmp_path / "d")
    rc, _, err = run_tool(preprocess_cli.main, spm_args(
        prefix, *controls.layout_flags("d0", terminal=8, w=1.0, prompt_w=0.1)))
    assert rc == 0, err
    before = read_sidecar(sidecar_path(prefix))
    read = sample_reader(prefix, before)
    tokens = [np.asarray(read(i)).copy() for i in range(before.header.num_samples)]
    old = np.array(before.records)
    assert np.any(old[:, 1] > old[:, 0])  # (d) jumps
    n = controls.make_contiguous(sidecar_path(prefix))
    after = read_sidecar(sidecar_path(prefix))
    P = after.layout.seq_length
    assert n == len(tokens) and np.array_equal(np.array(after.records)[:, 0], old[:, 0])
    read = sample_reader(prefix, after)
    for i, rec in enumerate(np.array(after.records)):
        assert np.array_equal(positions_from_record(rec, P), np.arange(P))
        assert np.array_equal(np.asarray(read(i)), tokens[i])


def test_g1_documents_are_short_range_and_g1p_closes_with_ep1():
    c = dict(mini.SIZES["full"])
    lo, hi = controls.short_doc_tokens(c)
    assert hi <= c["P"] - 24 and lo < hi  # a whole document fits one sample's context
    flags = controls.layout_flags("g1p", terminal=64, w=1.0, prompt_w=0.1)
    assert flags[flags.index("--terminal-prompts") + 1] == "ep1"
    assert flags[flags.index("--terminal-loss-weight") + 1] == "0.1"
    assert flags[:2] == ["--placement", "fixed"]
    assert controls.layout_flags("a1", terminal=64, w=1.0, prompt_w=0.1) is None


def test_paired_difference_and_its_table():
    x = {"0": {"counts": {"passkey": {"640": [9, 10]}}},
         "1": {"counts": {"passkey": {"640": [5, 10]}}},
         "2": {"counts": {"passkey": {"640": [10, 10]}}}}
    y = {"0": {"counts": {"passkey": {"640": [8, 10]}}},
         "1": {"counts": {"passkey": {"640": [5, 10]}}}}
    d = stats.paired_difference(x, y, "passkey", "640")  # seeds 0, 1 only: +0.1, 0.0
    assert d["per_seed"] == pytest.approx([0.1, 0.0]) and d["mean"] == pytest.approx(0.05)
    half = 12.706205 * (0.1 / 2 ** 0.5) / 2 ** 0.5  # t(1) x sd / sqrt(2)
    assert d["t95"] == pytest.approx([0.05 - half, 0.05 + half])
    assert stats.paired_difference(x, {"9": y["0"]}, "passkey", "640") is None
    table = report.paired_table({"paired": {"d-b": {"passkey": {"640": d}}}})
    assert "| (d) - (b) | passkey (in-dist.) | 640 | +5.0 |" in table


def test_held_out_columns_are_marked(tmp_path):
    cell = {"counts": {"niah_single_1": {"640": [1, 2]}, "passkey": {"640": [2, 2]},
                       "niah_multiquery": {"640": [0, 2]}}, "ppl": {}}
    results = {"config": {"lengths": "640"}, "methods": {"d": {"name": "x", "seeds": {"0": cell}}}}
    tasks = [*run.EVAL_TASKS, "niah_multiquery"]
    results["summary"] = {"d": stats.summarize({"0": cell}, tasks),
                          "base": stats.summarize({"-": cell}, tasks)}
    head = report.main_table(results).splitlines()[0]
    assert "NIAH (in-dist.) 640" in head and "MQ (held-out) 640" in head


def test_a_method_whose_data_has_another_layout_is_refused(run_tool, spm_args, tmp_path):
    """The layout check the smoke form runs on every method: (c) with (d)'s random terminals,
    or (d0) with its jumps left in, is one error line naming the method."""
    from tests.support.layout import SPM_B, SPM_L, SPM_P

    from megatron_endprompt.cli import preprocess as preprocess_cli

    c = {"L": SPM_L, "P": SPM_P, "prompt_w": 0.1}
    lay = dict(terminal=SPM_B, w=1.0)
    for m, flags_of in (("c", "c"), ("d", "d"), ("c", "d"), ("d0", "d0")):
        prefix = str(tmp_path / f"{m}_{flags_of}")
        flags = (controls.layout_flags if flags_of == "d0" else run.layout_flags)(
            flags_of, prompt_w=0.1, **lay)
        rc, _, err = run_tool(preprocess_cli.main, spm_args(prefix, *flags))
        assert rc == 0, err
        kw = {"data_prefix": prefix}
        if m == flags_of != "d0":
            assert f"({m}) document-tail" in layouts.check(m, kw, c, **lay)
            continue
        with pytest.raises(SystemExit) as exc:  # d0 before make_contiguous: still (d)'s jumps
            layouts.check(m, kw, c, **lay)
        assert str(exc.value).startswith(f"error: method ({m}): ") and "\n" not in str(exc.value)


def test_an_interrupted_base_stage_continues_from_its_last_save(tmp_path, monkeypatch):
    """--resume: a pretraining stage saved part-way under the same configuration is continued
    (--load of its own checkpoint, no --finetune); under another configuration it restarts."""
    argvs = []
    monkeypatch.setattr(run, "train", lambda name, argv, work: argvs.append(argv) or {})

    def fresh(*a, **k):
        raise RuntimeError("started over")
    monkeypatch.setattr(data, "make_tokenizer", fresh)
    rep = mini.Replication(dict(mini.SIZES["smoke"]), str(tmp_path), resume=True)
    key = {"base_iters": 2}
    (tmp_path / "ckpt_base").mkdir()
    (tmp_path / "ckpt_base" / "latest_checkpointed_iteration.txt").write_text("1")
    (tmp_path / "ckpt_base.partial.json").write_text(json.dumps(key))
    rep._base_stage(0, "ckpt_base", 2, None, key)
    argv = argvs[-1]
    assert argv[argv.index("--load") + 1] == str(tmp_path / "ckpt_base")
    assert "--finetune" not in argv and argv[argv.index("--save-interval") + 1] == "2"
    with pytest.raises(RuntimeError, match="started over"):
        rep._base_stage(0, "ckpt_base", 2, None, {"base_iters": 3})
    assert not (tmp_path / "ckpt_base").exists()


def test_held_out_tasks_run_only_at_lengths_their_prompt_fits(llama3_tokenizer_dir):
    """The main-table run stopped at the base row: at L0 = 320, ``niah_multivalue`` and
    ``niah_multiquery`` need more tokens than 320. Each held-out task now runs at the lengths
    its smallest prompt fits (the evaluator's own check); the others are reported as not run."""
    tasks = ["niah_multikey_2", "niah_multivalue", "niah_multiquery"]
    fits = run.held_out_lengths(llama3_tokenizer_dir, tasks, [48, 4096])
    assert fits == {t: [4096] for t in tasks}  # 48 tokens hold no prompt; 4096 hold each
