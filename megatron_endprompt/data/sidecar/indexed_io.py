"""Megatron's ``.bin/.idx`` corpus format, read and written with numpy alone.

Why: the data tools (preprocess, sidecar building, merge, inspect) touch the corpus only to
read or write this index, yet going through ``megatron.core.datasets.indexed_dataset`` imports
torch and Megatron-Core (~4-12 s of CPU and ~900 MiB before the first byte). This module
writes byte for byte what ``IndexedDatasetBuilder`` writes (tested against it on every dtype
and on ``add_index`` merges) and reads what it reads.

``.idx`` layout (version 1, little endian, no multimodal modes)::

    b"MMIDIDX\\x00\\x00"        9 bytes magic
    <Q version = 1             8 bytes
    <B dtype code              1 byte   (see DTYPE_CODES)
    <Q sequence count S        8 bytes
    <Q document count D + 1    8 bytes  (document indices, a leading 0 included)
    int32  sequence_lengths  [S]
    int64  sequence_pointers [S]       byte offset of each sequence in the .bin
    int64  document_indices  [D + 1]   sequence index where each document starts; last = S

``.bin``: the sequences' tokens back to back, in the dtype of the code.
"""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np

from megatron_endprompt.errors import UserError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
#: Megatron-Core's ``DType`` codes (``indexed_dataset.DType``).
DTYPE_CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3,
               np.dtype(np.int32): 4, np.dtype(np.int64): 5, np.dtype(np.float64): 6,
               np.dtype(np.float32): 7, np.dtype(np.uint16): 8}
_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
_HEADER = struct.Struct("<9sQBQQ")  # 34 bytes


def optimal_dtype(vocab_size: int | None) -> np.dtype:
    """The ``.bin`` dtype Megatron picks for a vocabulary (``DType.optimal_dtype``)."""
    return np.dtype(np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32)


class IndexReader:
    """A ``.idx`` file, memory-mapped (the arrays are views; nothing is copied).

    Attributes as Megatron's ``_IndexReader``: ``dtype``, ``sequence_lengths`` (int32 [S]),
    ``sequence_pointers`` (int64 [S]), ``document_indices`` (int64 [D + 1]).
    """

    def __init__(self, idx_path: str) -> None:
        self.path = idx_path
        try:
            size = os.path.getsize(idx_path)
            with open(idx_path, "rb") as f:
                head = f.read(_HEADER.size)
        except OSError as exc:
            raise UserError(f"{idx_path}: cannot read ({exc.strerror}); give the prefix of an "
                            "existing Megatron .bin/.idx pair") from None
        fix = "rebuild it with preprocess_data.py or tools/preprocess_endprompt.py"
        if len(head) < _HEADER.size:
            raise UserError(f"{idx_path}: not a Megatron .idx (only {len(head)} bytes); {fix}")
        magic, version, code, n_seq, n_doc = _HEADER.unpack(head)
        if magic != MAGIC:
            raise UserError(f"{idx_path}: not a Megatron .idx (bad magic {magic!r}); {fix}")
        if version != VERSION:
            raise UserError(f"{idx_path}: .idx version {version}, only version 1 is read; {fix}")
        if code not in _DTYPES:
            raise UserError(f"{idx_path}: unknown dtype code {code} in the .idx; {fix}")
        need = _HEADER.size + 12 * n_seq + 8 * n_doc
        if size < need:
            raise UserError(f"{idx_path}: truncated .idx ({size} bytes, its header needs "
                            f"{need}); {fix}")
        self.dtype = _DTYPES[code]
        self.sequence_count, self.document_count = n_seq, n_doc
        buf = np.memmap(idx_path, mode="r", dtype=np.uint8)
        off = _HEADER.size
        self.sequence_lengths = np.frombuffer(buf, np.int32, n_seq, off)
        self.sequence_pointers = np.frombuffer(buf, np.int64, n_seq, off + 4 * n_seq)
        self.document_indices = np.frombuffer(buf, np.int64, n_doc, off + 12 * n_seq)

    def __len__(self) -> int:
        return self.sequence_count


class CorpusReader:
    """Sequences of ``PREFIX.bin/.idx``: ``reader[i]`` -> tokens of sequence ``i`` (a view of
    the memory-mapped ``.bin``, shape ``[sequence_lengths[i]]``)."""

    def __init__(self, prefix: str) -> None:
        self.index = IndexReader(prefix + ".idx")
        self.bin = np.memmap(prefix + ".bin", mode="r", dtype=self.index.dtype) \
            if os.path.getsize(prefix + ".bin") else np.empty(0, self.index.dtype)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self.index.sequence_pointers[i]) // self.index.dtype.itemsize
        return self.bin[start : start + int(self.index.sequence_lengths[i])]


class _Growable:
    """An int64 vector grown by doubling (no per-element Python objects)."""

    def __init__(self) -> None:
        self.data = np.empty(1024, np.int64)
        self.n = 0

    def extend(self, values) -> None:
        values = np.asarray(values, dtype=np.int64).reshape(-1)
        while self.n + len(values) > len(self.data):
            self.data = np.concatenate([self.data, np.empty_like(self.data)])
        self.data[self.n : self.n + len(values)] = values
        self.n += len(values)

    def array(self) -> np.ndarray:
        return self.data[: self.n]


class IndexedWriter:
    """Writes ``.bin`` then ``.idx`` as ``IndexedDatasetBuilder`` does (same bytes).

    ``add_document(ids, lengths)``: one document of ``sum(lengths)`` tokens (``ids`` cast to
    the dtype, as Megatron's ``numpy.array(tensor, dtype=...)`` does); ``add_index(prefix)``:
    append a whole corpus of the same dtype; ``finalize(idx_path)``: close the ``.bin`` and
    write the index.
    """

    def __init__(self, bin_path: str, dtype) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"dtype {self.dtype} has no Megatron .idx code")
        self.file = open(bin_path, "wb")  # noqa: SIM115 - closed by finalize
        self.lengths = _Growable()
        self.doc_index = _Growable()
        self.doc_index.extend([0])

    def add_document(self, ids, lengths) -> None:
        arr = np.asarray(ids)
        if arr.dtype != self.dtype:
            arr = arr.astype(self.dtype)
        self.file.write(np.ascontiguousarray(arr).data)
        self.lengths.extend(lengths)
        self.doc_index.extend([self.lengths.n])

    def add_index(self, prefix: str) -> None:
        index = IndexReader(prefix + ".idx")
        if index.dtype != self.dtype:
            raise ValueError(f"{prefix}.idx: dtype {index.dtype} differs from {self.dtype}")
        offset = self.lengths.n
        self.lengths.extend(index.sequence_lengths)
        self.doc_index.extend(offset + index.document_indices[1:])
        with open(prefix + ".bin", "rb") as f:
            shutil.copyfileobj(f, self.file, 1 << 22)

    def finalize(self, idx_path: str) -> None:
        self.file.close()
        lengths = self.lengths.array()
        pointers = np.zeros(len(lengths), np.int64)
        np.cumsum(lengths[:-1] * self.dtype.itemsize, out=pointers[1:])
        with open(idx_path, "wb") as f:
            f.write(_HEADER.pack(MAGIC, VERSION, DTYPE_CODES[self.dtype], len(lengths),
                                 self.doc_index.n))
            f.write(lengths.astype(np.int32).tobytes())
            f.write(pointers.tobytes())
            f.write(self.doc_index.array().tobytes())

    def close(self) -> None:
        """Close the ``.bin`` without an index (an aborted run)."""
        self.file.close()
