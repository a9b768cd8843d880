"""Short-text retention: the benchmarks and their sizes (``spec``), MMLU, GSM8K and HellaSwag
through lm-eval on local files (``run``, ``mmlu``) and HumanEval executed in a sandbox
(``humaneval``)."""
