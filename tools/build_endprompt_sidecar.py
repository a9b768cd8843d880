#!/usr/bin/env python3
"""EndPrompt sidecar for an existing Megatron .bin/.idx. See ``--help``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron_endprompt.cli.build_sidecar import cli  # noqa: E402

if __name__ == "__main__":
    cli()
