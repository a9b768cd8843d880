"""The stages of ``benchmarks/gpu_check.sh`` (one CUDA GPU, at most 8 minutes), each recorded in
one JSON whatever happens to the others.

Stages (each a subprocess with its own time limit, cut to what is left of the total budget):

1. ``env``: torch / CUDA device / Megatron-Core / Transformer Engine versions, and
   ``megatron_endprompt.runtime.install()`` on the real GPU: wheel fixes in, TE RoPE router in
   (when TE is there), CPU layer *not* installed, ``compile_helpers()`` returns.
2. ``pytest_gpu``: ``pytest -m gpu tests/gpu`` (TE fused RoPE vs unfused, TE model at bf16).
3. ``bench``: ``benchmarks.step_time.bench`` on a ~1B Llama (Llama-3.2-1B shape: h 2048,
   16 layers, 32 heads / 8 KV groups, SwiGLU 8192, vocab 128256, tied), TE spec, bf16, TE fused
   RoPE, full activation recompute on both sides: EndPrompt at P=8192 vs full-length at L=65536
   (micro-batch 1): step-time ratio and ``max_memory_allocated`` ratio beside the FLOP ideal.
4. ``train_shared`` / ``train_mixed``: ~20 iterations through
   ``python -m megatron_endprompt.training.pretrain`` (torchrun, 1 GPU, NCCL) with the TE spec,
   bf16 and TE fused RoPE, on a fixed-placement prefix (every row the same layout -> freqs
   ``[S, 1, 1, D]`` into TE's fused kernel) and a random-placement one (rows differ ->
   ``[S, B, 1, D]`` through the runtime's router to the unfused kernel).

``--dry-run`` (no GPU needed) prepares the data, prints every stage's command and writes the JSON
with each stage ``planned``. ``--cpu-smoke`` (no GPU needed) runs ``env`` and both training
stages for real on the CPU runtime with a tiny model (no TE, fp32, 3 iterations) to check the
stage machinery itself. ``--only STAGE`` runs one stage. Data and scratch files go to
``--work-dir`` (not ``$OUT``: the device tool brings back at most 8 files).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time

from benchmarks.paths import OUT, REPO
from megatron_endprompt.disk import write_text

TOTAL_BUDGET_S = 470  # the shell wrapper's own set-up comes on top: 8 minutes in all

#: The ~1B Llama of the P-vs-L measurement (Llama-3.2-1B's shape).
BENCH_MODEL = ["--hidden", "2048", "--layers", "16", "--heads", "32", "--groups", "8",
               "--ffn", "8192", "--vocab", "128256", "--tie-embeddings"]
BENCH_P, BENCH_RATIO = 8192, 8  # L = 65536

#: The small Llama the training stages run (start-up dominates; the point is the code path).
TRAIN_P, TRAIN_L, TRAIN_VOCAB, TRAIN_ITERS = 1024, 8192, 4096, 20
TRAIN_MODEL = [
    "--num-layers", "4", "--hidden-size", "512", "--ffn-hidden-size", "1536",
    "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "2",
    "--position-embedding-type", "rope", "--rotary-base", "500000",
    "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
    "--untie-embeddings-and-output-weights", "--attention-dropout", "0", "--hidden-dropout", "0",
    "--seq-length", str(TRAIN_P), "--max-position-embeddings", str(TRAIN_P),
    "--tokenizer-type", "NullTokenizer", "--vocab-size", str(TRAIN_VOCAB),
]

ENV_PROBE = r"""
import json, os, sys
out = {}
import torch
out["python"] = sys.version.split()[0]
out["torch"] = torch.__version__
out["cuda_available"] = torch.cuda.is_available()
out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
out["gpu_memory_gib"] = (torch.cuda.get_device_properties(0).total_memory / 2**30
                         if torch.cuda.is_available() else None)
try:
    import megatron.core as mc
    out["megatron_core"] = mc.__version__
except Exception as exc:
    out["megatron_core"] = None; out["megatron_error"] = repr(exc)[:300]
try:
    import transformer_engine as te, transformer_engine.pytorch  # noqa: F401
    out["transformer_engine"] = te.__version__
except Exception as exc:
    out["transformer_engine"] = None; out["te_error"] = repr(exc)[:300]
try:  # Apex's kernel behind Megatron's default --gradient-accumulation-fusion
    import fused_weight_gradient_mlp_cuda  # noqa: F401
    out["apex_grad_accum_fusion"] = True
except Exception:
    out["apex_grad_accum_fusion"] = False
