"""Start-up checks of ``examples/pretrain_llama3_endprompt.sh``, run before ``torchrun`` by the
real launch and by ``--dry-run`` alike (the same function, so a dry run that passes launches).

The script passes its resolved variables (``TP=4 PP=1 ... DATA_BLEND=...``); every value is
validated here and the first problem is raised as one :class:`UserError` naming the variable
and the fix (the CLI prints ``error: ...`` and exits 2). Without this, bash reports ``TP=abc`` as
"integer expression expected" and carries on, a bad ``TP`` or ``NODE_RANK`` surfaces as a
torchrun/Megatron traceback on every rank, and a split that leaves the validation split of a
small corpus empty makes Megatron's index build spin without an error.

Checked: integer variables; the parallel layout (``TP`` within a node and dividing the heads and
KV heads, ``TP x PP x CP`` dividing the world, the global batch divisible by ``MICRO_BATCH x DP``);
the window via :class:`~megatron_endprompt.window.EndPromptWindow` (``P < L``, ``L >= L0``) and
``PI_FACTOR x L0 >= L``; ``DATA_BLEND`` (weight/prefix pairs, no glob characters),
``REPLAY_PREFIXES`` inside the blend, ``SPLIT``, ``SIDECAR_NAME``; and, unless a value is a
``<PLACEHOLDER>`` of a dry run, that the paths exist, every non-replay prefix has its sidecar
(the existing ones are listed when not) and no split with a non-zero weight gets 0 documents.
With a converted ``CHECKPOINT_IN`` (its ``endprompt_conversion.json``,
:mod:`megatron_endprompt.model_record`) the model is the checkpoint's: its flags replace the
script's Llama-3 8B shape, the heads, layers and vocabulary padding are checked against it, and
a given ``ROPE_BASE``/``NUM_QUERY_GROUPS``/``FFN_HIDDEN``/``ORIGINAL_LENGTH`` or extra shape flag
that contradicts it is refused, so a dry run that passes does not die at load. Each
non-replay sidecar's header is read: its ``P`` and ``L`` against ``SEQ_LENGTH`` and
``TARGET_LENGTH`` (the check every rank makes after start-up, here naming the variable). A
``CHECKPOINT_OUT`` holding a run is checked for a schedule Megatron would refuse to resume
(:mod:`megatron_endprompt.training.launch_resume`), and ``--transformer-impl`` is chosen for
the machine (:func:`transformer_impl`).
"""

from __future__ import annotations

import glob
import importlib.util
import math
import os
import struct
import sys
from collections.abc import Mapping

from megatron_endprompt.data.prepare.prefix_name import resolve_prefix
from megatron_endprompt.data.sidecar.sidecar import (
    check_belongs_to,
    check_sidecar_name,
    open_sidecar,
    sidecar_path,
)
from megatron_endprompt.errors import UserError
from megatron_endprompt.model_record import ModelRecord, read_model_record
from megatron_endprompt.training.checks import check_transformer_impl
from megatron_endprompt.training.launch_resume import check_resume_schedule
from megatron_endprompt.window import LAUNCH_FLAGS, EndPromptWindow

__all__ = ["LLAMA3_8B_HEADS", "LLAMA3_8B_LAYERS", "check_launch", "split_documents",
           "transformer_impl"]

#: The shape the shipped script launches (Llama-3 8B): attention heads and layers.
LLAMA3_8B_HEADS = 32
LLAMA3_8B_LAYERS = 32

_POSITIVE = ("NNODES", "GPUS_PER_NODE", "TP", "PP", "CP", "MICRO_BATCH", "GLOBAL_BATCH",
             "TRAIN_ITERS", "SEQ_LENGTH", "ORIGINAL_LENGTH", "TARGET_LENGTH", "NUM_QUERY_GROUPS",
             "SAVE_INTERVAL", "EVAL_INTERVAL", "LOG_INTERVAL", "MASTER_PORT")
_NON_NEGATIVE = ("NODE_RANK", "WARMUP_ITERS", "EVAL_ITERS", "SEED")
_SPLIT_NAMES = ("train", "valid", "test")

