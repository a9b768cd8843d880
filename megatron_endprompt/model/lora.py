"""LoRA adapters on Megatron-Core's tensor-parallel linears (local and Transformer Engine specs).

:class:`LoraLinear` wraps one built linear ``W`` (``linear_qkv``, ``linear_proj``,
``linear_fc1`` or ``linear_fc2``) and adds ``(alpha / r) B A x``:

* column-parallel (``linear_qkv``, ``linear_fc1``; ``W`` local ``[out/tp, in]``): ``A [r, in]``
  replicated over TP, ``B [out/tp, r]`` split like ``W``'s rows. ``A x`` is computed on every TP
  rank; its gradient is summed over TP (``copy_to_tensor_model_parallel_region``; under sequence
  parallelism ``A x`` of the local sequence chunk is all-gathered instead).
* row-parallel (``linear_proj``, ``linear_fc2``; ``W`` local ``[out, in/tp]``): ``A [r, in/tp]``
  split like ``W``'s columns, ``B [out, r]`` replicated. The partial ``A x`` are all-reduced
  (reduce-scattered over the sequence under sequence parallelism) before ``B``.

``B`` starts at zero, so the wrapped model computes exactly what the base computes until the
first update. ``A`` is one global uniform draw in ``[-1/sqrt(in), 1/sqrt(in)]`` (PEFT's
Kaiming-uniform bound) seeded by the run seed and the layer's global number, and a TP rank keeps
its slice: every TP/PP layout starts from the same adapters.

Checkpoint keys: the base's ``sharded_state_dict`` keys stay stock (a base checkpoint loads
into the wrapped model unchanged); the adapters add ``<linear>.lora_a`` / ``<linear>.lora_b``,
layer-stacked like the base weight (``[layers, r, in]``, ``[layers, out, r]`` globally), sharded
over TP as above, so a checkpoint moves between TP/PP layouts. :func:`apply_lora` freezes every
other parameter (``requires_grad=False``): Megatron's DDP and its (distributed) optimizer then
hold gradients and Adam state of the adapters only.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.tensor_parallel.layers import (
    set_defaults_if_not_set_tensor_model_parallel_attributes,
    set_tensor_model_parallel_attributes,
)
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

from megatron_endprompt.compat import swiglu_sharded_factory
from megatron_endprompt.errors import UserError
from megatron_endprompt.model.lora_settings import LORA_TARGETS, LoraSettings

__all__ = ["ADAPTER_SUFFIXES", "LoraCheckpointing", "LoraLinear", "apply_lora", "is_adapter_key",
           "lora_linears"]

#: Parameter (and checkpoint key) suffixes of the adapters.
ADAPTER_SUFFIXES = (".lora_a", ".lora_b")


def is_adapter_key(key: str) -> bool:
    """Whether a parameter name or checkpoint key is an adapter's."""
    return key.endswith(ADAPTER_SUFFIXES)


@dataclass(kw_only=True)
class LoraCheckpointing:
    """What the model's ``sharded_state_dict`` offers a checkpoint, shared by its adapters.
    While loading it offers what the loaded checkpoint has; from the first forward on, what a
    save should hold (:meth:`training_started`)."""

    adapters: bool = True
    """Offer the adapter tensors. ``False`` while loading a checkpoint that has none (the base
    model a LoRA run starts from: its adapters keep their initial values)."""

    base: bool = True
    """Offer the frozen base tensors. ``False`` while loading an adapter-only checkpoint (the
    base comes from the base checkpoint) and, under ``adapters_only``, in every save."""

    adapters_only: bool = False
    """Saves hold the adapters (and their optimizer state) only."""

    def training_started(self) -> None:
        """Loading is over: from now on offer what a save holds."""
        self.adapters, self.base = True, not self.adapters_only


