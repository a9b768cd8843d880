"""megatron-endprompt: EndPrompt long-context extension (terminal anchoring) for Megatron-Core.

The package reads as the data's path: ``window`` (``L``, ``L0``, ``s``, loss weights: resolved
and validated there only) -> ``layout`` (positions and weights of one sample) -> ``data``
(preprocessing, sidecar, Megatron dataset) -> ``runtime`` (the only code that patches torch or
Megatron: ``runtime.install()``) -> ``model`` (RoPE from position ids) -> training, conversion,
evaluation. ``launch`` holds process-launch helpers (free port, single-process group).
"""

__version__ = "0.1.0"
