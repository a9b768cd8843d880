#!/usr/bin/env python3
"""Long-context evaluation (RULER, passkey, perplexity, LongBench, short-text retention, or any
lm-eval task) of an HF model directory. See ``--help``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron_endprompt.cli.eval import cli  # noqa: E402

if __name__ == "__main__":
    cli()
