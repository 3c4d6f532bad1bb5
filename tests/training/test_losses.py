"""Losses against hand-computed values on tiny tables."""

import math

import torch
import torch.nn.functional as F

from recsys_alibi.config import TrainConfig
from recsys_alibi.training.losses import LOSSES, build_loss


def _table() -> torch.Tensor:
    # (N + 1 = 4, D = 2): row 0 padding
    return torch.tensor([[9.0, 9.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def test_full_softmax_matches_hand_value_and_ignores_padding():
    hidden = torch.tensor([[2.0, 0.0]])  # logits over items 1..3: 2, 0, 2
    loss = build_loss(TrainConfig(loss="softmax"), torch.ones(4, dtype=torch.int64))
    value = loss(hidden, torch.tensor([2]), _table())
    expected = -(0.0 - math.log(math.exp(2) + math.exp(0) + math.exp(2)))
    assert math.isclose(float(value), expected, rel_tol=1e-6)


def test_sampled_softmax_with_all_items_as_negatives_has_logq_correction():
    torch.manual_seed(0)
    cfg = TrainConfig(loss="sampled_softmax", num_negatives=64)
    counts = torch.tensor([0, 10, 10, 10])
    loss = build_loss(cfg, counts)
    hidden = torch.tensor([[1.0, 0.5], [0.2, 0.3]])
    value = loss(hidden, torch.tensor([1, 3]), _table())
    assert torch.isfinite(value) and float(value) > 0


def test_bce_and_gbce_reduce_to_log_sigmoid_terms():
    torch.manual_seed(0)
    hidden = torch.tensor([[3.0, 0.0]])
    for name in ("bce", "gbce"):
        negatives = {"num_negatives": 2} if name == "gbce" else {}  # bce draws one (num_negatives is refused)
        loss = build_loss(TrainConfig(loss=name, **negatives), torch.ones(4, dtype=torch.int64))
        value = float(loss(hidden, torch.tensor([1]), _table()))
        assert value > -F.logsigmoid(torch.tensor(3.0)).item() - 1e-6  # positive term plus negatives
    assert set(LOSSES) == {"softmax", "sampled_softmax", "bce", "gbce"}


def test_gbce_with_t_zero_equals_bce_with_same_negatives():
    # beta = alpha * (t * (1 - 1/alpha) + 1/alpha) = 1 at t = 0: plain BCE over k negatives
    torch.manual_seed(1)
    table = _table()
    hidden = torch.tensor([[0.5, -0.25]])
    loss = build_loss(TrainConfig(loss="gbce", num_negatives=3, gbce_t=0.0), torch.ones(4, dtype=torch.int64))
    torch.manual_seed(7)
    value = float(loss(hidden, torch.tensor([2]), table))
    torch.manual_seed(7)
    negatives = torch.randint(1, 4, (1, 3))
    neg = (hidden[:, None, :] * table[negatives]).sum(-1)
    neg = neg.masked_fill(negatives == 2, -math.inf)
    expected = -(F.logsigmoid((hidden * table[2]).sum(-1)) + F.logsigmoid(-neg).sum(-1)).mean()
    assert math.isclose(value, float(expected), rel_tol=1e-6)


def test_fused_full_softmax_equals_plain_cross_entropy_in_value_and_gradients():
    """Chunked fused loss (37 positions, chunks of 8: a ragged last chunk) vs float64 autograd."""
    torch.manual_seed(0)
    hidden = torch.randn(37, 5, requires_grad=True)
    table = torch.randn(12, 5, requires_grad=True)
    targets = torch.randint(1, 12, (37,))
    loss = LOSSES["softmax"](TrainConfig(), torch.ones(12, dtype=torch.int64), chunk=8)
    value = loss(hidden, targets, table)
    (2.0 * value).backward()  # a non-unit upstream gradient must scale both gradients

    ref_hidden = hidden.detach().double().requires_grad_()
    ref_table = table.detach().double().requires_grad_()
    logits = ref_hidden @ ref_table.T
    logits = logits.masked_fill(torch.arange(12) == 0, float("-inf"))
    reference = F.cross_entropy(logits, targets)
    (2.0 * reference).backward()

    assert math.isclose(float(value), float(reference), rel_tol=1e-6)
    torch.testing.assert_close(hidden.grad.double(), ref_hidden.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(table.grad.double(), ref_table.grad, atol=1e-6, rtol=1e-5)
    assert float(table.grad[0].abs().sum()) == 0.0  # padding row gets no gradient
    with torch.no_grad():  # the plain path gives the same value
        assert math.isclose(float(loss(hidden, targets, table)), float(reference), rel_tol=1e-6)


def test_fused_full_softmax_keeps_input_dtypes_under_bf16():
    hidden = torch.randn(10, 4, dtype=torch.bfloat16, requires_grad=True)
    table = torch.randn(6, 4, requires_grad=True)
    loss = LOSSES["softmax"](TrainConfig(), torch.ones(6, dtype=torch.int64), chunk=4)
    value = loss(hidden, torch.randint(1, 6, (10,)), table)
    value.backward()
    assert value.dtype == torch.float32
    assert hidden.grad.dtype == torch.bfloat16 and table.grad.dtype == torch.float32


def test_fused_full_softmax_under_bf16_autocast_is_close_to_float32():
    """bf16 products, float32 softmax: loss and gradients within bf16 rounding of float32."""
    torch.manual_seed(0)
    hidden = torch.randn(300, 16, requires_grad=True)
    table = (0.3 * torch.randn(50, 16)).requires_grad_()
    targets = torch.randint(1, 50, (300,))
    loss = LOSSES["softmax"](TrainConfig(), torch.ones(50, dtype=torch.int64), chunk=64)
    exact = loss(hidden, targets, table)
    exact.backward()
    exact_grads = hidden.grad.clone(), table.grad.clone()
    hidden.grad = table.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = loss(hidden, targets, table)
    low.backward()
    assert low.dtype == torch.float32 and hidden.grad.dtype == torch.float32
    assert float(low) != float(exact)  # the products did run in bfloat16
    assert abs(float(low) - float(exact)) < 1e-2 * float(exact)
    for got, want in zip((hidden.grad, table.grad), exact_grads):
        assert float((got - want).norm() / want.norm()) < 2e-2


def test_every_loss_ignores_positions_without_a_target():
    """Target 0 (padding) adds nothing: all positions in (as the training step passes them) give the
    value and gradients of the supervised positions alone, for the same negatives."""
    torch.manual_seed(0)
    n_rows, width = 12, 6
    table = torch.randn(n_rows, width, requires_grad=True)
    hidden = torch.randn(20, width, requires_grad=True)
    targets = torch.randint(1, n_rows, (20,))
    targets[[0, 3, 4, 11, 19]] = 0  # positions without a target
    keep = targets > 0
    counts = torch.arange(n_rows, dtype=torch.int64)
    for name in LOSSES:
        chunked = {"chunk": 7} if name == "softmax" else {}  # a ragged last chunk
        negatives = {"num_negatives": 5} if name in ("sampled_softmax", "gbce") else {}  # the losses that take it
        loss = LOSSES[name](TrainConfig(loss=name, **negatives), counts, **chunked)
        both = ({}, {})
        if name != "softmax":  # the same negatives for both calls (per position for bce / gbce)
            drawn = loss.negative_ids(targets, n_rows - 1)
            both = ({"negatives": drawn}, {"negatives": drawn if name == "sampled_softmax" else drawn[keep]})
        grads = []
        for rows, wanted, extra in ((hidden, targets, both[0]), (hidden[keep], targets[keep], both[1])):
            table.grad = hidden.grad = None
            value = loss(rows, wanted, table, **extra)
            value.backward()
            grads.append((float(value), hidden.grad.clone(), table.grad.clone()))
        (all_value, all_hidden, all_table), (kept_value, kept_hidden, kept_table) = grads
        assert math.isclose(all_value, kept_value, rel_tol=1e-6), name
        torch.testing.assert_close(all_hidden, kept_hidden, atol=1e-6, rtol=1e-5, msg=name)
        torch.testing.assert_close(all_table, kept_table, atol=1e-6, rtol=1e-5, msg=name)
        assert float(all_hidden[~keep].abs().max()) == 0.0, name  # no gradient from padding positions


def test_full_softmax_without_gradients_ignores_target_zero():
    table = _table()
    hidden = torch.tensor([[2.0, 0.0], [5.0, -1.0]])
    loss = build_loss(TrainConfig(loss="softmax"), torch.ones(4, dtype=torch.int64))
    with torch.no_grad():
        value = loss(hidden, torch.tensor([2, 0]), table)
    expected = -(0.0 - math.log(math.exp(2) + math.exp(0) + math.exp(2)))
    assert math.isclose(float(value), expected, rel_tol=1e-6)
