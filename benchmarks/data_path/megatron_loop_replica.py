"""An in-process replica of Megatron-LM's ``tools/preprocess_data.py`` loop, for
``data_path/bench.py`` runs without a Megatron-LM checkout (``--megatron-lm`` absent).

Written here from the script's behaviour (never copied): a ``multiprocessing.Pool`` of
``workers`` processes, each building Megatron's tokenizer once, ``imap(encode, lines, 32)``,
one ``IndexedDatasetBuilder.add_document`` per document, EOD appended.
"""

from __future__ import annotations

import json
import multiprocessing


class Encoder:
    """Replica of Megatron-LM's ``Encoder`` (used only without ``--megatron-lm``)."""

    def __init__(self, tok: tuple[str, str], append_eod: bool) -> None:
        self.tok = tok
        self.append_eod = append_eod

    def initializer(self) -> None:
        from megatron_endprompt.compat import build_megatron_tokenizer

        Encoder.tokenizer = build_megatron_tokenizer(*self.tok)

    def encode(self, json_line: str) -> tuple[list[int], int]:
        text = json.loads(json_line)["text"]
        ids = Encoder.tokenizer.tokenize(text)
        if len(ids) > 0 and self.append_eod:
            ids.append(Encoder.tokenizer.eod)
        return ids, len(json_line)


def replica_preprocess(jsonl: str, prefix: str, tok: tuple[str, str], workers: int) -> None:
    """Write ``prefix.bin/.idx`` with the replica of Megatron-LM's loop (in-process)."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    from megatron_endprompt.compat import build_megatron_tokenizer

    tokenizer = build_megatron_tokenizer(*tok)
    encoder = Encoder(tok, append_eod=True)
    with multiprocessing.Pool(workers, initializer=encoder.initializer) as pool, \
            open(jsonl, encoding="utf-8") as fin:
        builder = IndexedDatasetBuilder(prefix + ".bin",
                                        dtype=DType.optimal_dtype(tokenizer.vocab_size))
        for ids, _ in pool.imap(encoder.encode, fin, 32):
            builder.add_document(ids, [len(ids)])
        builder.finalize(prefix + ".idx")
