"""The data stage: JSONL text -> Megatron ``.bin/.idx`` + EndPrompt sidecar -> training samples.

Rooms, bottom to top (each imports only the rooms below it):

- ``tokenize/``: the input text and its ids — JSONL reading (``read_input``), Megatron's
  tokenizers and the ``tokenizer.json``-only one, the tokenizer identity a sidecar records,
  the fast paths (HF batches, tiktoken, SentencePiece batches), the chooser above them
  (``encoder_choice``) and the verdict that they equal Megatron's ids.
- ``sidecar/``: the on-disk formats and their checks — Megatron's ``.bin/.idx``
  (``indexed_io``), the ``PREFIX.endprompt`` sidecar (``sidecar_format`` header and records,
  ``sidecar`` reader/writer, ``sidecar_checks``), the samples' spans into the ``.bin``
  (``spans``, ``span_scan``), the terminal definition it records (``terminal_spec``),
  ``.bin`` block CRCs and verify-once trust.
- ``prepare/``: writing a prefix — ``preprocess`` and ``build_sidecar`` (cutting samples with
  ``samples``, prompt terminals from ``prompts``), ``merge`` of shards, the all-or-nothing
  commit (``atomic_output``, ``prefix_guard``), Megatron's naming, progress lines, and the
  generated corpora of the demo and tests (``synthetic``, ``motif_corpus``).

Beside the rooms, the reading side used by training and ``inspect``: ``dataset`` (the
``GPTDataset`` subclass), ``sample_index``, ``split_counts``, ``inspect_sample``, ``coverage``.
"""
