"""Checkpoint conversion both ways: Hugging Face Llama / Mistral / Qwen2 / Qwen3 <-> Megatron-Core
``torch_dist``.

* :mod:`.transforms` — one class per tensor transform (QKV, QKV bias, gate/up, vocabulary pad,
  identity, norm, per-head norm), each with its shapes and both directions;
* :mod:`.mapping` — the weight mapping, declared as data (one table for both directions);
* :mod:`.families` — the HF model families and the Megatron flags of each (QKV bias, QK norm);
* :mod:`.hf_config` — ``config.json`` <-> Megatron arguments (RoPE base, EndPrompt ``L``/``s``,
  linear or YaRN scaling);
* :mod:`.hf_io` — streaming safetensors reader, sharded writer with index;
* :mod:`.hybrid_layers` — a Llama-style ``HybridModel`` checkpoint's keys <-> the equal GPT
  model's (both directions);
* :mod:`.megatron_ckpt` — writing/finding/reading ``torch_dist`` checkpoints on one CPU process;
* :mod:`.tokenizer` — the exported tokenizer in HF form (SentencePiece models converted, a
  tokenizer_config.json transformers 4.x and 5.x both load);
* :mod:`.output` — all-or-nothing output directories;
* :mod:`.hf_to_megatron`, :mod:`.megatron_to_hf` — the two conversions.

Command line: ``tools/convert_checkpoint.py`` (:mod:`megatron_endprompt.cli.convert`).
"""

from megatron_endprompt.conversion.hf_to_megatron import HFToMegatronOptions, convert_hf_to_megatron
from megatron_endprompt.conversion.megatron_to_hf import MegatronToHFOptions, convert_megatron_to_hf

__all__ = [
    "HFToMegatronOptions",
    "MegatronToHFOptions",
    "convert_hf_to_megatron",
    "convert_megatron_to_hf",
]
