"""Shared inputs of the reliability sweep, built once (tiny: ~20 s on 2 cores): a SentencePiece
corpus and its EndPrompt prefix, a NullTokenizer prefix for the pretrain entry, a tiny HF
Llama (+ a NaN copy), its Megatron conversion (+ a NaN one) and an HF export of it.

Only the tools' public entry points are used, so the sweep also runs against older code
(``python tests/reliability/sweep.py`` with ``PYTHONPATH`` at another checkout)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from types import SimpleNamespace

from tests.support.hf_configs import tiny_llama_config

P, L, B = 64, 512, 8
SUFFIXES = (".bin", ".idx", ".endprompt")


def quiet_cli(main, argv) -> int:
    from megatron_endprompt.errors import run_cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = run_cli(main, argv)
    if rc != 0:
        raise RuntimeError(f"fixture command failed ({rc}): {argv}\n{err.getvalue()[-2000:]}")
    return rc


def preprocess_argv(prefix: str, corpus: str, model: str, *extra: str, L_: int = L) -> list[str]:
    return ["--input", corpus, "--output-prefix", prefix, "--tokenizer-type",
            "GPTSentencePieceTokenizer", "--tokenizer-model", model, "--seq-length", str(P),
            "--target-length", str(L_), "--terminal-length", str(B), "--append-eod",
            "--no-progress", *extra]


def null_argv(prefix: str, corpus: str, *extra: str, L_: int = L) -> list[str]:
    return ["--input", corpus, "--output-prefix", prefix, "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "1000", "--seq-length", str(P), "--target-length", str(L_),
            "--terminal-length", str(B), "--append-eod", "--no-progress", *extra]


def _hf_tokenizer(texts: list[str], out_dir: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.save_pretrained(out_dir)
    return fast


def _hf_model(out_dir: str, tok, *, nan: bool = False) -> str:
    import torch
    from transformers import LlamaForCausalLM

    cfg = tiny_llama_config(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    if nan:
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@contextlib.contextmanager
def _finite_check_off():
    """Build the NaN Megatron checkpoint even where hf-to-megatron refuses NaN weights."""
    import megatron_endprompt.conversion.hf_to_megatron as h2m

    saved = getattr(h2m, "check_finite", None)
    if saved is not None:
        h2m.check_finite = lambda *a, **k: None
    try:
        yield
    finally:
        if saved is not None:
            h2m.check_finite = saved


def build(root: str) -> SimpleNamespace:
    """Everything the cases need, under ``root`` (created)."""
    from megatron_endprompt.cli import convert as convert_cli
    from megatron_endprompt.cli import preprocess as preprocess_cli
    from megatron_endprompt.data.prepare.synthetic import train_sentencepiece, write_corpus

    os.makedirs(root, exist_ok=True)
    fx = SimpleNamespace(root=root)
    fx.corpus = write_corpus(os.path.join(root, "corpus.jsonl"), num_docs=40, seed=0,
                             min_sentences=1, max_sentences=24)
    fx.spm = train_sentencepiece(fx.corpus, os.path.join(root, "spm"), vocab_size=400)
    fx.spm_small = train_sentencepiece(fx.corpus, os.path.join(root, "spm_small"),
                                       vocab_size=320)
    with open(fx.corpus, encoding="utf-8") as f:
        fx.texts = [json.loads(line)["text"] for line in f]
    fx.good = os.path.join(root, "good", "data")
    os.makedirs(os.path.dirname(fx.good))
    quiet_cli(preprocess_cli.main, preprocess_argv(fx.good, fx.corpus, fx.spm))
    fx.small_corpus = os.path.join(root, "small.jsonl")  # a different, smaller dataset
    with open(fx.small_corpus, "w", encoding="utf-8") as f:
        for t in fx.texts[:15]:
            f.write(json.dumps({"text": t}) + "\n")
    # NullTokenizer prefixes for the pretrain entry (L and L=1024 for a sidecar mismatch)
    fx.null_corpus = os.path.join(root, "null.jsonl")
    with open(fx.null_corpus, "w") as f:
        for d in range(60):
            f.write(json.dumps({"text": " ".join(str((d * 7 + i) % 997) for i in range(90))})
                    + "\n")
    fx.null = os.path.join(root, "null", "ep")
    fx.null2 = os.path.join(root, "null", "ep2")
    fx.null_other_L = os.path.join(root, "null", "ep_L1024")
    os.makedirs(os.path.dirname(fx.null))
    quiet_cli(preprocess_cli.main, null_argv(fx.null, fx.null_corpus))
    for s in SUFFIXES:
        shutil.copyfile(fx.null + s, fx.null2 + s)
    quiet_cli(preprocess_cli.main, null_argv(fx.null_other_L, fx.null_corpus, L_=1024))
    # HF side
    fx.hf = os.path.join(root, "hf")
    fx.hf_nan = os.path.join(root, "hf_nan")
    tok = _hf_tokenizer(fx.texts, os.path.join(root, "hf_tok"))
    _hf_model(fx.hf, tok)
    _hf_model(fx.hf_nan, tok, nan=True)
    fx.mg = os.path.join(root, "mg")
    fx.mg_nan = os.path.join(root, "mg_nan")
    quiet_cli(convert_cli.main, ["hf-to-megatron", "--hf-dir", fx.hf, "--output", fx.mg,
                                 "--no-progress"])
    with _finite_check_off():
        quiet_cli(convert_cli.main, ["hf-to-megatron", "--hf-dir", fx.hf_nan, "--output",
                                     fx.mg_nan, "--no-progress"])
    fx.export = os.path.join(root, "export")
    quiet_cli(convert_cli.main, ["megatron-to-hf", "--checkpoint", fx.mg, "--output",
                                 fx.export, "--target-length", "1024", "--no-progress"])
    fx.ppl = os.path.join(root, "ppl.txt")
    with open(fx.ppl, "w", encoding="utf-8") as f:
        f.write(" ".join(fx.texts))
    return fx


@contextlib.contextmanager
def bin_on_full_disk(prefix: str):
    """The temporary ``.bin`` is ``/dev/full`` (every write fails with ENOSPC, a full disk); the
    link is removed afterwards, so what the run itself left is what the snapshot sees."""
    link = f"{prefix}.bin.tmp-{os.getpid()}"
    os.symlink("/dev/full", link)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link)
