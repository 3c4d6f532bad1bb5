"""The causal CPU flash path of the sdpa backend against the eager reference and the plain sdpa path.

``sdpa_attention`` hands causal self-attention (Lq == Lk, one mask shared by the batch, fixed
slopes) to the CPU flash kernel with its causal flag, so that the key blocks above the diagonal
are skipped instead of computed and masked (``recsys_alibi.model.sdpa.causal_flash_cpu``). The
sums are the same: outputs equal the plain path's bit for bit and the eager reference's, and
gradients the reference's, to fp32 round-off.
"""

from __future__ import annotations

import pytest
import torch

from recsys_alibi.config import ModelConfig
from recsys_alibi.model import sdpa as sdpa_module
from recsys_alibi.model.alibi import alibi_slopes
from recsys_alibi.model.masks import MaskSpec
from recsys_alibi.model.sdpa import causal_kernel_applies, eager_attention, sdpa_attention
from recsys_alibi.model.transformer import AlibiRanker

pytestmark = pytest.mark.skipif(sdpa_module._FLASH_CPU is None, reason="no CPU flash kernel in this torch")

B, H, L, D = 4, 2, 300, 16  # L spans several of the kernel's key blocks
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture
def plain(monkeypatch):
    """Run sdpa without the causal kernel (the plain path: full L x L with the mask)."""

    def run(*args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(sdpa_module, "_FLASH_CPU", None)
            return sdpa_attention(*args, **kwargs)

    return run


def _inputs(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=gen, dtype=torch.float32).to(dtype).requires_grad_() for _ in range(3))
    lengths = torch.tensor([L, 251, 7, 1])  # full, right padding, short, one event
    valid = (torch.arange(L)[None, :] < lengths[:, None])[:, None, :, None]  # (B, 1, L, 1)
    grad = torch.randn(B, H, L, D, generator=gen) * valid
    return q, k, v, lengths, grad.to(dtype)


def _grads(out, q, k, v, grad):
    return torch.autograd.grad(out, (q, k, v), grad)


@pytest.mark.parametrize("rules", [{}, {"window": 40}, {"window": 40, "sinks": 3}, {"bias_clamp": 3.0}])
def test_causal_kernel_matches_eager_values_and_gradients(rules):
    q, k, v, lengths, grad = _inputs()
    slopes = alibi_slopes(H)
    ref = eager_attention(q, k, v, slopes, lengths=lengths, **rules)
    out = sdpa_attention(q, k, v, slopes, lengths=lengths, **rules)
    torch.testing.assert_close(out, ref, **TOL)
    assert out[2, :, 7:].abs().max() == 0 and out[3, :, 1:].abs().max() == 0  # padded queries are zeros
    for fast, slow in zip(_grads(out, q, k, v, grad), _grads(ref, q, k, v, grad)):
        torch.testing.assert_close(fast, slow, **TOL)


def test_causal_kernel_is_taken_for_training_calls_only():
    q = torch.zeros(B, H, L, D)
    spec = MaskSpec.build(B, L, L, q.device, causal=True, lengths=torch.full((B,), L))
    slopes = alibi_slopes(H)
    assert causal_kernel_applies(q, spec, False, slopes)
    assert not causal_kernel_applies(q, spec, True, slopes)  # a per-row mask (packed rows)
    assert not causal_kernel_applies(q.double(), spec, False, slopes)
    assert not causal_kernel_applies(q, MaskSpec.build(B, L, L, q.device, causal=False), False, slopes)
    assert not causal_kernel_applies(q[:, :, -5:], MaskSpec.build(B, 5, L, q.device), False, slopes)  # decoding
    assert not causal_kernel_applies(q, spec, False, slopes.clone().requires_grad_())  # learnable slopes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_kernel_equals_the_plain_sdpa_path(plain, dtype):
    """Skipped blocks add exp(-inf) = 0: the same outputs bit for bit, gradients to round-off."""
    q, k, v, lengths, grad = _inputs(dtype)
    slopes = alibi_slopes(H)
    out = sdpa_attention(q, k, v, slopes, lengths=lengths)
    ref = plain(q, k, v, slopes, lengths=lengths)
    assert out.dtype == dtype and torch.equal(out, ref)
    tol = TOL if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for fast, slow in zip(_grads(out, q, k, v, grad), _grads(ref, q, k, v, grad)):
        torch.testing.assert_close(fast.float(), slow.float(), **tol)


def test_learnable_slopes_take_the_plain_path_and_get_gradients():
    q, k, v, lengths, grad = _inputs()
    slopes = alibi_slopes(H).clone().requires_grad_()
    out = sdpa_attention(q, k, v, slopes, lengths=lengths)
    ref = eager_attention(q, k, v, slopes, lengths=lengths)
    torch.testing.assert_close(out, ref, **TOL)
    (g_fast,) = torch.autograd.grad(out, slopes, grad)
    (g_ref,) = torch.autograd.grad(ref, slopes, grad)
    torch.testing.assert_close(g_fast, g_ref, atol=1e-4, rtol=1e-4)


def test_ranker_trains_alike_on_the_causal_kernel_the_plain_path_and_eager(monkeypatch):
    """The whole model on a right-padded batch: hidden states and every parameter gradient.

    Against the plain sdpa path to fp32 round-off; against eager as closely as the plain sdpa
    path itself was (the reference sums in another order: 1.7e-4 on gradients of up to 0.26).
    """
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=2, n_layers=2, max_len=160, dropout=0.0, embedding_backend="torch")
    model = AlibiRanker(cfg, n_items=50)
    items = torch.randint(1, 51, (3, 160))
    lengths = torch.tensor([160, 90, 3])
    valid = torch.arange(160)[None, :] < lengths[:, None]  # (B, L)
    items[~valid] = 0
    runs = {}
    for name, backend, kernel in (("fast", "sdpa", sdpa_module._FLASH_CPU), ("plain", "sdpa", None), ("eager", "eager", None)):
        monkeypatch.setattr(sdpa_module, "_FLASH_CPU", kernel)
        model.zero_grad()
        hidden = model.encode(items, lengths, backend=backend)[valid]  # (T, D)
        hidden.square().sum().backward()
        runs[name] = (hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    fast_hidden, fast = runs["fast"]
    for other, scale in (("plain", 1e-5), ("eager", 2e-3)):
        hidden, grads = runs[other]
        torch.testing.assert_close(fast_hidden, hidden, atol=scale * float(hidden.abs().max()), rtol=0)
        assert fast.keys() == grads.keys()
        for name, g in fast.items():
            torch.testing.assert_close(g, grads[name], atol=scale * float(grads[name].abs().max()), rtol=0, msg=lambda m: f"{name} vs {other}: {m}")
