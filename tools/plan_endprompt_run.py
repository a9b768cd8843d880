#!/usr/bin/env python3
"""Plan a cluster run: memory, time and cost of EndPrompt at P vs full-length at L (``--help``)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron_endprompt.cli.plan import cli  # noqa: E402

if __name__ == "__main__":
    cli()
