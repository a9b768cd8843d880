"""The shuffled sample index of an EndPrompt split: which samples a split holds, how many
epochs the requested number of samples needs, and the epoch-shuffled index itself (Megatron's
own document shuffle), cached on disk like ``GPTDataset``'s indices.

Used by :class:`~megatron_endprompt.data.dataset.EndPromptGPTDataset`; the cache key (its
``unique_description_hash``) is the dataset's.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from megatron_endprompt.compat import build_document_index
from megatron_endprompt.data.sidecar.sidecar import Sidecar
from megatron_endprompt.data.sidecar.span_scan import samples_within
from megatron_endprompt.disk import atomic_path, write_text

logger = logging.getLogger(__name__)


def samples_in_split(sidecar: Sidecar, index, indices: np.ndarray) -> np.ndarray:
    """Spans sidecar: the samples whose every token lies in the split's sequences ``indices``
    of the ``.idx`` ``index`` (Megatron splits a GPT corpus by sequence, a contiguous range; a
    sample straddling two splits is used by neither). Streamed over blocks of samples:
    O(block) temporaries."""
    if len(indices) == 0:
        return np.empty(0, dtype=np.int32)
    itemsize = np.dtype(index.dtype).itemsize
    lo, hi = int(np.min(indices)), int(np.max(indices))
    # the .idx stores its sequences back to back (checked when the sidecar was built; its
    # SHA-256 is verified): the split's stream range comes from two pointers
    begin = int(index.sequence_pointers[lo]) // itemsize
    end = np.iinfo(np.int64).max if hi + 1 >= len(index.sequence_pointers) else \
        int(index.sequence_pointers[hi + 1]) // itemsize
    return samples_within(sidecar, begin, end)


def epochs_and_final_split(units: int, num_samples: int | None) -> tuple[int, bool]:
    """``(epochs, separate)``: epochs over ``units`` samples to serve ``num_samples``, and
    whether the final epoch is shuffled separately (Megatron's rule: used for < 80%)."""
    if num_samples is None or units == 0:
        return 1, False
    epochs = max(1, -(-num_samples // units))
    from_final = num_samples - (epochs - 1) * units
    return epochs, epochs > 1 and from_final < int(0.8 * units)


def load_or_build_sample_index(*, units: Callable[[], np.ndarray], num_samples: int | None,
                               seed: int, cache: str, base: str, description: str,
                               name: str, split: str) -> np.ndarray:
    """Epoch-shuffled sample ids, one per sample, from ``cache/BASE-endprompt_sample_index.npy``
    when it and its description are there, else built (``units()``: the split's samples, only
    called then) and, on rank 0, saved atomically with ``description`` beside it. ``name`` and
    ``split`` are for the log line."""
    path = os.path.join(cache, f"{base}-endprompt_sample_index.npy")
    desc = os.path.join(cache, f"{base}-description.txt")
    if os.path.isfile(path) and os.path.isfile(desc):
        return np.load(path, mmap_mode="r", allow_pickle=False)
    t0 = time.time()
    samples = units()
    epochs, separate = epochs_and_final_split(len(samples), num_samples)
    index = build_document_index(samples, epochs, seed, separate)
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        os.makedirs(cache, exist_ok=True)
        with atomic_path(path, fsync=False) as tmp, open(tmp, "wb") as f:  # a cache
            np.save(f, index, allow_pickle=False)
        write_text(desc, description, fsync=False)  # last: the pair counts once it exists
    logger.info("built %s %s index: %d samples, %d epochs in %.3fs", name, split, len(index),
                epochs, time.time() - t0)
    return index
