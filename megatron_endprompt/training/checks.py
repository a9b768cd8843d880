"""Start-up checks of the pretrain entry that run before Megatron initialises anything.

Megatron reports a malformed blend, a missing prefix, a typo in ``--load`` or a zero
``--make-vocab-size-divisible-by`` late (after ``torch.distributed`` and the model are up) and
as a traceback (``assert all(is_none)``, ``FileNotFoundError`` in ``IndexedDataset``,
``ZeroDivisionError``) or not at all (a missing ``--load`` trains from scratch after a
warning). Each is refused here with one line naming the flag and the fix.

``--transformer-impl transformer_engine`` without a CUDA device is refused too (Transformer
Engine's modules cannot be built on a CPU, installed or not), and so are the Megatron features
that cannot carry EndPrompt's positions (combined 1F1B, CUDA graphs, MTP with a hybrid pattern).
``--context-parallel-size`` > 1 needs Transformer Engine's attention on a GPU; on a CPU the
runtime's context-parallel attention serves it.

Blend sources: ``--data-path``, ``--data-args-path`` (a file with the same tokens),
``--{train,valid,test}-data-path`` and ``--per-split-data-args-path`` (JSON), all parsed by
:func:`blends` — the one parser the sidecar check (``args.data_prefixes``) uses too, so
prefixes given through a file are checked like the others.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re

from megatron_endprompt.checkpoint_dir import resolve_checkpoint_dir
from megatron_endprompt.data.prepare.prefix_name import resolve_prefix
from megatron_endprompt.disk import writable_ancestor
from megatron_endprompt.errors import UserError
from megatron_endprompt.runtime import installed_layers
from megatron_endprompt.window import MAX_POSITION

__all__ = ["blends", "blend_prefixes", "check_startup", "check_target_length",
           "check_transformer_impl", "parse_args_checked"]

_BLEND_HELP = ("give PREFIX [PREFIX ...] or weight/prefix pairs W1 PREFIX1 W2 PREFIX2 ... "
               "with weights > 0")


def _read(flag: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{flag} {path}: cannot read ({getattr(exc, 'strerror', None) or exc})"
                        ) from None


def _sources(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """``(flag, tokens)`` for every blend the run names."""
    out: list[tuple[str, list[str]]] = []
    if getattr(args, "data_path", None):
        out.append(("--data-path", list(args.data_path)))
    path = getattr(args, "data_args_path", None)
    if path:
        out.append((f"--data-args-path {path}", _read("--data-args-path", path).split()))
    for split in ("train", "valid", "test"):
        values = getattr(args, f"{split}_data_path", None)
        if values:
            out.append((f"--{split}-data-path", list(values)))
    path = getattr(args, "per_split_data_args_path", None)
    if path:
        try:
            per_split = json.loads(_read("--per-split-data-args-path", path))
            for split in ("train", "valid", "test"):
                value = per_split[split]
                if value:
                    out.append((f"--per-split-data-args-path {path} [{split}]",
                                value.split() if isinstance(value, str) else list(value)))
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"--per-split-data-args-path {path}: not a JSON object with train, "
                            f"valid and test blends ({exc})") from None
    return out


def _parse_blend(flag: str, tokens: list[str]) -> list[tuple[float | None, str]]:
    """``[(weight or None, prefix)]`` of one blend, validated like a user would expect."""
    shown = " ".join(tokens)
    shown = shown if len(shown) <= 120 else shown[:117] + "..."
    if not tokens:
        raise UserError(f"{flag}: empty blend; {_BLEND_HELP}")

    def number(tok: str) -> float | None:
        try:
            return float(tok)
        except ValueError:
            return None

    numeric = [number(t) is not None for t in tokens]
    if len(tokens) % 2 == 0 and all(numeric[0::2]):
        pairs = [(number(w), p) for w, p in zip(tokens[0::2], tokens[1::2])]
        for w, p in pairs:
            if number(p) is not None and not os.path.exists(p + ".bin"):
                raise UserError(f"{flag} '{shown}': {p} in a prefix position is a number; "
                                f"{_BLEND_HELP}")
            if not (math.isfinite(w) and w > 0):
                raise UserError(f"{flag} '{shown}': weight {w:g} of {p} must be finite and "
                                f"> 0; drop the prefix instead of giving it weight 0")
        return pairs
    if any(numeric) and not all(os.path.exists(t + ".bin") for t, n in zip(tokens, numeric)
                                if n):
        raise UserError(f"{flag} '{shown}': mixes weights and prefixes ({len(tokens)} values); "
                        f"{_BLEND_HELP}")
    return [(None, t) for t in tokens]


def blends(args: argparse.Namespace) -> list[tuple[str, list[tuple[float | None, str]]]]:
    """Every blend of the run, parsed and validated: ``[(flag, [(weight, prefix), ...])]``."""
    return [(flag, _parse_blend(flag, tokens)) for flag, tokens in _sources(args)]


def blend_prefixes(args: argparse.Namespace) -> list[str]:
    """Every data prefix of the run (all blend sources), in order, without repeats."""
    return list(dict.fromkeys(p for _, pairs in blends(args) for _, p in pairs))


_LIST_FLAGS = {"--data-path": "data_path", "--train-data-path": "train_data_path",
               "--valid-data-path": "valid_data_path", "--test-data-path": "test_data_path"}


def _resolve_names(args: argparse.Namespace) -> list[str]:
    """Prefixes given in Megatron's other spelling (``PREFIX`` for ``PREFIX_text_document`` or
    the reverse, :mod:`~megatron_endprompt.data.prepare.prefix_name`) replaced in the flags that
    list them (``--data-path``, ``--{train,valid,test}-data-path``) before Megatron reads them;
    returns the notes to print. Prefixes read from a file (``--data-args-path``) are left to the
    not-found error; ``--endprompt-replay-prefixes`` is resolved where the run is built
    (:func:`~megatron_endprompt.training.run.build_run`)."""
    notes: dict[str, str] = {}
    for attr in _LIST_FLAGS.values():
        values = getattr(args, attr, None)
        if not values:
            continue
        resolved = []
        for tok in values:
            new, note = resolve_prefix(tok)
            if note:
                notes.setdefault(tok, note)
            resolved.append(new)
        setattr(args, attr, resolved)
    return list(notes.values())


def split_prefixes(args: argparse.Namespace) -> list[str]:
    """The prefixes Megatron splits by ``--split`` (``--data-path``, ``--data-args-path``; the
    per-split blends are not split)."""
    return list(dict.fromkeys(p for flag, pairs in blends(args) for _, p in pairs
                              if flag.startswith(("--data-path", "--data-args-path"))))


def _check_prefixes(args: argparse.Namespace) -> None:
    from megatron_endprompt.data.prepare.atomic_output import ensure_committed

    for flag, pairs in blends(args):
        for _, prefix in pairs:
            hint = ""
            if prefix.endswith((".bin", ".idx", ".endprompt")):
                hint = f" (drop the extension: {os.path.splitext(prefix)[0]})"
            ensure_committed(prefix, flag=flag)
            for suffix in (".bin", ".idx"):
                if not os.path.isfile(prefix + suffix):
                    raise UserError(f"{flag}: {prefix}{suffix} not found{hint}; give the prefix "
                                    "written by tools/preprocess_endprompt.py --output-prefix")


def _has_checkpoint(path: str) -> bool:
    """A checkpoint directory resolves under ``path`` (tracker, iter_*/release, or ``path``
    itself; :mod:`megatron_endprompt.checkpoint_dir`), or ``path`` holds shard files."""
    if not os.path.isdir(path):
        return False
    return resolve_checkpoint_dir(path, newest_without_tracker=True) is not None \
        or any(n.endswith(".distcp") for n in os.listdir(path))


def _check_load(args: argparse.Namespace) -> None:
    """A ``--load`` without a checkpoint makes Megatron train from scratch after a warning;
    that is refused unless it is the first launch of ``--load OUT --save OUT`` (with
    ``--pretrained-checkpoint IN`` or from scratch): OUT is written by this run, so a later
    launch resumes from it; a ``--load`` that differs from ``--save`` is a typo or a wrong path."""
    pretrained = getattr(args, "pretrained_checkpoint", None)
    if pretrained and not _has_checkpoint(pretrained):
        raise UserError(f"--pretrained-checkpoint {pretrained}: no Megatron checkpoint there "
                        "(no latest_checkpointed_iteration.txt, iter_* or release); fix the path "
                        "(convert HF weights with tools/convert_checkpoint.py hf-to-megatron)")
    load = getattr(args, "load", None)
    if not load or _has_checkpoint(load):
        return
    save = getattr(args, "save", None)
    same = bool(save) and os.path.abspath(save) == os.path.abspath(load)
    if same and not getattr(args, "finetune", False):
        # first launch of ``--load OUT --save OUT`` (from IN, or from scratch): OUT is written
        # by this run and every later launch resumes from it
        return
    what = "does not exist" if not os.path.exists(load) else "holds no Megatron checkpoint"
    raise UserError(f"--load {load} {what}; Megatron would train from scratch. Fix the path, "
                    "or start from a model with --load OUT --save OUT --pretrained-checkpoint IN")


def check_target_length(L: int | None) -> None:
    """``--endprompt-target-length`` within the positions a sidecar record holds (int32:
    :data:`~megatron_endprompt.window.MAX_POSITION`, the bound
    :class:`~megatron_endprompt.window.EndPromptWindow` enforces later). The value, not
    ``args``: the run builder (:mod:`.run`) is the one reader of the EndPrompt flags, and
    calls this where it first reads ``L``, before any checkpoint, data or tokenizer is read."""
    if L is not None and not 0 < L <= MAX_POSITION:
        raise UserError(f"--endprompt-target-length {L} must be in [1, {MAX_POSITION}] (int32 "
                        "positions)")


def check_startup(args: argparse.Namespace) -> list[str]:
    """All checks above; raises :class:`UserError`. Cheap: reads flags and directory listings.
    Returns the notes to print (prefixes resolved to Megatron's other spelling)."""
    divisor = getattr(args, "make_vocab_size_divisible_by", 128)
    if divisor is not None and divisor < 1:
        raise UserError(f"--make-vocab-size-divisible-by {divisor} must be >= 1 (128 is "
                        "Megatron's default)")
    notes = _resolve_names(args)
    check_transformer_impl(getattr(args, "transformer_impl", None))
    _check_features(args)
    _check_prefixes(args)
    _check_cache_path(args)
    _check_load(args)
    _check_save(args)
    _check_context_parallel(args)
    return notes


def check_transformer_impl(impl: str | None) -> None:
    """``--transformer-impl transformer_engine`` needs a CUDA device: Transformer Engine's
    modules refuse to build without one (with TE installed, a traceback from inside the model
    build; without it, one from Megatron's TE spec), so a CPU run is refused here in one line
    whether TE is installed or not. The pretrain entry sets ``--transformer-impl local`` on a
    CPU when the flag is not given (``runtime.CPU_ARGS``)."""
    if impl != "transformer_engine":
        return
    import importlib.util

    import torch

    if torch.cuda.is_available():
        return
    te = "installed" if importlib.util.find_spec("transformer_engine") else "not installed"
    raise UserError("--transformer-impl transformer_engine needs a CUDA GPU and none is visible "
                    f"(Transformer Engine is {te}; its modules run only on a GPU); on a CPU use "
                    "--transformer-impl local, or leave the flag out")


#: ``--cuda-graph-impl`` value -> why EndPrompt refuses it (the deprecated spellings map here).
_CUDA_GRAPH_REASONS = {
    "transformer_engine": "Transformer Engine's graph capture computes RoPE from a sequence "
                          "length outside the model's forward, i.e. contiguous positions",
    "local": "captured per-layer graphs fix the RoPE input's shape, which EndPrompt picks per "
             "micro-batch ([S,1,1,D] for one layout, [S,B,1,D] for mixed layouts)",
    "full_iteration": "a captured iteration freezes the host-side choice of RoPE shape "
                      "EndPrompt makes per micro-batch ([S,1,1,D] or [S,B,1,D])",
}


#: ``--cuda-graph-impl`` value -> the deprecated flag Megatron's ``validate_args`` maps onto it.
_CUDA_GRAPH_ALIASES = {"local": "--enable-cuda-graph",
                       "transformer_engine": "--external-cuda-graph"}


def _check_features(args: argparse.Namespace) -> None:
    """Megatron features that cannot carry EndPrompt's positions, refused before the first
    step (they raised a ``RuntimeError`` from inside it, or failed mid-run):
    ``--overlap-moe-expert-parallel-comm`` (the combined-1F1B schedule plan builds RoPE outside
    the model's forward), CUDA graphs (``--cuda-graph-impl``, ``--enable-cuda-graph``,
    ``--external-cuda-graph``) and multi-token prediction with ``--hybrid-layer-pattern``."""
    if getattr(args, "overlap_moe_expert_parallel_comm", False):
        raise UserError("--overlap-moe-expert-parallel-comm is not supported with EndPrompt: its "
                        "combined-1F1B schedule computes RoPE outside the model's forward, "
                        "without the batch's position_ids; drop the flag")
    impl = getattr(args, "cuda_graph_impl", None) or "none"
    alias = _CUDA_GRAPH_ALIASES.get(impl)  # Megatron has mapped a deprecated flag onto impl
    flag = f"--cuda-graph-impl {impl}" + (f" (or {alias})" if alias else "")
    if getattr(args, "enable_cuda_graph", False):  # deprecated spellings (before Megatron maps)
        impl, flag = "local", "--enable-cuda-graph"
    elif getattr(args, "external_cuda_graph", False):
        impl, flag = "transformer_engine", "--external-cuda-graph"
    if impl != "none":
        reason = _CUDA_GRAPH_REASONS.get(impl, "EndPrompt's RoPE is not graph-safe")
        raise UserError(f"{flag} is not supported with EndPrompt: {reason}; drop the flag "
                        "(train without CUDA graphs)")
    pattern = getattr(args, "hybrid_layer_pattern", None)
    if pattern and (getattr(args, "mtp_num_layers", None) or "/" in pattern):
        what = ("its '/' multi-token-prediction part" if "/" in pattern  # Megatron infers
                else f"--mtp-num-layers {args.mtp_num_layers}")  # --mtp-num-layers from '/'
        raise UserError(f"--hybrid-layer-pattern {pattern} with {what} is not supported by "
                        "EndPrompt (multi-token prediction needs GPTModel's MTP block); drop the "
                        "MTP layers, or leave out --hybrid-layer-pattern to train GPTModel with "
                        "--mtp-num-layers")


def _check_writable_dir(flag: str, path: str | None, why: str) -> None:
    """``path`` is a directory or can be created as one, under a nearest existing ancestor
    that is a directory and takes a new entry (a real write: ``os.access`` says yes to root on
    a read-only mount). Raises :class:`UserError` naming ``flag``."""
    if not path:
        return
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe.rstrip("/"))
    if not os.path.isdir(probe or "."):
        raise UserError(f"{flag} {path}: {probe} is not a directory; give a directory")
    try:
        writable_ancestor(probe or ".")
    except OSError as exc:
        raise UserError(f"{flag} {path}: {probe or '.'} is not writable ({exc.strerror}); "
                        f"point it at a writable directory ({why})") from None


