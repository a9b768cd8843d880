"""megatron-endprompt: EndPrompt long-context extension (terminal anchoring) for Megatron-Core.

The package reads as the data's path: ``layout`` (positions and weights of one sample) ->
``data`` (preprocessing, sidecar, Megatron dataset) -> ``model`` (RoPE from position ids) ->
``runtime`` (CPU layer for Megatron) -> training, conversion, evaluation.
"""

__version__ = "0.1.0"