if out["megatron_core"]:
    from megatron_endprompt import runtime
    out["runtime_layers"] = runtime.install()
    out["runtime_patches"] = len(runtime.patches())
    import megatron.core.datasets.utils as ds_utils
    ds_utils.compile_helpers()  # the pip wheel's stock version calls sys.exit(1)
    out["compile_helpers_returned"] = True
print("ENV_JSON " + json.dumps(out))
"""

DATA_SCRIPT = r"""
import sys
from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix
root, placement = sys.argv[1], sys.argv[2]
print(write_motif_prefix(root, seq_length=int(sys.argv[3]), target_length=int(sys.argv[4]),
                         vocab=int(sys.argv[5]), docs=400, placement=placement))
"""

_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.E+-]+)")
_BANNER = re.compile(r"EndPrompt: (L=\d+ L0=\d+.*? s=[0-9.]+)")
_STEP_MS = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")


class Run:
    """The JSON being written: one entry per stage, rewritten after every stage."""

    def __init__(self, out_dir: str, dry_run: bool) -> None:
        self.out_dir = out_dir
        self.path = os.path.join(out_dir, "gpu_check.json")
        self.start = time.monotonic()
        self.result: dict = {"benchmark": "gpu_check", "dry_run": dry_run,
                             "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "budget_s": TOTAL_BUDGET_S, "stages": {}}

    def left(self) -> float:
        return TOTAL_BUDGET_S - (time.monotonic() - self.start)

    def record(self, name: str, entry: dict) -> None:
        self.result["stages"][name] = entry
        self.result["elapsed_s"] = round(time.monotonic() - self.start, 1)
        self.result["ok"] = all(s.get("status") in ("ok", "planned")
                                for s in self.result["stages"].values())
        write_text(self.path, json.dumps(self.result, indent=2, default=str))


def run_cmd(cmd: list[str], *, timeout: float, log_path: str) -> tuple[int | None, str, float]:
    """``(exit code or None on timeout, output, seconds)``; output also written to ``log_path``.
    The command runs in its own process group, killed whole on timeout (torchrun's workers
    would otherwise keep the GPU)."""
    t0 = time.monotonic()
    env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            rc = None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with open(log_path, errors="replace") as f:
        return rc, f.read(), time.monotonic() - t0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(text: str, n: int = 25) -> list[str]:
    lines = [ln for ln in text.splitlines() if "warn" not in ln.lower()]
    return lines[-n:]


def stage(run: Run, name: str, budget: float, cmd: list[str], parse, dry_run: bool) -> dict:
    """Run one stage's command under ``min(budget, time left)``; record its outcome."""
    printable = " ".join(a if "\n" not in a else "<script>" for a in cmd)
    print(f"\n== {name}: {printable}", flush=True)
    if dry_run:
        entry = {"status": "planned", "command": printable, "budget_s": budget}
        run.record(name, entry)
        return entry
    limit = min(budget, run.left())
    if limit < 15:
        entry = {"status": "skipped", "reason": "out of time", "command": printable}
        run.record(name, entry)
        return entry
    rc, out, secs = run_cmd(cmd, timeout=limit, log_path=os.path.join(run.out_dir, f"{name}.log"))
    entry = {"command": printable, "seconds": round(secs, 1), "returncode": rc}
    try:
        entry.update(parse(out) or {})
    except Exception as exc:  # noqa: BLE001 - a parser bug must not lose the stage
        entry["parse_error"] = repr(exc)
    if rc is None:
        entry["status"] = f"timeout after {limit:.0f}s"
    elif "status" not in entry:
        entry["status"] = "ok" if rc == 0 else f"failed (exit {rc})"
    if entry["status"] != "ok":
        entry["log_tail"] = tail(out)
    print(f"   -> {entry['status']} ({secs:.0f}s)", flush=True)
    run.record(name, entry)
    return entry


def parse_env(out: str) -> dict:
    line = next((ln for ln in out.splitlines() if ln.startswith("ENV_JSON ")), None)
    if line is None:
        return {"status": "failed (no probe output)"}
    env = json.loads(line[len("ENV_JSON "):])
    problems = []
    if not env.get("cuda_available") and not CPU_SMOKE:
        problems.append("no CUDA device")
    if not env.get("megatron_core"):
        problems.append("megatron-core missing")
    layers = env.get("runtime_layers") or {}
    if env.get("megatron_core") and (not layers.get("wheel")
                                     or layers.get("cpu") != (not env.get("cuda_available"))):
        problems.append(f"runtime layers wrong for this machine: {layers}")
    if env.get("transformer_engine") and not layers.get("rope"):
        problems.append("TE present but the RoPE router is not installed")
    env["status"] = "ok" if not problems else "failed: " + "; ".join(problems)
    return env


def parse_pytest(out: str) -> dict:
    m = re.findall(r"=+ (.*?) in [0-9.]+s", out)
    return {"summary": m[-1] if m else None}


