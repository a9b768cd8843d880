"""CPU calibration: the planner's activation and FLOP figures against what
``benchmarks/step_time/bench.py`` measures on the same tiny models -- saved-tensor bytes
(``torch.autograd.graph.saved_tensors_hooks``) and ``FlopCounterMode`` FLOPs of one step --
within 10%, for GQA and multi-head attention, tied and untied embeddings, at ``P`` and ``L``."""

from __future__ import annotations

import pytest
import torch

from megatron_endprompt.planning import ActivationModel, ModelSpec
from megatron_endprompt.planning.flops import model_flops
from megatron_endprompt.planning.megatron_formulas import MegatronAccounting, megatron_namespace

TOLERANCE = 0.10


def _spec(args) -> ModelSpec:
    return ModelSpec(name="tiny", num_layers=args.layers, hidden_size=args.hidden,
                     ffn_hidden_size=args.ffn, num_attention_heads=args.heads,
                     num_query_groups=args.groups, head_dim=args.hidden // args.heads,
                     vocab_size=args.vocab, tied=args.tie_embeddings)


@pytest.mark.parametrize("groups,tied", [(1, False), (4, True)], ids=["gqa-untied", "mha-tied"])
def test_planner_matches_bench_measurements(tiny_cpu, bench_modules, groups, tied):
    models, measure = bench_modules
    args, model = tiny_cpu(groups, tied)
    spec = _spec(args)
    local = ActivationModel(model=spec, attention="local", bytes_per_value=4)
    flash = ActivationModel(model=spec, attention="flash", bytes_per_value=4, swiglu_fusion=False)
    gen = torch.Generator().manual_seed(0)
    for kind, seq in (("shared", args.seq_length), ("contiguous", args.ratio * args.seq_length)):
        batch = models.make_batch(kind, args, seq, gen, 2)
        measured_act = measure.activation_bytes(model, batch)
        predicted_act = local.stage(seq=seq, micro_batch=2).total
        assert abs(predicted_act / measured_act - 1) <= TOLERANCE, (kind, predicted_act,
                                                                    measured_act)
        # The S x S scores are what the local spec adds over flash attention: without them
        # the prediction would miss the measurement at L by far more than the tolerance.
        if kind == "contiguous":
            assert flash.stage(seq=seq, micro_batch=2).total < (1 - TOLERANCE) * measured_act

        measured_flops = measure.op_profile(model, batch)["flops"]
        acc = MegatronAccounting(megatron_namespace(spec, seq_length=seq, micro_batch=2, tp=1,
                                                    pp=1, cp=1, dp=1))
        predicted_flops = model_flops(acc, spec, 2, attention="local")
        assert abs(predicted_flops / measured_flops - 1) <= TOLERANCE, (kind, predicted_flops,
                                                                        measured_flops)
        # Megatron's own (causal-half) count is the GPU figure; the bench's formula agrees.
        assert acc.train_flops(2) == pytest.approx(2 * measure.train_flops(args, seq), rel=1e-9)
