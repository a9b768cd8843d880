"""A random tokenized corpus written by Megatron-Core's own ``IndexedDatasetBuilder``, for tests
that need a ``PREFIX.bin/.idx`` pair and not any particular text."""

from __future__ import annotations

import numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

__all__ = ["write_random_corpus"]


def write_random_corpus(prefix: str, n_docs: int, *, seed: int = 0) -> str:
    """``n_docs`` documents of 3..79 uint16 tokens below 999 (one sequence each) at ``prefix``;
    returns ``prefix``."""
    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for _ in range(n_docs):
        doc = rng.integers(0, 999, int(rng.integers(3, 80)))
        builder.add_document(doc, [len(doc)])
    builder.finalize(prefix + ".idx")
    return prefix
