"""Every specialised flex score_mod and mask_mod against float64 references.

The functions are evaluated on broadcast index grids (what flex's vmap does), so the bias and
its slope gradient are checked on CPU, where flex has no backward; then each specialisation
runs through FlexAttention uncompiled in float64 (no compile: seconds for all of them) against
the loop reference of test_attention.
"""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch
from test_attention import CASES, _kwargs, reference

from recsys_alibi.model.alibi import AlibiSlopes, alibi_slopes
from recsys_alibi.model.block_mask import build_flex_mask
from recsys_alibi.model.flex import FlexAlibi
from recsys_alibi.model.masks import MaskSpec
from recsys_alibi.model.score_mods import MaskModKey, ScoreModKey, alibi_score_mod, visibility_mask_mod

H, LQ, LK = 4, 6, 40


def _grid(b: int, h: int, lq: int, lk: int):
    """Index tensors broadcasting to (B, H, Lq, Lk), as flex evaluates the mods."""
    return (
        torch.arange(b)[:, None, None, None],
        torch.arange(h)[None, :, None, None],
        torch.arange(lq)[None, None, :, None],
        torch.arange(lk)[None, None, None, :],
    )


def _reference_bias(slopes, *, causal, clamp, offset, lq, lk):
    """Float64 ``-min(slope * dist, clamp)`` (H, Lq, Lk), queries at offset + 0..Lq-1."""
    i = torch.arange(lq, dtype=torch.float64)[:, None] + offset
    j = torch.arange(lk, dtype=torch.float64)[None, :]
    dist = i - j if causal else (i - j).abs()
    penalty = slopes.double()[:, None, None] * dist
    if clamp is not None:
        penalty = penalty.clamp(max=clamp)
    return -penalty


SLOPES = {
    "fixed": lambda: alibi_slopes(H),
    "zero_heads": lambda: torch.tensor([0.5, 0.0, 0.125, 0.0]),  # a share of heads without bias
    "wide_max_bias": lambda: alibi_slopes(H, max_bias=16.0),
}


@pytest.mark.parametrize("slopes_kind", sorted(SLOPES))
@pytest.mark.parametrize(
    "causal,clamp,offset", list(itertools.product([True, False], [None, 0.3], [False, True])), ids=str
)
def test_score_mod_equals_float64_bias(causal, clamp, offset, slopes_kind):
    slopes = SLOPES[slopes_kind]()
    off = LK - LQ if offset else 0
    lq = LQ if offset else LK
    score_mod = alibi_score_mod(ScoreModKey(causal, clamp, offset), slopes, torch.tensor(off))
    got = score_mod(torch.zeros(1, H, lq, LK), *_grid(1, H, lq, LK))[0]  # (H, Lq, Lk)
    want = _reference_bias(slopes, causal=causal, clamp=clamp, offset=off, lq=lq, lk=LK)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("clamp", [None, 0.3])
