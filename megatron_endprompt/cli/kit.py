"""The shared kit of the command-line tools: the console entry, the flag groups more than one
tool takes, and (from :mod:`megatron_endprompt.errors`) the one ``ValueError`` -> ``UserError``
re-wrap, so each tool only parses and prints.

A tool is ``build_parser()`` + ``main(argv) -> int`` + ``cli = entry(main)``; ``main`` calls
:func:`megatron_endprompt.runtime.quiet` before it imports anything of Megatron, builds the
library's option class inside ``with user_errors():`` (the option classes validate their
values), runs the library and prints its summary.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from megatron_endprompt.data.sidecar.terminal_spec import TERMINAL_SOURCES, TerminalSpec
from megatron_endprompt.errors import run_cli, user_errors
from megatron_endprompt.layout import PLACEMENTS, LayoutConfig
from megatron_endprompt.loss_weights import LossWeights
from megatron_endprompt.window import PREPROCESS_FLAGS

__all__ = ["add_layout_arguments", "add_summary_arguments", "entry", "layout_from_args",
           "terminal_from_args", "user_errors"]


def entry(main: Callable[[list[str] | None], int | None]) -> Callable[[], None]:
    """The console-script entry point of a tool's ``main``: one ``error:`` line and exit 2 for
    bad input, 130/143 on Ctrl-C/SIGTERM (:func:`~megatron_endprompt.errors.run_cli`)."""

    def cli() -> None:
        """Console-script entry point."""
        sys.exit(run_cli(main))

    cli.__module__ = main.__module__
    return cli


def add_layout_arguments(p: argparse.ArgumentParser) -> None:
    """The EndPrompt layout flags shared by preprocessing and sidecar building."""
    g = p.add_argument_group("EndPrompt layout")
    g.add_argument("--seq-length", type=int, required=True, help="P: physical sample length")
    g.add_argument("--target-length", type=int, required=True, help="L: target context window")
    g.add_argument("--terminal-length", type=int, default=None,
                   help="b: terminal tokens (continuation / document-tail)")
    g.add_argument("--placement", choices=PLACEMENTS, default="fixed",
                   help="fixed: terminal at L-b..L-1; random: start uniform in [a, L-b]; "
                        "pose: PoSE's train_pose.py law, one sample per document (with "
                        "--terminal-source continuation: PoSE; prompt: ET(PoSE), the prompt "
                        "at L-b)")
    g.add_argument("--terminal-source", choices=TERMINAL_SOURCES, default="continuation")
    g.add_argument("--terminal-prompts", default=None,
                   help="a built-in set, ep1 (default: EP1 alone, the paper's main result) or "
                        "ep1-3 (the EP1-EP3 mixture), or a file with one prompt per line")
    g.add_argument("--pose-chunks", type=int, default=None,
                   help="ET(PoSE): split the context into N>=2 pieces with random skips "
                        "(default 1; 2 with --placement pose, its only value)")
    g.add_argument("--terminal-loss-weight", type=float, default=None,
                   help="w > 0 (default: 0.1 for prompt terminals, a small w as the paper asks; "
                        "the paper gives no value; 1.0 for the other sources)")
    g.add_argument("--context-loss-weight", type=float, default=1.0,
                   help="1 keeps ordinary LM loss on the context; 0 trains terminals only")
    g.add_argument("--seed", type=int, default=1234)


def add_summary_arguments(p: argparse.ArgumentParser) -> None:
    """How the tools that write a sidecar report: a progress bar or none, and the summary as
    text or as JSON (for scripts)."""
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--summary-json", action="store_true", help="print the summary as JSON")


def terminal_from_args(args: argparse.Namespace) -> TerminalSpec:
    """``TerminalSpec`` of the shared flags (``ValueError`` on bad values)."""
    return TerminalSpec(source=args.terminal_source, prompts=args.terminal_prompts,
                        length=args.terminal_length,
                        seed=args.seed)


def layout_from_args(args: argparse.Namespace, terminal: TerminalSpec) -> LayoutConfig:
    """``LayoutConfig`` of the shared flags, ``w``'s default from ``terminal``'s source
    (``ValueError`` on bad values)."""
    return LayoutConfig(seq_length=args.seq_length, target_length=args.target_length,
                        placement=args.placement,
                        pose_chunks=(2 if args.placement == "pose" else 1)
                        if args.pose_chunks is None else args.pose_chunks,
                        loss_weights=LossWeights.for_source(
                            terminal.source, terminal=args.terminal_loss_weight,
                            context=args.context_loss_weight, flags=PREPROCESS_FLAGS))
