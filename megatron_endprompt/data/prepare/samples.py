"""Cut tokenized documents into EndPrompt samples of exactly ``P + 1`` tokens.

Each sample is stored as one Megatron document of ``P + 1`` tokens (``P`` inputs plus the
label of the last input, Megatron's ``add_extra_token_to_sequence`` convention), together with
its layout record. The terminal sources:

* ``continuation``: the corpus is one stream (documents concatenated, EOD-separated with
  ``--append-eod``, exactly as ``GPTDataset`` packs); windows of ``P + 1`` tokens with stride
  ``P``; the terminal is the window's last ``b`` inputs — the text simply continues.
* ``document-tail``: a document of ``n >= P + 1`` tokens gives one sample, its first ``a``
  tokens then its last ``b + 1`` tokens; the middle is not used (counted in the summary).
  Context and terminal always come from the same document. Documents shorter than one sample
  are packed (EOD-separated) into windows of ``P + 1`` tokens with stride ``P``, as
  ``continuation`` does, and those samples get *contiguous* positions (record ``T = a``, no
  PoSE skips) — there is no document tail to anchor at ``L - b``, so, as in the official
  code, no position jump either. They are counted (``samples_contiguous``).
* ``prompt``: the stream gives ``a = P - len(prompt)`` context tokens, followed by the prompt
  and the EOD token as the final label; a prompt is drawn per sample from the set.
* placement ``pose`` (:mod:`megatron_endprompt.pose_law`): one sample per document, PoSE's
  two chunks of it (a continuation sample ends with the label after the second chunk, a
  prompt sample with the prompt and the EOD); the draws come from ``sample_rng(seed, j)`` of
  document ``j``, and documents shorter than the window are dropped and counted.

Other placements never drop a document shorter than one sample: it is packed with its
neighbours. Only the stream's final
remainder, too short for one more sample, is left out, and it is counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from megatron_endprompt.data.sidecar.terminal_spec import check_source
from megatron_endprompt import pose_law
from megatron_endprompt.layout import LayoutConfig, make_record, sample_rng


@dataclass(kw_only=True)
class SampleStats:
    """Counters for the preprocessing summary."""

    samples: int = 0
    """Samples emitted."""
    docs: int = 0
    """Documents fed in."""
    docs_shorter_than_sample: int = 0
    """Documents with fewer than ``P + 1`` tokens (packed with neighbours)."""
    tokens_in: int = 0
    """Tokens fed in (EOD included)."""
    samples_contiguous: int = 0
    """``document-tail``: samples packed from documents shorter than one sample, with
    contiguous positions (no document long enough to give a tail)."""
    tokens_unused_middle: int = 0
    """``document-tail``: tokens between a document's context and its tail."""
    tokens_left_over: int = 0
    """Tokens at the end of the stream that could not fill one more sample."""
    prompt_counts: list[int] = field(default_factory=list)
    """``prompt``: how often each prompt was drawn."""
    docs_dropped: int = 0
    """``pose``: documents shorter than PoSE's window (no sample)."""
    tokens_dropped: int = 0
    """``pose``: the tokens of those documents."""
    pose_text_skip: int = 0
    """``pose``: text tokens skipped between the chunks, summed over samples."""
    pose_position_skip: int = 0
    """``pose``: position skips ``k``, summed over samples."""


def contiguous_record(layout: LayoutConfig, terminal_length: int) -> np.ndarray:
    """A record whose positions are ``0..P-1`` (terminal start ``T = a``; with PoSE, pieces cut
    at ``1..N-1`` with no skip), so ``a`` and the loss weights keep their meaning."""
    layout.check_terminal_length(terminal_length)
    n = layout.pose_chunks
    a = layout.seq_length - terminal_length
    record = np.empty(2 * n, dtype=np.int32)
    record[0] = record[1] = a
    record[2 : n + 1] = record[n + 1 :] = np.arange(1, n)
    return record


