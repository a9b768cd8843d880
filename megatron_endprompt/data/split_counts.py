"""Samples per train/valid/test split of one prefix, split the way Megatron's
``BlendedMegatronDatasetBuilder`` splits it, checked before training starts (issue 27).

Megatron parses ``--split`` into a split matrix (``parse_and_normalize_split`` +
``convert_split_vector_to_split_matrix``: a split of weight 0 is ``None``, not built) and gives
split ``i`` the sequences ``round(lo_i * N) .. round(hi_i * N)`` of the prefix. A split that has
a weight but rounds to no sequence (a 20-document prefix under ``90,5,5``) still gets a
dataset, of length 0, and Megatron's data loader then stops deep in start-up with
``AssertionError: no sample to consume: 0``. :func:`check_splits_nonempty` refuses that up
front in one line naming ``--split``.

Units: a sidecar over stored samples has one sample per sequence; a sidecar over the
tokenized documents (``sources``) uses the samples lying wholly inside the split's sequences
(:func:`~megatron_endprompt.data.sidecar.span_scan.samples_within`, as the dataset does); a replay
prefix (no sidecar) needs at least one document in the split.
"""

from __future__ import annotations

import math

import numpy as np
from megatron.core.datasets.blended_megatron_dataset_config import (
    convert_split_vector_to_split_matrix,
    parse_and_normalize_split,
)
from megatron.core.datasets.indexed_dataset import IndexedDataset

from megatron_endprompt.data.sidecar.sidecar import Sidecar
from megatron_endprompt.data.sidecar.span_scan import samples_within
from megatron_endprompt.errors import UserError

SPLIT_NAMES = ("train", "valid", "test")


def split_matrix(split: str) -> list[tuple[float, float] | None]:
    """Megatron's split matrix of a ``--split`` string (``None``: split not built)."""
    try:
        return convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    except (AssertionError, ValueError, ZeroDivisionError):
        raise UserError(f"--split {split}: not three non-negative weights with a positive sum "
                        "(e.g. --split 969,30,1)") from None


def split_sample_counts(prefix: str, sidecar: Sidecar | None,
                        split: str) -> dict[str, int | None]:
    """``{split name: samples}`` of ``prefix`` (``None`` where Megatron builds no dataset)."""
    index = IndexedDataset(prefix, mmap=True).index
    n = len(index.sequence_lengths)
    out: dict[str, int | None] = {}
    for name, bounds in zip(SPLIT_NAMES, split_matrix(split)):
        if bounds is None:
            out[name] = None
            continue
        beg, end = int(round(bounds[0] * float(n))), int(round(bounds[1] * float(n)))
        if sidecar is None or sidecar.sources is None or end <= beg:
            out[name] = max(0, end - beg)
            continue
        itemsize = np.dtype(index.dtype).itemsize
        lo = int(index.sequence_pointers[beg]) // itemsize
        hi = np.iinfo(np.int64).max if end >= n else \
            int(index.sequence_pointers[end]) // itemsize
        out[name] = int(len(samples_within(sidecar, lo, hi)))
    return out


def check_splits_nonempty(prefix: str, sidecar: Sidecar | None, split: str) -> None:
    """Refuse a prefix where a split with a weight in ``--split`` gets no sample."""
    counts = split_sample_counts(prefix, sidecar, split)
    empty = [name for name, c in counts.items() if c == 0]
    if not empty:
        return
    total = sum(c for c in counts.values() if c)
    unit = "documents" if sidecar is None else "samples"
    share = math.ceil(100.0 / max(total, 1))
    raise UserError(
        f"{prefix}: --split {split} gives the {'/'.join(empty)} split 0 of its {total} {unit} "
        f"(Megatron's loader would stop with 'no sample to consume'); give each split a share "
        f"of at least {share}% in --split (SPLIT=... in the launcher), a weight 0 to a split "
        "you do not use, or use a larger prefix")
