"""LoRA adapters under tensor parallelism through real gloo collectives (2 ranks): with and
without sequence parallelism, on Megatron-Core's column- and row-parallel linears and on a
column linear that fuses its input norm and returns the normalised input (the shape of Transformer
Engine's ``LayerNormColumnParallelLinear``, which the adapter reads with
``return_layernorm_output``); output, adapter gradients and input gradient equal an unsharded
computation (``lora_tp_worker.py``).

The local layer spec cannot train with sequence parallelism (its torch norm refuses it), so this
is where the adapters' sequence-parallel path -- the one every Transformer Engine run at TP > 1
takes, since the launcher sets ``--sequence-parallel`` there -- is checked on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.torchrun import run_torchrun

WORKER = Path(__file__).with_name("lora_tp_worker.py")


@pytest.mark.process
def test_adapters_under_tp_and_sequence_parallel_equal_unsharded(tmp_path) -> None:
    proc = run_torchrun(WORKER, "--out", tmp_path, nproc=2)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    done = sorted(p.name for p in tmp_path.glob("rank*.ok"))
    assert done == ["rank0.ok", "rank1.ok"], done
