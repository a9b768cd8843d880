"""The three functions ``megatron.training.pretrain`` takes: model provider, datasets
provider and forward step — Megatron's extension points, no fork of its trainer. Each is made
from the run's :class:`~megatron_endprompt.training.run.EndPromptRun` (a closure), so none
reads the EndPrompt flags back from Megatron's ``get_args()``."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from megatron_endprompt.training.lora_model import lora_model

if TYPE_CHECKING:
    from megatron_endprompt.training.run import EndPromptRun


def _require_rope_router(config: Any) -> None:
    """TE's fused RoPE takes only ``[S, 1, 1, D]``; mixed-layout micro-batches need the runtime's
    router (:mod:`megatron_endprompt.runtime.rope`) in place before the first forward."""
    from megatron.core.models.common.embeddings import rope_utils

    from megatron_endprompt.runtime import installed_layers

    if (config.apply_rope_fusion and rope_utils.fused_apply_rotary_pos_emb is not None
            and not installed_layers()["rope"]):
        raise RuntimeError(
            "EndPrompt with apply_rope_fusion needs megatron_endprompt.runtime.install() first "
            "(it routes per-row RoPE freqs around TE's fused kernel)")


def make_model_provider(run: EndPromptRun):
    """Megatron's ``model_provider`` for ``run``: see :func:`_model`."""

    def model_provider(pre_process: bool = True, post_process: bool = True,
                       vp_stage: int | None = None, config: Any = None,
                       pg_collection: Any = None):
        """This (virtual) pipeline stage's model (see :func:`_model`), with the run's LoRA
        adapters (:func:`~megatron_endprompt.training.lora_model.lora_model`)."""
        from megatron.training import get_args

        return lora_model(_model(run, pre_process=pre_process, post_process=post_process,
                                 vp_stage=vp_stage, config=config, pg_collection=pg_collection),
                          run.lora, get_args())

    return model_provider


def _model(run: EndPromptRun, *, pre_process: bool, post_process: bool, vp_stage: int | None,
           config: Any, pg_collection: Any):
    """This (virtual) pipeline stage's :class:`EndPromptGPTModel` (TE or local layer spec), with
    Megatron's multi-token-prediction block under ``--mtp-num-layers`` (on the last stage); under
    ``--hybrid-layer-pattern`` an :class:`EndPromptHybridModel` over the same layer spec.
    The PI factor is the resolved window's ``s``, passed once; under
    ``--endprompt-rope-scaling yarn|ntk-by-parts`` ``s`` is YaRN's factor instead
    (:meth:`~megatron_endprompt.training.run.EndPromptRun.model_rope_kwargs`)."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.training import get_args
    from megatron.training.arguments import core_transformer_config_from_args

    from megatron_endprompt.model import EndPromptGPTModel

    args = get_args()
    if config is None:
        config = core_transformer_config_from_args(args)
    _require_rope_router(config)
    use_te = args.transformer_impl == "transformer_engine"
    if use_te:
        spec = get_gpt_layer_with_transformer_engine_spec(
            qk_layernorm=args.qk_layernorm, multi_latent_attention=False)
    else:
        spec = get_gpt_layer_local_spec(normalization=args.normalization,
                                        qk_layernorm=args.qk_layernorm)
    if getattr(args, "hybrid_layer_pattern", None):
        return _hybrid_model(args, run, config, spec, pre_process=pre_process,
                             post_process=post_process, vp_stage=vp_stage,
                             pg_collection=pg_collection)
    mtp_spec = None
    if getattr(args, "mtp_num_layers", None):
        mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=use_te,
                                          vp_stage=vp_stage)
    return EndPromptGPTModel(
        config=config,
        transformer_layer_spec=spec,
        pre_process=pre_process,
        post_process=post_process,
        mtp_block_spec=mtp_spec,
        vp_stage=vp_stage,
        pg_collection=pg_collection,
        **_shared_model_kwargs(args, run),
    )


def _shared_model_kwargs(args: Any, run: EndPromptRun) -> dict:
    """The constructor arguments ``EndPromptGPTModel`` and ``EndPromptHybridModel`` take alike
    from Megatron's flags (one place, so the two models cannot drift)."""
    return dict(
        vocab_size=args.padded_vocab_size,
        max_sequence_length=max(args.max_position_embeddings, run.window.target_length),
        fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
        rope_scaling=args.use_rope_scaling,
        rope_scaling_factor=args.rope_scaling_factor,
        seq_len_interpolation_factor=None,  # folded into the window's s (see window.py)
        **run.model_rope_kwargs(),
    )


