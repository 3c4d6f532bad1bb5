"""ALiBi: per-head slopes and the linear distance bias.

ALiBi (Press, Smith & Lewis, "Train Short, Test Long: Attention with Linear Biases Enables
Input Length Extrapolation", ICLR 2022) adds ``-m_h * (i - j)`` to the attention score of
query ``i`` and key ``j`` in head ``h``; there is no position embedding at all. The slopes
``m_h`` form a geometric sequence fixed before training (optionally learnable here).

Positions: a bias for ``q_len`` queries and ``k_len`` keys puts the keys at positions
``0 .. k_len - 1`` and the queries at the LAST ``q_len`` of them (``k_len - q_len .. k_len - 1``),
which is what KV-cache decoding needs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["AlibiSlopes", "alibi_bias", "alibi_slopes", "distances"]


def _power_of_two_slopes(n: int, max_bias: float) -> list[float]:
    # m_h = 2^(-max_bias * h / n), h = 1..n
    return [2.0 ** (-max_bias * h / n) for h in range(1, n + 1)]


def alibi_slopes(n_heads: int, max_bias: float = 8.0) -> Tensor:
    """ALiBi slopes, one per head.

    ``m_h = 2^(-max_bias * h / n)`` for ``h = 1..n`` when ``n`` is a power of two (Press et
    al. 2022). Otherwise the rule of the paper's reference code: the ``c`` slopes of the
    closest lower power of two ``c``, followed by the 1st, 3rd, 5th, ... slopes of the ``2c``
    scheme (those that interleave with the first ``c``) until there are ``n`` slopes.

    Example: ``n=8`` gives 1/2, 1/4, ..., 1/256; ``n=6`` gives 1/4, 1/16, 1/64, 1/256 (the
    4-head scheme) then 1/2, 1/8 (the 1st and 3rd of the 8-head scheme).

    Args:
        n_heads: number of heads H, >= 1.
        max_bias: the exponent of the smallest slope, ``2^-max_bias`` (8 in the paper), > 0.

    Returns:
        (H,) float32 on the CPU, computed in float64 and rounded once.

    Raises:
        ValueError: ``n_heads < 1`` or ``max_bias <= 0``.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")
    if not max_bias > 0:
        raise ValueError(f"max_bias must be > 0, got {max_bias}")
    c = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = _power_of_two_slopes(c, max_bias)
    if c < n_heads:
        slopes += _power_of_two_slopes(2 * c, max_bias)[0::2][: n_heads - c]
    return torch.tensor(slopes, dtype=torch.float64).to(torch.float32)


def distances(
    q_len: int, k_len: int | None = None, *, causal: bool = True, device: torch.device | None = None
) -> Tensor:
    """Signed query-key distances ``i - j`` (``|i - j|`` when not causal).

    Returns:
        (q_len, k_len) int64; queries are the last ``q_len`` of the ``k_len`` positions.

    Raises:
        ValueError: ``q_len < 1`` or ``k_len < q_len``.
    """
    k_len = q_len if k_len is None else k_len
    if q_len < 1 or k_len < q_len:
        raise ValueError(f"need 1 <= q_len <= k_len, got q_len={q_len}, k_len={k_len}")
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # (Lq, 1)
    j = torch.arange(k_len, device=device)[None, :]  # (1, Lk)
    d = i - j
    return d if causal else d.abs()


def alibi_bias(
    slopes: Tensor,
    q_len: int,
    k_len: int | None = None,
    *,
    causal: bool = True,
    bias_clamp: float | None = None,
) -> Tensor:
    """The ALiBi bias for every head, query and key (Press et al. 2022).

    Entry ``[h, r, j]`` with query position ``i = k_len - q_len + r`` is ``-slopes[h] * (i - j)``
    for ``j <= i`` and ``-inf`` for ``j > i`` when ``causal``; ``-slopes[h] * |i - j|`` when not.
    With ``bias_clamp`` the finite entries are ``max(-slope * dist, -bias_clamp)``.
    Differentiable with respect to ``slopes`` (learnable slopes).

    Args:
        slopes: (H,) floating, e.g. from :func:`alibi_slopes`.
        q_len: number of queries Lq, the last Lq positions.
        k_len: number of keys Lk (default ``q_len``).
        causal: mask keys after the query with ``-inf``.
        bias_clamp: lower bound on the magnitude of the bias (> 0), or None.

    Returns:
        (H, Lq, Lk) in ``slopes.dtype`` on ``slopes.device``.

    Raises:
        ValueError: ``slopes`` is not 1-D, bad lengths, or ``bias_clamp <= 0``.
    """
    if slopes.dim() != 1:
        raise ValueError(f"slopes must be (H,), got shape {tuple(slopes.shape)}")
    if bias_clamp is not None and not bias_clamp > 0:
        raise ValueError(f"bias_clamp must be > 0, got {bias_clamp}")
    d = distances(q_len, k_len, causal=causal, device=slopes.device)  # (Lq, Lk)
    bias = -slopes[:, None, None] * d.abs().to(slopes.dtype)  # (H, Lq, Lk)
    if bias_clamp is not None:
        bias = bias.clamp(min=-bias_clamp)
    if causal:
        bias = bias.masked_fill(d < 0, float("-inf"))
    return bias


class AlibiSlopes(nn.Module):
    """The (H,) slope vector as a module, fixed or learnable.

    Fixed: a buffer equal to :func:`alibi_slopes`. Learnable: ``m_h = softplus(w_h) + c_h`` with
    ``w = log(expm1(m0))``, the inverse softplus of the fixed scheme ``m0``, and ``c`` a constant
    buffer ``m0 - softplus(w)`` of at most one float32 ulp of ``m0``, so that the initial slopes
    equal the fixed scheme bit for bit (float32 softplus alone cannot reach every value). The
    correction is dropped where it would make a slope <= 0, so slopes stay positive.

    Args:
        n_heads: H.
        max_bias: see :func:`alibi_slopes`.
        learnable: train the slopes.

    Example:
        >>> AlibiSlopes(8)().tolist()[:2]
        [0.5, 0.25]

    ``forward()`` returns (H,) float32 on the module's device.
    """

    def __init__(self, n_heads: int, max_bias: float = 8.0, learnable: bool = False) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.max_bias = max_bias
        self.learnable = learnable
        init = alibi_slopes(n_heads, max_bias)
        if learnable:
            raw = torch.log(torch.expm1(init.double())).float()
            self.raw = nn.Parameter(raw)
            self.register_buffer("correction", init - F.softplus(raw), persistent=True)
        else:
            self.register_buffer("fixed", init, persistent=False)

    def forward(self) -> Tensor:
        if self.learnable:
            soft = F.softplus(self.raw)
            m = soft + self.correction
            return torch.where(m > 0, m, soft)
        return self.fixed

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, max_bias={self.max_bias}, learnable={self.learnable}"
