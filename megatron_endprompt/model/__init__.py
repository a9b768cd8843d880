"""EndPrompt model pieces for Megatron-Core: RoPE from position ids (linear PI or YaRN), handed
per call to the GPTModel and the HybridModel that use it, and Megatron's zig-zag
context-parallel split."""

from megatron_endprompt.model.cp import zigzag_indices, zigzag_slice
from megatron_endprompt.model.gpt import EndPromptGPTModel
from megatron_endprompt.model.hybrid import EndPromptHybridModel
from megatron_endprompt.model.hybrid_spec import hybrid_stack_spec_from_layer_spec
from megatron_endprompt.model.rope import EndPromptRotaryEmbedding, resolve_pi_factor
from megatron_endprompt.model.yarn import YarnScaling

__all__ = [
    "EndPromptGPTModel",
    "EndPromptHybridModel",
    "EndPromptRotaryEmbedding",
    "YarnScaling",
    "hybrid_stack_spec_from_layer_spec",
    "resolve_pi_factor",
    "zigzag_indices",
    "zigzag_slice",
]
