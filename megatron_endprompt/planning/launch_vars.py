"""The planner's side of examples/pretrain_llama3_endprompt.sh: the script's defaults (read from
the script itself, so the planner plans what the script launches) and the ready-to-paste line of
script variables for a plan, with the wall-clock and per-save checkpoint size that go with it.

One source: :func:`script_defaults` parses the script's ``VAR=${VAR:-default}`` lines and its
``--recompute-granularity`` flag; nothing here repeats a value of the script.
"""

from __future__ import annotations

import math
import os
import re

from megatron_endprompt.errors import UserError
from megatron_endprompt.planning.plan import MethodPlan, PlanSettings, total_params
from megatron_endprompt.planning.presets import MODEL_PRESETS

__all__ = ["LAUNCH_SCRIPT", "PLANNER_VARIABLES", "SCRIPT_MODEL", "checkpoint_bytes",
           "launch_line", "model_note", "script_defaults", "wall_clock_hours"]

#: The model the script builds when CHECKPOINT_IN carries no conversion record.
SCRIPT_MODEL = "llama3-8b"

#: The launch script of this checkout (``--launch-script`` names another).
LAUNCH_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples", "pretrain_llama3_endprompt.sh")

#: The script's variables the planner takes defaults from (``RECOMPUTE``: its
#: ``--recompute-granularity`` value, which is not a variable of the script).
PLANNER_VARIABLES = ("TP", "PP", "CP", "GPUS_PER_NODE", "MICRO_BATCH", "GLOBAL_BATCH",
                     "SEQ_LENGTH", "ORIGINAL_LENGTH", "TARGET_LENGTH", "RECOMPUTE")

_DEFAULT_LINE = re.compile(r"^([A-Z][A-Z0-9_]*)=\$\{\1:-([^}$]*)\}", re.M)
_RECOMPUTE = re.compile(r"--recompute-granularity[ =]+([a-z]+)")

#: Bytes per parameter in a ``torch_dist`` save with the distributed Adam optimizer: bf16
#: weights (2) + fp32 main weights (4) + Adam first and second moments (4 + 4).
CHECKPOINT_BYTES_PER_PARAM = 14


def script_defaults(path: str = LAUNCH_SCRIPT) -> dict[str, str]:
    """``{VAR: default}`` for :data:`PLANNER_VARIABLES`, read from the launch script at
    ``path``; ``RECOMPUTE`` is ``none`` when the script passes no ``--recompute-granularity``.
    :class:`UserError` naming ``--launch-script`` when the file is missing or lacks one."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UserError(f"--launch-script {path}: cannot read it ({exc.strerror}); the planner "
                        "takes its defaults from the launch script: give its path") from None
    except UnicodeDecodeError:
        raise UserError(f"--launch-script {path}: not a text file (not UTF-8); give the "
                        "EndPrompt launch script") from None
    found = dict(_DEFAULT_LINE.findall(text))
    recompute = _RECOMPUTE.search(text)
    found["RECOMPUTE"] = recompute.group(1) if recompute else "none"
    missing = [v for v in PLANNER_VARIABLES if not found.get(v)]
    if missing:
        raise UserError(f"--launch-script {path}: no VAR=${{VAR:-default}} line for "
                        f"{', '.join(missing)}; give the EndPrompt launch script")
    return {v: found[v] for v in PLANNER_VARIABLES}


def checkpoint_bytes(s: PlanSettings) -> float:
    """One save: all parameters x :data:`CHECKPOINT_BYTES_PER_PARAM` (8.03e9 x 14 = 112 GB for
    Llama-3 8B); weights only would be 2 bytes a parameter."""
    return total_params(s.model) * CHECKPOINT_BYTES_PER_PARAM


def wall_clock_hours(s: PlanSettings, plan: MethodPlan) -> float:
    """Hours for the token budget at the plan's tokens/s (all GPUs together)."""
    return s.tokens / plan.tokens_per_second / 3600


def _other_model(s: PlanSettings) -> bool:
    return s.model != MODEL_PRESETS[SCRIPT_MODEL]


def model_note(s: PlanSettings) -> str | None:
    """For a model other than the script's own (Llama-3 8B), how the launch gets it: from
    ``CHECKPOINT_IN``'s conversion record (``None`` for Llama-3 8B)."""
    if not _other_model(s):
        return None
    return (f"model: {s.model.name} comes from CHECKPOINT_IN: convert it with "
            "tools/convert_checkpoint.py hf-to-megatron --hf-dir HF_DIR --output DIR (which "
            "records the model beside the checkpoint) and set CHECKPOINT_IN=DIR; the script's "
            "own shape is Llama-3 8B")


def launch_line(s: PlanSettings, plan: MethodPlan, gpus_per_node: int = 8) -> str:
    """``TP=.. PP=.. CP=.. MICRO_BATCH=.. GLOBAL_BATCH=.. NNODES=.. GPUS_PER_NODE=..
    SEQ_LENGTH=.. TARGET_LENGTH=.. TRAIN_ITERS=..`` for the launch script (EndPrompt plan);
    for a model other than Llama-3 8B it starts with ``CHECKPOINT_IN='<...>'``: the launcher
    takes that model from the converted checkpoint (:func:`model_note`)."""
    nodes = max(1, math.ceil(s.gpus / gpus_per_node))
    per_node = min(gpus_per_node, s.gpus)
    iters = max(1, math.ceil(s.tokens / (plan.global_batch * plan.seq_length)))
    lay = plan.layout
    ckpt = f"CHECKPOINT_IN='<{s.model.name} converted by hf-to-megatron>' " \
        if _other_model(s) else ""
    return (f"{ckpt}TP={lay.tp} PP={lay.pp} CP={lay.cp} MICRO_BATCH={s.micro_batch} "
            f"GLOBAL_BATCH={plan.global_batch} NNODES={nodes} GPUS_PER_NODE={per_node} "
            f"SEQ_LENGTH={s.seq_length} ORIGINAL_LENGTH={s.model.original_window} "
            f"TARGET_LENGTH={s.target_length} TRAIN_ITERS={iters}")
