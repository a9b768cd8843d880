#!/usr/bin/env python3
"""HF Llama <-> Megatron-Core torch_dist checkpoint conversion. See ``--help``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron_endprompt.cli.convert import cli  # noqa: E402

if __name__ == "__main__":
    cli()
