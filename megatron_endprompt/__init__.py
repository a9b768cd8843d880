"""megatron-endprompt: EndPrompt long-context extension (terminal anchoring) for Megatron-Core.

The package reads as the data's path, by pipeline stage (each package's own ``__init__`` maps
its rooms):

- ``window`` (``L``, ``L0``, ``s``: resolved and validated there only), ``loss_weights`` (the
  terminal and context weights as one value), ``layout`` (positions and weights of one sample)
  and ``pose_law`` (PoSE's own sample law, the ``pose`` placement): what a sample is.
- ``data/``: preprocessing (``tokenize/``, ``sidecar/``, ``prepare/``) and the Megatron dataset
  that reads it.
- ``runtime/``: the only code that patches torch or Megatron (``runtime.install()``).
- ``model/``: RoPE from position ids (PI, YaRN), the GPT and hybrid models that use it.
- ``training/``: the ``pretrain()`` providers, start-up checks, the weighted loss, long-context
  evaluation during training.
- ``conversion/``: Hugging Face <-> Megatron checkpoints; ``model_record`` (the model's shape
  written beside a converted checkpoint, read by the launcher) and ``checkpoint_dir`` (which
  directory of a save holds the checkpoint) serve both conversion and training.
- ``evaluation/``: long-context and short-text evaluation of an exported model.
- ``planning/``: a cluster run on paper (memory, FLOPs, time, cost, the layout that fits).
- ``cli/``: the tools' argument parsing and printing only (``tools/*.py`` and the console
  scripts call these).

Base modules every stage may import: ``errors`` (one-line ``UserError``), ``disk`` (the atomic
write, the writability rule, the one file lock), ``compat`` (Megatron-Core version differences),
``shape`` (a dense decoder's shape, for conversion and planning), ``launch`` (free port,
single-process group). ``demo`` and ``demo_train`` are ``make demo``'s quick start.
"""

__version__ = "0.1.0"
