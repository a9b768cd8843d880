"""Whether ``tokenizer.json`` read by ``tokenizers`` alone *is* Megatron's tokenizer: checked
once per tokenizer files and library versions, then cached.

Preprocessing with ``--tokenizer-type HuggingFaceTokenizer`` needs Megatron's tokenizer only
for its ids and identity; building it imports torch, Megatron-Core and transformers (~6 CPU-s,
most of a run on a small corpus). :func:`preprocessing_tokenizer` builds it the first time
(the *cold* run) and compares it with a
:class:`~megatron_endprompt.data.tokenize.json_tokenizer.JsonTokenizer` of the same directory:

* the serialized backend (``to_str()``: model, normalizer, pre-tokenizer, post-processor,
  added tokens) is the one transformers built (so a ``tokenizer_config.json`` token that
  transformers adds makes them differ);
* the identity (:func:`~megatron_endprompt.data.tokenize.tokenizer_identity.tokenizer_identity`:
  vocabulary size, EOD, fingerprint of the id -> token table) is equal;
* ``tokenize`` (special tokens around the text) and the plain encoding (prompts) give the same
  ids on :data:`~megatron_endprompt.data.tokenize.tiktoken_encoder.STRESS_TEXTS` and the added
  tokens' literals.

When all hold, the verdict is written (atomically) to ``CACHE/tokenizer-verdicts/KEY.json``,
``KEY`` the SHA-256 of every tokenizer file of the directory (weights excluded) and of the
installed megatron-core, transformers, tokenizers and tiktoken versions. A later run with a
matching verdict (and the same identity recomputed) uses the ``JsonTokenizer`` and imports none
of torch, Megatron-Core or transformers; the per-corpus probes then compare tiktoken with
``tokenizers`` on the first documents. ``CACHE`` is ``$MEGATRON_ENDPROMPT_CACHE``, else
``$XDG_CACHE_HOME/megatron-endprompt``, else ``~/.cache/megatron-endprompt``;
``MEGATRON_ENDPROMPT_CACHE=off`` turns the cache off. Which tokenizer was used, and why, is
said in the preprocessing's tokenizer-path line.

The same holds for ``SentencePieceTokenizer``, ``GPTSentencePieceTokenizer`` and
``Llama2Tokenizer``: :class:`~megatron_endprompt.data.tokenize.spm_encoder.SpmTokenizer` (the model
file read by ``sentencepiece`` alone) stands for Megatron's once a cold run found the wrapper
plain (``spm_processor``), the identity equal and the ids equal on the stress texts; the key
is the SHA-256 of the model file, the type and the megatron-core and sentencepiece versions.
"""

from __future__ import annotations

import hashlib
import json
import os

import time
from importlib import metadata
from typing import Any

from megatron_endprompt.data.tokenize.encode import fast_backend
from megatron_endprompt.data.tokenize.json_tokenizer import JsonTokenizer
from megatron_endprompt.data.tokenize.spm_encoder import (SPM_STRESS_TEXTS, SpmTokenizer,
                                                          spm_processor)
from megatron_endprompt.data.tokenize.tiktoken_encoder import STRESS_TEXTS
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer, encode_plain
from megatron_endprompt.data.tokenize.tokenizer_identity import (TokenizerIdentity,
                                                                 tokenizer_identity)
from megatron_endprompt.disk import write_text

VERDICT_VERSION = 1
"""Bumped whenever what is checked changes: older verdicts no longer match."""

_PACKAGES = ("megatron-core", "transformers", "tokenizers", "tiktoken")
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt",
            ".npz")