#: Launcher variables that shape the model, and the Megatron flag each sets.
MODEL_VARS = {"ROPE_BASE": "--rotary-base", "NUM_QUERY_GROUPS": "--num-query-groups",
              "FFN_HIDDEN": "--ffn-hidden-size"}


def _int(env: Mapping[str, str], name: str, minimum: int) -> int:
    text = env.get(name, "")
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"{name}={text!r} is not an integer; set {name} to an integer "
                        f">= {minimum}") from None
    if value < minimum:
        raise UserError(f"{name}={value} must be >= {minimum}")
    return value


def _stop_poll(text: str | None) -> None:
    """``STOP_POLL_SECONDS``: ``sleep``'s argument between checks after a stop request, a
    number of seconds > 0 (a bad one would make every check fail only once a stop comes)."""
    if text is None:
        return
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise UserError(f"STOP_POLL_SECONDS={text!r}: give seconds > 0, e.g. 2 or 0.5")


def _placeholder(value: str) -> bool:
    return value.startswith("<") and value.endswith(">")


def _blend(env: Mapping[str, str]) -> list[str]:
    """The prefixes of ``DATA_BLEND`` (weight/prefix pairs) or ``[DATA_PREFIX]``."""
    text = env.get("DATA_BLEND", "").strip()
    if not text:
        prefix = env.get("DATA_PREFIX", "")
        if glob.has_magic(prefix):
            raise UserError(f"DATA_PREFIX={prefix}: glob characters (* ? [) are not expanded; "
                            "give one prefix or a DATA_BLEND")
        return [prefix]
    tokens = text.split()
    for tok in tokens:
        if glob.has_magic(tok):
            raise UserError(f"DATA_BLEND: {tok} has glob characters (* ? [), which Megatron "
                            "does not expand; list each prefix with its weight")
    if len(tokens) % 2:
        raise UserError(f"DATA_BLEND has {len(tokens)} values; give weight/prefix pairs "
                        "\"W1 PREFIX1 W2 PREFIX2 ...\"")
    for w, p in zip(tokens[0::2], tokens[1::2]):
        try:
            weight = float(w)
        except ValueError:
            raise UserError(f"DATA_BLEND: {w!r} (before {p}) is not a weight; give weight/prefix "
                            "pairs \"W1 PREFIX1 W2 PREFIX2 ...\"") from None
        if not (math.isfinite(weight) and weight > 0):
            raise UserError(f"DATA_BLEND: weight {w} of {p} must be > 0; drop the prefix instead")
    return tokens[1::2]


def _split(text: str) -> list[float]:
    try:
        parts = [float(v) for v in text.replace("/", ",").split(",")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or any(not math.isfinite(v) or v < 0 for v in parts) \
            or sum(parts) <= 0:
        raise UserError(f"SPLIT={text!r}: give train,valid,test weights >= 0, e.g. 998,1,1 or "
                        "90,5,5")
    parts += [0.0] * (3 - len(parts))
    total = sum(parts)
    return [v / total for v in parts]


def split_documents(split: list[float], num_documents: int) -> list[int]:
    """Documents per split as Megatron's ``_get_split_indices`` assigns them (bounds rounded
    from the normalised weights, the last bound corrected to the total)."""
    bounds = [0]
    for w in split:
        bounds.append(bounds[-1] + int(round(w * float(num_documents))))
    bounds = [b - (bounds[-1] - num_documents) if i else b for i, b in enumerate(bounds)]
    return [max(0, b - a) for a, b in zip(bounds[:-1], bounds[1:])]


def _idx_documents(path: str) -> int:
    """Documents in a Megatron ``.idx`` (header: magic 9 B, version 8 B, dtype 1 B, sequence
    count 8 B, document count 8 B; the document index holds count + 1 bounds)."""
    with open(path, "rb") as f:
        head = f.read(34)
    if len(head) < 34 or not head.startswith(b"MMIDIDX"):
        raise UserError(f"{path}: not a Megatron .idx file; re-run tools/preprocess_endprompt.py")
    return struct.unpack("<Q", head[26:34])[0] - 1


def _existing_sidecars(prefix: str) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(glob.escape(prefix) + "*.endprompt"))


