"""Progress under a batch system (a job log, not a terminal): plain periodic lines when stderr is a
file, rates counted from when the work began, an ETA from the bytes done."""

from __future__ import annotations

import io
import re

import numpy as np

from megatron_endprompt.cli import build_sidecar as sidecar_cli
from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.sidecar.indexed_io import IndexedWriter
from megatron_endprompt.data.prepare.progress import Progress


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_rate_and_eta_count_from_the_start_of_the_work():
    """A backlog drained at once (tokens encoded while torch imported) must not read as an
    impossible rate with ETA 0 at 3% (the old line: 343,056,101 tokens/s, ETA 0 s)."""
    clock, out = Clock(), io.StringIO()
    started = clock.t
    clock.t += 10.0  # the imports: the work began 10 s ago
    p = Progress(1000, started=started, every_items=1, every_s=30, stream=out, clock=clock)
    clock.t += 1e-5
    p.update(30, tokens=5000)  # 3% of the bytes, drained from the backlog in 10 us
    line = out.getvalue().strip()
    assert "(3.0%)" in line
    rate = float(re.search(r"([\d,]+) tokens/s", line).group(1).replace(",", ""))
    assert rate == 500  # 5,000 tokens in 10 s, not 5,000 in 10 us
    assert "ETA 5 min 23 s" in line  # 970 bytes left at 3 bytes/s


def test_lines_are_periodic_and_end_with_a_last_line():
    clock, out = Clock(), io.StringIO()
    p = Progress(100, unit="documents", every_items=10**9, every_s=30, stream=out, clock=clock)
    for _ in range(100):
        clock.t += 1.0
        p.update(1)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 4  # at 30, 60, 90 s and the last one
    assert lines[0].startswith("progress: 30 of 100 documents (30.0%)")
    assert lines[-1].startswith("progress: 100 of 100 documents (100.0%)")
    assert "ETA" not in lines[-1]
    assert "\r" not in out.getvalue()


def test_preprocess_log_lines_show_possible_rates(llama3_args, run_tool, tmp_path,
                                                 monkeypatch):
    """End to end with early encoding (the Llama-3-like tokenizer.json) while Megatron's
    tokenizer takes 0.3 s to build (the imports of a fresh process): every logged rate is below
    all the tokens in 0.25 s — the old lines divided the drained backlog by microseconds."""
    import time

    # a cold run builds Megatron's there
    import megatron_endprompt.data.tokenize.tokenizer_verdict as tv

    real = tv.build_tokenizer
    monkeypatch.setattr(tv, "build_tokenizer", lambda spec: time.sleep(0.3) or real(spec))
    argv = [a for a in llama3_args(tmp_path / "x", "--log-interval", 1) if a != "--no-progress"]
    rc, out, err = run_tool(preprocess_cli.main, argv)
    assert rc == 0, err
    total = int(re.search(r"of ([\d,]+) tokenized", out).group(1).replace(",", ""))
    rates = [float(m.replace(",", "")) for m in re.findall(r"([\d,]+) tokens/s", err)]
    assert rates and max(rates) <= total / 0.25
    assert "\r" not in err and "tokenizer path:" in err


def test_sidecar_tool_prints_progress_when_stderr_is_a_file(run_tool, tmp_path):
    """Under SLURM stderr is a file: tqdm printed nothing there; now a last line at least."""
    prefix = str(tmp_path / "c")
    w = IndexedWriter(prefix + ".bin", np.uint16)
    rng = np.random.default_rng(0)
    for _ in range(50):
        d = rng.integers(0, 1000, 60)
        w.add_document(d, [len(d)])
    w.finalize(prefix + ".idx")
    rc, out, err = run_tool(sidecar_cli.main, ["--data-prefix", prefix, "--seq-length", 32,
                                               "--target-length", 256, "--terminal-length", 8])
    assert rc == 0, err
    assert "progress: 50 of 50 documents (100.0%)" in err and "\r" not in err