def _linear_kinds() -> dict[type, str]:
    """Megatron-Core linear class -> ``column`` / ``row``: the local spec's always, Transformer
    Engine's where TE imports (one table, looked up by exact type)."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    kinds: dict[type, str] = {ColumnParallelLinear: "column", RowParallelLinear: "row"}
    try:
        from megatron.core.extensions.transformer_engine import (
            TEColumnParallelLinear,
            TELayerNormColumnParallelLinear,
            TERowParallelLinear,
        )
    except (ImportError, AttributeError):  # no Transformer Engine: the local spec only
        return kinds
    kinds.update({TEColumnParallelLinear: "column", TELayerNormColumnParallelLinear: "column",
                  TERowParallelLinear: "row"})
    return kinds


def _group_rank_size(group: Any) -> tuple[int, int]:
    if group is None or not torch.distributed.is_initialized():
        return 0, 1
    return torch.distributed.get_rank(group), torch.distributed.get_world_size(group)


class LoraLinear(torch.nn.Module):
    """A Megatron-Core linear plus a LoRA adapter; same call and return as the base
    (``(output, bias)``). Attributes it does not have are the base's (``weight``,
    ``backward_dw`` ...), so Megatron code reaching into the linear keeps working."""

    def __init__(self, base: torch.nn.Module, *, kind: str, settings: LoraSettings,
                 init_key: str, checkpointing: LoraCheckpointing, swiglu: bool = False) -> None:
        super().__init__()
        self.base = base
        self.kind = kind
        self.swiglu = swiglu
        self.scaling = settings.scaling
        self.checkpointing = checkpointing
        self.dropout = torch.nn.Dropout(settings.dropout) if settings.dropout else None
        self.tp_group = getattr(base, "tp_group", None) or \
            parallel_state.get_tensor_model_parallel_group(check_initialized=False)
        self.sequence_parallel = bool(getattr(base, "sequence_parallel", False))
        # TE's LayerNormLinear fuses the input norm: ask it for the normalised input, which is
        # what W and the adapter both see. Its rank-local copy ([S/tp] under sequence
        # parallelism), not the gathered one: TE adds the gradient of the local copy to its
        # input gradient *after* its own TP reduction, so the adapter's path must be complete
        # there, as on the local spec; the gathered copy's gradient is summed over TP before
        # the reduce-scatter in some TE versions and dropped in others.
        self.layernorm_output = hasattr(base, "return_layernorm_output")
        if self.layernorm_output:
            base.return_layernorm_output = True
            base.return_layernorm_output_gathered = False
        tp_rank, tp_size = _group_rank_size(self.tp_group)
        weight = base.weight
        out_local, in_local = weight.shape
        in_full = in_local * (tp_size if kind == "row" else 1)
        r = settings.rank
        generator = torch.Generator().manual_seed(
            zlib.crc32(f"{settings.seed}:{init_key}".encode()))
        bound = 1.0 / math.sqrt(in_full)
        a = torch.empty(r, in_full).uniform_(-bound, bound, generator=generator)
        if kind == "row":
            a = a[:, tp_rank * in_local:(tp_rank + 1) * in_local]
        self.lora_a = torch.nn.Parameter(a.to(device=weight.device, dtype=weight.dtype))
        self.lora_b = torch.nn.Parameter(torch.zeros(out_local, r, device=weight.device,
                                                     dtype=weight.dtype))
        split, replicated = ((self.lora_b, self.lora_a) if kind == "column"
                             else (self.lora_a, self.lora_b))
        set_tensor_model_parallel_attributes(split, True, 0 if kind == "column" else 1, 1)
        set_defaults_if_not_set_tensor_model_parallel_attributes(replicated)
        # Under sequence parallelism each TP rank's gradient of the replicated factor covers
        # its sequence chunk only: Megatron all-reduces parameters marked like the norms.
        replicated.sequence_parallel = self.sequence_parallel
        # The base's state-dict keys stay stock (``weight``, not ``base.weight``): Megatron's
        # MLP finds its SwiGLU ``linear_fc1.weight`` by name, and a base checkpoint's keys load.
        self.register_state_dict_post_hook(_unnest_base)
        self.register_load_state_dict_pre_hook(_nest_base)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("base"), name)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any):
        """``x [S(/tp), B, in(/tp)]`` -> ``(W x + (alpha/r) B A x, bias)``, shapes as the
        base's."""
        self.checkpointing.training_started()  # loading is over
        result = self.base(x, *args, **kwargs)
        lora_x = x
        if self.layernorm_output:  # TE: (out, ln_out) inside, or (out, bias, ln_out)
            if getattr(self.base, "te_return_bias", False):
                out, bias, lora_x = result
            else:
                (out, lora_x), bias = result
        else:
            out, bias = result
        return out + self._delta(lora_x, self.sequence_parallel).to(out.dtype), bias

    def _delta(self, x: torch.Tensor, seq_split: bool) -> torch.Tensor:
        """``(alpha/r) B A dropout(x)``, laid out like the base's output."""
        if self.dropout is not None and self.training:
            if self.kind == "row" or seq_split:  # each TP rank's own columns or sequence
                with tensor_parallel.get_cuda_rng_tracker().fork():  # chunk: a mask of its own
                    x = self.dropout(x)
            else:  # replicated input: the same mask on every TP rank (default generator)
                x = self.dropout(x)
        h = F.linear(x, self.lora_a)  # [S(/tp), B, r]; row: partial sums over TP
        g = self.tp_group
        if self.kind == "column":
            h = (gather_from_sequence_parallel_region(h, group=g) if seq_split
                 else copy_to_tensor_model_parallel_region(h, group=g))
        else:
            h = (reduce_scatter_to_sequence_parallel_region(h, group=g) if seq_split
                 else reduce_from_tensor_model_parallel_region(h, group=g))
        return F.linear(h, self.lora_b) * self.scaling

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (),
                           metadata: dict | None = None) -> dict:
        """The base's sharded tensors (stock keys), plus ``lora_a`` / ``lora_b`` (see the module
        docstring) as :class:`LoraCheckpointing` says. A SwiGLU ``linear_fc1``'s ``B`` is
        sharded like its weight: each TP rank holds a slice of the gate rows and one of the up
        rows, the global tensor is ``cat(gate, up)``."""
        out = {}
        if self.checkpointing.base:
            out.update(self.base.sharded_state_dict(prefix, sharded_offsets, metadata))
        if self.checkpointing.adapters:
            axis = {"lora_b": 0} if self.kind == "column" else {"lora_a": 1}
            dp_group = (metadata or {}).get("dp_cp_group")
            adapters = make_sharded_tensors_for_checkpoint(
                {"lora_a": self.lora_a, "lora_b": self.lora_b}, prefix, axis, sharded_offsets,
                tp_group=self.tp_group, dp_cp_group=dp_group)
            if self.swiglu:
                key = f"{prefix}lora_b"
                adapters[key] = swiglu_sharded_factory(
                    adapters[key], sharded_offsets,
                    (metadata or {}).get("singleton_local_shards", False),
                    tp_group=self.tp_group, dp_group=dp_group)
            out.update(adapters)
        return out