def _check_sidecar(prefix: str, name: str | None, seq_length: int, target_length: int) -> None:
    """The sidecar's header against the launch (what the pretrain entry's ``find_sidecar``
    checks once every rank has started): its ``.bin``/``.idx`` sizes, ``P`` against
    ``SEQ_LENGTH`` and ``L`` against ``TARGET_LENGTH``, naming the variable. Reads the header
    only."""
    path = sidecar_path(prefix, name)
    sidecar = open_sidecar(path)  # header checksum and every value validated
    check_belongs_to(sidecar, prefix, full=False)
    layout = sidecar.layout
    rebuild = (f"tools/build_endprompt_sidecar.py --data-prefix {prefix}"
               f"{' --name ' + name if name else ''}")
    if layout.seq_length != seq_length:
        raise UserError(f"SEQ_LENGTH={seq_length}, but {path} was built for P = "
                        f"{layout.seq_length}: set SEQ_LENGTH={layout.seq_length}, or rebuild "
                        f"the sidecar with {rebuild} --seq-length {seq_length}")
    if layout.target_length != target_length:
        raise UserError(f"TARGET_LENGTH={target_length}, but {path} was built for L = "
                        f"{layout.target_length}: set TARGET_LENGTH={layout.target_length}, or "
                        f"rebuild the sidecar with {rebuild} --target-length {target_length} "
                        "(the .bin/.idx stay)")


def _check_prefix(prefix: str, name: str | None, split: list[float], env: Mapping[str, str],
                  replay: bool) -> None:
    for suffix in (".bin", ".idx"):
        if not os.path.isfile(prefix + suffix):
            raise UserError(f"{prefix}{suffix} not found; give the prefix written by "
                            "tools/preprocess_endprompt.py --output-prefix")
    if not replay and not os.path.isfile(sidecar_path(prefix, name)):
        have = _existing_sidecars(prefix)
        listed = f"; sidecars there: {', '.join(have)}" if have else "; no sidecar exists there"
        raise UserError(f"{prefix}: no sidecar {os.path.basename(sidecar_path(prefix, name))}"
                        f" (SIDECAR_NAME={name or ''}){listed}; fix SIDECAR_NAME, build it with "
                        "tools/build_endprompt_sidecar.py or list the prefix in REPLAY_PREFIXES")
    if not replay:
        _check_sidecar(prefix, name, int(env["SEQ_LENGTH"]), int(env["TARGET_LENGTH"]))
    docs = _idx_documents(prefix + ".idx")
    counts = split_documents(split, docs)
    for split_name, w, n in zip(_SPLIT_NAMES, split, counts):
        if w > 0 and n == 0:
            raise UserError(f"SPLIT={env.get('SPLIT')} leaves the {split_name} split of {prefix}"
                            f" empty ({docs} documents: {'/'.join(map(str, counts))}); use a "
                            "coarser split, e.g. SPLIT=90,5,5")


def _model_from_checkpoint(env: dict[str, str], extra: list[str]) -> ModelRecord | None:
    """``CHECKPOINT_IN``'s conversion record, with the variables it decides filled into ``env``
    (``ORIGINAL_LENGTH``, ``NUM_QUERY_GROUPS`` unless given: ``MODEL_VARS_GIVEN``); a given
    variable or extra flag contradicting it is refused. ``None``: no record (the script's
    Llama-3 8B shape, the variables as given)."""
    ckpt = env.get("CHECKPOINT_IN", "")
    record = None if _placeholder(ckpt) or not os.path.isdir(ckpt) else read_model_record(ckpt)
    if record is None:
        return None
    given = set(env.get("MODEL_VARS_GIVEN", "").split())
    record.check_given({var: (flag, env.get(var, "")) for var, flag in MODEL_VARS.items()
                        if var in given}, extra)
    window = str(record.max_position_embeddings)
    if "ORIGINAL_LENGTH" in given and env.get("ORIGINAL_LENGTH", "").strip() != window:
        raise UserError(f"ORIGINAL_LENGTH={env.get('ORIGINAL_LENGTH')} contradicts the checkpoint "
                        f"({record.path}: --max-position-embeddings {window}, the model's "
                        f"original window L0); unset ORIGINAL_LENGTH: the launcher takes L0 from "
                        "the checkpoint")
    env["ORIGINAL_LENGTH"] = window
    env["NUM_QUERY_GROUPS"] = str(record.query_groups)
    return record


