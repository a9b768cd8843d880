"""Data path: preprocessing throughput against Megatron-LM, dataset samples/s, the
tokenizer ceiling, the `.bin` checksum cost (``README.md`` here)."""
