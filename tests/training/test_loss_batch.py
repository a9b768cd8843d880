"""Weighted loss normaliser (unit level)."""

from __future__ import annotations

import torch

from megatron_endprompt.training.loss import weighted_loss_terms


def test_weighted_loss_is_exact_and_reports_unweighted_parts():
    losses = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    weights = torch.tensor([[1.0, 1.0, 1.0, 0.25, 0.25, 0.0]])
    terminal = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0, 1.0]])
    loss_sum, count, report = weighted_loss_terms(losses, weights, terminal)
    assert loss_sum.item() == 1 + 2 + 3 + 0.25 * 4 + 0.25 * 5
    assert count.item() == 5 and count.dtype == torch.int32
    # stock Megatron would use int(sum(w)) = int(3.5) = 3 as the count
    assert torch.equal(report["lm loss"], torch.tensor([8.25, 5.0]))
    assert torch.equal(report["context loss"], torch.tensor([3.0, 2.0]))
    assert torch.equal(report["terminal loss"], torch.tensor([12.0, 3.0]))


def test_normaliser_is_exact_across_micro_batches():
    """Megatron sums (numerator, count) over micro-batches and DP ranks, then divides once."""
    g = torch.Generator().manual_seed(0)
    mbs = [(torch.rand(2, 16, generator=g), (torch.rand(2, 16, generator=g) > 0.3).float() * 0.5)
           for _ in range(3)]
    num = sum(weighted_loss_terms(l, w, None)[0] for l, w in mbs)
    den = sum(weighted_loss_terms(l, w, None)[1] for l, w in mbs)
    all_l = torch.cat([l for l, _ in mbs])
    all_w = torch.cat([w for _, w in mbs])
    expected = (all_l * all_w).sum() / (all_w > 0).sum()
    torch.testing.assert_close(num / den, expected, rtol=0, atol=1e-6)


