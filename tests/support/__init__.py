"""What several test folders share, imported by full name (``from tests.support.torchrun
import run_torchrun``):

* ``layout``: P, L, b of the session's SentencePiece fixtures;
* ``megatron_flags``: the tiny Megatron GPT as flags;
* ``hf_configs``: tiny Hugging Face ``LlamaConfig``s (a random model, a RoPE-only one);
* ``torchrun``: start a worker script on N local ranks;
* ``sidecar_edit``: rewrite a sidecar header with a valid checksum (a buggy writer's output).
* ``megatron_preprocess``: the ``.bin/.idx`` Megatron-LM's ``preprocess_data.py`` writes.
* ``bad_input``: the data bad-input tests' corpora, snapshots and one-error-line check.

Fixtures stay in the ``conftest.py`` files; this package holds plain functions and constants."""
