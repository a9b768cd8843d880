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
              output_tensor: torch.Tensor):
    """Megatron ``loss_func`` (3-tuple form for ``--calculate-per-token-loss``)."""
    return weighted_loss_terms(output_tensor, loss_mask, terminal_mask)
