"""Per-document sliding-window perplexity (PoSE/LongLoRA) and the legacy EOS-joined stream
(``windows``)."""
