"""Cost of the .bin block CRCs (megatron_endprompt.data.sidecar.bin_checksum): GB/s of recording
them (``bin_block_crcs``, at write time; the same read as the full check at first use) and the time
of the sampled per-start check, on a file of ``--gb`` GB (default 1) in ``--dir``.

    python -m benchmarks.data_path.bin_checksum [--gb 1] [--dir /tmp]

The first pass may be served from disk, later ones from the page cache: both are printed."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from types import SimpleNamespace

from megatron_endprompt.data.sidecar.bin_checksum import SAMPLED_BLOCKS, bin_block_crcs, verify_bin


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    path = os.path.join(args.dir, f"bench-bin-crc-{os.getpid()}.bin")
    size = int(args.gb * 1e9)
    try:
        with open(path, "wb") as f:
            for _ in range(0, size, 64 << 20):
                f.write(os.urandom(min(64 << 20, size - f.tell())))
        for label in ("pass 1", "pass 2 (page cache)"):
            t0 = time.perf_counter()
            rec = bin_block_crcs(path)
            dt = time.perf_counter() - t0
            print(f"record/full check {label}: {size / 1e9:.2f} GB in {dt:.2f} s = "
                  f"{size / 1e9 / dt:.2f} GB/s ({len(rec['crcs'])} blocks)")
        sidecar = SimpleNamespace(path=path + ".endprompt", header=SimpleNamespace(bin_crc32=rec))
        t0 = time.perf_counter()
        n = verify_bin(sidecar, path, sample=SAMPLED_BLOCKS)
        print(f"sampled check per start: {n} blocks in {time.perf_counter() - t0:.3f} s")
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
