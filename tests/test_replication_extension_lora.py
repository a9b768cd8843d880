"""The LoRA block of the extension protocol: held-out text the fine-tuning never read, held-out
perplexity that scores the same tokens at every length, trainable parameters read from the
checkpoint's Adam state, the paired LoRA - full statistics, and (e2e) the block at toy sizes
through Megatron's pretrain, the merged export and the evaluation."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.replication import extension_eval
from benchmarks.replication import extension_lora
from benchmarks.replication import extension_lora_report as report
from benchmarks.replication import extension_text
from megatron_endprompt.data.prepare import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _corpus(path, speeches: int, lines: int = 2) -> str:
    """A tinyshakespeare-shaped corpus: speeches (a speaker line and generated verse) between
    blank lines, each distinct."""
    rng = np.random.default_rng(0)
    parts = [f"SPEAKER {i}:\n" + "\n".join(synthetic.sentence(rng) for _ in range(lines))
             for i in range(speeches)]
    path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    return str(path)


def _words(text: str) -> int:
    return len(text.split())


def test_held_out_text_starts_after_the_last_speech_the_fine_tuning_read(tmp_path):
    corpus = _corpus(tmp_path / "c.txt", 500)
    ft = str(tmp_path / "ft.jsonl")
    extension_text.write_natural_docs(ft, corpus=corpus, num_docs=30, min_tokens=20,
                                      max_tokens=60, seed=0, count=_words)
    out = str(tmp_path / "held.jsonl")
    info = extension_text.write_heldout_docs(out, corpus=corpus, fine_tuning=ft, num_docs=4,
                                             min_tokens=80, count=_words)
    _, pool = extension_text.split_speeches(corpus)
    ft_parts = {p for line in open(ft, encoding="utf-8")
                for p in json.loads(line)["text"].split("\n\n")}
    read = [i for i, s in enumerate(pool) if any(s.startswith(p) for p in ft_parts)]
    assert info["first_speech"] == max(read) + 1 and info["docs"] == 4
    held = [json.loads(line)["text"] for line in open(out, encoding="utf-8")]
    assert all(_words(d) >= 80 for d in held)
    speeches = [s for d in held for s in d.split("\n\n")]
    assert speeches == pool[info["first_speech"]:info["first_speech"] + info["speeches"]]
    assert not set(speeches) & ft_parts
    with pytest.raises(SystemExit, match="^error: .*--ppl-docs"):  # not that much left
        extension_text.write_heldout_docs(out, corpus=corpus, fine_tuning=ft, num_docs=500,
                                          min_tokens=80, count=_words)


def test_a_fine_tuning_text_that_wraps_the_corpus_holds_nothing_out(tmp_path):
    corpus = _corpus(tmp_path / "c.txt", 60)  # 24 fine-tuning speeches: 30 documents wrap
    ft = str(tmp_path / "ft.jsonl")
    extension_text.write_natural_docs(ft, corpus=corpus, num_docs=30, min_tokens=20,
                                      max_tokens=60, seed=0, count=_words)
    with pytest.raises(SystemExit, match="^error: .*wrap"):
        extension_text.consumed_speeches(corpus, ft)


def test_held_out_ppl_scores_the_same_tokens_at_every_length(tmp_path):
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from tests.support.hf_configs import tiny_llama_config

    corpus = _corpus(tmp_path / "c.txt", 120, lines=4)
    docs = tmp_path / "docs.jsonl"
    with open(corpus, encoding="utf-8") as f, open(docs, "w", encoding="utf-8") as g:
        text = f.read()
        for i in range(3):
            g.write(json.dumps({"text": text[i * 3000:(i + 1) * 3000]}) + "\n")
    tok_dir = synthetic.build_llama2_like_tokenizer(
        str(docs), str(tmp_path / "tok"), vocab_size=400)
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(vocab_size=len(tok))).eval()
    out = extension_eval.heldout_ppl(model, tok, str(docs), lengths=(32, 64), stride=32,
                                     doc_tokens=128)
    assert set(out) == {"32", "64"}
    for n in ("32", "64"):  # every token but BOS, once per length
        assert out[n]["tokens"] == 3 * 127 and out[n]["docs"] == 3
        assert math.isclose(out[n]["ppl"], math.exp(out[n]["nll"]), rel_tol=1e-9)
    # stride 32 over 128 tokens: 5 windows of <= 32 (each from the previous one's last
    # token), 3 of <= 64
    assert (out["32"]["windows"], out["64"]["windows"]) == (3 * 5, 3 * 3)
    with pytest.raises(ValueError, match="shorter than"):
        extension_eval.heldout_ppl(model, tok, str(docs), lengths=(32,), stride=32,
                                   doc_tokens=10 ** 5)


def test_trainable_parameters_are_the_checkpoints_adam_state(tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp

    state = {"decoder.linear_qkv.weight": torch.zeros(3, 12, 4),
             "decoder.linear_qkv.lora_a": torch.zeros(3, 2, 4),
             "decoder.linear_qkv.lora_b": torch.zeros(3, 12, 2),
             "optimizer.state.exp_avg.decoder.linear_qkv.lora_a": torch.zeros(3, 2, 4),
             "optimizer.state.exp_avg.decoder.linear_qkv.lora_b": torch.zeros(3, 12, 2),
             "optimizer.state.exp_avg_sq.decoder.linear_qkv.lora_a": torch.zeros(3, 2, 4),
             "optimizer.state.exp_avg_sq.decoder.linear_qkv.lora_b": torch.zeros(3, 12, 2)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "iter_0000002")),
             no_dist=True)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    assert extension_lora.checkpoint_params(str(tmp_path)) == {
        "trainable": 3 * 2 * 4 + 3 * 12 * 2, "adapters": 3 * 2 * 4 + 3 * 12 * 2,
        "base": 3 * 12 * 4}


def _entry(ppl0, ppl1, niah, step, rss, loss1=4.0):
    counts = {"niah_single_1": {"256": [niah[0], 20], "512": [niah[1], 20]},
              "passkey": {"256": [0, 20], "512": [0, 20]}}
    return {"counts": counts, "ppl": {"256": {"ppl": ppl0}, "512": {"ppl": ppl1}},
            "step_ms": step, "peak_rss_mib": rss, "losses": {"1": loss1, "50": 3.0},
            "lr": 1e-3, "params": {"trainable": 10, "adapters": 10, "base": 100}}


def _results():
    arms = {
        "full": {"0": _entry(10, 20, (10, 0), 100, 1000), "1": _entry(12, 22, (8, 2), 110, 1000),
                 "2": _entry(11, 25, (9, 1), 90, 1000)},
        "lora": {"0": _entry(11, 22, (10, 0), 80, 900), "1": _entry(13.2, 24.2, (9, 2), 88, 900),
                 "2": _entry(12.1, 27.5, (10, 0), 72, 900, loss1=4.5)},
    }
    ref = _entry(9, 40, (10, 0), None, None)
    return {"config": {"L0": 256, "L": 512},
            "references": {"base_s1": ref, "base_pi": ref},
            "arms": {k: {"label": k, "seeds": v} for k, v in arms.items()}}


def test_lora_minus_full_is_paired_by_seed_with_holm_over_the_table():
    res = _results()
    report.summarize(res, extension_lora.PAIRS)
    d = res["paired"]["lora-full"]
    # PPL as log ratios: LoRA 10% above full in every seed -> x1.100, no spread
    assert d["ppl_L0"]["per_seed"] == pytest.approx([math.log(1.1)] * 3)
    assert d["ppl_L0"]["t95"] == pytest.approx([math.log(1.1)] * 2)
    assert d["step_ms"]["per_seed"] == pytest.approx([math.log(0.8)] * 3)
    assert d["niah_single_1_retention"]["per_seed"] == pytest.approx([0.0, -0.05, -0.1])
    assert d["iteration1_equal"] == {"0": True, "1": True, "2": False}
    cells = [v for k, v in d.items() if k != "iteration1_equal"]
    assert len(cells) == len(report.QUANTITIES) and all("p_holm" in v for v in cells)
    assert "lora_hilr-full" not in res["paired"]  # an arm not run is not paired
    s = res["summary"]["full"]
    assert s["ppl_L0"]["mean"] == pytest.approx((10 * 12 * 11) ** (1 / 3))  # geometric
    assert s["step_ms"]["mean"] == pytest.approx(100.0)
    table = report.paired_table(res)
    assert "| (lora) - (full) | held-out PPL @L0 | **x1.100** | **[x1.100, x1.100]** |" in table
    assert "| (lora) - (full) | NIAH retention | -5.0 |" in table
    arms = report.arms_table(res)
    assert "| (lora) lora | 10 (10.0% of 100) |" in arms
    assert "| PI only (no training) | - | - | - | 9.00 | 40.00 | 50.0 | 0.0 | 0.0 | 0.0 |" \
        in arms


@pytest.mark.e2e
def test_lora_block_end_to_end_at_toy_sizes(tmp_path):
    """Base (2 steps), full and LoRA EndPrompt (2 steps each) through Megatron's pretrain,
    merged export with PI, retrieval and held-out PPL: 3 torchrun launches."""
    corpus = _corpus(tmp_path / "c.txt", 2500, lines=3)
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.replication.extension_lora", "--smoke",
         "--seeds", "1", "--workdir", str(tmp_path / "w"), "--out", str(out),
         "--corpus", corpus], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    c = res["config"]
    full, lora = (res["arms"][k]["seeds"]["0"] for k in ("full", "lora"))
    r = c["lora_rank"]
    h, f, layers = c["hidden"], c["ffn"], c["layers"]
    qkv = h + 2 * (h // c["heads"]) * c["groups"]
    adapters = layers * r * ((h + qkv) + (h + h) + (h + 2 * f) + (f + h))  # A [r,in] + B [out,r]
    assert lora["params"] == {"trainable": adapters, "adapters": adapters,
                              "base": full["params"]["base"]}
    assert full["params"]["trainable"] == full["params"]["base"]  # every weight trains
    assert full["losses"]["1"] == lora["losses"]["1"]  # B = 0, same data and order
    # Megatron's warm-up gives step 1 LR 0; step 2 trains: the merged adapters move the model
    pi = res["references"]["base_pi"]["ppl"]["512"]["ppl"]
    assert len({pi, full["ppl"]["512"]["ppl"], lora["ppl"]["512"]["ppl"]}) == 3
    assert full["tokens_per_step"] == lora["tokens_per_step"] == c["ft_docs"] * c["P"]
    for e in (full, lora):
        assert e["step_ms"] > 0 and e["peak_rss_mib"] > 100
        assert set(e["ppl"]) == {"256", "512"} and e["ppl"]["512"]["ppl"] > 1
        assert e["counts"]["passkey"]["512"][1] == c["samples"]
    assert res["paired"]["lora-full"]["iteration1_equal"] == {"0": True}
    hf = json.loads((tmp_path / "w" / "hf_lora_lora_seed0" / "config.json").read_text())
    assert hf["rope_scaling"]["factor"] == 2.0 and hf["max_position_embeddings"] == 512
    md = (tmp_path / "r.md").read_text()
    assert "| (lora) EndPrompt (ep1f), LoRA, equal LR |" in md and "held-out PPL @L" in md
