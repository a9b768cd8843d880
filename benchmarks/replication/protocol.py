"""The mini-replication's protocol: its methods, the comparisons it reports, its sizes and the
configuration keys that decide what a cached run or base can be reused for.

Kept apart from the orchestration (``mini_replication.py``) so that the report, the data
statistics and the tests read the protocol without importing the runner.
"""

from __future__ import annotations

METHODS = {
    "a": "PI only (no training)",
    "b": "full-length FT at L",
    "c": "EndPrompt fixed",
    "d": "EndPrompt random",
    "e": "PoSE (train_pose.py)",
    "f": "(d) + the project's two-piece chunks",
    "g": "EndPrompt prompt EP1-3",
    "h": "full-length FT, equal tokens",
    "d0": "(d), no jump (contiguous)",
    "a1": "PI + short FT, stream windows",
    "g1p": "short-range docs + EP1 terminal",
    "g1n": "short-range docs, no terminal, (g1p)'s cuts",
    "g1nP": "short-range docs, no terminal, P-token windows",
    "etp": "ET(PoSE): PoSE's law + EP1 terminal",
    "hd": "full-length FT, equal tokens, (d)'s docs packed",
    "hg": "full-length FT, equal tokens, (g1p)'s docs packed",
}

#: Methods trained on fewer, longer samples with the tokens per step of the ``P``-token rows:
#: ``ft_docs x P / L`` sequences of ``L`` tokens per step.
EQUAL_TOKENS = ("h", "hd", "hg")

#: The comparisons the report makes, each paired by seed: (x, y) gives x - y.
PAIRS = (
    ("d", "hd"),     # EndPrompt vs full-length at equal tokens, (d)'s documents
    ("g1p", "hg"),   # the paper's configuration vs full-length at equal tokens, same stream
    ("d", "b"),      # EndPrompt vs full-length at equal documents and steps (4x the tokens)
    ("d", "d0"),     # the position jump
    ("g1p", "g1n"),  # the content-free prompt terminal
    ("g1n", "hg"),   # short contiguous windows vs full-length, the same stream, no terminal
    ("etp", "d"),    # ET(PoSE) vs ET
    ("f", "d"),      # the project's two-piece chunks on top of (d)
    ("e", "d"),      # PoSE vs ET
)

#: ``full``: the README tables; ``smoke``: CI (launch overhead dominates).
SIZES = {
    "full": dict(hidden=128, ffn=352, layers=4, heads=4, groups=2, vocab=1024, split_digits=True,
                 L0=320, L=640,
                 P=160, ratio=None,
                 base_iters=1200, base_more=[800], base_mb=8, base_lr=3e-3, ft_iters=300,
                 ft_docs=8, ft_lr=1e-3, ft_warmup=30, ft_min=None, terminal=64, w=1.0,
                 prompt_w=0.1, fact_span=80,
                 log_interval=10, lengths="320,480,640", samples=100, eval_batch=25,
                 ppl_docs=12, ppl_windows=12,
                 methods="a,b,c,d,e,f,etp,g,hd,hg,d0,a1,g1p,g1n", sweep_b=[32, 80],
                 held_out="niah_multikey_2,niah_multivalue,niah_multiquery"),
    "smoke": dict(hidden=64, ffn=176, layers=4, heads=4, groups=2, vocab=1024, split_digits=False,
                  L0=128, L=384,
                  P=128, ratio=None,
                  base_iters=2, base_more=[], base_mb=2, base_lr=3e-3, ft_iters=2, ft_docs=2,
                  ft_lr=3e-4, ft_warmup=None, ft_min=None,
                  terminal=48, w=1.0, prompt_w=0.1, fact_span=72, log_interval=1,
                  lengths="384", samples=2, eval_batch=2, ppl_docs=2, ppl_windows=1,
                  # one method trained end to end (~40 s a torchrun on 2 busy cores); every
                  # method's data built and checked for its layout (layouts.py)
                  methods="f", held_out="niah_multikey_2", check_all=True),
}
#: Configuration that shapes the base checkpoint (its cache key).
BASE_KEYS = ("hidden", "ffn", "layers", "heads", "groups", "vocab", "split_digits", "L0",
             "base_iters", "base_mb", "base_lr")
#: Pretraining saves this often (a stage interrupted is continued under ``--resume``).
BASE_SAVE_EVERY = 100
#: Configuration that shapes an evaluation (with the checkpoint and its window).
EVAL_KEYS = ("L", "lengths", "samples", "eval_batch", "ppl_docs", "ppl_windows", "held_out")
