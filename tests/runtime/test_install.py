"""``megatron_endprompt.runtime.install()``: the one patching entry.

A GPU machine is faked with ``torch.cuda.is_available = lambda: True`` in a fresh interpreter
(the runtime patches process-global state): the wheel fixes must be installed there — the pip
wheel's ``compile_helpers()`` otherwise calls ``sys.exit(1)`` at start-up — and the CPU layer
must not. ``uninstall()`` restores every original; a patched function whose code changed is
refused with one line, leaving nothing patched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0, (f"rc={proc.returncode}\nstdout:\n{proc.stdout}"
                                  f"\nstderr:\n{proc.stderr}")
    return proc


@pytest.mark.process
def test_pretrain_entry_on_a_gpu_installs_wheel_fixes_not_cpu_layer() -> None:
    """Defect 1: with CUDA available the pretrain entry installed nothing, so the wheel's
    ``compile_helpers()`` exited the job (rc 1) and the distributed-optimizer fixes were off."""
    proc = _run_python("""
        import threading, torch
        torch.cuda.is_available = lambda: True          # a GPU machine, as far as we know
        cuda_before = {n: getattr(torch.cuda, n) for n in
                       ("device_count", "current_device", "set_device", "Stream", "Event",
                        "get_rng_state", "manual_seed", "synchronize")}
        tensor_before = (torch.Tensor.cuda, torch.Tensor.type, threading.Thread.start)

        from megatron_endprompt.training import pretrain
        try:
            pretrain.main(["--no-such-flag"])  # runs the start-up, then argparse exits
        except SystemExit:
            pass

        from megatron_endprompt import runtime
        on = {name for name, installed in runtime.installed_layers().items() if installed}
        assert on == {"wheel", "trainer", "quiet"}, on   # no CPU layer, no TE router
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
        patched = {where for _, where in runtime.patches()}
        assert "megatron.core.datasets.utils.compile_helpers" in patched, patched
        assert any(w.endswith("DistributedOptimizer.load_state_dict") for w in patched), patched
        assert {n: getattr(torch.cuda, n) for n in cuda_before} == cuda_before   # no CPU layer
        assert (torch.Tensor.cuda, torch.Tensor.type, threading.Thread.start) == tensor_before
        from torch.overrides import _get_current_function_mode_stack
        assert not _get_current_function_mode_stack()

        import megatron.core.datasets.utils as ds_utils
        ds_utils.compile_helpers()     # the wheel has no Makefile: stock calls sys.exit(1)
        print("ALIVE")
    """)
    assert "ALIVE" in proc.stdout
    assert "on CPU" not in proc.stderr


@pytest.mark.process
def test_uninstall_restores_every_original() -> None:
    _run_python("""
        import logging, threading, torch
        import megatron.core.datasets.utils as ds_utils
        import megatron.core.tensor_parallel.random as mp_random
        import megatron.training.training as mt_training
        from megatron.core.models.backends import LocalSpecProvider
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
        from torch.autograd.function import BackwardCFunction
        from torch.overrides import _get_current_function_mode_stack

        def snapshot():
            return {
                "cuda": {n: getattr(torch.cuda, n) for n in dir(torch.cuda)},
                "tensor": (torch.Tensor.cuda, torch.Tensor.type, threading.Thread.start,
                           BackwardCFunction.apply, BackwardCFunction.apply_boxed),
                "megatron": (ds_utils.compile_helpers, mp_random._get_cuda_rng_state,
                             mt_training.train, mt_training.load_checkpoint,
                             mt_training.initialize_megatron,
                             DistributedOptimizer.state_dict,
                             DistributedOptimizer.load_state_dict),
                "filters": list(logging.getLogger(
                    "megatron.core.tensor_parallel.random").filters),
                # the local layer spec's attention: the CPU layer's context-parallel one
                "core_attention": LocalSpecProvider().core_attention(),
            }

        before = snapshot()
        from megatron_endprompt import runtime
        assert runtime.install(cpu=True, verbose=False)["cpu"]
        during = snapshot()
        for key in before:
            assert during[key] != before[key], key
        assert _get_current_function_mode_stack()
        assert torch.empty(1, device="cuda").device.type == "cpu"

        n = runtime.uninstall()
        assert n == len([1 for _ in range(n)]) and n > 40, n
        assert runtime.patches() == []
        assert not any(runtime.installed_layers().values()), runtime.installed_layers()
        after = snapshot()
        for key in before:
            assert after[key] == before[key], key
        assert not _get_current_function_mode_stack()
        try:
            torch.empty(1, device="cuda")
        except (RuntimeError, AssertionError):
            pass
        else:
            raise AssertionError("CUDA allocations still land on the CPU after uninstall")
        # and it installs again cleanly
        assert runtime.install(cpu=True, verbose=False)["cpu"]
        runtime.uninstall()
    """)


def test_changed_megatron_function_is_refused_with_one_line(monkeypatch) -> None:
    """A Megatron release whose ``DistributedOptimizer.load_state_dict`` differs from the one
    the fix was written for: ``install()`` refuses, names the function, and leaves nothing
    patched (the wheel fixes applied before it are rolled back)."""
    import megatron.core.datasets.utils as ds_utils
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    from megatron_endprompt import runtime

    def load_state_dict(self, state_dict):  # a "new release": different code
        return None

    monkeypatch.setattr(DistributedOptimizer, "load_state_dict", load_state_dict)
    stock_compile_helpers = ds_utils.compile_helpers
    before = runtime.patches()  # what earlier in-process tests left (e.g. runtime.quiet())
    with pytest.raises(runtime.PatchedFunctionChanged) as info:
        runtime.install(cpu=False)
    message = str(info.value)
    assert "\n" not in message
    assert "DistributedOptimizer.load_state_dict changed" in message
    assert "update megatron_endprompt/runtime" in message
    assert runtime.installed_layers()["wheel"] is False and runtime.patches() == before
    assert ds_utils.compile_helpers is stock_compile_helpers


def test_fingerprint_ignores_docstrings_and_comments_not_code(tmp_path) -> None:
    import importlib.util
    import inspect

    from megatron_endprompt.runtime import fingerprint

    def load(name: str, src: str):
        path = tmp_path / f"{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"fp_probe_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.f

    a = load("a", "def f(x):\n    'doc'\n    return x + 1\n")
    b = load("b", "def f(x):\n    # a comment\n    return (x +\n            1)\n")
    c = load("c", "def f(x):\n    return x + 2\n")
    assert inspect.getsource(a) != inspect.getsource(b)
    assert fingerprint(a) == fingerprint(b) != fingerprint(c)


@pytest.mark.parametrize("version, reason", [
    ("0.21.0", "newer releases are unreviewed"),
    ("0.17.1", "lack megatron.training's config-container pretrain entry"),
    ("0.16.1", "lack megatron.training's config-container pretrain entry"),
])
def test_unsupported_megatron_version_is_refused(monkeypatch, version, reason) -> None:
    """The one version gate: outside ``>=0.18,<0.21`` install fails with one line naming the
    reason, before anything is patched; the model constructor uses the same gate."""
    from megatron.core import package_info

    from megatron_endprompt import runtime

    assert runtime.check_megatron_version().split(".")[:2] in (["0", "18"], ["0", "19"],
                                                               ["0", "20"])
    monkeypatch.setattr(package_info, "__version__", version)
    before = runtime.patches()  # what earlier in-process tests left (e.g. runtime.quiet())
    with pytest.raises(RuntimeError, match=f"{version} is not supported") as info:
        runtime.install(cpu=False)
    assert reason in str(info.value) and "\n" not in str(info.value)
    assert runtime.patches() == before


def test_ledger_restores_inherited_and_missing_attributes() -> None:
    from megatron_endprompt.runtime import Ledger

    class Base:
        def f(self):
            return "base"

    class Child(Base):
        pass

    obj, module_like = Base(), type("M", (), {})
    ledger = Ledger()
    ledger.replace(obj, "f", lambda: "patched", patch="t")
    ledger.replace(Child, "f", lambda self: "patched", patch="t")
    ledger.replace(module_like, "new", 1, patch="t", must_exist=False)
    assert obj.f() == Child().f() == "patched" and module_like.new == 1
    assert ledger.entries()[0][0] == "t" and len(ledger) == 3
    assert ledger.restore() == 3
    assert obj.f() == Child().f() == "base"
    assert "f" not in vars(obj) and "f" not in vars(Child) and not hasattr(module_like, "new")


@pytest.mark.process
def test_gpu_patch_set_is_exactly_the_wheel_fixes_plus_the_rope_router_with_te() -> None:
    """On a (faked) GPU machine ``install()`` patches exactly the wheel fixes, plus the TE RoPE
    router once TE's fused kernel is importable (faked: the real package is absent here);
    nothing of the CPU layer, whatever TE's presence; with TE's fused Adam (faked) not the two
    torch-Adam fixes."""
    proc = _run_python("""
        import json, torch
        torch.cuda.is_available = lambda: True
        import megatron.core.dist_checkpointing.strategies.filesystem_async as fs_async
        from megatron.core.models.common.embeddings import rope_utils
        from megatron_endprompt import runtime

        out = {"psutil": bool(getattr(fs_async, "HAVE_PSUTIL", True))}
        out["no_te"] = [runtime.install(), runtime.patches()]
        runtime.uninstall()
        rope_utils.fused_apply_rotary_pos_emb = lambda t, freqs, **kw: t   # TE importable
        out["te"] = [runtime.install(), runtime.patches()]
        runtime.uninstall()
        import megatron.core.optimizer.distrib_optimizer as dist_opt
        dist_opt.HAVE_APEX_OR_TE = True   # TE's fused Adam: no torch-Adam fallback
        out["te_adam"] = [runtime.install(), runtime.patches()]
        print("RESULT" + json.dumps(out))
    """)
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    opt = "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer."
    wheel = [["wheel", "megatron.core.datasets.utils.compile_helpers"]]
    if not out["psutil"]:
        wheel.append(["wheel", "megatron.core.dist_checkpointing.strategies.filesystem_async."
                               "_process_memory"])
    wheel.append(["wheel", "megatron.training.training.training_log"])
    wheel += [["wheel", opt + name] for name in
              ("state_dict", "_set_main_param_and_optimizer_states", "load_state_dict")]
    assert out["no_te"] == [{"wheel": True, "rope": False, "cpu": False}, wheel]
    router = [["rope-fallback", "megatron.core.models.common.embeddings.rope_utils."
                                "fused_apply_rotary_pos_emb"]]
    assert out["te"] == [{"wheel": True, "rope": True, "cpu": False}, wheel + router]
    # with TE's (or Apex's) fused Adam the distributed optimizer needs only the no-grad copy
    # (fp32 resumes); the state-template and Adam-step fixes are for torch Adam alone
    gpu = [entry for entry in wheel if not entry[1].endswith(("DistributedOptimizer.state_dict",
                                                              "load_state_dict"))]
    assert len(gpu) == len(wheel) - 2
    assert out["te_adam"] == [{"wheel": True, "rope": True, "cpu": False}, gpu + router]


def test_ledger_accepts_any_reviewed_release_fingerprint() -> None:
    """Fingerprints are kept per reviewed release: a function equal to any of them is patched
    (old code compared with one 0.19 fingerprint and refused 0.18's and main's); one equal to
    none is refused with one line naming every reviewed release."""
    from megatron_endprompt.runtime import Ledger, PatchedFunctionChanged, fingerprint

    def f(x):
        return x + 1

    owner = type("Owner", (), {"f": staticmethod(f)})
    ledger = Ledger()
    ledger.replace(owner, "f", lambda x: x, patch="t",
                   expected={"0.18.2": "000000000000", "0.19.2": fingerprint(f)})
    assert ledger.restore() == 1
    with pytest.raises(PatchedFunctionChanged) as info:
        ledger.check(owner, "f", {"0.18.2": "000000000000", "0.20.0": "111111111111"},
                     patch="t")
    assert "000000000000 (0.18.2), 111111111111 (0.20.0)" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.process
def test_uninstall_removes_the_trainer_settings_and_the_import_filters() -> None:
    """The child reaper (``multiprocessing``'s ``BaseProcess.start``), the CUDA
    launch-queue variable and the import-noise warning filters were set outside
    ``install()``'s ledger (by the pretrain entry, ``compat``, ``cli/convert``), so
    ``uninstall()`` left them in place."""
    _run_python("""
        import logging, multiprocessing.process as mpp, os, warnings
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        start, filters = mpp.BaseProcess.start, list(warnings.filters)
        level = logging.getLogger("megatron.core.dist_checkpointing").level
        from megatron_endprompt import runtime
        runtime.quiet(checkpoints=True)
        runtime.install(cpu=False, trainer=True)
        assert mpp.BaseProcess.start is not start
        assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        from megatron_endprompt.runtime.process import CHECKPOINT_NOISE, IMPORT_NOISE
        ours = set(IMPORT_NOISE + CHECKPOINT_NOISE)
        def patterns():
            return {f[1].pattern for f in warnings.filters if f[1] is not None}
        assert not ours & {f[1].pattern for f in filters if f[1] is not None}
        assert ours <= patterns()
        assert logging.getLogger("megatron.core.dist_checkpointing").level == logging.ERROR
        where = {w for _, w in runtime.patches()}
        assert "multiprocessing.process.BaseProcess.start" in where, where
        warnings.filterwarnings("ignore", message="added by someone else")
        runtime.uninstall()
        assert mpp.BaseProcess.start is start
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ
        assert not ours & patterns() and "added by someone else" in patterns()
        assert logging.getLogger("megatron.core.dist_checkpointing").level == level
        assert runtime.patches() == []
    """)


@pytest.mark.process
def test_pretrain_entry_installs_the_reaper_through_the_ledger() -> None:
    proc = _run_python("""
        import multiprocessing.process as mpp, torch
        torch.cuda.is_available = lambda: True
        start = mpp.BaseProcess.start
        from megatron_endprompt.training import pretrain
        try:
            pretrain.main(["--no-such-flag"])
        except SystemExit:
            pass
        from megatron_endprompt import runtime
        assert ("child-reaper", "multiprocessing.process.BaseProcess.start") in runtime.patches()
        runtime.uninstall()
        assert mpp.BaseProcess.start is start
        print("OK")
    """)
    assert "OK" in proc.stdout


@pytest.mark.process
def test_tokenizer_env_and_scoped_env_are_undone() -> None:
    """Preprocessing's tokenizer variables are a ledger layer (set only when unset, removed by
    ``uninstall()``, listed by ``installed_layers()``); ``scoped_env`` puts back what was there."""
    proc = _run_python("""
        import os
        from megatron_endprompt import runtime
        os.environ.pop("RAYON_RS_NUM_THREADS", None)
        os.environ.pop("TOKENIZERS_PARALLELISM", None)
        runtime.tokenizer_env(threads=3)
        assert os.environ["RAYON_RS_NUM_THREADS"] == "3"
        assert "TOKENIZERS_PARALLELISM" not in os.environ
        runtime.tokenizer_env(threads=5, forked_workers=True)   # first count stays
        assert os.environ["RAYON_RS_NUM_THREADS"] == "3"
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
        assert runtime.installed_layers()["tokenizer-env"]
        assert [p for p, _ in runtime.patches()] == ["tokenizer-env", "tokenizer-env"]
        runtime.uninstall()
        assert "RAYON_RS_NUM_THREADS" not in os.environ
        assert "TOKENIZERS_PARALLELISM" not in os.environ
        os.environ["MASTER_ADDR"] = "10.0.0.1"
        os.environ.pop("MASTER_PORT", None)
        with runtime.scoped_env(MASTER_ADDR="127.0.0.1", MASTER_PORT="1234"):
            assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["MASTER_PORT"] == "1234"
        assert os.environ["MASTER_ADDR"] == "10.0.0.1" and "MASTER_PORT" not in os.environ
    """)
    assert proc.returncode == 0
