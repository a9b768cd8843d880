"""Megatron-Core ``torch_dist`` checkpoint (any TP/PP, ``iter_*`` or the ``latest`` pointer)
-> HF Llama directory: sharded safetensors + index, ``config.json``, tokenizer.

No GPU and no knowledge of the saving run's layout are needed: the checkpoint stores global
tensors, read here one at a time (:func:`~.megatron_ckpt.read_tensor`, a per-layer weight as its
layer-stacked global tensor) in a single-process gloo group, mapped to HF names (:mod:`.mapping`)
and streamed into shards. Peak memory: the largest stacked weight (``linear_fc1`` of all layers,
under half of a Llama model) plus one output shard (2 GiB by default).
The architecture comes from the checkpoint's saved ``args``; ``L`` and ``s`` default to the
EndPrompt flags the training run recorded (``endprompt_target_length``, ``endprompt_pi_factor``).
A Llama-style ``HybridModel`` checkpoint (``--hybrid-layer-pattern "*-" * n``) exports as the
``n``-layer GPT model it equals (:class:`~.hybrid_layers.HybridLayers`: its per-layer tensors
read by GPT layer); other hybrid patterns are refused.

Vocabulary un-padding: the real vocabulary size is, in order, the HF config recorded by
``hf-to-megatron`` (untrained conversions), the size of the tokenizer Megatron built from the
saved ``--tokenizer-type/--tokenizer-model/--vocab-size`` (exactly what it padded), or the length
of the ``--tokenizer`` exported.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from megatron_endprompt.compat import build_megatron_tokenizer
from megatron_endprompt.conversion.hf_config import hf_config_dict, spec_from_megatron_args
from megatron_endprompt.conversion.hf_io import ShardedSafetensorsWriter
from megatron_endprompt.conversion.hybrid_layers import HybridLayers
from megatron_endprompt.conversion.lora_export import LoraExport
from megatron_endprompt.conversion.mapping import Dims, WeightMapping, expand, mappings_for
from megatron_endprompt.conversion.megatron_ckpt import (
    find_checkpoint,
    load_common_state,
    read_tensor,
    single_process_group,
    tensor_metadata,
)
from megatron_endprompt.conversion.output import (
    atomic_output_dir,
    check_finite,
    check_output,
    guarded_output,
)
from megatron_endprompt.conversion.special_tokens import KEYS, resolve_special_ids, tokenizer_ids
from megatron_endprompt.conversion.tokenizer import export_tokenizer
from megatron_endprompt.disk import check_apart
from megatron_endprompt.errors import UserError, user_errors
from megatron_endprompt.window import EXPORT_FLAGS, EndPromptWindow

__all__ = ["MegatronToHFOptions", "convert_megatron_to_hf", "resolve_window"]


@dataclass(frozen=True, kw_only=True)
class MegatronToHFOptions:
    """Options of ``convert_checkpoint.py megatron-to-hf``."""

    checkpoint: str
    """The Megatron checkpoint: its save directory or one ``iter_*`` directory; only read."""
    output: str
    """The HF directory to write (whole or not at all)."""
    tokenizer: str | None = None
    """Tokenizer to export beside the weights (default: the one the run recorded, if any)."""
    target_length: int | None = None
    """``L`` of the exported RoPE scaling (default: the run's)."""
    pi_factor: float | None = None
    """``s`` of the exported RoPE scaling (default: the run's)."""
    overwrite: bool = False
    """Replace an existing ``output`` (otherwise it is refused)."""
    progress: bool = True
    """Show a progress bar over the tensors."""
    max_shard_bytes: int = 2 << 30
    """Largest safetensors shard written."""
    lora_format: str = "merged"
    """LoRA adapters: ``merged`` into the weights, or ``peft`` (an adapter directory)."""


def resolve_window(args: Any, original_window: int, target_length: int | None,
                   pi_factor: float | None) -> tuple[int, float, int]:
    """``(L, s, L0)`` for the export: flags first, then the training run's EndPrompt args; no
    EndPrompt at all keeps the original window with ``s = 1``. Validation is
    :class:`~megatron_endprompt.window.EndPromptWindow`'s, plus the launcher's rule
    ``s x L0 >= L`` (positions ``< L`` divided by ``s`` stay within ``L0``) for linear PI and
    any ``(L, s)`` but the run's own: that one is how the model was trained, whatever it is (a
    YaRN export is held to ``s = L / L0`` by its own check). Raises :class:`UserError`."""
    L0 = int(getattr(args, "endprompt_original_length", None) or original_window)
    # ``is None``, not ``or``: an explicit 0 is refused below, never replaced by the default
    L = target_length if target_length is not None else getattr(args, "endprompt_target_length",
                                                                None)
    s = pi_factor if pi_factor is not None else getattr(args, "endprompt_pi_factor", None)
    if L is None:
        if s is not None and s != 1.0:
            raise UserError(f"--pi-factor {s:g} needs a target length: pass --target-length L")
        return L0, 1.0, L0
    with user_errors():
        window = EndPromptWindow(target_length=int(L), original_length=L0, pi_factor=s,
                                 flags=EXPORT_FLAGS)
    L, s = window.target_length, window.pi_factor
    run = (getattr(args, "endprompt_target_length", None), getattr(args, "endprompt_pi_factor",
                                                                       None))
    linear = (getattr(args, "endprompt_rope_scaling", None) or "linear") == "linear"
    # the run's own (L, s) is what the model was trained as; YaRN is held to s = L/L0 later
    if linear and not window.positions_fit and (L, s) != run:
        need = EndPromptWindow(target_length=L, original_length=L0, flags=EXPORT_FLAGS)
        s_text = f"--pi-factor {s:g}" if pi_factor is not None else f"the run's s={s:g}"
        L_text = f"--target-length {L}" if target_length is not None else f"the run's L={L}"
        raise UserError(f"{s_text} with {L_text}: positions reach L/s = {L / s:g}, beyond the "
                        f"original window L0={L0} ({EXPORT_FLAGS['original_length']}), a RoPE "
                        f"the launcher refuses; pass --pi-factor {need.pi_factor:g} "
                        "(ceil(L/L0)) or leave --pi-factor out")
    return L, s, L0


def _megatron_tokenizer(args: Any) -> Any:
    """The tokenizer Megatron builds from the saved args, or ``None`` when not buildable."""
    tokenizer_type = getattr(args, "tokenizer_type", None)
    model = getattr(args, "tokenizer_model", None)
    if tokenizer_type is None:
        return None
    if tokenizer_type != "NullTokenizer" and not (model and os.path.exists(model)):
        return None
    try:
        return build_megatron_tokenizer(tokenizer_type, model, getattr(args, "vocab_size", None))
    except Exception:  # noqa: BLE001 - an unbuildable tokenizer just gives no answer
        return None


def _training_eod(args: Any, tokenizer: Any) -> int | None:
    """End-of-document id the run trained with, for a real (not Null) tokenizer."""
    if tokenizer is None or getattr(args, "tokenizer_type", None) == "NullTokenizer":
        return None
    try:
        return int(tokenizer.eod)
    except Exception:  # noqa: BLE001 - a tokenizer without an end id gives no answer
        return None


def _tokenizer_flag(opts: MegatronToHFOptions, source: str) -> str:
    """How an error names the exported tokenizer: the flag, or the run's recorded model."""
    return f"--tokenizer {source}" if opts.tokenizer else f"the run's --tokenizer-model {source}"


def _reads(work: list[tuple[WeightMapping, int | None]], dims: Dims,
           hybrid: HybridLayers | None
           ) -> Iterator[tuple[str, bool, list[tuple[WeightMapping, int | None]]]]:
    """``(checkpoint key, stacked, [(mapping, layer)])`` per tensor to read: a GPT
    checkpoint's layer-stacked tensor once for all its layers (``stacked``: index it by layer),
    a hybrid checkpoint's tensors one per layer (:meth:`HybridLayers.checkpoint_key`)."""
    if hybrid is not None:
        for mapping, layer in work:
            yield hybrid.checkpoint_key(mapping.checkpoint_key(), layer), False, [(mapping, layer)]
        return
    for mapping in dict.fromkeys(m for m, _ in work):
        rows = range(dims.num_layers) if mapping.per_layer else [None]
        yield mapping.checkpoint_key(), mapping.per_layer, [(mapping, layer) for layer in rows]


def convert_megatron_to_hf(opts: MegatronToHFOptions) -> dict[str, Any]:
    """Run the export, ``--output`` held apart from ``--checkpoint`` and ``--tokenizer`` and
    locked for the run (:func:`~.output.guarded_output`); returns a summary."""
    inputs = [("--checkpoint", opts.checkpoint)]
    if opts.tokenizer:
        inputs.append(("--tokenizer", opts.tokenizer))
    with guarded_output(opts.output, inputs=inputs, overwrite=opts.overwrite):
        return _export(opts)


def _export(opts: MegatronToHFOptions) -> dict[str, Any]:
    """The export itself, under :func:`convert_megatron_to_hf`'s guard."""
    from tqdm import tqdm

    check_output(opts.output, overwrite=opts.overwrite)
    ckpt = find_checkpoint(opts.checkpoint)
    with single_process_group():
        common = load_common_state(ckpt)
        args = common.get("args")
        if args is None:
            raise UserError(f"{ckpt}: no saved args in the checkpoint; the architecture is "
                            "unknown")
        hybrid = HybridLayers.from_args(args)  # None for GPTModel; other patterns refused
        spec = spec_from_megatron_args(args)
        if hybrid is not None:  # saved num_layers counts the hybrid layers (2 per GPT layer)
            spec = dataclasses.replace(spec, num_layers=hybrid.num_layers)
        L, s, L0 = resolve_window(args, spec.max_position_embeddings, opts.target_length,
                                  opts.pi_factor)
        meta = tensor_metadata(ckpt)
        lora = LoraExport.from_checkpoint(  # None: no adapters
            ckpt, meta, rank=getattr(args, "endprompt_lora_rank", None),
            alpha=getattr(args, "endprompt_lora_alpha", None), lora_format=opts.lora_format)
        embed = meta.get("embedding.word_embeddings.weight")
        if embed is None:
            raise UserError(f"{ckpt}: no embedding.word_embeddings.weight; not a GPT checkpoint")
        padded = embed[0][0]
        source_vocab = (getattr(args, "endprompt_hf_config", None) or {}).get("vocab_size")
        run_tokenizer = _megatron_tokenizer(args)
        vocab = source_vocab or (int(run_tokenizer.vocab_size) if run_tokenizer else None)
        vocab_from = "recorded HF config" if source_vocab else "Megatron tokenizer"
        with atomic_output_dir(opts.output, overwrite=opts.overwrite) as tmp:
            tokenizer_len, token_ids = None, None
            tokenizer_src = opts.tokenizer
            if tokenizer_src is None and getattr(args, "tokenizer_type", None) in (
                    "HuggingFaceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer",
                    "SentencePieceTokenizer"):
                model = getattr(args, "tokenizer_model", None)
                tokenizer_src = model if model and os.path.exists(model) else None
                if tokenizer_src:
                    check_apart(opts.output, [("(the run's --tokenizer-model)", tokenizer_src)])
            if tokenizer_src is not None:
                tok = export_tokenizer(tokenizer_src, tmp, model_max_length=L)
                tokenizer_len = len(tok)
                token_ids = tokenizer_ids(tok)
            if vocab is None:
                vocab, vocab_from = (tokenizer_len, "--tokenizer") if tokenizer_len \
                    else (padded, "padded size (no tokenizer known)")
            if vocab > padded:
                raise UserError(f"vocabulary {vocab} ({vocab_from}) is larger than the "
                                f"checkpoint's embedding ({padded} rows)")
            if tokenizer_len is not None and tokenizer_len > vocab:
                raise UserError(f"{_tokenizer_flag(opts, tokenizer_src)}: {tokenizer_len} ids, "
                                f"more than the model's vocabulary {vocab} ({vocab_from}): ids "
                                f"{vocab}..{tokenizer_len - 1} would index past the exported "
                                f"embedding ({vocab} rows); export with the tokenizer the model "
                                "was trained with")
            dims = Dims(**{**spec.shape_fields(), "vocab_size": vocab},
                        padded_vocab_size=padded)
            work = list(expand(mappings_for(dims), dims))
            reads = list(_reads(work, dims, hybrid))
            for key, stacked, parts in reads:  # validate everything before reading tensors
                want = parts[0][0].megatron_shape(dims)
                if stacked:
                    want = (dims.num_layers, *want)
                if key not in meta:
                    raise UserError(f"{ckpt}: tensor {key} is missing")
                if meta[key][0] != want:
                    raise UserError(f"{ckpt}: {key} has shape {list(meta[key][0])}, the saved "
                                    f"args imply {list(want)}")
            dtype = meta["embedding.word_embeddings.weight"][1]
            writer = ShardedSafetensorsWriter(tmp, max_shard_bytes=opts.max_shard_bytes)
            bar = tqdm(total=len(work), desc="megatron-to-hf", unit="tensor",
                       disable=not opts.progress)
            for key, stacked, parts in reads:  # one (stacked) tensor at a time
                if lora is not None and lora.peft:  # the adapters only, no base tensor
                    lora.collect_peft(key, stacked, parts, dims)
                    bar.update(len(parts))
                    continue
                tensor = read_tensor(ckpt, key, meta[key])
                check_finite(tensor, f"{ckpt}: tensor {key}")
                if lora is not None:
                    tensor = lora.merged(key, tensor)  # W + (alpha/r) B A
                for mapping, layer in parts:
                    part = tensor[layer] if stacked else tensor
                    writer.add_all(zip(mapping.hf_names(layer=layer), mapping.to_hf(part, dims)))
                    bar.update()
                del tensor
            bar.close()
            shards = (lora.write_peft(tmp, dropout=getattr(args, "endprompt_lora_dropout", None))
                      if lora is not None and lora.peft else writer.close())
            config = hf_config_dict(spec, target_length=L, pi_factor=s, vocab_size=vocab)
            config["dtype"] = config["torch_dtype"] = str(dtype).removeprefix("torch.")
            special, notes = resolve_special_ids(
                recorded={k: spec.extra.get(k) for k in KEYS},
                tokenizer=token_ids, training_eod=_training_eod(args, run_tokenizer))
            for key in KEYS:  # never LlamaConfig's default 1/2 (see special_tokens)
                config.pop(key, None)
            config.update(special)
            with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
                json.dump(config, f, indent=2)
            generation = {k: config[k] for k in ("bos_token_id", "eos_token_id",
                                                 "pad_token_id") if config.get(k) is not None}
            with open(os.path.join(tmp, "generation_config.json"), "w", encoding="utf-8") as f:
                json.dump(generation, f, indent=2)
    return {"checkpoint": ckpt, "output": opts.output, "iteration": common.get("iteration"),
            "target_length": L, "pi_factor": s, "original_length": L0,
            "rope_theta": spec.rope_theta, "vocab_size": vocab, "vocab_from": vocab_from,
            "padded_vocab_size": padded, "shards": shards, "tensors": len(work),
            "hybrid_layer_pattern": hybrid.pattern if hybrid else None,
            "tokenizer": tokenizer_src, "special_token_ids": special,
            "lora": None if lora is None else {"format": lora.format, "rank": lora.rank,
                                               "alpha": lora.alpha},
            "special_token_notes": notes}