def _te_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def _cuda_available() -> bool:
    import torch  # only where Transformer Engine is installed (torch loads in seconds)

    return torch.cuda.is_available()


def transformer_impl(extra: list[str]) -> tuple[str, str]:
    """The ``--transformer-impl`` the machine can run and why (the script's one note line):
    ``transformer_engine`` where Transformer Engine is installed and a CUDA GPU is visible, else
    ``local`` (Megatron's own layers, which also run on a CPU). A ``--transformer-impl`` among
    the ``extra`` flags is the user's choice: kept, and refused here when it is
    ``transformer_engine`` without a GPU (each rank would refuse it after start-up)."""
    given = [f.partition("=")[2] or (extra[i + 1] if i + 1 < len(extra) else "")
             for i, f in enumerate(extra) if f.partition("=")[0] == "--transformer-impl"]
    if given:
        if given[-1] == "transformer_engine":
            if not _cuda_available():
                check_transformer_impl(given[-1])  # the pretrain entry's one line
            if not _te_installed():
                raise UserError("--transformer-impl transformer_engine: Transformer Engine is "
                                "not installed; install it, or drop the flag (the launcher "
                                "then uses --transformer-impl local)")
        return given[-1], "given"
    if not _te_installed():
        return "local", ("Transformer Engine is not installed; on GPUs install it for "
                         "transformer_engine")
    if not _cuda_available():
        return "local", "no CUDA GPU visible"
    return "transformer_engine", "a CUDA GPU and Transformer Engine are present"


