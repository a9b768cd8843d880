"""LongBench from local files: its prompts and generation budgets (``spec``), its metrics
(``metrics``) and its protocol run on a loaded model (``run``)."""
