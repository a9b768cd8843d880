"""The planner's accounting against Megatron's own functions, and its layout search."""

from __future__ import annotations

import json

import pytest

from megatron_endprompt.errors import UserError
from megatron_endprompt.planning import GPU_PRESETS, MODEL_PRESETS, ActivationModel, PlanSettings
from megatron_endprompt.planning.megatron_formulas import MegatronAccounting, megatron_namespace
from megatron_endprompt.planning.memory import GIB, memory_breakdown
from megatron_endprompt.planning.plan import candidate_layouts, evaluate, plan_method, plan_run, \
    total_params
from megatron_endprompt.planning.presets import model_from_hf_config

L8B = MODEL_PRESETS["llama3-8b"]


def settings(**kw) -> PlanSettings:
    base = dict(model=L8B, gpu=GPU_PRESETS["h100-80gb"], gpus=32, tokens=1e9, seq_length=8192,
                target_length=65536)
    return PlanSettings(**{**base, **kw})


def test_parameter_counts_are_the_published_ones():
    assert total_params(L8B) == 8_030_261_248  # Meta-Llama-3-8B
    assert total_params(MODEL_PRESETS["llama2-7b"]) == 6_738_415_616  # Llama-2-7b-hf
    assert total_params(MODEL_PRESETS["llama3-70b"]) == pytest.approx(70.55e9, rel=1e-3)


@pytest.mark.parametrize("tp,pp,cp,dp", [(1, 1, 1, 8), (2, 2, 2, 4), (8, 4, 1, 2)])
def test_model_states_equal_megatrons_formula(tp, pp, cp, dp):
    """weights + gradients + optimizer == Megatron's compute_weight_and_optimizer_memory (6 +
    12 / shards bytes per parameter), the optimizer sharded over DP x CP."""
    ns = megatron_namespace(L8B, seq_length=8192, micro_batch=1, tp=tp, pp=pp, cp=cp, dp=dp)
    acc = MegatronAccounting(ns)
    mem = memory_breakdown(acc, ActivationModel(model=L8B), num_microbatches=8)
    assert mem.static == pytest.approx(acc.weight_and_optimizer_bytes(shard_over=dp * cp))
    assert mem.weights == pytest.approx(2 * mem.params)
    assert mem.optimizer == pytest.approx(12 * mem.params / (dp * cp))


def test_activation_scaling_with_tp_cp_pp_and_recompute():
    act = ActivationModel(model=L8B)
    one = act.stage(seq=65536, micro_batch=1)
    assert act.stage(seq=65536, micro_batch=1, tp=2, cp=4).layers == pytest.approx(one.layers / 8)
    # flash attention: no S^2 term -> linear in S
    assert act.stage(seq=8192, micro_batch=1).per_layer == pytest.approx(one.per_layer / 8)
    # 1F1B: the first stage holds PP micro-batches of layers/PP layers
    assert act.stage(seq=8192, micro_batch=1, pp=4, num_microbatches=16).layers == \
        pytest.approx(act.stage(seq=8192, micro_batch=1).layers)
    full = ActivationModel(model=L8B, recompute="full").stage(seq=65536, micro_batch=1)
    assert full.per_layer == 65536 * 4096 * 2  # the layer input only
    assert full.recompute_buffer == pytest.approx(one.per_layer)
    assert full.total < one.total / 5
    # within ~15% of Megatron's s*b*h*(18 + 4f/h) per layer (its formula ignores GQA)
    megatron_per_layer = 65536 * 4096 * (18 + 4 * 14336 / 4096)
    assert 1.0 < one.per_layer / megatron_per_layer < 1.2


def test_cheapest_layout_fits_and_nothing_cheaper_does():
    s = settings()
    plan = plan_method(s, "full", 65536)
    assert plan.fits and plan.memory.total <= s.usable_bytes
    assert plan.layout.tp * plan.layout.cp > 1  # 64K needs model parallelism on 80 GB
    for layout in candidate_layouts(s, 65536):
        if layout.cost_key() >= plan.layout.cost_key():
            break
        assert not evaluate(s, "full", 65536, layout).fits, layout


def test_endprompt_beats_full_length_on_the_same_layout():
    plans = plan_run(settings(recompute="full"))
    ep, same = plans["endprompt"], plans["full_same_layout"]
    assert same.layout == ep.layout
    assert ep.memory.activations.total < same.memory.activations.total / 4
    assert ep.gpu_hours < plans["full"].gpu_hours
    # full recompute re-runs one forward: 4/3 of the model FLOPs
    assert ep.step_hardware_flops == pytest.approx(ep.step_model_flops * 4 / 3)


def test_nothing_fits_reports_the_least_memory_layout():
    s = settings(model=MODEL_PRESETS["llama3-70b"], gpu=GPU_PRESETS["a100-40gb"], gpus=2)
    plan = plan_method(s, "full", 131072)
    assert not plan.fits
    assert all(evaluate(s, "full", 131072, lay).memory.total >= plan.memory.total - 1
               for lay in candidate_layouts(s, 131072))


def test_fixed_dimensions_are_kept_and_bad_settings_name_the_flag():
    plans = plan_run(settings(tp=4, cp=2))
    assert {(p.layout.tp, p.layout.cp) for p in plans.values()} == {(4, 2)}
    with pytest.raises(ValueError, match="--tp 3"):
        settings(tp=3)
    with pytest.raises(ValueError, match="--target-length"):
        settings(target_length=4096)
    with pytest.raises(ValueError, match="--mfu"):
        settings(mfu=40)


def test_hf_config_file_or_directory(tmp_path):
    cfg = dict(model_type="llama", num_hidden_layers=32, hidden_size=4096,
               intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
               vocab_size=128256, max_position_embeddings=8192, tie_word_embeddings=False)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for path in (tmp_path, tmp_path / "config.json"):
        spec = model_from_hf_config(str(path))
        assert (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size, spec.num_query_groups,
                spec.head_dim, spec.vocab_size, spec.original_window) == \
            (32, 4096, 14336, 8, 128, 128256, 8192)
        assert total_params(spec) == 8_030_261_248
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="--hf-config .*bad.json"):
        model_from_hf_config(str(tmp_path / "bad.json"))
    (tmp_path / "partial.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(UserError, match="num_hidden_layers"):
        model_from_hf_config(str(tmp_path / "partial.json"))


def test_8b_example_of_the_readme():
    """The README's 8B 8K -> 64K example (see "Planning a run")."""
    plans = plan_run(settings(gpus=8, tp=1, pp=1, cp=1, recompute="full",
                              gpu=GPU_PRESETS["h100-80gb"]))
    ep, full = plans["endprompt"], plans["full"]
    assert ep.fits and not full.fits
    assert ep.memory.total / GIB == pytest.approx(65.2, abs=0.1)
    assert full.memory.total / GIB == pytest.approx(129.2, abs=0.1)
    assert ep.memory.total / full.memory.total == pytest.approx(36.5 / 76, abs=0.03)
