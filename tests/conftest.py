"""Session-wide fixtures: a generated corpus and a SentencePiece model trained on it inside the
test session (no download, well under a second), plus an in-process CLI runner."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from tests.support.layout import SPM_B, SPM_L, SPM_P  # noqa: F401  (re-exported for the fixtures)


#: Where the real checkpoints of the e2e tests are cached (tests/e2e/real_checkpoint.py): the
#: user's cache as the session found it, read before ``verdict_cache`` moves
#: ``MEGATRON_ENDPROMPT_CACHE`` to an empty per-test directory (a model is too large to fetch
#: again for every test).
_USER_CACHE = os.environ.get("MEGATRON_ENDPROMPT_CACHE", "")
_MODEL_CACHE = (os.environ.get("MEGATRON_ENDPROMPT_MODEL_CACHE")
                or (_USER_CACHE if _USER_CACHE not in ("", "off") else None)
                or os.path.join(os.path.expanduser("~"), ".cache", "megatron-endprompt"))


@pytest.fixture(autouse=True)
def verdict_cache(tmp_path_factory, monkeypatch):
    """Each test its own empty tokenizer-verdict cache (never the user's ~/.cache): a test's
    first preprocessing run is a cold one (``data.tokenizer_verdict``). Subprocesses inherit
    it through the environment. Returns the cache root. The model cache stays the user's.
    The launcher's cached option list (``training.launch_flags``: a pure function of the
    installed Megatron and our parser, keyed by their hash) is shared by the session's tests:
    each would otherwise import Megatron again to build it (~8 s); a test of the cold cache
    points ``MEGATRON_ENDPROMPT_CACHE`` at a directory of its own."""
    root = tmp_path_factory.mktemp("verdict_cache")
    shared = tmp_path_factory.getbasetemp() / "launch-options-shared"
    shared.mkdir(exist_ok=True)
    (root / "launch-options").symlink_to(shared, target_is_directory=True)
    monkeypatch.setenv("MEGATRON_ENDPROMPT_CACHE", str(root))
    monkeypatch.setenv("MEGATRON_ENDPROMPT_MODEL_CACHE", _MODEL_CACHE)
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


#: The markers of the tiers outside ``make check`` (see pytest.ini and the README's "Tests").
SLOW_TIERS = ("process", "e2e")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: it must see the ``slow`` added here
def pytest_collection_modifyitems(config, items):
    """Every ``process`` and ``e2e`` test is also ``slow``, so ``-m "not slow"`` is the fast
    tier whichever of the three a test carries. ``gpu`` tests run only where CUDA is present
    (``pytest -m gpu`` on a GPU machine); ``te`` tests wherever ``transformer_engine.pytorch``
    imports, else skipped with the import error as the reason. torch is imported only when a
    ``gpu`` test was collected: a run of tests that need no torch pays no torch import here."""
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_TIERS):
            item.add_marker(pytest.mark.slow)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items:
        import torch

        if not torch.cuda.is_available():
            skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a GPU "
                                           "machine)")
            for item in gpu_items:
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
    ``HuggingFaceTokenizer``. See
    :func:`megatron_endprompt.data.prepare.synthetic.build_llama3_like_tokenizer`."""
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
