"""Long-context evaluation of an HF causal LM (``tools/eval_longcontext.py``).

``ruler_spec`` carries RULER's task definitions; ``ruler_niah``/``ruler_aggregate`` render its
prompts and ``ruler`` fits them to a length (RULER's protocol); ``passkey`` is the
landmark-attention prompt; ``perplexity`` the per-document PoSE/LongLoRA protocol; ``runner``
loads and runs the model; ``scoring`` and ``report`` score and write; ``suite`` is the
pipeline (``EvalConfig`` + ``run_eval``); ``lm_eval_backend`` runs any lm-evaluation-harness
task and ``lm_eval_results`` reads its metrics. ``legacy_tasks`` holds the pre-RULER prompts
(``legacy_*`` tasks).
``ruler_qa`` is RULER's qa_1/qa_2 from local files; ``longbench_spec``/``longbench_metrics``/
``longbench`` run LongBench; ``short_text`` (lm-eval on local files) and ``humaneval`` the
short-text retention suite; ``bench_stage`` runs them inside ``run_eval``; ``paper_report``
lays the results out as the EndPrompt paper's tables.
"""