def _check_cache_path(args: argparse.Namespace) -> None:
    """``--data-cache-path`` must be writable: Megatron writes its index caches and we write
    the sidecar verification verdicts there on the first start (a read-only one was a
    traceback from deep inside the dataset build)."""
    _check_writable_dir("--data-cache-path", getattr(args, "data_cache_path", None),
                        "the index caches are written there")


def _check_save(args: argparse.Namespace) -> None:
    """``--save`` must be a writable directory (or creatable as one) now, as ``--load`` is
    checked: otherwise training runs until the first save and every rank then dies with an
    ``OSError``/``NotADirectoryError``."""
    _check_writable_dir("--save", getattr(args, "save", None), "checkpoints are saved there")


#: Tokenizer types whose ``--tokenizer-model`` is a local file or directory Megatron opens.
_TOKENIZER_FILES = ("GPTSentencePieceTokenizer", "SentencePieceTokenizer", "Llama2Tokenizer",
                    "TikTokenizer", "HuggingFaceTokenizer")


def _check_tokenizer(args: argparse.Namespace) -> None:
    """A ``--tokenizer-model`` that is not there: one line now, not Megatron's ``ValueError``
    traceback on every rank. A HuggingFaceTokenizer name of the hub form ``org/name`` (not an
    absolute or ``./`` path) is left to transformers."""
    kind = getattr(args, "tokenizer_type", None)
    model = getattr(args, "tokenizer_model", None)
    if kind not in _TOKENIZER_FILES or not model or os.path.exists(model):
        return
    hub_id = re.fullmatch(r"[\w.-]+/[\w.-]+", model) and not model.startswith(".")
    if kind == "HuggingFaceTokenizer" and hub_id:
        return
    raise UserError(f"--tokenizer-model {model}: no such file or directory (--tokenizer-type "
                    f"{kind}); give the tokenizer the data was preprocessed with")


