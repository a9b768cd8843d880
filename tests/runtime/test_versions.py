"""The table of Megatron-Core differences (``runtime/versions.py``), each row detected from the
installed code. The other releases' shapes are reproduced with the real signatures/attributes
they have (0.18.2's ``pretrain`` order, its optimizer without ``optimizer_state_keys``), so
each row is exercised on whatever release is installed; the 0.18.x venv of ``.ci/run`` runs
the same tests on the real thing."""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from megatron_endprompt.runtime import versions


@pytest.fixture
def fresh_features():
    versions.megatron_features.cache_clear()
    yield
    versions.megatron_features.cache_clear()


def _pretrain_018(cfg_container, train_valid_test_dataset_provider, model_provider, model_type,
                  forward_step_func, process_non_loss_data_func=None,
                  get_embedding_ranks=None, get_position_embedding_ranks=None,
                  non_loss_data_func=None, store=None, inprocess_call_wrapper=None):
    """0.18.2's signature: ``model_provider`` third, positional."""
    return ("0.18", model_provider, model_type, forward_step_func, non_loss_data_func)


def _pretrain_019(cfg_container, train_valid_test_dataset_provider, model_type,
                  forward_step_func, model_provider=None, process_non_loss_data_func=None,
                  get_embedding_ranks=None, get_position_embedding_ranks=None,
                  non_loss_data_func=None, store=None, inprocess_call_wrapper=None):
    """0.19.2's signature: ``model_provider`` a keyword after ``forward_step_func``."""
    return ("0.19", model_provider, model_type, forward_step_func, non_loss_data_func)


@pytest.mark.parametrize("fake", [_pretrain_018, _pretrain_019])
def test_pretrain_call_order_follows_the_installed_signature(monkeypatch, fresh_features,
                                                             fake) -> None:
    """0.18's ``pretrain`` takes ``model_provider`` third: the old fixed keyword call failed
    with "pretrain() got multiple values for argument 'model_provider'"."""
    from megatron.training import training as mt  # where the signature is read

    monkeypatch.setattr(mt, "pretrain", fake)
    got = versions.call_pretrain(fake, "cfg", "data", "MODEL_TYPE", "step", model_provider="mp",
                                 non_loss_data_func="hook")
    assert got[1:] == ("mp", "MODEL_TYPE", "step", "hook")
    if fake is _pretrain_018:
        with pytest.raises(TypeError, match="multiple values for argument 'model_provider'"):
            fake("cfg", "data", "MODEL_TYPE", "step", model_provider="mp")


def test_detected_features_match_the_installed_release() -> None:
    import megatron.training as mt
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    features = versions.megatron_features()
    params = list(inspect.signature(mt.pretrain).parameters)
    assert features.pretrain_model_provider_positional == (params[2] == "model_provider")
    assert features.optimizer_state_keys == hasattr(DistributedOptimizer, "optimizer_state_keys")
    minor = tuple(int(p) for p in features.version.split(".")[:2])
    assert features.pretrain_model_provider_positional == (minor == (0, 18))
    assert features.optimizer_state_keys == (minor >= (0, 19))
    assert features.tokenizer_use_gigatoken == (minor >= (0, 20))


def test_optimizer_state_keys_without_the_019_helpers(monkeypatch, fresh_features) -> None:
    """0.18's distributed optimizer has no ``optimizer_state_keys``/``_get_state_key_dtype``:
    the resume fix's template must then use Adam's two moments with the config's dtypes (the
    old body called the missing helpers and DP2 resume failed)."""
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for name in ("optimizer_state_keys", "_get_state_key_dtype"):
        if hasattr(DistributedOptimizer, name):
            monkeypatch.delattr(DistributedOptimizer, name)
    opt = DistributedOptimizer.__new__(DistributedOptimizer)
    opt.config = types.SimpleNamespace(exp_avg_dtype=OptimizerConfig.exp_avg_dtype,
                                       exp_avg_sq_dtype=torch.float16)
    assert versions.optimizer_state_key_dtypes(opt) == [("exp_avg", torch.float32),
                                                        ("exp_avg_sq", torch.float16)]


def test_tokenizer_namespace_carries_gigatoken_only_where_read(monkeypatch,
                                                               fresh_features) -> None:
    """Megatron-LM main's builder reads ``args.use_gigatoken`` (AttributeError without it);
    older builders get 0.19's namespace unchanged."""
    import megatron.core.tokenizers.utils.build_tokenizer as bt

    has = "use_gigatoken" in inspect.getsource(bt)
    assert versions.tokenizer_namespace_extras() == ({"use_gigatoken": False} if has else {})
    real_getsource = inspect.getsource
    monkeypatch.setattr(versions.inspect, "getsource", lambda obj: (
        real_getsource(obj) + "\n# kwargs['use_gigatoken'] = args.use_gigatoken"
        if obj is bt else real_getsource(obj)))
    versions.megatron_features.cache_clear()
    assert versions.tokenizer_namespace_extras() == {"use_gigatoken": False}
