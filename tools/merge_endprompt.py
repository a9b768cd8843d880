#!/usr/bin/env python3
"""Merge preprocessed shards (.bin/.idx + EndPrompt sidecars). See ``--help``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron_endprompt.cli.merge import cli  # noqa: E402

if __name__ == "__main__":
    cli()
