"""Weighted per-token loss with an exact normaliser.

``loss_mask`` carries weights: context ``1`` (or the context weight), terminal ``w``, ``0``
for ignored tokens. Megatron's stock ``loss_func`` returns ``loss_mask.sum().to(int)`` as the
token count, which truncates a weight sum like ``3.75`` to ``3``. We define:

    training loss = sum_i w_i * l_i  /  #{i : w_i > 0}

summed over every micro-batch, DP and CP rank of the global batch: the numerator is what we
return as the loss, the denominator (an exact integer) as ``num_tokens``; Megatron's
``--calculate-per-token-loss`` path all-reduces both and divides once
(``finalize_model_grads`` for gradients, ``train_step`` for the logged value). The reported
``context loss`` and ``terminal loss`` are *unweighted* means over their supervised tokens.
"""

from __future__ import annotations

import torch


def weighted_loss_terms(
    losses: torch.Tensor, loss_mask: torch.Tensor, terminal_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``losses``/``loss_mask``/``terminal_mask``: ``[B, S]``. Returns ``(sum w*l, count,
    report)`` where each report value is ``[numerator, denominator]`` (float32)."""
    losses = losses.float().reshape(-1)
    weights = loss_mask.float().reshape(-1)
    supervised = weights > 0
    loss_sum = torch.sum(losses * weights)
    count = supervised.sum()
    report = {"lm loss": torch.stack([loss_sum.detach(), count.float()])}
    if terminal_mask is not None:
        term = supervised & (terminal_mask.reshape(-1) > 0)
        ctx = supervised & ~term
        detached = losses.detach()
        report["context loss"] = torch.stack([(detached * ctx).sum(), ctx.sum().float()])
        report["terminal loss"] = torch.stack([(detached * term).sum(), term.sum().float()])
    return loss_sum, count.to(torch.int), report


def loss_func(loss_mask: torch.Tensor, terminal_mask: torch.Tensor | None,
              output_tensor: torch.Tensor, *, loss_log: str | None = None):
    """Megatron ``loss_func`` (3-tuple form for ``--calculate-per-token-loss``)."""
    loss_sum, count, report = weighted_loss_terms(output_tensor, loss_mask, terminal_mask)
    if loss_log is not None and torch.is_grad_enabled():
        _append_loss_record(loss_log, report)
    return loss_sum, count, report


def _append_loss_record(directory: str, report: dict[str, torch.Tensor]) -> None:
    """``--endprompt-loss-log DIR``: one JSON line per training micro-batch with the exact
    ``[numerator, denominator]`` pairs, per rank (TP rank 0 of the last stage writes). Summing
    an iteration's pairs over micro-batches and ranks gives its exact loss — Megatron's
    printed value is a running average at 7 digits. Costs a device sync; debugging aid."""
    import json
    import os

    from megatron.core import parallel_state as mpu
    from megatron.training import get_args

    if mpu.get_tensor_model_parallel_rank() != 0:
        return
    os.makedirs(directory, exist_ok=True)
    record = {"iteration": int(get_args().curr_iteration) + 1}
    record.update({k: [float(x) for x in v.tolist()] for k, v in report.items()})
    path = os.path.join(directory, f"rank{torch.distributed.get_rank()}.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_loss_log(directory: str, key: str = "lm loss") -> dict[int, float]:
    """Exact per-iteration loss ``{iteration: sum(num) / sum(den)}`` from a loss log."""
    import glob
    import json

    sums: dict[int, list[float]] = {}
    for path in glob.glob(f"{directory}/rank*.jsonl"):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                acc = sums.setdefault(rec["iteration"], [0.0, 0.0])
                acc[0] += rec[key][0]
                acc[1] += rec[key][1]
    return {it: num / den for it, (num, den) in sorted(sums.items()) if den}
