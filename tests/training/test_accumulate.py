"""Element-share accumulation weights and the masked per-sample MSE."""

from __future__ import annotations

import pytest
import torch

from hotstep_ray.training.accumulate import masked_mse, micro_batch_weights

# Tolerances: assert_close's float32 defaults (rtol 1.3e-6 ~ 11 ulp, atol 1e-5). The two sides
# reduce the same <= 210 squared errors (|loss| ~ 2) in different orders: a few ulp of |loss|
# per reduction level (~5e-7), inside the defaults on any CPU; a wrong weight moves it by O(0.1).


def _window(seed: int = 0):
    """7 samples of different valid lengths (T = 10, C = 3), cut into micro-batches of 3, 3, 1."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [10, 4, 7, 9, 2, 10, 5]
    pred = torch.randn(7, 10, 3, generator=generator)
    target = torch.randn(7, 10, 3, generator=generator)
    mask = torch.arange(10)[None, :] < torch.tensor(lengths)[:, None]  # [7, 10]
    per_sample = torch.stack(
        [(pred[i, :n] - target[i, :n]).square().mean() for i, n in enumerate(lengths)]
    )
    cuts = [(0, 3), (3, 6), (6, 7)]
    return pred, target, mask, per_sample, cuts


def test_weights_are_element_shares():
    assert micro_batch_weights([3, 3, 1]) == [3 / 7, 3 / 7, 1 / 7]
    assert micro_batch_weights([1, 1, 1, 1]) == [0.25] * 4  # batch 1: same as 1/GA
    with pytest.raises(ValueError):
        micro_batch_weights([0, 0])


def test_weighted_micro_batches_equal_the_window_mean_of_per_sample_means():
    pred, target, mask, per_sample, cuts = _window()
    weights = micro_batch_weights([b - a for a, b in cuts])
    losses = [masked_mse(pred[a:b], target[a:b], mask[a:b]) for a, b in cuts]
    total = sum(w * loss for w, loss in zip(weights, losses, strict=True))
    torch.testing.assert_close(total, per_sample.mean())  # float32 defaults (top of file)
    # The naive 1/n_micro_batches gives the lone tail sample 3x the weight of the others.
    naive = sum(loss / len(cuts) for loss in losses)
    assert not torch.allclose(naive, per_sample.mean())  # off by O(|loss|), not by round-off
    sizes = [b - a for a, b in cuts]
    naive_per_sample = [1 / len(cuts) / n for n in sizes]  # [1/9, 1/9, 1/3]
    # B / n_tail, in Python float64: a few ulp from 3 (approx's default rel 1e-6)
    assert naive_per_sample[-1] / naive_per_sample[0] == pytest.approx(3.0)
    share_per_sample = [w / n for w, n in zip(weights, sizes, strict=True)]
    # every sample counts the same; float64 ratios: a few ulp (approx's default rel 1e-6)
    assert share_per_sample == pytest.approx([1 / 7] * 3)


def test_accumulated_gradients_equal_the_window_gradient():
    _, target, mask, _, cuts = _window(1)
    pred = torch.randn(7, 10, 3, requires_grad=True)
    masked_mse(pred, target, mask).backward()
    whole = pred.grad.clone()
    pred.grad = None
    weights = micro_batch_weights([b - a for a, b in cuts])
    for weight, (a, b) in zip(weights, cuts, strict=True):
        (weight * masked_mse(pred[a:b], target[a:b], mask[a:b])).backward()
    # float32 defaults: each element is 2(p - t)·w/n, a few roundings of |grad| <= 0.2 apart;
    # the naive weighting would be 3x off on the tail sample
    torch.testing.assert_close(pred.grad, whole)


def test_padding_never_reaches_the_loss_or_its_gradient():
    pred, target, mask, per_sample, _ = _window(2)
    dirty = pred.clone()
    dirty[~mask] = 1e6  # garbage in the padded frames
    dirty.requires_grad_(True)
    loss = masked_mse(dirty, target, mask)
    torch.testing.assert_close(loss, per_sample.mean())  # float32 defaults (top of file)
    loss.backward()
    assert torch.equal(dirty.grad[~mask], torch.zeros_like(dirty.grad[~mask]))


def test_sample_and_element_weights():
    pred, target, mask, per_sample, _ = _window(3)
    weights = torch.tensor([1.0, 2.0, 0.5, 1.0, 1.0, 0.0, 1.5])
    torch.testing.assert_close(  # float32 defaults (top of file)
        masked_mse(pred, target, mask, weights=weights), (per_sample * weights).mean()
    )
    channel = torch.tensor([1.0, 0.0, 0.0])  # only channel 0 counts, still divided by all 3
    expected = torch.stack(
        [(pred[i, mask[i], 0] - target[i, mask[i], 0]).square().sum() / (mask[i].sum() * 3)
         for i in range(7)]
    ).mean()  # fmt: skip
    # float32 defaults (top of file), both
    torch.testing.assert_close(masked_mse(pred, target, mask, element_weights=channel), expected)
    torch.testing.assert_close(masked_mse(pred, target), (pred - target).square().mean())
