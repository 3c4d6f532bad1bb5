"""Measuring a backend: the share of exactly-zero weights that the bias alone causes."""

from __future__ import annotations

import torch

from recsys_alibi.diagnostics.paths import resolve_dtype

__all__ = ["probe_zero_share"]


def probe_zero_share(
    backend: str,
    slopes: torch.Tensor,
    length: int,
    dtype: str | torch.dtype,
    *,
    window: int | None = None,
    sinks: int = 0,
    bias_clamp: float | None = None,
    chunk: int = 256,
    weights: bool = False,
) -> torch.Tensor:
    """Measure, per head, the share of causal (query, key) pairs that get exactly zero weight
    from the bias alone in one attention backend.

    Queries and keys are zero (all scores equal, so only the ALiBi bias differs) and the values
    are the identity (in column chunks): output row ``i``, column ``j`` is then key ``j``'s
    weight in query ``i``'s output, as the backend computes it, including any flushing in the
    fused kernel or in the P @ V product. With ``weights=True`` (eager only) the weights tensor
    itself is read instead.

    Args:
        backend: ``eager`` | ``sdpa`` | ``flex`` (through
            :func:`recsys_alibi.model.attention.alibi_attention`).
        slopes: (H,) float32. length: L. dtype: input dtype of q, k, v.
        window, sinks, bias_clamp: as in ``alibi_attention``; the share counts visible pairs.
        chunk: value columns per call (memory: H * L * chunk values).

    Returns:
        (H,) float64 shares in [0, 1].

    Raises:
        ValueError: ``weights=True`` with another backend than eager.
    """
    from recsys_alibi.model.attention import alibi_attention, eager_attention
    from recsys_alibi.model.masks import MaskSpec

    dt = resolve_dtype(dtype)
    slopes = torch.as_tensor(slopes, dtype=torch.float32)
    n_heads = slopes.shape[0]
    spec = MaskSpec(q_len=length, k_len=length, causal=True, window=window, sinks=sinks)
    pos = torch.arange(length)
    visible = spec.visible(pos, pos, batch=False)[0, 0]  # (L, L) bool
    zeros = torch.zeros(n_heads, dtype=torch.float64)
    kw = dict(causal=True, window=window, sinks=sinks, bias_clamp=bias_clamp)
    if weights:
        if backend != "eager":
            raise ValueError("weights=True reads the eager weights tensor; use backend='eager'")
        q = torch.zeros(1, n_heads, length, 8, dtype=dt)
        _, w = eager_attention(q, q, q, slopes, return_weights=True, **kw)  # (1, H, L, L)
        zeros = ((w[0] == 0) & visible).sum(dim=(1, 2)).double()
    else:
        for c0 in range(0, length, chunk):
            c1 = min(length, c0 + chunk)
            q = torch.zeros(1, n_heads, length, c1 - c0, dtype=dt)
            v = torch.zeros(1, n_heads, length, c1 - c0, dtype=dt)
            cols = torch.arange(c0, c1)
            v[0, :, cols, cols - c0] = 1.0  # identity block: (L, chunk)
            with torch.no_grad():
                out = alibi_attention(q, q, v, slopes, backend=backend, **kw)  # (1, H, L, chunk)
            zeros += ((out[0] == 0) & visible[:, c0:c1]).sum(dim=(1, 2)).double()
    return zeros / visible.sum().double()