def parse_train(out: str, iters: int = TRAIN_ITERS) -> dict:
    losses = {int(a): float(b) for a, b in _ITER.findall(out)}
    banner = _BANNER.search(out)
    steps = [float(x) for x in _STEP_MS.findall(out)]
    entry = {"iterations_logged": len(losses), "banner": banner.group(1) if banner else None,
             "cpu_layer_installed": "no CUDA device, running Megatron-Core" in out,
             "step_ms_last": steps[-1] if steps else None}
    if losses:
        its = sorted(losses)
        entry.update(loss_first=losses[its[0]], loss_last=losses[its[-1]])
        finite = all(math.isfinite(v) for v in losses.values())
        if not finite or entry["cpu_layer_installed"] != CPU_SMOKE or len(losses) < iters:
            entry["status"] = "failed: " + ", ".join(
                p for p, bad in (("non-finite loss", not finite),
                                 ("CPU layer installed on a GPU",
                                  entry["cpu_layer_installed"] != CPU_SMOKE),
                                 (f"{len(losses)}/{iters} iterations", len(losses) < iters))
                if bad)
    return entry


def parse_json_file(json_path: str):
    """A stage parser that returns the JSON file the stage wrote (``{}`` when it wrote none)."""
    def parse(out: str) -> dict:
        if not os.path.exists(json_path):
            return {}
        with open(json_path) as f:
            return {"result": json.load(f)}
    return parse


def parse_bench(json_path: str):
    def parse(out: str) -> dict:
        if not os.path.exists(json_path):
            return {}
        with open(json_path) as f:
            res = json.load(f)
        p2 = res.get("part2_P_vs_L", {})
        gib = 2 ** 30
        summary = {"config": {k: res.get("config", {}).get(k)
                              for k in ("P", "L", "B", "params", "spec", "dtype", "recompute")},
                   "rope_overhead_vs_stock": {k: v.get("ratio_of_medians") for k, v in
                                              res.get("part1_rope_overhead", {})
                                              .get("vs_stock", {}).items()}}
        if "error" in p2:
            summary["P_vs_L"] = {"error": p2["error"]}
        elif p2:
            summary["P_vs_L"] = {
                "step_time_s": {"endprompt_P": p2["endprompt_P"]["median_s"],
                                "full_L": p2["full_L"]["median_s"]},
                "step_time_ratio": p2["time_ratio"],
                "flop_ideal_ratio": p2["time_ideal_flop_ratio"],
                "max_memory_allocated_gib": {k: v / gib for k, v in
                                             p2.get("cuda_peak_bytes", {}).items()},
                "max_memory_allocated_ratio": p2.get("cuda_peak_ratio"),
                "memory_ideal_ratio": p2.get("peak_ideal"),
                "activation_ratio": p2.get("activation_ratio"),
            }
        summary["gpu_throughput"] = res.get("gpu_throughput")
        return summary
    return parse


#: ``--cpu-smoke``: the stage machinery on the CPU runtime (set in ``main``).
CPU_SMOKE = False
SMOKE_P, SMOKE_L, SMOKE_ITERS = 128, 1024, 3


