"""Tests of the CPU runtime layer (``megatron_endprompt.runtime``).

The unit tests run the runtime in a fresh interpreter (it patches process-global state).
The training tests launch Megatron-Core's real ``pretrain()`` on the tiny GPT of
``tests/runtime/pretrain_tiny.py`` under ``torchrun --nproc_per_node 2`` with gloo; each
takes roughly 15-40 s on two CPU cores. PP=2 (and TP=2, DP=2) training is pinned to the
single-rank losses in tests/training/test_pretrain.py.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.torchrun import run_torchrun

pytestmark = pytest.mark.process  # every test here starts a fresh interpreter or torchrun

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("pretrain_tiny.py")
RUN_TIMEOUT_S = 300


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter; fail the test with its output if it fails."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=_env(), timeout=RUN_TIMEOUT_S, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def _pretrain(tmp: Path, name: str, *args: str) -> dict[int, list[float]]:
    """Run the tiny pretrain on 2 ranks; return {iteration: [micro-batch losses, all ranks]}."""
    losses_dir = tmp / f"losses_{name}"
    proc = run_torchrun(DRIVER, "--losses-dir", losses_dir, *args, nproc=2, env=_env(), cwd=tmp,
                        timeout=RUN_TIMEOUT_S)
    log = proc.stdout + proc.stderr
    (tmp / f"{name}.log").write_text(log)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{log[-6000:]}"
    per_iteration: dict[int, list[float]] = collections.defaultdict(list)
    for path in sorted(losses_dir.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            per_iteration[record["iteration"]].append(record["loss"])
    return dict(per_iteration)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


# ----------------------------------------------------------------------------------------------
# Unit tests
# ----------------------------------------------------------------------------------------------

def test_install_patches_once_and_rewrites_devices() -> None:
    """Installed: CUDA device args land on CPU in every thread; stand-ins are distinct; the
    ``torch_dist`` save's results queue is served by a fork of this process (a spawned server
    imported torch afresh, ~2.4 s, on every saving rank of every launch)."""
    proc = _run_python("""
        import sys, threading, types, torch
        from megatron_endprompt import runtime
        assert not torch.cuda.is_available()
        assert runtime.install() == {"wheel": True, "rope": False, "cpu": True}
        n_patched = len(runtime.patches())
        assert runtime.install()["cpu"] and len(runtime.patches()) == n_patched  # once

        assert not torch.cuda.is_available()          # Megatron's CPU branches still run
        assert torch.cuda.device_count() == 1 and torch.cuda.current_device() == 0
        assert torch.empty(3, device="cuda").device.type == "cpu"
        assert torch.zeros(2, device=torch.cuda.current_device()).device.type == "cpu"
        assert torch.ones(2, device=torch.device("cuda:0")).device.type == "cpu"
        t = torch.arange(4.0)
        assert t.cuda() is t and t.to("cuda").device.type == "cpu"
        assert t.to(torch.cuda.current_device(), torch.float64).dtype == torch.float64
        assert t.type() == "torch.FloatTensor"      # non-Megatron callers see the truth

        seen = []
        worker = threading.Thread(target=lambda: seen.append(torch.empty(1, device="cuda").device))
        worker.start(); worker.join()
        assert seen == [torch.device("cpu")]

        class Doubled(torch.autograd.Function):  # autograd runs backward with no modes
            @staticmethod
            def forward(ctx, x):
                return 2 * x

            @staticmethod
            def backward(ctx, grad):
                return 2 * grad + torch.zeros(3, device=torch.cuda.current_device())

        leaf = torch.ones(3, requires_grad=True)
        Doubled.apply(leaf).sum().backward()
        assert leaf.grad.tolist() == [2.0, 2.0, 2.0]

        names = ["set_device", "synchronize", "empty_cache", "reset_peak_memory_stats",
                 "memory_allocated", "max_memory_allocated", "device_count",
                 "current_device", "get_rng_state", "set_rng_state", "manual_seed",
                 "manual_seed_all"]
        fns = [getattr(torch.cuda, n) for n in names]
        assert len({id(f) for f in fns}) == len(fns)

        torch.cuda.manual_seed(7)
        a = torch.rand(3)
        torch.cuda.manual_seed(7)
        assert torch.equal(a, torch.rand(3))           # CUDA RNG calls drive the CPU generator
        state = torch.cuda.get_rng_state(); b = torch.rand(2)
        torch.cuda.set_rng_state(state); assert torch.equal(b, torch.rand(2))

        ev = torch.cuda.Event(enable_timing=True); ev.record(); ev.synchronize()
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.current_stream().wait_stream(torch.cuda.Stream())
        assert torch.cuda.get_device_capability() == (9, 0)

        import megatron.core.optimizer.clip_grads as clip_grads
        probe = eval("lambda t: t.type()", vars(clip_grads))
        assert probe(torch.zeros(1)) == "torch.cuda.FloatTensor"  # what Megatron compares with

        import megatron.core.datasets.utils as ds_utils
        ds_utils.compile_helpers()   # the wheel has no Makefile: must not exit the process

        # a class only this process has: a spawned queue server cannot unpickle it
        import megatron.core.dist_checkpointing.strategies.filesystem_async as fs_async
        only_here = types.ModuleType("only_in_this_process")
        exec("class Result:\\n    n = 3\\n", vars(only_here))
        sys.modules[only_here.__name__] = only_here
        results = fs_async.get_write_results_queue()
        results.put(only_here.Result())
        assert results.get().n == 3
        print("OK")
    """)
    assert "OK" in proc.stdout
    assert "running Megatron-Core" in proc.stderr and "on CPU" in proc.stderr


# ----------------------------------------------------------------------------------------------
# The real trainer on CPU
# ----------------------------------------------------------------------------------------------

def _assert_loss_falls(losses: dict[int, list[float]], iterations: int) -> None:
    assert sorted(losses) == list(range(1, iterations + 1))
    first = _mean(losses[1] + losses[2])
    last = _mean(losses[iterations - 1] + losses[iterations])
    assert last < first - 0.2, {k: round(_mean(v), 4) for k, v in losses.items()}


def _assert_resume_exact(full: dict[int, list[float]], resumed: dict[int, list[float]],
                         start: int, end: int) -> None:
    assert sorted(resumed) == list(range(start, end + 1))
    for iteration in range(start, end + 1):
        # Bit-exact, every micro-batch on every rank.
        assert resumed[iteration] == full[iteration], (iteration, full[iteration],
                                                       resumed[iteration])


def test_cpu_training_rank_imports_megatron_without_torch_compile() -> None:
    """A CPU training rank (``install(trainer=True)``) imports Megatron with ``torch.compile``
    held back, so its jit-fused functions stay eager and torch's dynamo/inductor are not
    imported (~2-3 s per rank); ``torch.compile`` itself is torch's again afterwards; a
    non-trainer install (the tests) imports Megatron as before; the conversion tool imports it
    eager too; with CUDA (faked) nothing is imported eager."""
    out = _run_python("""
        import sys, torch
        compile_ = torch.compile
        from megatron_endprompt import runtime
        runtime.install(cpu=True, trainer=True)
        import megatron.training.training
        from megatron.core.fusions.fused_bias_swiglu import bias_swiglu
        x, b = torch.randn(4, 8), torch.randn(8)
        y1, y2 = torch.chunk(x + b, 2, dim=-1)
        same = torch.equal(bias_swiglu(x, b), torch.nn.functional.silu(y1) * y2)
        print("eager", "torch._dynamo" not in sys.modules, torch.compile is compile_, same)
    """).stdout
    assert "eager True True True" in out, out
    tool = _run_python("""
        import sys
        from megatron_endprompt import runtime
        runtime.install(cpu=True)
        import megatron.training.training
        print("dynamo", "torch._dynamo" in sys.modules)
    """).stdout
    assert "dynamo True" in tool, tool
    convert = _run_python("""
        import sys
        from megatron_endprompt.cli import convert
        try:  # refused after the conversion modules (and Megatron) were imported
            convert.main(["megatron-to-hf", "--checkpoint", "/nonexistent", "--output", "/x"])
        except Exception as exc:
            print(type(exc).__name__)
        print("megatron", "megatron.core" in sys.modules, "dynamo", "torch._dynamo" in sys.modules)
    """).stdout
    assert "megatron True dynamo False" in convert, convert
    gpu = _run_python("""
        import sys, torch
        torch.cuda.is_available = lambda: True  # a GPU machine keeps the compiled fusions
        from megatron_endprompt import runtime
        print("gpu", runtime.import_megatron_eager(), "megatron.core" in sys.modules)
    """).stdout
    assert "gpu False False" in gpu, gpu


def test_tp2_trains_and_resumes_exactly(tmp_path: Path) -> None:
    """TP=2: loss falls over 10 iterations; a resume from the iteration-3 torch_dist
    checkpoint reproduces iterations 4-10 exactly (dropout on, RNG state restored)."""
    ckpt = tmp_path / "ckpt"
    tp2 = ["--tensor-model-parallel-size", "2", "--train-iters", "10"]
    full = _pretrain(tmp_path, "full", *tp2, "--save", str(ckpt), "--save-interval", "3")
    _assert_loss_falls(full, 10)
    assert (ckpt / "iter_0000003").is_dir()
    resumed = _pretrain(tmp_path, "resumed", *tp2, "--load", str(ckpt), "--ckpt-step", "3")
    _assert_resume_exact(full, resumed, 4, 10)
