"""Time to build RULER prompts (haystack fit + render + tokenize) per task and length.

    python -m benchmarks.evaluation.ruler_prompts --tokenizer HF_DIR --lengths 16384,65536

Prints seconds per task x length for one sample (the binary search dominates) and the prompt
length reached. CPU only; no model runs.
"""

from __future__ import annotations

import argparse
import time

from megatron_endprompt.evaluation.ruler import synthetic as ruler
from megatron_endprompt.evaluation.ruler import sources as ruler_sources
from megatron_endprompt.evaluation.core.prompt import TextTokens
from megatron_endprompt.evaluation.core.runner import load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", required=True, help="HF directory with a tokenizer")
    p.add_argument("--lengths", default="16384,65536")
    p.add_argument("--samples", type=int, default=1)
    args = p.parse_args()
    tokens = TextTokens(load_tokenizer(args.tokenizer))
    hay = ruler_sources.load_haystack()
    lengths = [int(x) for x in args.lengths.split(",")]
    print("| task | " + " | ".join(f"{n} (s, tokens)" for n in lengths) + " |")
    for task in ruler.RULER_TASKS:
        cells = []
        for n in lengths:
            t = time.perf_counter()
            s = ruler.make_ruler_samples(task, tokens, lengths=[n], samples=args.samples,
                                         seed=42, haystack=hay)
            cells.append(f"{time.perf_counter() - t:.1f}, {len(s[0].input_ids)}")
        print(f"| {task} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
