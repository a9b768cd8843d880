"""A ``tiktoken`` encoding equal to a byte-level BPE ``tokenizer.json`` — or the reason it
cannot be one.

Why: ``tiktoken`` encodes the same byte-level BPE ~5x cheaper per token than HF ``tokenizers``.
It is only used when it is *provably the same tokenizer* by structure, and the
caller then also compares ids with Megatron's tokenizer (:mod:`.encode`'s probe). Structure
accepted (everything else is refused with its reason, and the HF path runs):

* no normalizer (an NFC normalizer changes text before splitting; tiktoken has none);
* pre-tokenizer ``ByteLevel(add_prefix_space=False, use_regex=True)`` (GPT-2's pattern) or
  ``Sequence[Split(Regex, behavior=isolated, invert=False), ByteLevel(add_prefix_space=False,
  use_regex=False)]`` (Llama-3), decoder ``ByteLevel``;
* model ``BPE`` without dropout, byte fallback, ``unk_token`` use, subword prefix/suffix, every
  vocabulary string made of the GPT-2 byte alphabet, and merge ``k`` producing a token whose id
  grows with ``k`` (tiktoken merges by id: merge order = id order);
* single bytes the vocabulary lacks (a trained vocabulary routinely drops 0xC0, 0xC1,
  0xF5-0xFF, never valid UTF-8, and control bytes its corpus never held) are listed in
  :attr:`Conversion.missing_bytes`: HF drops such a byte silently while tiktoken cannot encode
  it at all, so only a text free of them may go to tiktoken — the caller sends the others to
  HF ``tokenizers`` (:func:`missing_byte_finder`);
* added tokens without ``lstrip``/``rstrip``/``single_word``, not normalized through a
  normalizer, without whitespace, none a substring of another (HF matches them
  leftmost-longest, tiktoken by alternation) — these become tiktoken's special tokens, encoded
  with ``allowed_special="all"`` semantics, as HF and Megatron turn ``<|end_of_text|>`` text into
  that token.

Regex dialect: HF runs the split pattern on Oniguruma (Ruby syntax), tiktoken on
``fancy-regex``. They differ on ``X{m,n}+``: possessive to fancy-regex ("at most n"), a
repeated group to Oniguruma — so it is rewritten ``(?:X{m,n})+``; and on ``^``/``$``/``\\h``/
``\\Z``, which are refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

#: HF ``ByteLevel(use_regex=True)``'s split pattern (GPT-2's), a fact of that library.
GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")


@dataclass(frozen=True, kw_only=True)
class Conversion:
    """The outcome of :func:`convert`: an encoding, or ``None`` and why."""

    encoding: object | None
    """A ``tiktoken.Encoding`` with the file's ranks, split pattern and added tokens."""
    reason: str
    """Why it was refused, or what was converted (for the one-line path report)."""
    missing_bytes: tuple[int, ...] = ()
    """Single bytes the vocabulary lacks: a text whose UTF-8 holds one must not go to tiktoken."""


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, inverted (the ByteLevel alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def convert_pattern(pattern: str) -> tuple[str | None, str]:
    """``(tiktoken pattern, note)`` for an Oniguruma split pattern, or ``(None, reason)``."""
    out, i, depth = [], 0, 0
    atom_start = None  # start in ``out`` of the last complete atom
    rewrites = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 >= len(pattern):
                return None, "split pattern ends in a backslash"
            nxt = pattern[i + 1]
            if depth == 0 and nxt in "hHZGK":
                return None, (f"split pattern uses \\{nxt}, "
                              "which the two regex engines read differently")
            j = i + 2
            if nxt in "pP" and j < len(pattern) and pattern[j] == "{":
                j = pattern.index("}", j) + 1
            tok = pattern[i:j]
            if depth == 0:
                atom_start = len(out)
            out.append(tok)
            i = j
            continue
        if depth:
            if c == "]":
                depth -= 1
            elif c == "[":
                depth += 1  # nested class (Oniguruma/fancy both allow)
            out.append(c)
            i += 1
            continue
        if c == "[":
            depth = 1
            atom_start = len(out)
            out.append(c)
            i += 1
            if i < len(pattern) and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < len(pattern) and pattern[i] == "]":
                out.append("]")
                i += 1
            continue
        if c in "^$":
            return None, (f"split pattern uses {c!r}, a line anchor to Oniguruma "
                          "but a text anchor to tiktoken")
        if c == "{":
            m = re.match(r"\{\d*(,\d*)?\}", pattern[i:])
            if m:
                end = i + m.end()
                if end < len(pattern) and pattern[end] == "+":
                    if atom_start is None:
                        return None, f"split pattern quantifier {m.group()}+ follows no simple atom"
                    atom = "".join(out[atom_start:])
                    del out[atom_start:]
                    out.append(f"(?:{atom}{m.group()})+")
                    rewrites += 1
                    i = end + 1
                else:
                    out.append(m.group())
                    i = end
                atom_start = None
                continue
        if c in "()|":
            atom_start = None
        elif c in "*+?":
            pass
        else:
            atom_start = len(out)
        out.append(c)
        i += 1
    if depth:
        return None, "split pattern has an unclosed character class"
    note = f"{rewrites} '{{m,n}}+' rewritten as '(?:...{{m,n}})+'" if rewrites else "pattern as is"
    return "".join(out), note


def _pre_tokenizer_pattern(pre: dict | None) -> tuple[str | None, str]:
    if pre is None:
        return None, "no pre-tokenizer (not byte-level BPE)"
    if pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space"):
            return None, "ByteLevel add_prefix_space=True (a space is prepended to every text)"
        if not pre.get("use_regex", True):
            return None, "ByteLevel without its split regex"
        return GPT2_PATTERN, "GPT-2 pattern"
    if pre.get("type") != "Sequence":
        return None, f"pre-tokenizer {pre.get('type')} (not byte-level BPE)"
    items = pre.get("pretokenizers") or []
    if len(items) != 2 or items[0].get("type") != "Split" or items[1].get("type") != "ByteLevel":
        kinds = ", ".join(str(p.get("type")) for p in items)
        return None, f"pre-tokenizer Sequence[{kinds}] (only Split + ByteLevel converts)"
    split, byte_level = items
    if byte_level.get("add_prefix_space"):
        return None, "ByteLevel add_prefix_space=True (a space is prepended to every text)"
    if byte_level.get("use_regex", True):
        return None, "Split followed by ByteLevel with its own regex (two splits)"
    if split.get("behavior") != "Isolated" or split.get("invert"):
        return None, f"Split behavior {split.get('behavior')} invert={split.get('invert')}"
    regex = (split.get("pattern") or {}).get("Regex")
    if regex is None:
        return None, "Split on a plain string, not a regex"
    return convert_pattern(regex)


def _check_added(added: list[dict], has_normalizer: bool) -> str | None:
    contents = [a["content"] for a in added]
    for a in added:
        for flag in ("lstrip", "rstrip", "single_word"):
            if a.get(flag):
                return f"added token {a['content']!r} has {flag}=True"
        if a.get("normalized") and has_normalizer:
            return f"added token {a['content']!r} is matched after normalization"
        if not a["content"] or any(ch.isspace() for ch in a["content"]):
            return f"added token {a['content']!r} is empty or holds whitespace"
    ordered = sorted(contents, key=len)
    for k, short in enumerate(ordered):
        for long in ordered[k + 1:]:
            if short in long:
                return f"added token {short!r} is inside {long!r} (matching order differs)"
    return None


def convert(tokenizer_json: str) -> Conversion:
    """A ``tiktoken.Encoding`` for the serialized HF tokenizer (``Tokenizer.to_str()``)."""
    spec = json.loads(tokenizer_json)
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return Conversion(encoding=None, reason=f"model {model.get('type')} (only BPE converts)")
    if spec.get("normalizer") is not None:
        kind = spec["normalizer"].get("type")
        return Conversion(encoding=None, reason=f"normalizer {kind} (tiktoken does not normalize)")
    if model.get("dropout"):  # None or 0.0: deterministic
        return Conversion(encoding=None, reason=f"BPE dropout={model['dropout']}")
    if model.get("byte_fallback"):
        return Conversion(encoding=None, reason="BPE byte_fallback=True")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return Conversion(encoding=None, reason=f"BPE {key}={model.get(key)!r}")
    if (spec.get("decoder") or {}).get("type") != "ByteLevel":
        decoder = (spec.get("decoder") or {}).get("type")
        return Conversion(encoding=None, reason=f"decoder {decoder} (not ByteLevel)")
    pattern, note = _pre_tokenizer_pattern(spec.get("pre_tokenizer"))
    if pattern is None:
        return Conversion(encoding=None, reason=note)
    added = spec.get("added_tokens") or []
    bad = _check_added(added, spec.get("normalizer") is not None)
    if bad:
        return Conversion(encoding=None, reason=bad)
    ranks, why = _ranks(model, {a["id"] for a in added})
    if ranks is None:
        return Conversion(encoding=None, reason=why)
    missing = tuple(b for b in range(256) if bytes([b]) not in ranks)
    import tiktoken

    try:
        enc = tiktoken.Encoding("endprompt-bpe", pat_str=pattern, mergeable_ranks=ranks,
                                special_tokens={a["content"]: a["id"] for a in added})
    except Exception as exc:  # fancy-regex refuses the pattern, duplicate ranks ...
        return Conversion(encoding=None, reason=f"tiktoken refused it ({str(exc)[:120]})")
    reason = f"byte-level BPE, {note}"
    if missing:
        reason += (f"; the vocabulary lacks {len(missing)} of the 256 single bytes "
                   f"({_byte_list(missing)}): documents holding one go to HF tokenizers")
    return Conversion(encoding=enc, reason=reason, missing_bytes=missing)


def _byte_list(values: tuple[int, ...]) -> str:
    """``0x00-0x08, 0x0b, 0xc0`` (runs collapsed)."""
    runs: list[list[int]] = []
    for b in values:
        if runs and b == runs[-1][1] + 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    return ", ".join(f"0x{a:02x}" if a == b else f"0x{a:02x}-0x{b:02x}" for a, b in runs)


def missing_byte_finder(missing: tuple[int, ...]):
    """A predicate ``text -> bool``: does the UTF-8 of ``text`` hold one of ``missing``?

    Checked on the ``str`` (no encoding) for ASCII bytes and lead bytes, each the first byte of
    a known range of code points; 0xC0, 0xC1 and 0xF5-0xFF never occur in UTF-8; only a
    missing continuation byte (0x80-0xBF) needs the encoded bytes, of non-ASCII texts only.
    """
    ranges = []
    for b in missing:
        if b < 0x80:
            ranges.append((b, b))
        elif 0xC2 <= b <= 0xDF:
            ranges.append(((b & 0x1F) << 6, ((b & 0x1F) << 6) + 0x3F))
        elif 0xE0 <= b <= 0xEF:
            ranges.append(((b & 0x0F) << 12, ((b & 0x0F) << 12) + 0xFFF))
        elif 0xF0 <= b <= 0xF4:
            ranges.append(((b & 0x07) << 18, min(((b & 0x07) << 18) + 0x3FFFF, 0x10FFFF)))
    chars = re.compile("[" + "".join(f"\\U{a:08x}-\\U{z:08x}" for a, z in ranges) + "]") \
        if ranges else None
    cont = bytes(b for b in missing if 0x80 <= b <= 0xBF)
    cont_re = re.compile(b"[" + b"".join(re.escape(bytes([c])) for c in cont) + b"]") \
        if cont else None

    def holds(text: str) -> bool:
        if chars is not None and chars.search(text):
            return True
        return cont_re is not None and not text.isascii() and \
            cont_re.search(text.encode("utf-8", "surrogatepass")) is not None

    return holds


def _ranks(model: dict, added_ids: set[int]) -> tuple[dict[bytes, int] | None, str]:
    table = _unicode_to_byte()
    ranks: dict[bytes, int] = {}
    for token, idx in model.get("vocab", {}).items():
        if idx in added_ids:
            continue
        try:
            ranks[bytes(table[ch] for ch in token)] = idx
        except KeyError:
            return None, f"vocabulary entry {token!r} is not in the byte-level alphabet"
    if len(set(ranks.values())) != len(ranks):
        return None, "two vocabulary entries share an id"
    last = -1
    for merge in model.get("merges", []):
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        try:
            idx = ranks[bytes(table[ch] for ch in a + b)]
        except KeyError:
            return None, f"merge {a!r} + {b!r} makes a token outside the vocabulary"
        if idx <= last:
            return None, "merge order differs from id order (tiktoken merges by id)"
        last = idx
    return ranks, ""
