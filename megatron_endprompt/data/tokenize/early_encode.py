"""Start-up overlap: tokenize from ``tokenizer.json`` while Megatron-Core is being imported.

Building Megatron's tokenizer and its ``.bin`` writer imports torch, Megatron-Core and
transformers: ~4-5 s of one core before the first document could be tokenized, a third of a
15M-token run. For ``--tokenizer-type HuggingFaceTokenizer`` with a local directory holding a
``tokenizer.json``, :class:`EarlyEncoding` loads that file with ``tokenizers`` alone (~0.1 s)
and starts the Rust batch pipeline (:func:`~megatron_endprompt.data.tokenize.encode.fast_encoded`)
in a background thread at once; the imports run meanwhile on the main thread (the Rust work runs
without the GIL). Nothing is written until Megatron's tokenizer exists. :meth:`adopt` then keeps the
documents already encoded — and the running pipeline — only if the file's tokenizer is exactly the
one Megatron built (same serialized state: model, normalizer, pre-tokenizer, post-processor, added
tokens; ``to_str()`` equal), so the ids are Megatron's by construction, and the probe of
:func:`~megatron_endprompt.data.tokenize.encode.probe_fast_encoder` has already passed on Megatron's
own backend. With ``use_tiktoken`` the thread runs the tiktoken encoder of the same file
(:mod:`.tiktoken_encoder`), kept only if the probe chose tiktoken too. Otherwise the work is dropped
and the caller encodes from scratch with Megatron's backend: slower, never different.

Memory stays bounded: the thread stops producing while ``max_pending_tokens`` encoded tokens
wait to be written.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator

import numpy as np

from megatron_endprompt.data.tokenize.encode import FastEncoder, fast_encoded
from megatron_endprompt.data.tokenize.tiktoken_encoder import TiktokenEncoder, tiktoken_encoder
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec

_END = object()


def tokenizer_json(spec: TokenizerSpec) -> str | None:
    """The ``tokenizer.json`` Megatron's ``HuggingFaceTokenizer`` will load for ``spec``, if
    it is a local file (a hub name or a directory without one: ``None``)."""
    if spec.tokenizer_type != "HuggingFaceTokenizer" or not spec.tokenizer_model:
        return None
    path = os.path.join(spec.tokenizer_model, "tokenizer.json")
    return path if os.path.isfile(path) else None


class EarlyEncoding:
    """Documents of ``lines`` encoded by the ``tokenizer.json`` backend in a daemon thread.

    ``append_eod``: each document's ids get one extra slot, filled with Megatron's EOD id
    in :meth:`adopt` (the id is not known before Megatron's tokenizer is built).
    """

    def __init__(self, path: str, lines, *, json_keys: list[str], append_eod: bool,
                 spec: TokenizerSpec, max_pending_tokens: int = 1 << 25,
                 use_tiktoken: bool = False, workers: int = 1) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(path)
        self.append_eod = append_eod
        eod = 0 if append_eod else None
        encoder = None
        if use_tiktoken:  # kept only if the probe admits tiktoken for Megatron's tokenizer
            encoder, _ = tiktoken_encoder(self.backend, eod=eod, workers=workers)
        self._encoder = encoder or FastEncoder(self.backend, eod=eod)
        self._items: deque = deque()
        self._pending = 0
        self._limit = max_pending_tokens
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(
            target=self._run, args=(lines, json_keys, spec), daemon=True,
            name="early-encode")
        self._thread.start()

    def _run(self, lines, json_keys, spec) -> None:
        try:
            # vocab=None: only the sign is checked here; adopt() bounds the ids by the vocabulary
            for item in fast_encoded(lines, self._encoder, json_keys=json_keys, vocab=None,
                                     spec=spec):
                if not self._put(item, 0 if item[1] is None else len(item[1])):
                    return
            self._put(_END, 0)
        except BaseException as exc:  # re-raised in order by the consumer
            self._put(exc, 0)

    def _put(self, item, size: int) -> bool:
        with self._cond:
            while not self._stop and self._pending >= self._limit:
                self._cond.wait()
            if self._stop:
                return False
            self._items.append(item)
            self._pending += size
            self._cond.notify_all()
            return True

    def _get(self):
        with self._cond:
            while not self._items:
                self._cond.wait()
            item = self._items.popleft()
            if isinstance(item, tuple) and item[1] is not None:
                self._pending -= len(item[1])
            self._cond.notify_all()
            return item

    @property
    def encoder(self) -> FastEncoder | TiktokenEncoder:
        """The encoder this thread runs (its counters are the adopted run's)."""
        return self._encoder

    def cancel(self) -> None:
        """Stop the thread and drop what it encoded (it exits at its next document)."""
        with self._cond:
            self._stop = True
            self._items.clear()
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()  # before any fork (the pool path) and so no batch runs on

    def adopt(self, encoder: FastEncoder | TiktokenEncoder | None, *, vocab: int | None,
              eod: int | None) -> Iterator[tuple[str, np.ndarray | None, int]] | None:
        """The documents in input order, as ``fast_encoded`` on Megatron's ``encoder`` would
        yield them, if the file's backend is that encoder's; else cancel and ``None``."""
        same = (encoder is not None and type(encoder) is type(self._encoder)
                and self.backend.to_str() == encoder.backend.to_str()
                and (vocab is None or self.backend.get_vocab_size(with_added_tokens=True) <= vocab)
                and (eod is not None) == self.append_eod)
        if not same:
            self.cancel()
            return None
        return self._drain(eod)

    def _drain(self, eod: int | None) -> Iterator[tuple[str, np.ndarray | None, int]]:
        try:
            while True:
                item = self._get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                if eod is not None and item[1] is not None:
                    item[1][-1] = eod
                yield item
        finally:
            self.cancel()
