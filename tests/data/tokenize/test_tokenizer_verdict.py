"""The cached verdict that ``tokenizer.json`` read by ``tokenizers`` alone is Megatron's
``HuggingFaceTokenizer`` (so preprocessing can skip Megatron's import): the identity from
``tokenizers`` equals Megatron's, a cold run writes the verdict, a warm run uses it with the same
bytes and says so, and any change of the files, the library versions or a disagreement means
Megatron's tokenizer again."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.tokenize import tokenizer_verdict
from megatron_endprompt.data.tokenize.json_tokenizer import JsonTokenizer
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.data.tokenize.tokenizer_identity import tokenizer_identity

_KEYS = ("vocab_size", "eod", "fingerprint")


def _gpt2_dir(texts, path) -> str:
    """A GPT-2-style HF directory (byte-level BPE, ``<|endoftext|>`` as EOS, no BOS)."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(texts, trainer=BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eot = "<|endoftext|>"
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot,
                            unk_token=eot).save_pretrained(str(path))
    return str(path)


def _summary(run_tool, argv) -> dict:
    rc, out, err = run_tool(preprocess_cli.main, [*argv, "--summary-json"])
    assert rc == 0, err
    return json.loads(out)


def _files(prefix) -> tuple[bytes, bytes]:
    return tuple(open(f"{prefix}{s}", "rb").read() for s in (".bin", ".idx"))


@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_identity_from_tokenizers_alone_equals_megatrons(kind, spm_corpus, llama3_tokenizer_dir,
                                                         tmp_path):
    directory = (_gpt2_dir(spm_corpus.texts, tmp_path / "gpt2") if kind == "gpt2"
                 else llama3_tokenizer_dir)
    megatron = build_tokenizer(TokenizerSpec(tokenizer_type="HuggingFaceTokenizer",
                                             tokenizer_model=directory))
    light = JsonTokenizer.from_directory(directory)
    assert light.eod is not None
    ours, theirs = tokenizer_identity(light), tokenizer_identity(megatron)
    assert {k: getattr(ours, k) for k in _KEYS} == {k: getattr(theirs, k) for k in _KEYS}
    assert tokenizer_verdict.compare(light, megatron) is None


def test_cold_run_caches_the_verdict_warm_run_uses_it(llama3_args, run_tool, tmp_path,
                                                      verdict_cache):
    cold = _summary(run_tool, llama3_args(tmp_path / "cold", "--workers", 2))
    assert "cold run" in cold["tokenizer_note"]
    assert "verdict cached in" in cold["tokenizer_note"]
    assert len(os.listdir(verdict_cache / "tokenizer-verdicts")) == 1
    warm = _summary(run_tool, llama3_args(tmp_path / "warm", "--workers", 2))
    assert "cached verdict" in warm["tokenizer_note"]
    assert warm["tokenizer_path"] == cold["tokenizer_path"] == "tiktoken"
    assert _files(tmp_path / "cold") == _files(tmp_path / "warm")
    # the sidecars record the same tokenizer identity (training compares it)
    from megatron_endprompt.data.sidecar.sidecar import open_sidecar

    assert open_sidecar(f"{tmp_path}/cold.endprompt").header.tokenizer == \
        open_sidecar(f"{tmp_path}/warm.endprompt").header.tokenizer
    # HF path and prompts too: the same bytes as the cold run's Megatron-built tokenizer
    hf = _summary(run_tool, llama3_args(tmp_path / "hf", "--tokenizer-backend", "hf"))
    assert "cached verdict" in hf["tokenizer_note"]
    assert _files(tmp_path / "hf") == _files(tmp_path / "cold")


def test_prompts_through_the_cached_verdict_equal_megatrons(llama3_args, run_tool, tmp_path):
    prompt = ("--terminal-source", "prompt", "--terminal-prompts", "ep1-3")
    cold = _summary(run_tool, llama3_args(tmp_path / "cold", *prompt))
    warm = _summary(run_tool, llama3_args(tmp_path / "warm", *prompt))
    assert "cached verdict" in warm["tokenizer_note"]
    assert warm["prompt_ids"] == cold["prompt_ids"] and warm.get("ep2") == cold.get("ep2")


def test_transformers_changing_the_tokenizer_is_never_cached(
        llama3_tokenizer_dir, llama3_args, run_tool, tmp_path, verdict_cache):
    """A ``tokenizer_config.json`` token that ``tokenizer.json`` lacks: transformers adds it,
    so ``tokenizers`` alone is not Megatron's tokenizer: no verdict, Megatron's ids."""
    tok_dir = tmp_path / "tok"
    shutil.copytree(llama3_tokenizer_dir, tok_dir)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    config["additional_special_tokens"] = ["<|extra|>"]
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    for name in ("a", "b"):
        s = _summary(run_tool, [*llama3_args(tmp_path / name), "--tokenizer-model", str(tok_dir)])
        assert "tokenizers alone differs" in s["tokenizer_note"], s
    verdicts = verdict_cache / "tokenizer-verdicts"
    assert not verdicts.is_dir() or not os.listdir(verdicts)


def test_key_follows_every_tokenizer_file_and_library_version(llama3_tokenizer_dir, tmp_path):
    d = tmp_path / "tok"
    shutil.copytree(llama3_tokenizer_dir, d)
    versions = tokenizer_verdict.library_versions()
    key = tokenizer_verdict.verdict_key(str(d), versions)
    (d / "model.safetensors").write_bytes(b"weights are not read by the tokenizer")
    assert tokenizer_verdict.verdict_key(str(d), versions) == key
    assert tokenizer_verdict.verdict_key(str(d), versions | {"transformers": "0.0"}) != key
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=3))
    assert tokenizer_verdict.verdict_key(str(d), versions) != key


def test_verdict_with_another_identity_is_not_used(llama3_args, run_tool, tmp_path,
                                                   verdict_cache):
    _summary(run_tool, llama3_args(tmp_path / "cold"))
    (path,) = (verdict_cache / "tokenizer-verdicts").iterdir()
    entry = json.loads(path.read_text())
    entry["identity"]["fingerprint"] = "0" * 64
    path.write_text(json.dumps(entry))
    again = _summary(run_tool, llama3_args(tmp_path / "again"))
    assert "cold run" in again["tokenizer_note"]
    assert json.loads(path.read_text())["identity"]["fingerprint"] != "0" * 64


def test_cache_off_builds_megatrons_tokenizer(llama3_args, run_tool, tmp_path, monkeypatch):
    monkeypatch.setenv("MEGATRON_ENDPROMPT_CACHE", "off")
    for name in ("a", "b"):
        s = _summary(run_tool, llama3_args(tmp_path / name))
        assert "MEGATRON_ENDPROMPT_CACHE=off" in s["tokenizer_note"]


def test_added_token_literal_probed(llama3_tokenizer_dir):
    light = JsonTokenizer.from_directory(llama3_tokenizer_dir)
    texts = tokenizer_verdict.probe_texts(light)
    assert any("<|end_of_text|>" in t and "<|begin_of_text|>" in t for t in texts)
    light.backend.add_special_tokens([AddedToken("<|x|>", special=True, normalized=False)])
    assert any("<|x|>" in t for t in tokenizer_verdict.probe_texts(light))
