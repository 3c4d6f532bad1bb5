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


# heads that can see far: slope schemes chosen by config


def test_wide_slopes_span_the_paper_head_to_one_over_the_context() -> None:
    from recsys_alibi.model.alibi import wide_slopes

    assert wide_slopes(4, 2048).tolist() == pytest.approx([1 / 4, 1 / 32, 1 / 256, 1 / 2048], rel=1e-6)
    assert wide_slopes(2, 100).tolist() == pytest.approx([1 / 16, 1 / 100], rel=1e-6)
    assert wide_slopes(1, 500).tolist() == pytest.approx([1 / 500], rel=1e-6)
    assert torch.equal(wide_slopes(4, 3), alibi_slopes(4))  # short contexts: the paper's scheme
    with pytest.raises(ValueError, match="long_context"):
        wide_slopes(4, 1)


def test_free_heads_set_the_flattest_slopes_to_zero() -> None:
    from recsys_alibi.config import ModelConfig
    from recsys_alibi.model.alibi import head_slopes

    four = head_slopes(ModelConfig(d_model=16, n_heads=4, free_heads=2))
    assert four.tolist() == [1 / 4, 1 / 16, 0.0, 0.0]
    six = head_slopes(ModelConfig(d_model=12, n_heads=6, free_heads=2))  # 1/4 .. 1/256, then 1/2, 1/8
    assert six.tolist() == [1 / 4, 1 / 16, 0.0, 0.0, 1 / 2, 1 / 8]
    wide = head_slopes(ModelConfig(d_model=16, n_heads=4, slopes="wide", long_context=2048, free_heads=1))
    assert wide.tolist() == pytest.approx([1 / 4, 1 / 32, 1 / 256, 0.0], rel=1e-6)
    assert torch.equal(head_slopes(ModelConfig(d_model=16, n_heads=4)), alibi_slopes(4))  # the default is unchanged


def test_free_heads_more_than_heads_is_a_config_error() -> None:
    from recsys_alibi.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="free_heads"):
        load_config(overrides=["model.n_heads=2", "model.free_heads=3"])


def test_free_head_attends_uniformly_whatever_the_distance() -> None:
    slopes = torch.tensor([0.5, 0.0])
    bias = alibi_bias(slopes, 6)  # (H, L, L)
    weights = torch.softmax(bias, dim=-1)  # equal scores: the bias alone
    assert torch.allclose(weights[1, 5], torch.full((6,), 1 / 6))  # the last query: every key 1/6
    assert weights[0, 5, 0] == pytest.approx(math.exp(-2.5) * weights[0, 5, 5])  # the biased head: e^(-0.5 d)


def test_learnable_slopes_may_fall_to_zero_and_free_heads_stay_zero() -> None:
    from recsys_alibi.config import ModelConfig

    cfg = ModelConfig(d_model=16, n_heads=4, free_heads=1, learnable_slopes=True, slope_floor="zero")
    module = AlibiSlopes.from_config(cfg)
    assert module().tolist() == [1 / 4, 1 / 16, 1 / 64, 0.0]  # starts at the scheme, bit for bit
    opt = torch.optim.SGD(module.parameters(), lr=1.0)
    for _ in range(3):  # push every slope down: 1/4 - 3 * 0.1 < 0
        opt.zero_grad()
        (0.1 * module().sum()).backward()
        opt.step()
    assert module().tolist() == [0.0, 0.0, 0.0, 0.0]  # reached exactly 0
    assert module.raw.grad[3] == 0.0  # the free head never had a gradient
    soft = AlibiSlopes.from_config(cfg.model_copy(update={"slope_floor": "positive"}))
    assert soft().tolist() == [1 / 4, 1 / 16, 1 / 64, 0.0] and bool((soft()[:3] > 0).all())
    with pytest.raises(ValueError, match="init"):
        AlibiSlopes(2, init=torch.tensor([0.5, -0.1]))


# break-api-s67 findings 3, 10 and 11 (bias and slope rows), against float64 references


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_bias_is_the_float64_product_rounded_once(dtype) -> None:
    # finding 3: the distance was rounded to the slope dtype first (bf16: -298 for -0.3 * 987), and
    # fp16 distances above 65504 gave -inf, NaN for a slope of 0
    slopes = torch.tensor([0.3, 0.5, 0.0, 1 / 3], dtype=dtype)
    for causal in (True, False):
        got = alibi_bias(slopes, 3, 70000, causal=causal)
        i = torch.arange(70000 - 3, 70000, dtype=torch.float64)[:, None]
        j = torch.arange(70000, dtype=torch.float64)[None, :]
        want = (-slopes.double()[:, None, None] * (i - j).abs()).to(dtype)
        if causal:
            want = want.masked_fill(j > i, -math.inf)
        assert got.dtype == dtype and torch.equal(got, want)
        assert not got.isnan().any() and torch.all((got[2] == 0) | (got[2] == -math.inf))  # free head: never NaN
    assert math.isfinite(got[1, 0, 0].item())  # -0.5 * 69997: was -inf in float16
    if dtype == torch.bfloat16:
        assert alibi_bias(slopes, 1, 988)[0, 0, 0].item() == -296.0  # -0.30078125 * 987 = -296.87 (was -298)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: alibi_slopes(2.5), TypeError, "n_heads"),
        (lambda: alibi_slopes("4"), TypeError, "n_heads"),
        (lambda: alibi_slopes(None), TypeError, "n_heads"),
        (lambda: alibi_slopes(True), TypeError, "n_heads"),
        (lambda: alibi_slopes(4, "8"), TypeError, "max_bias"),
        (lambda: alibi_slopes(1, 200), ValueError, "max_bias"),
        (lambda: alibi_slopes(8, 1200), ValueError, "max_bias"),
        (lambda: alibi_slopes(4, math.inf), ValueError, "max_bias"),
        (lambda: alibi_bias(alibi_slopes(1), 2.5, 5), TypeError, "q_len"),
        (lambda: alibi_bias(alibi_slopes(1), 2, 5.0), TypeError, "k_len"),
        (lambda: alibi_bias(torch.tensor([math.inf]), 2), ValueError, "slopes"),
        (lambda: alibi_bias(torch.tensor([math.nan]), 2), ValueError, "slopes"),
        (lambda: alibi_bias(torch.tensor([0.5, -0.25]), 2), ValueError, "slopes"),
        (lambda: alibi_bias(torch.tensor([1, 2]), 3), TypeError, "slopes"),
        (lambda: alibi_bias([0.5], 3), TypeError, "slopes"),
    ],
)
def test_bad_slope_and_bias_arguments_raise_one_error_naming_them(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_largest_max_bias_keeps_every_slope_positive() -> None:
    slopes = alibi_slopes(4, 149.0)  # 2^-149: the smallest float32 above 0
    want = [2.0 ** (-149.0 * h / 4) for h in range(1, 5)]
    assert slopes.tolist() == [float(torch.tensor(w, dtype=torch.float64).float()) for w in want]
    assert bool((slopes > 0).all())
