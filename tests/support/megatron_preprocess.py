"""What Megatron-LM's ``tools/preprocess_data.py`` writes for a JSONL file, for byte comparisons.

Its loop, restated (not copied): each line's ``text`` tokenized by Megatron's tokenizer
(``tokenizer.tokenize``), EOD appended with ``--append-eod``, one document per line through
Megatron-Core's own ``IndexedDatasetBuilder`` with ``DType.optimal_dtype(vocab_size)``. Test
corpora hold no blank or empty lines (our tool skips those, Megatron-LM writes empty documents).
"""

from __future__ import annotations

import json

import numpy as np


def megatron_preprocess(jsonl: str, prefix: str, tokenizer, *, append_eod: bool) -> str:
    """Write ``prefix.bin/.idx`` as Megatron-LM's script would; returns ``prefix``."""
    import torch
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(prefix + ".bin",
                                    dtype=DType.optimal_dtype(tokenizer.vocab_size))
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            ids = list(tokenizer.tokenize(json.loads(line)["text"]))
            if ids and append_eod:
                ids.append(tokenizer.eod)
            builder.add_document(torch.tensor(np.asarray(ids, np.int64)), [len(ids)])
    builder.finalize(prefix + ".idx")
    return prefix


def same_bin_idx(a: str, b: str) -> bool:
    """Whether two prefixes' ``.bin`` and ``.idx`` are byte-identical."""
    for suffix in (".bin", ".idx"):
        with open(a + suffix, "rb") as fa, open(b + suffix, "rb") as fb:
            if fa.read() != fb.read():
                return False
    return True
