"""Start-up cost per rank at corpus scale: ``EndPromptGPTDataset`` vs stock
``GPTDataset`` on the same prefix, first start and later start.

The corpus is synthetic and its tokens are never written: ``PREFIX.bin`` is a sparse file of the
right size (start-up never reads tokens), ``PREFIX.idx`` is a real Megatron index for
``--docs`` documents of ``P + 1`` tokens (written in chunks), and ``PREFIX.endprompt`` a matching
sidecar (fixed placement) written by the library's own writer.

Each measured start is a fresh Python process that builds train/valid/test through
``BlendedMegatronDatasetBuilder`` (split 98,1,1; one epoch of train samples) and reports:

* wall and CPU time of ``build()`` (imports excluded, tokenizer construction excluded for
  both; our tokenizer-identity check and verification included);
* bytes read: ``/proc/self/io`` ``read_bytes`` (storage reads, including memory-map page
  faults; the files' pages are evicted with ``posix_fadvise(DONTNEED)`` before every run, so
  this is the cold-cache figure a shared filesystem sees) and ``rchar`` (``read()`` syscalls);
* peak RSS of the process (``VmHWM``, reset through ``/proc/self/clear_refs`` just before
  ``build()``, so it is the peak *during* the build, imports included), and its RSS before
  ``build()``. Not ``ru_maxrss``: after ``vfork`` + ``exec`` (Python's ``subprocess``) it
  starts at the *parent's* peak, so every child reported at least the driver's RSS.

"first start": empty data cache directory (rank 0 of the data group: builds the index cache,
and for ours runs the full verification once). "later start": the cache is there (every other
rank, and every restart): ours checks the file identities, the header checksum and reads the
cached indices, as stock does.

``--sidecars`` picks the EndPrompt sidecars measured beside stock: ``stored`` (sample ``i`` is
stored sequence ``i``), and the *spans* sidecars that ``build_endprompt_sidecar.py`` writes over
an existing corpus (samples composed from pieces of the ``.bin``, :mod:`.data.spans`):
``windows`` (continuation windows of ``P + 1`` tokens, stride ``P``, over the document stream:
one run, a few bytes of ``sources``) and ``pieces`` (one sample per document, two pieces each,
context and the document's own tail: 40 bytes of ``sources`` per sample).

    .venv/bin/python -m benchmarks.startup.bench --docs 1000000 10000000 [--repeat 2] \
        [--sidecars stored pieces windows]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from benchmarks.paths import OUT, REPO
from benchmarks.startup.report import report
from megatron_endprompt.disk import atomic_path

P, L, B, VOCAB = 8192, 65536, 512, 128000


# -- synthetic corpus ---------------------------------------------------------------------
def make_corpus(prefix: str, docs: int) -> None:
    """Sparse ``.bin``, real ``.idx`` (uint32 tokens) and a matching sidecar."""
    import struct

    import numpy as np

    from megatron_endprompt.compat import build_megatron_tokenizer
    from megatron_endprompt.data.sidecar.sidecar import (SidecarHeader, data_fingerprint,
                                                         sidecar_path, write_sidecar)
    from megatron_endprompt.data.tokenize.tokenizer_identity import tokenizer_identity
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
    header = SidecarHeader(layout=layout.to_header(), terminal_source="continuation",
                           terminal_length=B, num_samples=docs, **data_fingerprint(prefix),
                           tokenizer=tokenizer_identity(
                               tok, tokenizer_type="NullTokenizer").as_dict())
    with atomic_path(sidecar_path(prefix), fsync=False) as tmp:
        write_sidecar(tmp, header, records)


def spans_name(layout: str) -> str:
    return f"spans-{layout}"


def make_spans(prefix: str, docs: int, layout: str) -> str:
    """A spans sidecar ``PREFIX.spans-LAYOUT.endprompt`` over the corpus of :func:`make_corpus`
    (documents of ``P + 1`` tokens back to back); ``pieces``' sources go through a temporary
    memory map, so the writer never holds them in memory."""

    import numpy as np

    from megatron_endprompt.compat import build_megatron_tokenizer
    from megatron_endprompt.data.sidecar.sidecar import (SidecarHeader, data_fingerprint,
                                                         sidecar_path, write_sidecar)
    from megatron_endprompt.data.tokenize.tokenizer_identity import tokenizer_identity
    from megatron_endprompt.layout import LayoutConfig

    path = sidecar_path(prefix, spans_name(layout))
    if os.path.exists(path):
        return path
    tmp = None
    if layout == "windows":
        n = (docs * (P + 1) - 1) // P
        sources, source = np.zeros(2, dtype=np.int64), "continuation"
    else:
        n, source, chunk = docs, "document-tail", 1 << 22
        tmp = path + ".sources.tmp"
        sources = np.lib.format.open_memmap(tmp, mode="w+", dtype="<i8", shape=(5 * n + 1,))
        for s in range(0, n + 1, chunk):
            sources[s : min(s + chunk, n + 1)] = np.arange(s, min(s + chunk, n + 1)) * 2
        body = sources[n + 1 :].reshape(n, 4)
        for s in range(0, n, chunk):
            start = np.arange(s, min(s + chunk, n), dtype=np.int64) * (P + 1)
            body[s : s + len(start)] = np.stack(
                [start, np.full(len(start), P + 1 - B), start + P + 1 - B,
                 np.full(len(start), B)], axis=1)
        sources.flush()
    layout_cfg = LayoutConfig(seq_length=P, target_length=L, placement="fixed")
    records = np.lib.stride_tricks.as_strided(np.array([P - B, L - B], dtype=np.int32),
                                              shape=(n, 2), strides=(0, 4))
    tok = build_megatron_tokenizer("NullTokenizer", None, VOCAB)
    header = SidecarHeader(layout=layout_cfg.to_header(), terminal_source=source, terminal_length=B,
                           num_samples=n, **data_fingerprint(prefix),
                           tokenizer=tokenizer_identity(
                               tok, tokenizer_type="NullTokenizer").as_dict(),
                           sources={"kind": "spans", "layout": layout})
    with atomic_path(path, fsync=False) as out:
        write_sidecar(out, header, records, sources)
    if tmp:
        del sources, body
        os.unlink(tmp)
    return path


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


def _rss_kib(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    """``VmHWM`` := current RSS (Linux >= 4.0); harmless where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# -- one start (child process) ------------------------------------------------------------
def child(kind: str, prefix: str, cache: str, docs: int, name: str | None = None) -> dict:
    from megatron_endprompt import runtime

    runtime.quiet()
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
            **common, endprompt_target_length=L, endprompt_sidecar_name=name)
    sizes = [int(docs * 0.98), docs // 100, docs // 100]
    _reset_peak_rss()
    rss0, io0, t0, c0 = _rss_kib(), _io(), time.perf_counter(), time.process_time()
    datasets = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    io1 = _io()
    sample = datasets[0][len(datasets[0]) // 2]  # the datasets work
    assert sample["tokens"].shape[0] == P
    return {"wall_s": wall, "cpu_s": cpu, "read_bytes": io1["read_bytes"] - io0["read_bytes"],
            "rchar": io1["rchar"] - io0["rchar"], "rss_before_mib": rss0 / 1024,
            "peak_rss_mib": _rss_kib("VmHWM") / 1024,
            "samples": [len(d) for d in datasets]}


def run_child(kind: str, prefix: str, cache: str, docs: int, name: str | None = None) -> dict:
    from megatron_endprompt.data.sidecar.sidecar import sidecar_path

    evict([prefix + ".idx", sidecar_path(prefix, name), cache])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-m", "benchmarks.startup.bench", "--child", kind,
                          "--prefix", prefix, "--cache", cache, "--docs", str(docs)]
                         + (["--name", name] if name else []), env=env, check=True,
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


def _best(runs: list[dict]) -> dict:
    """Minimum over repeats of every number (wall time varies with machine load; bytes and
    RSS hardly do)."""
    return {k: min(r[k] for r in runs) if isinstance(runs[0][k], (int, float)) else runs[0][k]
            for k in runs[0]}


KINDS = {"stored": ("ours", None), "pieces": ("ours-pieces", "pieces"),
         "windows": ("ours-windows", "windows")}
"""``--sidecars`` value: (result key, spans layout or None for the stored-sample sidecar)."""


def measure(workdir: str, docs: int, repeat: int, sidecars: list[str],
            later_repeat: int = 1) -> dict:
    from megatron_endprompt.data.sidecar.sidecar import open_sidecar

    prefix = os.path.join(workdir, f"corpus_{docs}")
    t0 = time.perf_counter()
    make_corpus(prefix, docs)
    made = time.perf_counter() - t0
    res: dict = {"docs": docs, "idx_bytes": os.path.getsize(prefix + ".idx"),
                 "sidecar_bytes": os.path.getsize(prefix + ".endprompt"),
                 "bin_bytes_sparse": os.path.getsize(prefix + ".bin"), "make_s": made,
                 "idx_seq_read_s": min(seq_read_s(prefix + ".idx") for _ in range(repeat))}
    kinds = {"stock": None}
    for sc in sidecars:
        key, layout = KINDS[sc]
        kinds[key] = None if layout is None else spans_name(layout)
        if layout is not None:
            path = make_spans(prefix, docs, layout)
            res[f"{key}_sidecar_bytes"] = os.path.getsize(path)
            res[f"{key}_samples"] = open_sidecar(path).header.num_samples
    runs = {kind: {"first": [], "later": []} for kind in kinds}
    for r in range(repeat):  # interleaved, so all see the same machine load
        for kind, name in kinds.items():
            cache = os.path.join(workdir, f"cache_{kind}_{docs}_{r}")
            shutil.rmtree(cache, ignore_errors=True)
            child_kind = "stock" if kind == "stock" else "ours"
            runs[kind]["first"].append(run_child(child_kind, prefix, cache, docs, name))
            for _ in range(later_repeat):  # cheap: more tries at the noisy later start
                runs[kind]["later"].append(run_child(child_kind, prefix, cache, docs, name))
            shutil.rmtree(cache, ignore_errors=True)
    for kind in kinds:
        res[kind] = {start: _best(runs[kind][start]) for start in ("first", "later")}
        res[kind].update(all_first=runs[kind]["first"], all_later=runs[kind]["later"])
        f, l_ = res[kind]["first"], res[kind]["later"]
        print(f"{docs:>12,} {kind:12s} first {f['wall_s']:7.2f}s {f['read_bytes'] / 1e6:9.1f} MB"
              f"  later {l_['wall_s']:7.2f}s {l_['read_bytes'] / 1e6:9.1f} MB  peak RSS "
              f"{f['peak_rss_mib']:.0f}/{l_['peak_rss_mib']:.0f} MiB", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--workdir", default=os.path.join(OUT, "startup"))
    p.add_argument("--out", default=os.path.join(OUT, "startup.json"))
    p.add_argument("--keep", action="store_true", help="keep the synthetic corpora")
    p.add_argument("--later-repeat", type=int, default=1,
                   help="later starts per first start (their minimum is reported: at 10^8 "
                        "documents both datasets' later start is mostly Megatron's own "
                        "np.arange of the split's 98M indices, 0.14-0.6 s by memory state)")
    p.add_argument("--sidecars", nargs="+", choices=tuple(KINDS), default=["stored"],
                   help="EndPrompt sidecars to measure beside stock (default: stored)")
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="print the README tables (and projection) from earlier --out files")
    p.add_argument("--before", nargs="+", metavar="JSON",
                   help="with --report: also print these (earlier code's) measurements")
    p.add_argument("--child", choices=("stock", "ours"))
    p.add_argument("--prefix")
    p.add_argument("--cache")
    p.add_argument("--name", help="(child) sidecar name")
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.prefix, a.cache, a.docs[0], a.name)))
        return
    if a.report:
        print(report(a.report, a.before))
        return
    os.makedirs(a.workdir, exist_ok=True)
    results = [measure(a.workdir, n, a.repeat, a.sidecars, a.later_repeat) for n in a.docs]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"P": P, "L": L, "vocab": VOCAB, "runs": results}, f, indent=1)
    print(f"wrote {a.out}\n")
    print(report([a.out]))
    if not a.keep:
        for n in a.docs:
            for ext in (".bin", ".idx", ".endprompt", ".spans-pieces.endprompt",
                        ".spans-windows.endprompt"):
                path = os.path.join(a.workdir, f"corpus_{n}{ext}")
                if os.path.exists(path):
                    os.unlink(path)


if __name__ == "__main__":
    main()
