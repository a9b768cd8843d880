"""Hugging Face safetensors directories: stream tensors in, write sharded files + index out.

Reading opens each ``*.safetensors`` file with ``safe_open`` (memory-mapped) and materialises one
tensor at a time, so a conversion holds the tensors of one Megatron weight (at most QKV or
gate+up of one layer) beyond what it is writing. Writing buffers up to ``max_shard_bytes``
and writes ``model-0000i-of-0000N.safetensors`` plus ``model.safetensors.index.json``.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable

import torch
from torch import Tensor

from megatron_endprompt.errors import UserError

__all__ = ["HFCheckpointReader", "ShardedSafetensorsWriter"]

INDEX_FILE = "model.safetensors.index.json"
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn,
              "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
              "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


class HFCheckpointReader:
    """Tensor names, shapes and data of an HF directory's safetensors (sharded or not).

    Raises :class:`UserError` for a directory without safetensors, an index naming missing
    files, or files that cannot be opened.
    """

    def __init__(self, hf_dir: str) -> None:
        from safetensors import safe_open

        self.hf_dir = hf_dir
        index = os.path.join(hf_dir, INDEX_FILE)
        if os.path.exists(index):
            with open(index, encoding="utf-8") as f:
                try:
                    weight_map: dict[str, str] = json.load(f)["weight_map"]
                except (json.JSONDecodeError, KeyError) as exc:
                    raise UserError(f"{index}: not a safetensors index ({exc})") from None
            files = sorted(set(weight_map.values()))
            missing = [n for n in files if not os.path.exists(os.path.join(hf_dir, n))]
            if missing:
                raise UserError(f"{hf_dir}: incomplete download, {len(missing)} of {len(files)} "
                                f"shard(s) named in {INDEX_FILE} are missing (e.g. {missing[0]})")
        else:
            files = sorted(n for n in os.listdir(hf_dir) if n.endswith(".safetensors"))
            if not files:
                bins = [n for n in os.listdir(hf_dir) if n.endswith((".bin", ".pt", ".pth"))]
                hint = (f" (found {bins[0]}: re-save with save_pretrained(..., "
                        "safe_serialization=True))") if bins else ""
                raise UserError(f"{hf_dir}: no *.safetensors weights{hint}")
            weight_map = {}
        self._handles = {}
        for name in files:
            path = os.path.join(hf_dir, name)
            try:
                self._handles[name] = safe_open(path, framework="pt")
            except Exception as exc:  # noqa: BLE001 - a truncated or corrupt file
                raise UserError(f"{path}: cannot open as safetensors ({exc})") from None
        if not weight_map:
            weight_map = {k: name for name, h in self._handles.items() for k in h.keys()}
        else:
            for name, h in self._handles.items():
                listed = {k for k, f in weight_map.items() if f == name}
                absent = listed - set(h.keys())
                if absent:
                    raise UserError(f"{os.path.join(hf_dir, name)}: truncated or partial shard, "
                                    f"{len(absent)} tensor(s) from the index are not in it "
                                    f"(e.g. {sorted(absent)[0]})")
        self.weight_map = weight_map

    def names(self) -> list[str]:
        """All tensor names."""
        return list(self.weight_map)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape without reading the data."""
        return tuple(self._handles[self.weight_map[name]].get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        """Stored dtype without reading the data (a safetensors dtype torch cannot hold is
        refused, never read as float32)."""
        code = self._handles[self.weight_map[name]].get_slice(name).get_dtype()
        if code not in _ST_DTYPES:
            raise UserError(f"{self.hf_dir}: tensor {name} is stored as {code}, which this "
                            "conversion cannot read; re-save the model in bf16/fp16/fp32")
        return _ST_DTYPES[code]

    def get(self, name: str) -> Tensor:
        """Read one tensor (a fresh CPU tensor)."""
        return self._handles[self.weight_map[name]].get_tensor(name)


class ShardedSafetensorsWriter:
    """Write tensors into ``out_dir`` as HF sharded safetensors with an index."""

    def __init__(self, out_dir: str, *, max_shard_bytes: int = 2 << 30) -> None:
        self.out_dir = out_dir
        self.max_shard_bytes = max_shard_bytes
        self._buffer: dict[str, Tensor] = {}
        self._buffer_bytes = 0
        self._shards: list[list[str]] = []
        self._total_bytes = 0

    def add(self, name: str, tensor: Tensor) -> None:
        """Queue one tensor; flushes a shard when it would exceed ``max_shard_bytes``."""
        size = tensor.numel() * tensor.element_size()
        if self._buffer and self._buffer_bytes + size > self.max_shard_bytes:
            self._flush()
        self._buffer[name] = tensor.contiguous()
        self._buffer_bytes += size
        self._total_bytes += size

    def add_all(self, items: Iterable[tuple[str, Tensor]]) -> None:
        for name, tensor in items:
            self.add(name, tensor)

    def _flush(self) -> None:
        from safetensors.torch import save_file

        from safetensors import SafetensorError

        index = len(self._shards)
        path = os.path.join(self.out_dir, f"shard-{index}.tmp")
        try:
            save_file(self._buffer, path, metadata={"format": "pt"})
        except SafetensorError as exc:  # its I/O errors are not OSError: make them one
            text = str(exc)
            code = errno.ENOSPC if "No space left" in text or "StorageFull" in text \
                else errno.EIO
            raise OSError(code, os.strerror(code), path) from None
        self._shards.append(list(self._buffer))
        self._buffer, self._buffer_bytes = {}, 0

    def close(self) -> list[str]:
        """Flush, name the shards ``model-0000i-of-0000N.safetensors``, write the index;
        returns the shard file names."""
        if self._buffer:
            self._flush()
        n = len(self._shards)
        weight_map: dict[str, str] = {}
        names = []
        for i, keys in enumerate(self._shards):
            name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(os.path.join(self.out_dir, f"shard-{i}.tmp"),
                       os.path.join(self.out_dir, name))
            weight_map.update(dict.fromkeys(keys, name))
            names.append(name)
        with open(os.path.join(self.out_dir, INDEX_FILE), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": self._total_bytes},
                       "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        return names
