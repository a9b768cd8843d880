#!/usr/bin/env python3
"""Print an EndPrompt sample, its positions and weights, and dataset stats. See ``--help``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron_endprompt.cli.inspect import cli  # noqa: E402

if __name__ == "__main__":
    cli()
