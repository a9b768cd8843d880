"""torchrun worker (2 ranks, TP = 2) for test_model_lora_tp.py: a column-parallel then a
row-parallel Megatron-Core linear, each wrapped by :class:`LoraLinear`, equal an unsharded
computation of ``y = W x + (alpha/r) B A x`` twice over -- output, every adapter gradient and the
input gradient -- with and without sequence parallelism, and for a column linear that fuses its
input norm and returns the normalised input beside its output (Transformer Engine's
``LayerNormColumnParallelLinear`` contract with ``return_layernorm_output``: the returned
rank-local copy's gradient is added to the input gradient after the layer's own TP reduction; the
all-gathered copy's, with ``return_layernorm_output_gathered``, before its reduce-scatter).

As Megatron's ``finalize_model_grads`` does, gradients of parameters marked ``sequence_parallel``
are summed over TP before they are compared. Writes ``OUT/rank<R>.ok`` on success.

Shapes: ``x [S, B, H]`` (``[S/2, B, H]`` per rank under sequence parallelism), column output
``[S, B, F/2]``, row output ``[S, B, H]`` (``[S/2, B, H]``).
"""

from __future__ import annotations

import argparse
import os

from tests.support.torchrun import install_rank_runtime

S, B, H, F, R, ALPHA = 8, 2, 16, 24, 4, 8.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()

    install_rank_runtime()
    import torch
    import torch.nn.functional as F_
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_endprompt.model.lora import LoraCheckpointing, LoraLinear
    from megatron_endprompt.model.lora_settings import LoraSettings

    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    mpu.initialize_model_parallel(tensor_model_parallel_size=2)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    tp = mpu.get_tensor_model_parallel_group()
    settings = LoraSettings(rank=R, alpha=ALPHA)
    scale = settings.scaling

    gen = torch.Generator().manual_seed(7)

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).float()

    x_full, g_full = draw(S, B, H), draw(S, B, H)
    w1, a1, b1 = draw(F, H), draw(R, H), draw(F, R)
    w2, a2, b2 = draw(H, F), draw(R, F), draw(H, R)
    cols = slice(rank * F // 2, (rank + 1) * F // 2)
    rows = slice(rank * S // 2, (rank + 1) * S // 2)

    def rms(t):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

    def reference(fused_norm: bool):
        leaves = [t.clone().requires_grad_() for t in (x_full, a1, b1, a2, b2)]
        x, la1, lb1, la2, lb2 = leaves
        h = rms(x) if fused_norm else x
        y1 = F_.linear(h, w1) + scale * F_.linear(F_.linear(h, la1), lb1)
        y2 = F_.linear(y1, w2) + scale * F_.linear(F_.linear(y1, la2), lb2)
        (y2 * g_full).sum().backward()
        return y2.detach(), [t.grad for t in leaves]

    class NormColumnLinear(torch.nn.Module):
        """RMS norm fused into a column-parallel linear: ``forward(x) -> ((out, ln_out), None)``
        when asked for the normalised input (``ln_out``: this rank's copy)."""

        def __init__(self, weight, sequence_parallel: bool):
            super().__init__()
            self.weight = torch.nn.Parameter(weight, requires_grad=False)
            self.sequence_parallel, self.tp_group = sequence_parallel, tp
            self.return_layernorm_output = False
            self.return_layernorm_output_gathered = False

        def forward(self, x):
            ln = rms(x)
            full = gather_from_sequence_parallel_region(ln, group=tp) \
                if self.sequence_parallel else \
                tensor_parallel.copy_to_tensor_model_parallel_region(ln, group=tp)
            out = F_.linear(full, self.weight)
            # gathered: TE's all-gathered copy, whose gradient joins the layer's own before
            # the reduce-scatter (as in TE 1.x); else the rank's copy, added after it
            ret = full if self.return_layernorm_output_gathered and self.sequence_parallel \
                else ln
            return ((out, ret) if self.return_layernorm_output else out), None

    def sharded(sequence_parallel: bool, fused_norm: bool):
        cfg = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=2,
                                tensor_model_parallel_size=2,
                                sequence_parallel=sequence_parallel,
                                use_cpu_initialization=True, gradient_accumulation_fusion=False,
                                add_bias_linear=False)
        init = torch.nn.init.zeros_
        if fused_norm:
            col = NormColumnLinear(w1[cols].clone(), sequence_parallel)
        else:
            col = ColumnParallelLinear(H, F, config=cfg, init_method=init, bias=False,
                                       gather_output=False, tp_group=tp)
        row = RowParallelLinear(F, H, config=cfg, init_method=init, bias=False,
                                input_is_parallel=True, skip_bias_add=True, tp_group=tp)
        with torch.no_grad():
            col.weight.copy_(w1[cols])
            row.weight.copy_(w2[:, cols])
        for base in (col, row):
            base.weight.requires_grad_(False)
        ck = LoraCheckpointing()
        lcol = LoraLinear(col, kind="column", settings=settings, init_key="c", checkpointing=ck)
        lrow = LoraLinear(row, kind="row", settings=settings, init_key="r", checkpointing=ck)
        with torch.no_grad():
            lcol.lora_a.copy_(a1)
            lcol.lora_b.copy_(b1[cols])
            lrow.lora_a.copy_(a2[:, cols])
            lrow.lora_b.copy_(b2)
        x = (x_full[rows] if sequence_parallel else x_full).clone().requires_grad_()
        y1, _ = lcol(x)
        y2, _ = lrow(y1)
        g = g_full[rows] if sequence_parallel else g_full
        (y2 * g).sum().backward()
        params = [lcol.lora_a, lcol.lora_b, lrow.lora_a, lrow.lora_b]
        for prm in params:  # what finalize_model_grads does for sequence-parallel parameters
            if getattr(prm, "sequence_parallel", False):
                torch.distributed.all_reduce(prm.grad, group=tp)
        return y2.detach(), [x.grad, *(prm.grad for prm in params)]

    def close(got, want, what):
        err = (got - want).abs().max().item()
        assert err <= 1e-4 * (1 + want.abs().max().item()), f"rank {rank}: {what}: {err}"

    for sequence_parallel in (False, True):
        for fused_norm in (False, True):
            case = f"sp={sequence_parallel} fused_norm={fused_norm}"
            want_y, (dx, da1, db1, da2, db2) = reference(fused_norm)
            got_y, (gx, ga1, gb1, ga2, gb2) = sharded(sequence_parallel, fused_norm)
            local = rows if sequence_parallel else slice(None)
            close(got_y, want_y[local], f"{case} output")
            close(gx, dx[local], f"{case} dx")
            close(ga1, da1, f"{case} column dA")
            close(gb1, db1[cols], f"{case} column dB")
            close(ga2, da2[:, cols], f"{case} row dA")
            close(gb2, db2, f"{case} row dB")
    open(os.path.join(a.out, f"rank{rank}.ok"), "w").close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
