"""``--backend lm-eval``: any lm-evaluation-harness task on the HF export (``backend``) and its
results read generically (``results``)."""
