"""Long-context evaluation of an HF causal LM: passkey retrieval, a RULER-style
needle-in-a-haystack family and sliding-window perplexity (``tools/eval_longcontext.py``).

``tasks`` builds prompts of an exact token length, ``scoring`` scores them, ``runner`` runs the
model (batched greedy generation, chunked perplexity) and ``report`` writes JSON, markdown and
PNGs.
"""
