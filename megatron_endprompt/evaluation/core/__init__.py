"""The core every task family stands on: the prompt sample and tokenizer view (``prompt``),
scores (``scoring``), loading and running the model (``runner``), results that survive
(``results_io``), local JSONL reading (``local_jsonl``), chat templates (``chat``), the run's
choices (``config``) and the row type of the task table (``task``). Imports nothing above it."""
