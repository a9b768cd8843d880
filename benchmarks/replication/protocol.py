"""The mini-replication's protocol: its methods, the comparisons it reports, its sizes and the
configuration keys that decide what a cached run or base can be reused for.

Kept apart from the orchestration (``mini_replication.py``) so that the report, the data
statistics and the tests read the protocol without importing the runner.
"""

from __future__ import annotations

from benchmarks.replication import pose
from benchmarks.replication.rows import RowSpec

_TAIL = ("--terminal-source", "document-tail", "--terminal-length", "{b}",
         "--terminal-loss-weight", "{w}")
#: (g1p)'s EP1 prompt terminal and (etp)'s.
_EP1 = ("--terminal-source", "prompt", "--terminal-prompts", "ep1", "--terminal-loss-weight",
        "{pw}")

#: Every row of the mini-replication, one typed record each (``rows.RowSpec``): its training
#: data (a JSONL preprocessed with its layout flags, or a plain prefix cut as ``plain`` says),
#: its physical sample length and its tokens per step. The runner (``layouts.build`` /
#: ``layouts.check``) reads nothing else about a row.
ROWS = {r.key: r for r in (
    RowSpec(key="a", label="PI only (no training)"),
    RowSpec(key="b", label="full-length FT at L", source="ft_plain", plain="padded", seq="L"),
    RowSpec(key="c", label="EndPrompt fixed", source="ft.jsonl",
            layout=("--placement", "fixed", *_TAIL)),
    RowSpec(key="d", label="EndPrompt random", source="ft.jsonl",
            layout=("--placement", "random", *_TAIL)),
    RowSpec(key="e", label="PoSE (train_pose.py)", source="ft.jsonl",
            layout=tuple(pose.POSE_FLAGS)),  # PoSE as train_pose.py draws it
    RowSpec(key="f", label="(d) + the project's two-piece chunks", source="ft.jsonl",
            layout=("--placement", "random", "--pose-chunks", "2", *_TAIL)),
    RowSpec(key="g", label="EndPrompt prompt EP1-3", source="ft.jsonl",
            # the committed (g) results used the mixture, the old default
            layout=("--placement", "fixed", "--terminal-source", "prompt",
                    "--terminal-prompts", "ep1-3", "--terminal-loss-weight", "{pw}")),
    RowSpec(key="h", label="full-length FT, equal tokens", source="ft_plain", plain="padded",
            seq="L", equal_tokens=True),
    RowSpec(key="d0", label="(d), no jump (contiguous)", source="ft.jsonl",
            layout=("--placement", "random", *_TAIL), contiguous=True),
    RowSpec(key="a1", label="PI + short FT, stream windows", source="ft_stream",
            plain="stream"),
    RowSpec(key="g1p", label="short-range docs + EP1 terminal", source="g1.jsonl",
            layout=("--placement", "fixed", *_EP1)),
    # (g1p)'s cuts: with --seq-length a, the stream in windows of a + 1 tokens, stride a, as
    # (g1p) takes its a-token contexts; uniform loss; records then made contiguous (T = a)
    RowSpec(key="g1n", label="short-range docs, no terminal, (g1p)'s cuts", source="g1.jsonl",
            layout=("--placement", "random", "--terminal-source", "continuation",
                    "--terminal-length", "1", "--terminal-loss-weight", "1"),
            seq="a", contiguous=True),
    RowSpec(key="g1nP", label="short-range docs, no terminal, P-token windows",
            source="g1_plain", plain="stream"),
    RowSpec(key="etp", label="ET(PoSE): PoSE's law + EP1 terminal (reconstruction)",
            source="ft.jsonl", layout=("--placement", "pose", *_EP1), reconstruction=True),
    RowSpec(key="hd", label="full-length FT, equal tokens, (d)'s docs packed",
            source="ft_stream", plain="packed", seq="L", equal_tokens=True),
    RowSpec(key="hg", label="full-length FT, equal tokens, (g1p)'s docs packed",
            source="g1_plain", plain="packed", seq="L", equal_tokens=True),
)}
#: Row labels by key (the tables' and results' ``name``).
METHODS = {k: r.label for k, r in ROWS.items()}

#: Methods trained on fewer, longer samples with the tokens per step of the ``P``-token rows:
#: ``ft_docs x P / L`` sequences of ``L`` tokens per step.
EQUAL_TOKENS = tuple(k for k, r in ROWS.items() if r.equal_tokens)

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