def _check_context_parallel(args: argparse.Namespace) -> None:
    """Megatron's context parallelism runs only in Transformer Engine's attention
    (``TEDotProductAttention``) on a GPU; with the local attention both ranks die after the
    model is built, on Megatron's assertion. Without CUDA the CPU runtime serves the local layer
    spec a context-parallel attention (:mod:`megatron_endprompt.runtime.cp_attention`), so CP is
    accepted where that runtime layer is installed."""
    import importlib.util

    cp = getattr(args, "context_parallel_size", 1) or 1
    if cp <= 1 or installed_layers()["cpu"]:
        return
    impl = getattr(args, "transformer_impl", None)
    te = importlib.util.find_spec("transformer_engine") is not None
    if impl != "transformer_engine" or not te:
        why = (f"--transformer-impl is {impl}" if impl != "transformer_engine"
               else "Transformer Engine is not installed")
        raise UserError(f"--context-parallel-size {cp} needs Transformer Engine's attention "
                        f"({why}); use --transformer-impl transformer_engine on GPUs with "
                        "Transformer Engine, or --context-parallel-size 1")


def parse_args_checked(argv: list[str], extra_args_provider) -> argparse.Namespace:
    """Megatron's ``parse_and_validate_args`` (it reads ``sys.argv``), with the flags it
    divides by and the tokenizer it builds checked first, and its bare ``assert``s in
    ``validate_args`` (e.g. ``--save`` without ``--save-interval``) turned into one line quoting
    the failed condition."""
    import traceback

    from megatron.training.arguments import parse_and_validate_args

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    pre.add_argument("--tokenizer-type")
    pre.add_argument("--tokenizer-model")
    known, _ = pre.parse_known_args(argv)
    _check_tokenizer(known)  # Megatron's parse builds the tokenizer: a missing one raised there
    if known.make_vocab_size_divisible_by < 1:
        raise UserError(f"--make-vocab-size-divisible-by {known.make_vocab_size_divisible_by} "
                        "must be >= 1 (128 is Megatron's default)")
    try:
        return parse_and_validate_args(extra_args_provider=extra_args_provider)
    except AssertionError as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else (frame.line or "")
        raise UserError(f"Megatron refused the flags: {detail} (megatron {where}); set the "
                        "flags it names") from None
