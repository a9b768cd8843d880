"""Long-context evaluation of an HF causal LM (``tools/eval_longcontext.py``), in rooms by task
family over one core, behind one task table.

Floors, bottom up (a room imports only rooms below it):

- ``core/``: the prompt sample and tokenizer view, scores, loading and running the model,
  results that survive, local JSONL, chat templates, the run's choices (``config.EvalConfig``)
  and the task table's row type (``task.GenerationTask``, ``task.Resource``).
- Task families: ``ruler/`` (RULER's 11 synthetic tasks and qa_1/qa_2), ``passkey/`` (passkey
  and the pre-RULER ``legacy_*`` prompts), ``perplexity/`` (per-document sliding windows),
  ``longbench/`` (LongBench / LongBench-E), ``short_text/`` (MMLU, GSM8K, HellaSwag through
  lm-eval on local files; HumanEval).
- ``report/``: the JSON, markdown and plots, the paper's layout and its comparability gate.
- ``lm_eval/``: lm-eval's tasks for ``--backend lm-eval``, its results read, its seeds.
- Top: ``task_table`` (every generation task, one row each, and the ``--tasks`` groups),
  ``bench_stage`` (LongBench and short text inside a run), ``lm_eval_run`` (the lm-eval
  backend's run) and ``suite`` (``run_eval``: the native pipeline, dispatching through the
  table; ``evaluate``: either backend).

Adding a generation task: its module in its family's room (builder, scorer, length rule, any
resource) and one row in ``task_table.TASKS`` (``--tasks`` and its ``--help`` read the table).
"""
