"""Activation memory: the tensors autograd keeps from forward to backward, per layer and per GPU.

Megatron's ``compute_activation_memory`` (Korthikanti et al. 2022, Table 2) charges
``s b h (18 + 4 f / h)`` bytes per layer: it assumes ``q = h`` (no GQA), a non-gated MLP
shape, selective recompute or flash attention (no ``S x S`` term) and sequence parallelism.
Llama models break the first two, so the planner counts the saved tensors of Megatron-Core's
own layers instead -- an inventory read off what ``torch.autograd.graph.saved_tensors_hooks``
sees in a step (``benchmarks/step_time/bench.py``), ``q = n d``, ``kv = g d``, ``f`` = SwiGLU
width, per token of one micro-batch row (values in the activation dtype unless noted):

``attention="flash"`` (the GPU plan: Transformer Engine spec, flash/fused attention)
    * input norm fused into QKV (TE ``LayerNormLinear``): the input ``h``, the normalised
      input ``h`` (kept for the weight gradient), ``1/rms`` (fp32);
    * attention: RoPE'd ``q`` and ``k`` (``q + kv``), ``v`` -- a view that keeps the fused QKV
      buffer alive (``q + 2 kv``), the attention output ``q`` (saved by flash attention and by
      the output projection), the softmax log-sum-exp (``n`` fp32); no ``S x S`` tensor;
    * pre-MLP norm fused into FC1: ``h``, ``h``, fp32 ``1/rms``;
    * SwiGLU MLP: FC1 output ``2f`` and FC2 input ``f``; without Megatron's SwiGLU fusion
      (``bias_swiglu_fusion`` off) also ``silu(gate)`` and the up-projection half, ``5f``.
``attention="local"`` (the CPU calibration mode: Megatron's local spec, unfused kernels)
    * torch RMSNorm (decomposed): input, ``x/rms``, output (``3h``) and ``1/rms`` (per norm);
    * attention: ``q``, ``k`` and ``v`` as ``DotProductAttention`` saves them (GQA expands
      ``k`` and ``v`` to ``n`` heads: ``q`` each; without GQA ``v`` is a view of the fused QKV
      buffer, ``q + 2 kv``), the context ``q``, the softmax probabilities ``n S`` (the
      ``S x S`` scores, per token: this is the term flash attention removes), and the RoPE
      ``cos``/``sin`` of ``q`` and ``k`` (``4 S d`` per layer and micro-batch, fp32);
    * MLP: ``5f`` (unfused SwiGLU).

Outside the layers: token ids (int64), the RoPE table (flash: one fp32 ``[S, 1, 1, d]`` for all
layers), the final norm, the logits that Megatron's
vocab-parallel cross entropy keeps in fp32 (``V`` x 4 bytes: it up-casts), its target mask and
targets (1 + 8 bytes); the local spec also keeps its ``S x S`` boolean causal mask.

Recompute (Megatron ``--recompute-granularity``): ``selective`` recomputes core attention (the
``S x S`` probabilities / the log-sum-exp go; its inputs stay); ``full`` (uniform, one layer per
checkpoint) keeps only each layer's input ``h`` plus, while one layer is recomputed in
backward, that layer's full set.

Parallelism: TP shards every per-layer term (with sequence parallelism, which Megatron uses
with TP > 1) and the logits; CP shards the tokens; the first pipeline stage holds
``min(PP, microbatches)`` micro-batches of its ``layers / PP`` layers in flight (1F1B), the
last stage one micro-batch plus the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_endprompt.planning.presets import ModelSpec

__all__ = ["ActivationModel", "StageActivations"]

ATTENTION_KINDS = ("flash", "local")
RECOMPUTE_KINDS = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class StageActivations:
    """Activation bytes on the most loaded pipeline stage of one GPU."""

    #: one layer, one micro-batch (what ``recompute`` keeps)
    per_layer: float
    #: all of the stage's layers times the micro-batches in flight
    layers: float
    #: embedding input / final norm / fp32 logits / loss masks on this stage
    outside_layers: float
    #: a freshly recomputed layer during backward (``recompute="full"`` only)
    recompute_buffer: float
    #: which stage ("first" or "last") is the most loaded
    stage: str

    @property
    def total(self) -> float:
        return self.layers + self.outside_layers + self.recompute_buffer


@dataclass(frozen=True, kw_only=True)
class ActivationModel:
    """Saved-tensor inventory of a Megatron-Core Llama layer (see the module docstring)."""

    model: ModelSpec
    #: ``flash`` (TE spec, GPU plan) or ``local`` (Megatron local spec, CPU calibration)
    attention: str = "flash"
    #: ``none`` | ``selective`` | ``full``
    recompute: str = "none"
    #: bytes of an activation value (2 for bf16, 4 for fp32)
    bytes_per_value: int = 2
    #: Megatron's fused SwiGLU (default on with ``--swiglu``); flash mode only
    swiglu_fusion: bool = True

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention={self.attention!r}; one of {ATTENTION_KINDS}")
        if self.recompute not in RECOMPUTE_KINDS:
            raise ValueError(f"recompute={self.recompute!r}; one of {RECOMPUTE_KINDS}")

    # -- one layer -------------------------------------------------------------------------
    def layer_bytes(self, seq: int, micro_batch: int, *, recompute: str | None = None) -> float:
        """Bytes one layer saves for ``micro_batch`` rows of ``seq`` tokens on one GPU without
        model parallelism (divide by TP x CP)."""
        m, a = self.model, self.bytes_per_value
        recompute = self.recompute if recompute is None else recompute
        h, q, kv, f, n = m.hidden_size, m.query_width, m.kv_width, m.ffn_hidden_size, \
            m.num_attention_heads
        tokens = seq * micro_batch
        if recompute == "full":
            return tokens * h * a
        gqa = m.num_query_groups != m.num_attention_heads
        if self.attention == "flash":
            norms = 2 * (2 * h * a + 4)
            attn = (q + kv + (q + 2 * kv) + q) * a + (0 if recompute == "selective" else 4 * n)
            mlp = (3 * f if self.swiglu_fusion else 5 * f) * a
            return tokens * (norms + attn + mlp)
        norms = 2 * (3 * h * a + 4)
        if recompute == "selective":  # checkpoint inputs: q, k, the v view of QKV; context
            attn = (q + kv + (q + 2 * kv) + q) * a
        else:
            k_saved, v_saved = (q, q) if gqa else (kv, q + 2 * kv)
            attn = (q + k_saved + v_saved + q) * a + n * seq * a
        rope = 4 * seq * m.head_dim * 4 / tokens  # cos/sin of q and k, fp32, per micro-batch
        return tokens * (norms + attn + 5 * f * a + rope)

    # -- outside the layers ------------------------------------------------------------------
    def embedding_bytes(self, seq: int, micro_batch: int) -> float:
        """Token ids (int64); with the local spec the ``S x S`` boolean causal mask, with flash
        attention the fp32 RoPE table ``[S, 1, 1, d]`` TE's fused RoPE keeps (one for all
        layers)."""
        if self.attention == "local":
            return 8 * seq * micro_batch + seq * seq
        return 8 * seq * micro_batch + 4 * seq * self.model.head_dim

    def output_bytes(self, seq: int, micro_batch: int, vocab: int) -> float:
        """Final norm, fp32 logits kept by the cross entropy, its target mask and targets."""
        h, a = self.model.hidden_size, self.bytes_per_value
        norm = 3 * h * a + 4 if self.attention == "local" else 2 * h * a + 4
        return seq * micro_batch * (norm + 4 * vocab + 1 + 8)

    # -- a GPU ------------------------------------------------------------------------------
    def stage(self, *, seq: int, micro_batch: int, tp: int = 1, pp: int = 1, cp: int = 1,
              num_microbatches: int = 1, vocab: int | None = None) -> StageActivations:
        """Activation bytes on one GPU of the most loaded pipeline stage (first or last)."""
        m = self.model
        if self.attention == "local" and (cp > 1 or tp > 1):
            raise ValueError("attention='local' models Megatron's local spec on one rank only")
        if m.num_layers % pp:
            raise ValueError(f"{m.num_layers} layers do not split into {pp} pipeline stages")
        vocab = vocab or m.vocab_size
        shard = tp * cp
        stage_layers = m.num_layers // pp
        per_layer = self.layer_bytes(seq, micro_batch) / shard
        full_layer = self.layer_bytes(seq, micro_batch, recompute="none") / shard
        buffer = full_layer if self.recompute == "full" else 0.0
        in_flight = min(pp, max(1, num_microbatches))
        emb = self.embedding_bytes(seq // cp, micro_batch)
        out = self.output_bytes(seq // cp, micro_batch, vocab) / tp
        first_layers = stage_layers * per_layer * in_flight
        first_out = emb * in_flight + (out if pp == 1 else 0.0)
        last_layers, last_out = stage_layers * per_layer, out
        if pp == 1 or first_layers + first_out >= last_layers + last_out:
            return StageActivations(per_layer=per_layer, layers=first_layers,
                                    outside_layers=first_out, recompute_buffer=buffer,
                                    stage="first")
        return StageActivations(per_layer=per_layer, layers=last_layers, outside_layers=last_out,
                                recompute_buffer=buffer, stage="last")

    def logits_transient_bytes(self, *, seq: int, micro_batch: int, tp: int = 1, cp: int = 1,
                               vocab: int | None = None) -> float:
        """The output layer's logits in the activation dtype, alive beside the fp32 copy while
        the loss is computed (forward) and again as their gradient (backward)."""
        vocab = vocab or self.model.vocab_size
        return seq * micro_batch * vocab * self.bytes_per_value / (tp * cp)
