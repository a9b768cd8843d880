"""The extra flags ``examples/pretrain_llama3_endprompt.sh`` appends to the Megatron command
line, checked before ``torchrun``: every option must be one the ``pretrain`` entry parses
(Megatron's or ours). A typo such as ``--dryrun`` for ``--dry-run`` would otherwise pass the
script's checks and start a real multi-rank launch, whose every rank then stops at Megatron's
parser (or, for the dry-run typo, trains for real).

Building that parser imports Megatron and torch (seconds on an idle machine, close to a minute
on a busy one), so the option list is cached per installation (:func:`options_cache_path`) and a
dry run with extra flags takes well under a second after the first."""

from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib.util
import json
import os
from importlib import metadata

from megatron_endprompt.errors import UserError

__all__ = ["SCRIPT_OPTIONS", "check_extra_flags"]

#: The launcher's own options (not forwarded).
SCRIPT_OPTIONS = ("--dry-run", "--help")


def options_cache_path() -> str | None:
    """The cached option list of this installation: under ``$MEGATRON_ENDPROMPT_CACHE`` (else
    ``$XDG_CACHE_HOME/megatron-endprompt`` or ``~/.cache/megatron-endprompt``), named by a hash of
    megatron-core's version and the sources the parser is built from (Megatron's
    ``training/arguments.py`` and ``argument_utils.py``, our ``training/args.py`` and
    ``long_eval.py``), so another Megatron or a changed flag never reads a stale list.
    ``None``: ``MEGATRON_ENDPROMPT_CACHE=off``, or Megatron is not installed."""
    root = os.environ.get("MEGATRON_ENDPROMPT_CACHE")
    if root and root.lower() in ("off", "0", "none", "no"):
        return None
    spec = importlib.util.find_spec("megatron")  # the top package only: nothing imported
    if spec is None or not spec.submodule_search_locations:
        return None
    megatron_dir = list(spec.submodule_search_locations)[0]
    here = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    try:
        digest.update(metadata.version("megatron-core").encode())
    except metadata.PackageNotFoundError:
        pass
    for path in (os.path.join(megatron_dir, "training", "arguments.py"),
                 os.path.join(megatron_dir, "training", "argument_utils.py"),
                 os.path.join(here, "args.py"), os.path.join(here, "long_eval.py")):
        try:
            with open(path, "rb") as f:
                digest.update(f.read())
        except OSError:
            return None
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "megatron-endprompt")
    return os.path.join(root, "launch-options", digest.hexdigest()[:32] + ".json")


def _known_options() -> set[str]:
    """Option strings of the ``pretrain`` entry's parser (Megatron's + ``--endprompt-*``):
    read from the cache, else built (Megatron and torch load here, only when extra flags are
    given and the cache is cold) and cached."""
    path = options_cache_path()
    if path is not None and os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                return set(json.load(f))
        except (OSError, ValueError):
            pass  # unreadable: build it again
    known = _build_known_options()
    if path is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(sorted(known), f)
            os.replace(tmp, path)  # whole or absent, for launches on many nodes at once
        except OSError:
            pass  # a read-only home: no cache, the same answer
    return known


def _build_known_options() -> set[str]:
    from megatron.training.arguments import add_megatron_arguments

    from megatron_endprompt.training.args import add_endprompt_args

    parser = add_endprompt_args(add_megatron_arguments(argparse.ArgumentParser(
        allow_abbrev=False)))
    return set(parser._option_string_actions)


def check_extra_flags(flags: list[str]) -> None:
    """Refuse an option among ``flags`` that the ``pretrain`` entry does not know (one
    :class:`UserError`, the closest known option suggested). Values (tokens not starting with
    ``--``) are left to Megatron's parser."""
    options = [f.split("=", 1)[0] for f in flags if f.startswith("--") and f != "--"]
    if not options:
        return
    known = _known_options()
    for option in options:
        if option in known:
            continue
        close = difflib.get_close_matches(option, [*SCRIPT_OPTIONS, *known], n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UserError(f"unknown option {option}: neither this script's ("
                        f"{', '.join(SCRIPT_OPTIONS)}) nor a Megatron/EndPrompt flag{hint} "
                        "(nothing was launched)")