def _hybrid_model(args: Any, run: EndPromptRun, config: Any, layer_spec: Any, **stage: Any):
    """``--hybrid-layer-pattern`` (e.g. ``"*-" * n``, Llama-style): Megatron-Core's
    ``HybridModel`` over the same layer spec's attention/MLP halves, EndPrompt RoPE per call.
    Multi-token prediction with a hybrid pattern is refused at start-up
    (:func:`~megatron_endprompt.training.checks.check_startup`)."""
    from megatron_endprompt.model import EndPromptHybridModel

    return EndPromptHybridModel(
        config=config,
        hybrid_stack_spec=layer_spec,
        hybrid_layer_pattern=args.hybrid_layer_pattern,
        **stage,
        **_shared_model_kwargs(args, run),
    )


def dataset_config(args: Any, run: EndPromptRun):
    """``EndPromptDatasetConfig`` from Megatron's flags plus the run's (window, sidecar name,
    replay prefixes, the start-up tokenizer identity)."""
    from megatron.training import get_tokenizer
    from megatron.training.utils.common_utils import get_blend_and_blend_per_split

    from megatron_endprompt.data.dataset import EndPromptDatasetConfig

    blend, blend_per_split = get_blend_and_blend_per_split(args)
    return EndPromptDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=args.split,
        path_to_cache=args.data_cache_path,
        mmap_bin_files=args.mmap_bin_files,
        tokenizer=get_tokenizer(),
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
        endprompt_target_length=run.window.target_length,
        endprompt_loss_weights=run.window.loss_weights,
        endprompt_sidecar_name=run.sidecar_name,
        endprompt_replay_prefixes=list(run.replay_prefixes),
        endprompt_tokenizer_identity=run.tokenizer_identity,
    )


def make_datasets_provider(run: EndPromptRun):
    """Megatron's ``train_valid_test_datasets_provider`` for ``run``, the datasets checking its
    start-up tokenizer identity (``None``: each computes it from Megatron's tokenizer)."""

    def datasets_provider(train_val_test_num_samples: list[int], vp_stage: int | None = None):
        """Train/valid/test datasets through ``BlendedMegatronDatasetBuilder``, built on TP
        rank 0 of every pipeline stage (see :mod:`megatron_endprompt.training.batch` for
        why)."""
        from megatron.core import parallel_state as mpu
        from megatron.core.datasets.blended_megatron_dataset_builder import \
            BlendedMegatronDatasetBuilder
        from megatron.training import get_args

        from megatron_endprompt.data.dataset import EndPromptGPTDataset

        args = get_args()
        return BlendedMegatronDatasetBuilder(
            EndPromptGPTDataset, train_val_test_num_samples,
            lambda: mpu.get_tensor_model_parallel_rank() == 0,
            dataset_config(args, run),
        ).build()

    # Every rank enters the builder (it synchronises with barriers); ``is_built_on_rank`` keeps
    # the actual datasets to TP rank 0 of each stage, as in Megatron-LM's pretrain_gpt.
    datasets_provider.is_distributed = True
    return datasets_provider


def make_forward_step(run: EndPromptRun):
    """Megatron's ``forward_step_func`` for ``run`` (its loss log): see :func:`_forward_step`."""
    return partial(_forward_step, loss_log=run.loss_log)


def _forward_step(data_iterator: Any, model: Any, return_schedule_plan: bool = False, *,
                  loss_log: str | None = None):
    """One micro-batch: positions reach every stage; the last stage returns token losses.

    ``loss_mask`` (the EndPrompt weights ``[B, S]``: terminal ``w``, 0 for padding and masked
    EOD) goes to the model too: Megatron's multi-token-prediction loss (``--mtp-num-layers``)
    reads it inside ``GPTModel.forward`` and would otherwise weight every token 1. (Its
    per-token scaling uses the rolled weight sums; the global normaliser stays ``#{w > 0}``.)
    """
    from megatron.core.utils import get_attr_wrapped_model

    from megatron_endprompt.training.batch import get_batch
    from megatron_endprompt.training.loss import loss_func

    first = bool(get_attr_wrapped_model(model, "pre_process"))
    last = bool(get_attr_wrapped_model(model, "post_process"))
    batch = get_batch(data_iterator, first_stage=first, last_stage=last)
    output = model(batch.get("tokens"), batch["position_ids"], batch.get("attention_mask"),
                   labels=batch.get("labels"), loss_mask=batch.get("loss_mask"))
    return output, partial(loss_func, batch.get("loss_mask"), batch.get("terminal_mask"),
                           loss_log=loss_log)