@pytest.mark.parametrize("causal", [True, False])
def test_learnable_slopes_get_the_float64_gradient(causal, clamp):
    slopes = AlibiSlopes(H, learnable=True)
    g = torch.randn(H, LK, LK, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = alibi_score_mod(ScoreModKey(causal, clamp), slopes())(torch.zeros(1, H, LK, LK), *_grid(1, H, LK, LK))
    (got[0].double() * g).sum().backward()
    raw = slopes.raw.detach().double().requires_grad_()
    ref_slopes = torch.nn.functional.softplus(raw) + slopes.correction.double()
    want = _reference_bias(ref_slopes, causal=causal, clamp=clamp, offset=0, lq=LK, lk=LK)
    (want * g).sum().backward()
    torch.testing.assert_close(slopes.raw.grad.double(), raw.grad, atol=1e-5, rtol=1e-5)


def test_offset_score_mod_needs_its_tensor():
    with pytest.raises(ValueError, match="offset"):
        alibi_score_mod(ScoreModKey(offset=True), alibi_slopes(H))
    with pytest.raises(ValueError, match="k_pos"):
        visibility_mask_mod(MaskModKey(window=4, sinks=2, rows=False))


def _packed_ids(b: int, lk: int) -> torch.Tensor:
    row0 = [1] * 9 + [2] * 20 + [0] * (lk - 29)
    row1 = [3] * 15 + [4] * (lk - 15)
    return torch.tensor([row0, row1][:b])


MASK_VARIANTS = {
    "causal": dict(causal=True),
    "bidir": dict(causal=False),
    "causal_window": dict(causal=True, window=7),
    "causal_window_sinks": dict(causal=True, window=7, sinks=2),
    "bidir_window_sinks": dict(causal=False, window=5, sinks=3),
    "padded": dict(causal=True, lengths=[40, 17]),
    "bidir_padded_window": dict(causal=False, window=6, lengths=[33, 0]),
    "packed_window_sinks": dict(causal=True, window=6, sinks=2, seq_ids="packed"),
    "packed_bidir": dict(causal=False, seq_ids="packed"),
}


@pytest.mark.parametrize("decoding", [False, True], ids=["self", "decoding"])
@pytest.mark.parametrize("variant", sorted(MASK_VARIANTS))
def test_mask_mod_equals_visibility(variant, decoding):
    kw = dict(MASK_VARIANTS[variant])
    if "lengths" in kw:
        kw["lengths"] = torch.tensor(kw["lengths"])
    if kw.get("seq_ids") == "packed":
        kw["seq_ids"] = _packed_ids(2, LK)
    lq = LQ if decoding else LK
    spec = MaskSpec.build(2, lq, LK, torch.device("cpu"), **kw)
    fm = build_flex_mask(spec, 2, torch.device("cpu"))
    assert fm.mask_key.offset == decoding
    got = fm.block_mask.mask_mod(*_grid(fm.batch_pad, 1, fm.q_pad, fm.k_pad))  # (B_pad, 1, q_pad, k_pad)
    want = spec.visible(spec.q_positions(torch.device("cpu")), torch.arange(LK))  # (1 | B, 1, Lq, Lk)
    zero = spec.zero_rows(spec.q_positions(torch.device("cpu")))
    live = got[:2, :, :lq, :LK]
    if zero is not None:  # padded query rows: the mask may leave them anything, their output is zeroed
        live, want = live & ~zero, want & ~zero
    assert torch.equal(live, want.expand_as(live))
    assert not got[:2, :, :, LK:].any() and not got[2:].any() and not got[:, :, lq:].any()


def test_unpadded_grid_drops_the_row_rules():
    spec = MaskSpec.build(2, 128, 128, torch.device("cpu"), causal=True, window=16)
    fm = build_flex_mask(spec, 2, torch.device("cpu"))
    assert fm.mask_key == MaskModKey(causal=True, window=16, sinks=0, rows=False, offset=False)
    got = fm.block_mask.mask_mod(*_grid(2, 1, 128, 128))
    i, j = torch.arange(128)[:, None], torch.arange(128)[None, :]
    assert torch.equal(got.expand(2, 1, 128, 128), ((i >= j) & (i - j < 16)).expand(2, 1, 128, 128))


def _eager_flex_forward(runner, case, slopes, q, k, v):
    kw = _kwargs(case)
    clamp = kw.pop("bias_clamp", None)
    spec = MaskSpec.build(q.shape[0], q.shape[2], k.shape[2], q.device, **kw)
    mask = build_flex_mask(spec, q.shape[0], q.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uncompiled flex warns that it materialises the scores
        out = runner(q, k, v, slopes, mask, bias_clamp=clamp)
    zero = spec.zero_rows(spec.q_positions(q.device))
    return out if zero is None else out.masked_fill(zero, 0.0)


@pytest.mark.parametrize("decoding", [False, True], ids=["self", "decoding"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_specialisation_forward_equals_float64_reference(case, decoding):
    g = torch.Generator().manual_seed(5)
    b, lk = 2, 130
    lq = 5 if decoding else lk
    q = torch.randn(b, 3, lq, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, 3, lk, 16, generator=g, dtype=torch.float64) for _ in range(2))
    slopes = torch.tensor([0.5, 0.0, 2.0**-6], dtype=torch.float64)  # one head without bias
    runner = FlexAlibi(compiled=False)
    got = _eager_flex_forward(runner, case, slopes, q, k, v)
    want = reference(q, k, v, slopes, **_kwargs(case))
    assert got.dtype == torch.float64 and got.shape == (b, 3, lq, 16)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    assert math.isfinite(float(got.abs().sum()))
