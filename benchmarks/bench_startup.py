"""Start-up cost per rank at corpus scale (issue 15): ``EndPromptGPTDataset`` vs stock
``GPTDataset`` on the same prefix, first start and later start.

The corpus is synthetic and its tokens are never written: ``PREFIX.bin`` is a sparse file of the
right size (start-up never reads tokens), ``PREFIX.idx`` is a real Megatron index for
``--docs`` documents of ``P + 1`` tokens (written in chunks), and ``PREFIX.endprompt`` a matching
sidecar (fixed placement) written by the library's own writer.

Each measured start is a fresh Python process that builds train/valid/test through
``BlendedMegatronDatasetBuilder`` (split 98,1,1; one epoch of train samples) and reports:

* wall time of ``build()`` (imports excluded, tokenizer construction excluded for both;
  our tokenizer-identity check and verification included);
* bytes read: ``/proc/self/io`` ``read_bytes`` (storage reads, including memory-map page
  faults; the files' pages are evicted with ``posix_fadvise(DONTNEED)`` before every run, so
  this is the cold-cache figure a shared filesystem sees) and ``rchar`` (``read()`` syscalls);
* peak RSS (``ru_maxrss``) of the process, and its RSS before ``build()``.

"first start": empty data cache directory (rank 0 of the data group: builds the index cache,
and for ours runs the full verification once). "later start": the cache is there (every other
rank, and every restart): ours checks the file identities, the header checksum and reads the
cached indices, as stock does.

    .venv/bin/python benchmarks/bench_startup.py --docs 1000000 10000000 [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
P, L, B, VOCAB = 8192, 65536, 512, 128000


# -- synthetic corpus ---------------------------------------------------------------------
def make_corpus(prefix: str, docs: int) -> None:
    """Sparse ``.bin``, real ``.idx`` (uint32 tokens) and a matching sidecar."""
    import struct
    from dataclasses import asdict

    import numpy as np

    from megatron_endprompt.compat import build_megatron_tokenizer
    from megatron_endprompt.data.sidecar import (SidecarHeader, data_fingerprint, sidecar_path,
                                                 write_sidecar)
    from megatron_endprompt.data.tokenizer_identity import tokenizer_identity
    from megatron_endprompt.layout import LayoutConfig

    if os.path.exists(sidecar_path(prefix)):
        return
    itemsize, chunk = 4, 1 << 22  # uint32 tokens (vocab > 65535)
    with open(prefix + ".bin", "wb") as f:
        f.truncate(docs * (P + 1) * itemsize)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 4))  # 4: uint32
        f.write(struct.pack("<Q", docs) + struct.pack("<Q", docs + 1))
        for s in range(0, docs, chunk):
            f.write(np.full(min(chunk, docs - s), P + 1, dtype=np.int32).tobytes())
        for s in range(0, docs, chunk):
            n = min(chunk, docs - s)
            f.write((np.arange(s, s + n, dtype=np.int64) * ((P + 1) * itemsize)).tobytes())
        for s in range(0, docs + 1, chunk):
            f.write(np.arange(s, min(s + chunk, docs + 1), dtype=np.int64).tobytes())
    layout = LayoutConfig(seq_length=P, target_length=L, placement="fixed")
    records = np.lib.stride_tricks.as_strided(np.array([P - B, L - B], dtype=np.int32),
                                              shape=(docs, 2), strides=(0, 4))
    tok = build_megatron_tokenizer("NullTokenizer", None, VOCAB)
    header = SidecarHeader(layout=asdict(layout), terminal_source="continuation",
                           terminal_length=B, num_samples=docs, **data_fingerprint(prefix),
                           tokenizer=tokenizer_identity(tok, tokenizer_type="NullTokenizer"))
    write_sidecar(sidecar_path(prefix) + ".tmp", header, records)
    os.replace(sidecar_path(prefix) + ".tmp", sidecar_path(prefix))


def evict(paths: list[str]) -> None:
    """Drop these files' pages from the page cache (cold-cache reads, nothing else touched)."""
    for root in paths:
        files = [root] if os.path.isfile(root) else [
            os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
        for path in files:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _io() -> dict:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# -- one start (child process) ------------------------------------------------------------
def child(kind: str, prefix: str, cache: str, docs: int) -> dict:
    from megatron_endprompt.compat import quiet_megatron_import_noise

    quiet_megatron_import_noise()
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    from megatron_endprompt.compat import build_megatron_tokenizer
    from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset

    tok = build_megatron_tokenizer("NullTokenizer", None, VOCAB)
    common = dict(random_seed=1234, sequence_length=P, blend=([prefix], None), split="98,1,1",
                  tokenizer=tok, reset_position_ids=False, reset_attention_mask=False,
                  eod_mask_loss=False, create_attention_mask=False, path_to_cache=cache)
    if kind == "stock":
        cls, config = GPTDataset, GPTDatasetConfig(**common)
    else:
        cls, config = EndPromptGPTDataset, EndPromptDatasetConfig(
            **common, endprompt_target_length=L)
    sizes = [int(docs * 0.98), docs // 100, docs // 100]
    rss0, io0, t0 = _rss_kib(), _io(), time.perf_counter()
    datasets = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()
    wall = time.perf_counter() - t0
    io1 = _io()
    sample = datasets[0][len(datasets[0]) // 2]  # the datasets work
    assert sample["tokens"].shape[0] == P
    return {"wall_s": wall, "read_bytes": io1["read_bytes"] - io0["read_bytes"],
            "rchar": io1["rchar"] - io0["rchar"], "rss_before_mib": rss0 / 1024,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "samples": [len(d) for d in datasets]}


def run_child(kind: str, prefix: str, cache: str, docs: int) -> dict:
    evict([prefix + ".idx", prefix + ".endprompt", cache])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--prefix", prefix,
                          "--cache", cache, "--docs", str(docs)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def seq_read_s(path: str) -> float:
    """Cold sequential read of a file (the cost of hashing it is separate)."""
    evict([path])
    buf = bytearray(8 << 20)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def measure(workdir: str, docs: int, repeat: int) -> dict:
    prefix = os.path.join(workdir, f"corpus_{docs}")
    t0 = time.perf_counter()
    make_corpus(prefix, docs)
    made = time.perf_counter() - t0
    res: dict = {"docs": docs, "idx_bytes": os.path.getsize(prefix + ".idx"),
                 "sidecar_bytes": os.path.getsize(prefix + ".endprompt"),
                 "bin_bytes_sparse": os.path.getsize(prefix + ".bin"), "make_s": made,
                 "idx_seq_read_s": min(seq_read_s(prefix + ".idx") for _ in range(repeat))}
    for kind in ("stock", "ours"):
        firsts, laters = [], []
        for r in range(repeat):
            cache = os.path.join(workdir, f"cache_{kind}_{docs}_{r}")
            shutil.rmtree(cache, ignore_errors=True)
            firsts.append(run_child(kind, prefix, cache, docs))
            laters.append(run_child(kind, prefix, cache, docs))
            shutil.rmtree(cache, ignore_errors=True)
        best = lambda runs: {k: (min(r[k] for r in runs) if isinstance(runs[0][k], float)  # noqa: E731
                                 or isinstance(runs[0][k], int) else runs[0][k])
                             for k in runs[0]}
        res[kind] = {"first": best(firsts), "later": best(laters),
                     "all_first": firsts, "all_later": laters}
        print(f"{docs:>12,} {kind:5s} first {res[kind]['first']['wall_s']:7.2f}s "
              f"{res[kind]['first']['read_bytes'] / 1e6:9.1f} MB  later "
              f"{res[kind]['later']['wall_s']:7.2f}s {res[kind]['later']['read_bytes'] / 1e6:9.1f}"
              f" MB  peak RSS {res[kind]['first']['peak_rss_mib']:.0f}/"
              f"{res[kind]['later']['peak_rss_mib']:.0f} MiB", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--workdir", default=os.path.join(HERE, "out", "startup"))
    p.add_argument("--out", default=os.path.join(HERE, "out", "startup.json"))
    p.add_argument("--keep", action="store_true", help="keep the synthetic corpora")
    p.add_argument("--child", choices=("stock", "ours"))
    p.add_argument("--prefix")
    p.add_argument("--cache")
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.prefix, a.cache, a.docs[0])))
        return
    os.makedirs(a.workdir, exist_ok=True)
    results = [measure(a.workdir, n, a.repeat) for n in a.docs]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"P": P, "L": L, "vocab": VOCAB, "runs": results}, f, indent=1)
    print(f"wrote {a.out}")
    if not a.keep:
        for n in a.docs:
            for ext in (".bin", ".idx", ".endprompt"):
                path = os.path.join(a.workdir, f"corpus_{n}{ext}")
                if os.path.exists(path):
                    os.unlink(path)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    main()