class _Stream:
    """A FIFO of token arrays with cheap ``take``."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self.size = 0

    def push(self, tokens: np.ndarray) -> None:
        self._parts.append(tokens)
        self.size += len(tokens)

    def peek(self, n: int) -> np.ndarray:
        """The first ``n`` tokens (``n <= size``), merging parts as needed."""
        if len(self._parts[0]) < n:
            self._parts = [np.concatenate(self._parts)]
        return self._parts[0][:n]

    def drop(self, n: int) -> None:
        """Discard the first ``n`` tokens."""
        self.size -= n
        while n:
            head = self._parts[0]
            if len(head) <= n:
                n -= len(head)
                self._parts.pop(0)
            else:
                self._parts[0] = head[n:]
                n = 0

    def take_all(self) -> np.ndarray:
        out = np.concatenate(self._parts) if self._parts else np.empty(0, np.int64)
        self._parts, self.size = [], 0
        return out


class SampleMaker:
    """Turns documents into ``(tokens [P + 1] int64, record [2N] int32)`` samples, in order.

    The layout of sample ``i`` (and, for prompts, which prompt) comes from
    ``sample_rng(seed, i)``, so the output does not depend on the number of workers.
    """

    def __init__(
        self,
        layout: LayoutConfig,
        *,
        terminal_source: str,
        terminal_length: int | None,
        prompts: list[np.ndarray] | None = None,
        eod: int | None = None,
        seed: int = 0,
    ) -> None:
        check_source(terminal_source)
        if terminal_source == "prompt":
            if not prompts:
                raise ValueError("terminal source 'prompt' needs at least one prompt")
            if eod is None:
                raise ValueError("terminal source 'prompt' needs the tokenizer's EOD id")
            for p in prompts:
                layout.check_terminal_length(len(p))
        else:
            if terminal_length is None:
                raise ValueError(f"--terminal-source {terminal_source} needs --terminal-length")
            layout.check_terminal_length(terminal_length)
        pose_law.check_pose_terminal(layout, source=terminal_source,
                                     terminal_length=terminal_length)
        self.layout = layout
        self.source = terminal_source
        self.b = terminal_length
        self.prompts = prompts or []
        self.eod = eod
        self.seed = seed
        self.stats = SampleStats(prompt_counts=[0] * len(self.prompts))
        self._stream = _Stream()
        self._pending: tuple[np.random.Generator, int] | None = None

    # -- per sample randomness ---------------------------------------------------------
    def _next_draw(self) -> tuple[np.random.Generator, int]:
        """Generator and prompt index (or -1) of the next sample; drawn once, then kept."""
        if self._pending is None:
            rng = sample_rng(self.seed, self.stats.samples)
            choice = int(rng.integers(len(self.prompts))) if self.prompts else -1
            self._pending = (rng, choice)
        return self._pending

    def _emit(self, tokens: np.ndarray, terminal_length: int,
              contiguous: bool = False) -> tuple[np.ndarray, np.ndarray]:
        rng, choice = self._next_draw()
        if contiguous:
            record = contiguous_record(self.layout, terminal_length)
        else:
            record = make_record(self.layout, terminal_length=terminal_length, rng=rng)
        self._pending = None
        return self._count(tokens, record, choice)

    def _count(self, tokens: np.ndarray, record: np.ndarray,
               choice: int) -> tuple[np.ndarray, np.ndarray]:
        self.stats.samples += 1
        if choice >= 0:
            self.stats.prompt_counts[choice] += 1
        assert len(tokens) == self.layout.seq_length + 1
        return tokens, record

    # -- feeding -----------------------------------------------------------------------
    def add_document(self, tokens: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Feed one tokenized document; yields the samples it completes."""
        P = self.layout.seq_length
        self.stats.docs += 1
        self.stats.tokens_in += len(tokens)
        if len(tokens) < P + 1:
            self.stats.docs_shorter_than_sample += 1
        if self.layout.placement == "pose":
            yield from self._add_document_pose(tokens)
            return
        if self.source == "document-tail":
            yield from self._add_document_tail(tokens)
            return
        self._stream.push(tokens)
        if self.source == "continuation":
            while self._stream.size >= P + 1:
                window = self._stream.peek(P + 1).copy()
                self._stream.drop(P)
                yield self._emit(window, self.b)
        else:
            while True:
                _, choice = self._next_draw()
                prompt = self.prompts[choice]
                a = P - len(prompt)
                if self._stream.size < a:
                    break
                sample = np.concatenate([self._stream.peek(a), prompt, [self.eod]])
                self._stream.drop(a)
                yield self._emit(sample, len(prompt))

    def _add_document_tail(self, tokens: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        P, b = self.layout.seq_length, self.b
        if len(tokens) >= P + 1:
            a = P - b
            self.stats.tokens_unused_middle += len(tokens) - (P + 1)
            yield self._emit(np.concatenate([tokens[:a], tokens[len(tokens) - b - 1 :]]), b)
            return
        # No tail to take: pack with neighbours into contiguous windows (never mixing one
        # document's context with another's tail at a jumped position).
        self._stream.push(tokens)
        while self._stream.size >= P + 1:
            window = self._stream.peek(P + 1).copy()
            self._stream.drop(P)
            self.stats.samples_contiguous += 1
            yield self._emit(window, b, contiguous=True)

    def _add_document_pose(self, tokens: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        P, L = self.layout.seq_length, self.layout.target_length
        rng = sample_rng(self.seed, self.stats.docs - 1)  # per document: drops shift nothing
        choice = int(rng.integers(len(self.prompts))) if self.prompts else -1
        b = self.b if choice < 0 else len(self.prompts[choice])
        window = P if choice < 0 else P - b
        text = len(tokens) - 1  # the last token (EOD) may only be a label
        if pose_law.usable_tokens(text, P) < window:
            self.stats.docs_dropped += 1
            self.stats.tokens_dropped += len(tokens)
            return
        d = pose_law.draw(rng, text_tokens=text, window=window, seq_length=P, target_length=L)
        first, second = tokens[: d.r1], tokens[d.l2 : d.r2 + (choice < 0)]
        tail = [] if choice < 0 else [self.prompts[choice], np.array([self.eod])]
        sample = np.concatenate([first, second, *tail])
        self.stats.tokens_unused_middle += len(tokens) - len(first) - len(second)
        self.stats.pose_text_skip += d.l2 - d.r1
        self.stats.pose_position_skip += d.k
        yield self._count(sample, pose_law.pose_record(d, self.layout, terminal_length=b,
                                                       prompt=choice >= 0), choice)

    def finish(self) -> None:
        """Record what is left in the stream (too short for one more sample)."""
        left = self._stream.size
        self.stats.tokens_left_over += left
        self._stream.take_all()