def check_launch(env: Mapping[str, str],
                 extra: list[str] | None = None) -> dict[str, str | list[str]]:
    """Validate the launch variables ``env`` (and the extra Megatron flags ``extra``); returns
    the values the script derives (``PI_FACTOR``, ``SEQUENCE_PARALLEL`` 0/1; with a converted
    ``CHECKPOINT_IN``, ``ORIGINAL_LENGTH`` and ``MODEL_FLAGS`` from its record, a list).
    Raises :class:`UserError` (one line)."""
    env = dict(env)
    record = _model_from_checkpoint(env, list(extra or []))
    heads = record.heads if record else LLAMA3_8B_HEADS
    layers = record.layers if record else LLAMA3_8B_LAYERS
    v = {name: _int(env, name, 1) for name in _POSITIVE}
    v.update({name: _int(env, name, 0) for name in _NON_NEGATIVE})
    for name in ("STOP_GRACE", "SHUTDOWN_TIMEOUT"):  # bash's arithmetic after a stop
        if name in env:
            _int(env, name, 0)
    _stop_poll(env.get("STOP_POLL_SECONDS"))
    tp, pp, cp = v["TP"], v["PP"], v["CP"]
    lr = env.get("LR", "2e-5")  # the script always passes it
    try:
        if not (math.isfinite(float(lr)) and float(lr) > 0):
            raise ValueError
    except ValueError:
        raise UserError(f"LR={lr!r}: give a learning rate > 0, e.g. 2e-5") from None
    if v["MASTER_PORT"] > 65535:
        raise UserError(f"MASTER_PORT={v['MASTER_PORT']} is not a TCP port; give one in "
                        "1..65535 (e.g. 6000)")
    if v["NODE_RANK"] >= v["NNODES"]:
        raise UserError(f"NODE_RANK={v['NODE_RANK']} must be below NNODES={v['NNODES']} "
                        "(ranks count from 0)")
    if tp > v["GPUS_PER_NODE"] or v["GPUS_PER_NODE"] % tp:
        raise UserError(f"TP={tp} must divide GPUS_PER_NODE={v['GPUS_PER_NODE']} (tensor "
                        "parallelism stays within a node)")
    for what, n in (("attention heads", heads),
                    ("KV heads (NUM_QUERY_GROUPS)", v["NUM_QUERY_GROUPS"])):
        if n % tp:
            raise UserError(f"TP={tp} must divide the {n} {what}; use TP=1, 2, 4 or 8")
    if layers % pp:
        raise UserError(f"PP={pp} must divide the {layers} layers")
    if record is not None:
        record.check_padding(tp)
    world = v["NNODES"] * v["GPUS_PER_NODE"]
    if world % (tp * pp * cp):
        raise UserError(f"TP*PP*CP={tp * pp * cp} must divide the {world} GPUs "
                        f"(NNODES={v['NNODES']} x GPUS_PER_NODE={v['GPUS_PER_NODE']})")
    dp = world // (tp * pp * cp)
    if v["GLOBAL_BATCH"] % (v["MICRO_BATCH"] * dp):
        raise UserError(f"GLOBAL_BATCH={v['GLOBAL_BATCH']} must be a multiple of MICRO_BATCH x DP"
                        f" = {v['MICRO_BATCH']} x {dp}")
    P, L, L0 = v["SEQ_LENGTH"], v["TARGET_LENGTH"], v["ORIGINAL_LENGTH"]
    if cp > 1 and P % (2 * cp):
        raise UserError(f"CP={cp} needs SEQ_LENGTH={P} divisible by 2*CP={2 * cp}")
    need = math.ceil(L / L0)
    s_text = env.get("PI_FACTOR", "").strip()
    try:
        s = float(s_text) if s_text else float(need)
    except ValueError:
        raise UserError(f"PI_FACTOR={s_text!r} is not a number; unset it for ceil(L/L0)") from None
    try:
        window = EndPromptWindow(target_length=L, seq_length=P, original_length=L0,
                                 pi_factor=s, flags=LAUNCH_FLAGS)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not window.positions_fit:
        raise UserError(f"PI_FACTOR={s_text} with TARGET_LENGTH={L}: positions reach "
                        f"L/s = {L / s:g} > ORIGINAL_LENGTH={L0}; set PI_FACTOR={need} "
                        "(ceil(L/L0)) or unset it")
    prefixes = _blend(env)
    replay = env.get("REPLAY_PREFIXES", "").split()
    for r in replay:
        if not any(os.path.abspath(r) == os.path.abspath(p) for p in prefixes):
            raise UserError(f"REPLAY_PREFIXES: {r} is not a prefix of DATA_BLEND/DATA_PREFIX; "
                            "fix the path")
    split = _split(env.get("SPLIT", ""))
    name = env.get("SIDECAR_NAME", "").strip() or None
    if name is not None:
        check_sidecar_name(name)
    tokenizer = env.get("TOKENIZER", "")
    if not _placeholder(tokenizer) and not os.path.exists(tokenizer):
        raise UserError(f"TOKENIZER={tokenizer}: not found; give the HF tokenizer directory (or "
                        "a SentencePiece .model with TOKENIZER_TYPE)")
    ckpt_in = env.get("CHECKPOINT_IN", "")
    if not _placeholder(ckpt_in) and not os.path.isdir(ckpt_in):
        raise UserError(f"CHECKPOINT_IN={ckpt_in}: not a directory; convert the base model with "
                        "tools/convert_checkpoint.py hf-to-megatron")
    for given in prefixes:
        if not _placeholder(given):
            replayed = any(os.path.abspath(r) == os.path.abspath(given) for r in replay)
            prefix, note = resolve_prefix(given)  # training resolves it the same way
            if note:
                print(note, file=sys.stderr)
            _check_prefix(prefix, name, split, env, replayed)
    seq_par = env.get("SEQUENCE_PARALLEL", "auto").strip().lower()
    if seq_par not in ("auto", "0", "1"):
        raise UserError(f"SEQUENCE_PARALLEL={seq_par!r}: give auto, 0 or 1")
    if seq_par == "auto":  # needs Transformer Engine's sequence-parallel layers
        te = importlib.util.find_spec("transformer_engine") is not None
        seq_par = "1" if tp > 1 and te else "0"
    if seq_par == "1" and tp == 1:
        seq_par = "0"  # Megatron ignores it at TP=1 (and warns)
    check_resume_schedule(env, list(extra or []))
    impl, why = transformer_impl(list(extra or []))
    derived = {"PI_FACTOR": f"{s:g}", "SEQUENCE_PARALLEL": seq_par, "TRANSFORMER_IMPL": impl,
               "TRANSFORMER_IMPL_WHY": why}
    if record is not None:
        derived.update(ORIGINAL_LENGTH=str(L0), MODEL_FLAGS=list(record.flags))
    return derived
