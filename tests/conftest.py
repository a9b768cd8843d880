"""Session-wide fixtures: a generated corpus and a SentencePiece model trained on it inside the
test session (no download, well under a second), plus an in-process CLI runner."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from spm_layout import SPM_B, SPM_L, SPM_P  # noqa: F401  (re-exported for the fixtures)


@pytest.fixture(autouse=True)
def verdict_cache(tmp_path_factory, monkeypatch):
    """Each test its own empty tokenizer-verdict cache (never the user's ~/.cache): a test's
    first preprocessing run is a cold one (``data.tokenizer_verdict``). Subprocesses inherit
    it through the environment. Returns the cache root."""
    root = tmp_path_factory.mktemp("verdict_cache")
    monkeypatch.setenv("MEGATRON_ENDPROMPT_CACHE", str(root))
    return root


@pytest.fixture(scope="session")
def spm_corpus(tmp_path_factory):
    """``corpus.jsonl`` (40 documents, some shorter than one sample) and ``spm.model`` trained on
    it. Fields: ``root``, ``path``, ``model``, ``texts``."""
    from megatron_endprompt.data.prepare.synthetic import train_sentencepiece, write_corpus

    root = tmp_path_factory.mktemp("spm_corpus")
    path = write_corpus(str(root / "corpus.jsonl"), num_docs=40, seed=0,
                        min_sentences=1, max_sentences=24)
    model = train_sentencepiece(path, str(root / "spm"), vocab_size=400)
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    return SimpleNamespace(root=root, path=path, model=model, texts=texts)


@pytest.fixture(scope="session")
def spm_tokenizer(spm_corpus):
    """The Megatron-Core tokenizer of ``spm_corpus.model`` (as preprocessing builds it)."""
    from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer

    return build_tokenizer(TokenizerSpec(tokenizer_type="GPTSentencePieceTokenizer",
                                         tokenizer_model=spm_corpus.model))


@pytest.fixture(scope="session")
def spm_args(spm_corpus):
    """``spm_args(prefix, *extra)``: preprocess argv for the SentencePiece corpus (continuation,
    fixed placement, P/L/b = SPM_P/SPM_L/SPM_B, --append-eod, one worker); ``extra`` flags come
    last, so they override the defaults (argparse keeps the last value)."""

    def argv(prefix, *extra, inputs=None):
        return ["--input", *(inputs or [spm_corpus.path]), "--output-prefix", str(prefix),
                "--tokenizer-type", "GPTSentencePieceTokenizer",
                "--tokenizer-model", spm_corpus.model,
                "--seq-length", str(SPM_P), "--target-length", str(SPM_L),
                "--terminal-length", str(SPM_B), "--append-eod", "--no-progress",
                *map(str, extra)]

    return argv


@pytest.fixture
def run_tool(capsys):
    """``run_tool(main, argv) -> (returncode, stdout, stderr)``: a tool's ``main`` run in-process
    through :func:`megatron_endprompt.errors.run_cli`, exactly as the console script does."""
    from megatron_endprompt.errors import run_cli

    def call(main, argv):
        capsys.readouterr()
        rc = run_cli(main, [str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return call


def _te_import_error() -> str | None:
    """Why ``transformer_engine.pytorch`` does not import here (``None`` when it does)."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or TE's own load errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first}"
    return None


#: Where TE cannot be had: its torch binding (``transformer_engine_torch`` 2.20) is published as
#: a source distribution only; building it takes ~47 min on 2 cores.
TE_HINT = ("install Transformer Engine's PyTorch package to run them (`pip install "
           "--no-build-isolation transformer_engine[pytorch]`; its torch binding builds from "
           "source) and run `pytest -m te`")


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests run only where CUDA is present (``pytest -m gpu`` on a GPU machine);
    ``te`` tests wherever ``transformer_engine.pytorch`` imports, else skipped with the import
    error as the reason."""
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a GPU machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    te_items = [item for item in items if "te" in item.keywords]
    error = _te_import_error() if te_items else None
    if error:
        skip = pytest.mark.skip(reason=f"Transformer Engine is not importable ({error}); "
                                       f"{TE_HINT}")
        for item in te_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def llama3_tokenizer_dir(spm_corpus):
    """A Llama-3-like Hugging Face tokenizer directory (byte-level BPE trained on
    ``spm_corpus`` in ~20 ms; ``<|begin_of_text|>`` added before every text; base model:
    ``eos_token`` ``<|end_of_text|>``), loadable by ``AutoTokenizer`` and by Megatron's
    ``HuggingFaceTokenizer``. See :func:`megatron_endprompt.data.prepare.synthetic.build_llama3_like_tokenizer`."""
    from megatron_endprompt.data.prepare.synthetic import build_llama3_like_tokenizer

    return build_llama3_like_tokenizer(spm_corpus.texts, str(spm_corpus.root / "llama3_tok"))


@pytest.fixture(scope="session")
def llama3_tokenizer(llama3_tokenizer_dir):
    """Megatron-Core's ``HuggingFaceTokenizer`` of ``llama3_tokenizer_dir`` (as preprocessing
    and training build it)."""
    from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer

    return build_tokenizer(TokenizerSpec(tokenizer_type="HuggingFaceTokenizer",
                                         tokenizer_model=llama3_tokenizer_dir))


@pytest.fixture(scope="session")
def llama3_args(spm_corpus, llama3_tokenizer_dir):
    """``llama3_args(prefix, *extra)``: like ``spm_args`` but with the Llama-3-like HF tokenizer
    (``--tokenizer-type HuggingFaceTokenizer``)."""

    def argv(prefix, *extra, inputs=None):
        return ["--input", *(inputs or [spm_corpus.path]), "--output-prefix", str(prefix),
                "--tokenizer-type", "HuggingFaceTokenizer",
                "--tokenizer-model", llama3_tokenizer_dir,
                "--seq-length", str(SPM_P), "--target-length", str(SPM_L),
                "--terminal-length", str(SPM_B), "--append-eod", "--no-progress",
                *map(str, extra)]

    return argv
