"""ALiBi slopes and bias against hand-computed values (Press et al. 2022)."""

from __future__ import annotations

import math

import pytest
import torch

from recsys_alibi.model.alibi import AlibiSlopes, alibi_bias, alibi_slopes

HAND_SLOPES = {
    1: [2**-8],
    2: [2**-4, 2**-8],
    3: [2**-4, 2**-8, 2**-2],  # 2-head scheme, then the 1st of the 4-head scheme
    4: [2**-2, 2**-4, 2**-6, 2**-8],
    5: [2**-2, 2**-4, 2**-6, 2**-8, 2**-1],
    6: [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3],  # 4-head, then 1st and 3rd of the 8-head
    8: [2**-1, 2**-2, 2**-3, 2**-4, 2**-5, 2**-6, 2**-7, 2**-8],
    12: [2 ** -(h * 8 / 8) for h in range(1, 9)] + [2 ** -(h * 8 / 16) for h in (1, 3, 5, 7)],
}


@pytest.mark.parametrize("n", sorted(HAND_SLOPES))
def test_slopes_equal_hand_values(n: int) -> None:
    got = alibi_slopes(n)
    assert got.dtype == torch.float32 and got.shape == (n,)
    assert got.tolist() == pytest.approx(HAND_SLOPES[n], rel=1e-7)


def test_slopes_max_bias_and_errors() -> None:
    assert alibi_slopes(4, max_bias=4.0).tolist() == [2**-1, 2**-2, 2**-3, 2**-4]
    with pytest.raises(ValueError):
        alibi_slopes(0)
    with pytest.raises(ValueError):
        alibi_slopes(4, max_bias=0.0)


def test_bias_causal_by_hand() -> None:
    m = torch.tensor([0.5, 0.25])
    got = alibi_bias(m, 2, 4)  # queries at positions 2 and 3
    inf = math.inf
    want_h0 = [[-1.0, -0.5, 0.0, -inf], [-1.5, -1.0, -0.5, 0.0]]
    assert got.shape == (2, 2, 4)
    assert got[0].tolist() == want_h0
    assert got[1, 1].tolist() == [-0.75, -0.5, -0.25, 0.0]


def test_bias_symmetric_and_clamped() -> None:
    m = torch.tensor([0.5])
    assert alibi_bias(m, 3, causal=False)[0].tolist() == [[0.0, -0.5, -1.0], [-0.5, 0.0, -0.5], [-1.0, -0.5, 0.0]]
    clamped = alibi_bias(m, 1, 5, bias_clamp=1.2)[0, 0].tolist()
    assert clamped == pytest.approx([-1.2, -1.2, -1.0, -0.5, 0.0], rel=1e-7)
    with pytest.raises(ValueError):
        alibi_bias(m, 5, 3)


@pytest.mark.parametrize("n", [1, 3, 6, 8])
def test_alibi_slopes_module(n: int) -> None:
    fixed = AlibiSlopes(n)
    assert torch.equal(fixed(), alibi_slopes(n))
    assert not list(fixed.parameters())
    learn = AlibiSlopes(n, learnable=True)
    assert torch.equal(learn(), alibi_slopes(n))  # bit-exact initialisation
    learn().sum().backward()
    assert learn.raw.grad is not None and torch.all(learn.raw.grad > 0)


def test_learnable_slopes_stay_positive() -> None:
    learn = AlibiSlopes(4, learnable=True)
    with torch.no_grad():
        learn.raw.fill_(-30.0)
    assert torch.all(learn() >= 0)