def train_args(prefix: str, cache: str, *, grad_accum_fusion: bool = True) -> list[str]:
    if CPU_SMOKE:
        model = [a if a not in ("512", "1536", "4") else {"512": "64", "1536": "128", "4": "2"}[a]
                 for a in TRAIN_MODEL]
        model[model.index("--seq-length") + 1] = str(SMOKE_P)
        model[model.index("--max-position-embeddings") + 1] = str(SMOKE_P)
        precision, target, iters = [], SMOKE_L, SMOKE_ITERS
    else:
        model, target, iters = TRAIN_MODEL, TRAIN_L, TRAIN_ITERS
        precision = ["--bf16", "--transformer-impl", "transformer_engine"]
        if not grad_accum_fusion:  # pip TE without Apex: Megatron's output layer would refuse
            precision.append("--no-gradient-accumulation-fusion")
    return [*model, *precision,
            "--data-path", prefix, "--split", "98,1,1", "--data-cache-path", cache,
            "--endprompt-target-length", str(target),
            "--micro-batch-size", "4", "--global-batch-size", "16",
            "--train-iters", str(iters), "--lr", "1e-3", "--min-lr", "1e-4",
            "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--clip-grad", "1.0",
            "--seed", "1234", "--calculate-per-token-loss", "--log-interval", "1",
            "--eval-iters", "0", "--eval-interval", "100000", "--num-workers", "0"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=OUT)
    p.add_argument("--dry-run", action="store_true", help="no GPU: prepare data, plan stages")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="no GPU: run env + the training stages on the CPU runtime, tiny model")
    p.add_argument("--work-dir", default=os.environ.get("GPU_CHECK_WORK", "/tmp/gpu_check_work"),
                   help="data and scratch files (kept out of --out-dir)")
    p.add_argument("--only", choices=("env", "pytest_gpu", "bench", "train_shared",
                                      "train_mixed", "plan"), action="append")
    a = p.parse_args(argv)
    global CPU_SMOKE
    CPU_SMOKE = a.cpu_smoke
    if a.cpu_smoke:
        a.only = a.only or ["env", "train_shared", "train_mixed"]
    os.makedirs(a.out_dir, exist_ok=True)
    os.makedirs(a.work_dir, exist_ok=True)
    run = Run(a.out_dir, a.dry_run)
    py = sys.executable
    want = set(a.only or ("env", "pytest_gpu", "bench", "train_shared", "train_mixed", "plan"))

    if "env" in want:
        env = stage(run, "env", 60, [py, "-c", ENV_PROBE], parse_env, a.dry_run)
    else:
        env = {}
    has_te = bool(env.get("transformer_engine")) or a.dry_run or a.cpu_smoke

    if "pytest_gpu" in want:
        stage(run, "pytest_gpu", 100, [py, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu",
                                       "-p", "no:cacheprovider"], parse_pytest, a.dry_run)

    if "bench" in want:
        bench_json = os.path.join(a.out_dir, "step_time_gpu.json")
        cmd = [py, "-m", "benchmarks.step_time.bench", "--device", "cuda", *BENCH_MODEL,
               "--seq-length", str(BENCH_P), "--ratio", str(BENCH_RATIO), "--micro-batch", "2",
               "--long-micro-batch", "1", "--iters", "5", "--warmup", "2", "--iters-long", "2",
               "--no-aa-control", "--recompute", "--peak-tflops", "989", "--out", bench_json]
        if has_te:
            stage(run, "bench", 200, cmd, parse_bench(bench_json), a.dry_run)
        else:
            run.record("bench", {"status": "skipped: transformer_engine not importable "
                                           "(the TE spec is what users run)",
                                 "command": " ".join(cmd)})

    data_root = os.path.join(a.work_dir, "data")
    for placement, name in (("fixed", "train_shared"), ("random", "train_mixed")):
        if name not in want:
            continue
        root = os.path.join(data_root, placement)
        os.makedirs(root, exist_ok=True)
        prefix = os.path.join(root, "ep")
        cmd = [py, "-m", "torch.distributed.run", "--nproc_per_node", "1",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               "-m", "megatron_endprompt.training.pretrain",
               *train_args(prefix, os.path.join(root, "cache"),
                           grad_accum_fusion=env.get("apex_grad_accum_fusion", True))]
        if not has_te:
            run.record(name, {"status": "skipped: transformer_engine not importable",
                              "command": " ".join(cmd)})
            continue
        if not os.path.exists(prefix + ".bin"):
            P, L = (SMOKE_P, SMOKE_L) if CPU_SMOKE else (TRAIN_P, TRAIN_L)
            rc, out, _ = run_cmd([py, "-c", DATA_SCRIPT, root, placement, str(P), str(L),
                                  str(TRAIN_VOCAB)], timeout=min(60, run.left()),
                                 log_path=os.path.join(a.work_dir, f"{name}_data.log"))
            if rc != 0:
                run.record(name, {"status": f"failed: data preparation (exit {rc})",
                                  "log_tail": tail(out)})
                continue
        stage(run, name, 90 if not CPU_SMOKE else 240, cmd,
              lambda out: parse_train(out, SMOKE_ITERS if CPU_SMOKE else TRAIN_ITERS), a.dry_run)

    if "plan" in want:  # the planner's prediction beside max_memory_allocated (calibration)
        plan_json = os.path.join(a.out_dir, "plan_vs_measured.json")
        cmd = [py, "-m", "benchmarks.step_time.plan_vs_measured", "--device", "cuda",
               *BENCH_MODEL, "--seq-length", str(BENCH_P), "--ratio", "4", "--micro-batch", "2",
               "--long-micro-batch", "1", "--out", plan_json]
        stage(run, "plan", 120, cmd, parse_json_file(plan_json), a.dry_run)

    run.result["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run.record("_summary", {"status": "ok" if run.result["ok"] else "failed stages: " + ", ".join(
        k for k, v in run.result["stages"].items() if v.get("status") not in ("ok", "planned"))})
    print(f"\nwrote {run.path}: " + ", ".join(f"{k}={v['status']}" for k, v in
                                           run.result["stages"].items()), flush=True)
    return 0 if run.result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
