"""EndPrompt model pieces for Megatron-Core: RoPE from position ids (linear PI or YaRN), the
GPTModel that uses it, and Megatron's zig-zag context-parallel split."""

from megatron_endprompt.model.cp import zigzag_indices, zigzag_slice
from megatron_endprompt.model.gpt import EndPromptGPTModel
from megatron_endprompt.model.rope import EndPromptRotaryEmbedding, resolve_pi_factor
from megatron_endprompt.model.yarn import YarnScaling

__all__ = [
    "EndPromptGPTModel",
    "EndPromptRotaryEmbedding",
    "YarnScaling",
    "resolve_pi_factor",
    "zigzag_indices",
    "zigzag_slice",
]