def cache_dir() -> str | None:
    """Where verdicts live, or ``None`` when ``MEGATRON_ENDPROMPT_CACHE=off``."""
    root = os.environ.get("MEGATRON_ENDPROMPT_CACHE")
    if root and root.lower() in ("off", "0", "none", "no"):
        return None
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "megatron-endprompt")
    return os.path.join(root, "tokenizer-verdicts")


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries the verdict depends on (``None``: not installed)."""
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def verdict_key(directory: str, versions: dict) -> str:
    """SHA-256 of the directory's tokenizer files (names and bytes) and ``versions``."""
    files = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith(".") or name.lower().endswith(_WEIGHTS) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            files.append((name, hashlib.file_digest(f, "sha256").hexdigest()))
    blob = json.dumps({"verdict_version": VERDICT_VERSION, "versions": versions, "files": files},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def probe_texts(light: JsonTokenizer) -> list[str]:
    """The stress set and one text of every added token's literal."""
    added = sorted(t.content for t in light.backend.get_added_tokens_decoder().values())
    texts = list(STRESS_TEXTS)
    if added:
        texts.append("x" + "y".join(added) + "z " + " ".join(added) + " <|not special|>")
    return texts


def compare(light: JsonTokenizer, tokenizer: Any) -> str | None:
    """``None`` when ``light`` is Megatron's ``tokenizer`` (see the module docstring), else the
    first difference."""
    backend = fast_backend(tokenizer)
    if backend is None:
        return "Megatron's tokenizer is not an HF fast tokenizer that includes special tokens"
    if backend.to_str() != light.backend.to_str():
        return "transformers changes tokenizer.json (e.g. tokens added from tokenizer_config.json)"
    diff = tokenizer_identity(light).difference(tokenizer_identity(tokenizer))
    if diff is not None:
        return diff.replace(" differs from ", " differs from Megatron's ", 1)
    for text in probe_texts(light):
        if light.tokenize(text) != list(tokenizer.tokenize(text)) or \
                light.encode_plain(text) != encode_plain(tokenizer, text):
            return f"ids differ from Megatron's on {text[:40]!r}"
    return None


def _write(path: str, entry: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_text(path, json.dumps(entry, indent=1), fsync=False)  # whole verdict or none


def _read(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and entry.get("equal") is True else None


SPM_TYPES = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")


def _spm_key(spec: TokenizerSpec) -> tuple[str, dict]:
    versions = {name: library_versions().get(name) for name in ("megatron-core",)}
    try:
        versions["sentencepiece"] = metadata.version("sentencepiece")
    except metadata.PackageNotFoundError:
        versions["sentencepiece"] = None
    with open(spec.tokenizer_model, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    blob = json.dumps({"verdict_version": VERDICT_VERSION, "versions": versions,
                       "type": spec.tokenizer_type, "model_sha256": digest}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest(), versions


def compare_spm(light: Any, tokenizer: Any) -> str | None:
    """``None`` when the ``sentencepiece``-only ``light`` is Megatron's SentencePiece
    ``tokenizer``, else the first difference."""
    proc, why = spm_processor(tokenizer)
    if proc is None:
        return f"Megatron's wrapper is not a plain encode ({why})"
    diff = tokenizer_identity(light).difference(tokenizer_identity(tokenizer))
    if diff is not None:
        return diff.replace(" differs from ", " differs from Megatron's ", 1)
    for text in (*STRESS_TEXTS, *SPM_STRESS_TEXTS):
        if light.tokenize(text) != list(tokenizer.tokenize(text)):
            return f"ids differ from Megatron's on {text[:40]!r}"
    return None


def _spm_tokenizer(spec: TokenizerSpec, root: str | None) -> tuple[Any, str]:
    try:
        light = SpmTokenizer(spec.tokenizer_model)
        key, versions = _spm_key(spec)
    except Exception:  # noqa: BLE001 - unreadable for sentencepiece: Megatron's error decides
        return build_tokenizer(spec), ""
    if root is None:
        return build_tokenizer(spec), "no verdict cache (MEGATRON_ENDPROMPT_CACHE=off)"
    if versions["megatron-core"] is None:
        return build_tokenizer(spec), ""
    return _checked(os.path.join(root, key + ".json"), light, lambda: build_tokenizer(spec),
                    compare_spm, label=spec.tokenizer_type, library="sentencepiece",
                    light_read="model read by sentencepiece alone",
                    files="this model and these versions",
                    record={"versions": versions,
                            "model": os.path.abspath(spec.tokenizer_model),
                            "type": spec.tokenizer_type})


def _checked(path: str, light: Any, build: Any, compare_to: Any, *, label: str,
             library: str, light_read: str, files: str, record: dict) -> tuple[Any, str]:
    """The verdict flow both light tokenizers share: ``light`` when the cached verdict at
    ``path`` says it is Megatron's ``label`` tokenizer (same identity), else Megatron's own
    (``build()``), compared with ``light`` by ``compare_to`` and the verdict cached.
    ``record``: what the cache entry states besides the verdict (versions, files)."""
    entry = _read(path)
    if entry is not None:
        cached = TokenizerIdentity.from_dict(entry["identity"])
        if cached is not None and cached.matches(tokenizer_identity(light)):
            return light, (f"{light_read}, no torch/Megatron import: "
                           f"cached verdict {path} (equal to Megatron's {label}, "
                           f"checked {entry.get('checked_utc')})")
    tokenizer = build()
    diff = compare_to(light, tokenizer)
    if diff is not None:
        return tokenizer, f"Megatron's {label} ({library} alone differs: {diff})"
    entry = {"equal": True, "verdict_version": VERDICT_VERSION, **record,
             "identity": tokenizer_identity(tokenizer).ids_part(),
             "checked_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        _write(path, entry)
    except OSError as exc:
        return tokenizer, (f"Megatron's {label} (no cached verdict; {library} "
                           f"alone matched it, but the verdict could not be cached: {exc})")
    return tokenizer, (f"Megatron's {label} (no cached verdict for {files}: cold run); "
                       f"{library} alone matched it, verdict cached in {path}")


def preprocessing_tokenizer(spec: TokenizerSpec, *, backend: Any = None) -> tuple[Any, str]:
    """``(tokenizer, note)``: a :class:`JsonTokenizer` when a cached verdict says it is
    Megatron's tokenizer for these files and versions, else Megatron's own tokenizer (whose
    verdict is then checked and cached). ``backend``: the directory's ``tokenizer.json``
    already loaded (the early encoder's). ``note``: one clause for the tokenizer-path line
    (empty when no ``tokenizer.json`` is involved)."""
    directory = spec.tokenizer_model
    root = cache_dir()
    if spec.tokenizer_type in SPM_TYPES and directory and os.path.isfile(directory):
        return _spm_tokenizer(spec, root)
    if spec.tokenizer_type != "HuggingFaceTokenizer" or not directory or \
            not os.path.isfile(os.path.join(directory, "tokenizer.json")):
        return build_tokenizer(spec), ""
    try:
        light = JsonTokenizer.from_directory(directory, backend)
    except Exception:  # noqa: BLE001 - a file only transformers reads: Megatron's path decides
        return build_tokenizer(spec), ""
    if root is None:
        return build_tokenizer(spec), "no verdict cache (MEGATRON_ENDPROMPT_CACHE=off)"
    versions = library_versions()
    if versions["megatron-core"] is None or versions["transformers"] is None:
        return build_tokenizer(spec), ""  # the builder's own error names what is missing
    return _checked(os.path.join(root, verdict_key(directory, versions) + ".json"), light,
                    lambda: build_tokenizer(spec), compare, label="HuggingFaceTokenizer",
                    library="tokenizers", light_read="tokenizer.json via tokenizers alone",
                    files="these files and versions",
                    record={"versions": versions, "directory": os.path.abspath(directory),
                            "texts_checked": len(probe_texts(light))})