def _unnest_base(module: LoraLinear, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    """``state_dict`` hook: ``<prefix>base.X`` -> ``<prefix>X`` (the stock keys)."""
    for key in [k for k in state_dict if k.startswith(f"{prefix}base.")]:
        state_dict[prefix + key[len(prefix) + len("base."):]] = state_dict.pop(key)


def _nest_base(module: LoraLinear, state_dict: dict, prefix: str, *_: Any) -> None:
    """``load_state_dict`` pre-hook: a stock ``<prefix>X`` (not an adapter's) ->
    ``<prefix>base.X``, where the base module finds it."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix):]
        if rest not in ("lora_a", "lora_b") and not rest.startswith("base."):
            state_dict[f"{prefix}base.{rest}"] = state_dict.pop(key)


def _layer_number(model: torch.nn.Module, name: str) -> int | None:
    """The global ``layer_number`` of the nearest enclosing transformer layer of ``name``."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        number = getattr(model.get_submodule(".".join(parts[:i])), "layer_number", None)
        if isinstance(number, int):
            return number
    return None


def apply_lora(model: torch.nn.Module, settings: LoraSettings, *,
               checkpointing: LoraCheckpointing | None = None) -> torch.nn.Module:
    """Wrap ``settings.targets`` in every layer of ``model`` (one pipeline chunk, built) with
    :class:`LoraLinear` and freeze everything else; returns ``model``.

    A target that is not a dense column/row-parallel linear (an MoE expert's grouped linear) is
    refused with a :class:`UserError` naming the module. ``checkpointing`` (shared by every
    adapter) defaults to offering base and adapters."""
    checkpointing = checkpointing or LoraCheckpointing()
    kinds = _linear_kinds()
    found = [(n, m) for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in settings.targets]
    for name, module in found:
        target = name.rsplit(".", 1)[-1]
        kind = kinds.get(type(module))
        if kind is None or kind != LORA_TARGETS[target]:
            raise UserError(f"--endprompt-lora-targets {target}: {name} is a "
                            f"{type(module).__name__}, not a {LORA_TARGETS[target]}-parallel "
                            "dense linear; drop it from the targets")
        parent, _, child = name.rpartition(".")
        stack = name.split(".", 1)[0]
        key = f"{stack}:{_layer_number(model, name)}:{target}"
        swiglu = target == "linear_fc1" and bool(getattr(module.config, "gated_linear_unit",
                                                         False))
        setattr(model.get_submodule(parent), child,
                LoraLinear(module, kind=kind, settings=settings, init_key=key,
                           checkpointing=checkpointing, swiglu=swiglu))
    for name, param in model.named_parameters():
        param.requires_grad = is_adapter_key(name)

    def forgive_unoffered(module: torch.nn.Module, incompatible: Any) -> None:
        """A strict load of a checkpoint without adapters (or, for adapter-only checkpoints,
        without the base) misses only what ``sharded_state_dict`` did not offer."""
        incompatible.missing_keys[:] = [
            k for k in incompatible.missing_keys
            if (checkpointing.adapters if is_adapter_key(k) else checkpointing.base)]

    model.register_load_state_dict_post_hook(forgive_unoffered)
    _offer_as_checkpointing_says(model, checkpointing)
    return model


def _offer_as_checkpointing_says(model: torch.nn.Module, checkpointing: LoraCheckpointing
                                 ) -> None:
    """Give this model instance a ``sharded_state_dict`` that drops every tensor but the
    adapters' while ``checkpointing.base`` is off (an adapter-only save or load). An attribute
    of our own model object, which Megatron's DDP and Float16Module wrappers call through;
    Megatron's classes are not touched."""
    full = model.sharded_state_dict

    def sharded_state_dict(*args: Any, **kwargs: Any) -> dict:
        state = full(*args, **kwargs)
        if checkpointing.base:
            return state
        return {k: v for k, v in state.items() if is_adapter_key(k)}

    model.sharded_state_dict = sharded_state_dict


def lora_linears(model: torch.nn.Module) -> dict[str, LoraLinear]:
    """``{module name: LoraLinear}`` of ``model``."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLinear)}

