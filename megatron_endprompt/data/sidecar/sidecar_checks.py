"""Every value of a sidecar header, and every record, checked on read.

Why: the header checksum catches a flipped bit, but a header written by a buggy or foreign tool
has a valid checksum. Each value is therefore checked for type, finiteness, range and
consistency with ``P`` / ``L`` before anything trusts it; each record (at full verification)
for a layout :func:`~megatron_endprompt.layout.make_record` can actually produce.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np

from megatron_endprompt.data.sidecar.sidecar_format import REBUILD, SidecarHeader
from megatron_endprompt.data.sidecar.terminal_spec import SEED_LIMIT
from megatron_endprompt.data.sidecar.terminal_spec import TERMINAL_SOURCES as SOURCES
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LAYOUT_HEADER_KEYS, PLACEMENTS, LayoutConfig, context_lengths
from megatron_endprompt.loss_weights import LossWeights
from megatron_endprompt.pose_law import check_pose_records, check_pose_terminal

_INT32 = 2**31 - 1
_IDX_HEADER = 34  # Megatron .idx: magic 9, version 8, dtype 1, sequence and document counts


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _is_hex(v, n: int = 64) -> bool:
    return isinstance(v, str) and len(v) == n and all(c in "0123456789abcdef" for c in v)


def _int_in(v, lo: int, hi: int) -> bool:
    return _is_int(v) and lo <= v <= hi


def validate_header(values: dict, path: str) -> None:
    """Raise :class:`UserError` ``PATH: invalid sidecar header: FIELD=VALUE (why); fix`` on
    the first value that is missing, of the wrong type, non-finite, out of range or
    inconsistent with the layout."""
    def bad(name: str, value, why: str) -> UserError:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return UserError(f"{path}: invalid sidecar header: {name}={shown} ({why}); {REBUILD}")

    if not isinstance(values, dict):
        raise bad("header", type(values).__name__, "not a JSON object")
    known = {f.name for f in fields(SidecarHeader)}
    for name in values:
        if name not in known:
            raise bad(name, values[name], "unknown field")
    for name in ("layout", "terminal_source", "terminal_length"):
        if name not in values:
            raise bad(name, None, "missing")

    layout = values["layout"]
    layout_keys = set(LAYOUT_HEADER_KEYS)
    if not isinstance(layout, dict) or set(layout) != layout_keys:
        raise bad("layout", layout, f"needs exactly {sorted(layout_keys)}")
    P, L = layout["seq_length"], layout["target_length"]
    if not _int_in(P, 2, _INT32 - 1):
        raise bad("layout.seq_length", P, "an integer P >= 2")
    if not _int_in(L, P + 1, _INT32):
        raise bad("layout.target_length", L, f"an integer L > P={P} that fits int32")
    if layout["placement"] not in PLACEMENTS:
        raise bad("layout.placement", layout["placement"], f"one of {PLACEMENTS}")
    if not _int_in(layout["pose_chunks"], 1, P - 1):
        raise bad("layout.pose_chunks", layout["pose_chunks"], f"an integer in [1, P-1={P - 1}]")
    if layout["placement"] == "pose" and layout["pose_chunks"] != 2:
        raise bad("layout.pose_chunks", layout["pose_chunks"], "2 for placement pose")
    for key, name, want in (("terminal_loss_weight", "terminal", "finite and > 0"),
                            ("context_loss_weight", "context", "finite and >= 0")):
        value = layout[key]
        try:
            LossWeights(**{name: value})  # the one validation of the weights
        except ValueError:
            value = None
        if not _is_real(value):
            raise bad(f"layout.{key}", layout[key], want)
    config = LayoutConfig.from_header(layout)

    source, b = values["terminal_source"], values["terminal_length"]
    if source not in SOURCES:
        raise bad("terminal_source", source, f"one of {SOURCES}")
    if source == "prompt":
        if b is not None:
            raise bad("terminal_length", b, "null for prompt terminals")
    else:
        if not _is_int(b):
            raise bad("terminal_length", b, "an integer b")
        try:
            config.check_terminal_length(b)
        except ValueError as exc:
            raise bad("terminal_length", b, str(exc)) from None
    try:
        check_pose_terminal(config, source=source, terminal_length=b)
    except ValueError as exc:
        name, value = ("terminal_length", b) if source == "continuation" else \
            ("terminal_source", source)
        raise bad(name, value, str(exc)) from None
    prompts = values.get("prompts", [])
    if not isinstance(prompts, list) or not all(isinstance(p, str) and p for p in prompts):
        raise bad("prompts", prompts, "a list of non-empty strings")
    if source == "prompt" and not prompts:
        raise bad("prompts", prompts, "prompt terminals need the prompt set")

    n = values.get("num_samples", 0)
    if not _int_in(n, 0, 2**48):
        raise bad("num_samples", n, "an integer >= 0")
    if not _int_in(values.get("seed", 0), 0, SEED_LIMIT - 1):
        raise bad("seed", values.get("seed"), "an integer >= 0")
    if not _is_hex(values.get("idx_sha256")):
        raise bad("idx_sha256", values.get("idx_sha256"), "64 lowercase hex digits")
    spans = bool(values.get("sources"))
    seqs = 1 if spans else n  # spans: samples are pieces of >= 1 sequence
    idx_bytes = values.get("idx_bytes")
    if not _int_in(idx_bytes, _IDX_HEADER + 12 * seqs, 2**62):
        raise bad("idx_bytes", idx_bytes, f"a Megatron .idx of {seqs} sequences has at least "
                  f"{_IDX_HEADER + 12 * seqs} bytes")
    if not _int_in(values.get("bin_bytes"), n, 2**62):
        raise bad("bin_bytes", values.get("bin_bytes"), f"at least one byte per sample ({n})")
    if not _int_in(values.get("records_crc32"), 0, 2**32 - 1):
        raise bad("records_crc32", values.get("records_crc32"), "a CRC-32")
    _validate_tokenizer(values.get("tokenizer", {}), bad)
    _validate_sources(values.get("sources", {}), source, len(prompts), bad)
    if not isinstance(values.get("stats", {}), dict):
        raise bad("stats", values.get("stats"), "a JSON object")


def _validate_tokenizer(tok, bad) -> None:
    if not isinstance(tok, dict):
        raise bad("tokenizer", tok, "a JSON object")
    if not tok:
        return  # unknown tokenizer (a sidecar for an existing corpus made without one)
    vocab = tok.get("vocab_size")
    if not _int_in(vocab, 1, _INT32):
        raise bad("tokenizer.vocab_size", vocab, "an integer >= 1")
    eod = tok.get("eod")
    if eod is not None and not _int_in(eod, 0, vocab - 1):
        raise bad("tokenizer.eod", eod, f"an id below the vocabulary size {vocab}")
    fp = tok.get("fingerprint")
    if fp is not None and not _is_hex(fp):
        raise bad("tokenizer.fingerprint", fp, "64 lowercase hex digits")
    for key in ("tokenizer_type", "tokenizer_model"):
        if tok.get(key) is not None and not isinstance(tok[key], str):
            raise bad(f"tokenizer.{key}", tok[key], "a string")


def _validate_sources(src, terminal_source: str, n_prompts: int, bad) -> None:
    """``sources`` of a sidecar over an existing corpus (see :mod:`.spans`)."""
    if not isinstance(src, dict):
        raise bad("sources", src, "a JSON object")
    if not src:
        return  # samples stored one per sequence
    known = {"kind", "layout", "length", "crc32", "prompt_tokens", "eod"}
    for key in src:
        if key not in known:
            raise bad(f"sources.{key}", src[key], "unknown field")
    if src.get("kind") != "spans":
        raise bad("sources.kind", src.get("kind"), "'spans'")
    if src.get("layout", "pieces") not in ("pieces", "windows"):
        raise bad("sources.layout", src.get("layout"), "'pieces' or 'windows'")
    if not _int_in(src.get("length"), 0, 2**56):
        raise bad("sources.length", src.get("length"), "an integer >= 0")
    if not _int_in(src.get("crc32"), 0, 2**32 - 1):
        raise bad("sources.crc32", src.get("crc32"), "a CRC-32")
    eod = src.get("eod")
    if eod is not None and not _int_in(eod, 0, _INT32):
        raise bad("sources.eod", eod, "a token id >= 0")
    tokens = src.get("prompt_tokens", [])
    if not isinstance(tokens, list) or not all(
            isinstance(t, list) and t and all(_int_in(i, 0, _INT32) for i in t) for t in tokens):
        raise bad("sources.prompt_tokens", tokens, "lists of token ids, one per prompt")
    if terminal_source == "prompt":
        if len(tokens) != n_prompts:
            raise bad("sources.prompt_tokens", len(tokens), f"one per prompt ({n_prompts})")
        if eod is None:
            raise bad("sources.eod", eod, "prompt terminals end with the EOD id")


def check_records(records: np.ndarray, layout: LayoutConfig, terminal_length: int | None,
                  contiguous_ok: bool = False) -> tuple[int, str] | None:
    """First impossible record of a chunk ``[n, 2N]`` as ``(row, reason)``; ``None`` if all
    are layouts ``make_record`` can draw: ``1 <= a < P``, ``a = P - b`` for a fixed ``b``,
    ``a <= T <= L - b`` (``T = L - b`` for fixed placement), PoSE cuts increasing inside the
    context and skips non-decreasing within the budget ``T - a``; placement ``pose``: PoSE's
    law besides (:func:`~megatron_endprompt.pose_law.check_pose_records`). ``contiguous_ok``
    (``document-tail``): a record with contiguous positions (``T = a``, no skip; samples packed
    from documents shorter than one sample) is valid under fixed placement too."""
    if len(records) == 0:
        return None
    P, L, N = layout.seq_length, layout.target_length, layout.pose_chunks
    a = context_lengths(records)
    T = records[:, 1].astype(np.int64)
    b = P - a
    checks = [((a >= 1) & (a <= P - 1), "context length a outside [1, P-1]")]
    if terminal_length is not None:
        checks.append((a == P - terminal_length, f"a != P - b = {P - terminal_length}"))
    checks.append(((T >= a) & (T + b <= L), "terminal start T outside [a, L-b]"))
    if layout.placement == "fixed":
        fixed_ok = T == L - b
        if contiguous_ok:
            fixed_ok |= (T == a) & np.all(records[:, N + 1 :] == records[:, 2 : N + 1], axis=1)
        checks.append((fixed_ok, "fixed placement needs T = L - b"))
    if N > 1:
        cuts = records[:, 2 : N + 1].astype(np.int64)
        skips = records[:, N + 1 :].astype(np.int64) - cuts
        inc = np.all(np.diff(cuts, axis=1) > 0, axis=1) if N > 2 else np.ones(len(a), bool)
        checks.append((inc & (cuts[:, 0] >= 1) & (cuts[:, -1] <= a - 1), "PoSE cuts"))
        nondec = np.all(np.diff(skips, axis=1) >= 0, axis=1) if N > 2 else np.ones(len(a), bool)
        checks.append((nondec & (skips[:, 0] >= 0) & (skips[:, -1] <= T - a), "PoSE skips"))
    if layout.placement == "pose":
        checks += check_pose_records(records, layout, terminal_length)
    for ok, why in checks:
        if not ok.all():
            row = int(np.flatnonzero(~ok)[0])
            return row, f"{why}; record {records[row].tolist()}"
    return None
