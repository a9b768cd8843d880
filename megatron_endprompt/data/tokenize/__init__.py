"""Input text and its token ids: JSONL reading, tokenizers, identity, fast encoding paths."""
