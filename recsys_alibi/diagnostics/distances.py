"""Distances at which the ALiBi bias alone makes a weight vanish, and the remedies' limits.

Every function is exact for the models of :mod:`recsys_alibi.diagnostics.paths`: the predicate
"the weight at distance d is gone" is monotone in d, so a bracket and a bisection find the
first such d. A slope of 0 (a free head, ``model.free_heads``) has no bias: its weights never
vanish (None), except ``underflow_distance``/``subnormal_distance``, which raise as for any
slope that never underflows.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from recsys_alibi.diagnostics.paths import SoftmaxPath, exp_path
from recsys_alibi.model.alibi import alibi_slopes

__all__ = [
    "bias_clamp_limit", "min_max_bias", "path_normal_distance", "path_zero_distance",
    "subnormal_distance", "underflow_distance", "zero_share",
]  # fmt: skip

_MAX_DISTANCE = 2**53  # largest distance whose float64 value is exact
_SCAN = 4096  # candidate distances evaluated at once at the end of the search


def _check_slope(slope: float) -> float:
    slope = float(slope)
    if not (math.isfinite(slope) and slope >= 0):
        raise ValueError(f"slope must be a finite number >= 0, got {slope}")
    return slope


def _first_gone(
    slope: float, path: SoftmaxPath, bias_clamp: float | None = None, row_len: int | None = None
) -> int | None:
    """Smallest integer d >= 0 whose weight is gone along ``path``; None if no d <= 2**53 is.

    Closed-form estimate ``d ~ -log_floor / slope``, a bracket grown around it until the
    predicate is False at ``lo`` and True at ``hi``, bisection, and a vectorised scan of the
    last few thousand candidates. Exact because the predicate is monotone in ``d`` (``-slope *
    d``, rounding, ``exp`` and the comparisons are all monotone).
    """
    slope = _check_slope(slope)

    def gone(d: int) -> bool:
        return bool(path.is_gone(slope, torch.tensor([d], dtype=torch.int64), bias_clamp, row_len)[0])

    if gone(0):
        return 0
    if slope == 0 or not gone(_MAX_DISTANCE):  # no bias: every distance weighs as d = 0
        return None
    log_z = path.log_z(slope, row_len)
    est = min(_MAX_DISTANCE, max(1, int((-path.log_floor() - log_z) / slope)))
    lo, hi, pad = max(0, est - est // 32 - 2), min(_MAX_DISTANCE, est + est // 32 + 2), est // 32 + 2
    while lo > 0 and gone(lo):
        hi, lo, pad = lo, max(0, lo - 2 * pad), 2 * pad
    while not gone(hi):
        lo, hi, pad = hi, min(_MAX_DISTANCE, hi + 2 * pad), 2 * pad
    # invariant: not gone(lo) (or lo == 0, which is never gone) and gone(hi)
    while hi - lo > _SCAN:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if gone(mid) else (mid, hi)
    cand = torch.arange(lo, hi + 1, dtype=torch.int64)
    flags = path.is_gone(slope, cand, bias_clamp, row_len)
    return int(cand[int(torch.nonzero(flags)[0])])


def underflow_distance(slope: float, dtype: torch.dtype) -> int:
    """Smallest integer ``d >= 0`` for which ``torch.exp(x) == 0``, where ``x`` is ``-slope * d``
    computed in float64 and then cast to ``dtype`` (exp evaluated in ``dtype``).

    This is the distance at which the bias alone pushes the softmax weight ratio
    ``w(d) / w(0) = exp(-slope * d)`` to zero when the softmax runs in ``dtype``.

    Args:
        slope: ALiBi slope m_h >= 0 (per position).
        dtype: torch.float16, torch.bfloat16, torch.float32 or torch.float64 (or its name).

    Returns:
        The distance in positions (items). E.g. slope 1/2: 35 (fp16), 186 (bf16), 208 (fp32),
        1491 (fp64).

    Raises:
        ValueError: slope not finite and >= 0, unsupported dtype, or no underflow up to 2**53
            (a slope of 0 never underflows).
    """
    d = _first_gone(slope, exp_path(dtype, "zero"))
    if d is None:
        raise ValueError(f"slope {slope}: exp(-slope * d) does not underflow in {dtype} for any d <= 2**53")
    return d


def subnormal_distance(slope: float, dtype: torch.dtype) -> int:
    """Smallest integer ``d >= 0`` for which ``torch.exp(x)`` is below the smallest normal of
    ``dtype`` (``torch.finfo(dtype).smallest_normal``), ``x`` as in :func:`underflow_distance`.

    From here on the weight ratio has lost precision (subnormal) or is already zero in kernels
    that flush subnormals. E.g. slope 1/2: 20 (fp16), 175 (bf16), 175 (fp32), 1417 (fp64).

    Raises:
        ValueError: as :func:`underflow_distance`.
    """
    d = _first_gone(slope, exp_path(dtype, "normal"))
    if d is None:
        raise ValueError(f"slope {slope}: exp(-slope * d) stays normal in {dtype} for every d <= 2**53")
    return d


def path_zero_distance(
    slope: float, path: SoftmaxPath, bias_clamp: float | None = None, row_len: int | None = None
) -> int | None:
    """Smallest distance whose weight from the bias alone is gone along ``path`` (None: never).

    With ``bias_clamp`` the bias is ``max(-slope * d, -bias_clamp)``, so a small enough clamp
    returns None. ``row_len``: keys in the row, for the normaliser (use the context length L;
    None: unbounded, which for flat slopes, ``1 / slope >> L``, overstates Z and the loss).
    """
    return _first_gone(slope, path, bias_clamp, row_len)


def path_normal_distance(
    slope: float, path: SoftmaxPath, bias_clamp: float | None = None, row_len: int | None = None
) -> int | None:
    """Smallest distance whose weight falls below the smallest normal of ``path.weight_dtype``."""
    return _first_gone(slope, replace(path, floor="normal"), bias_clamp, row_len)


def _pairs_from(start: int, max_len: int, window: int | None, sinks: int) -> int:
    """Visible causal (query, key) pairs of a length-``max_len`` sequence at distances ``start .. max_len - 1``.

    ``L - d`` pairs per distance d; with a window only ``d < window`` plus, beyond it, the pairs whose key is one
    of the first ``sinks`` positions (``min(sinks, L - d)``). Summed in closed form (exact integers), so a length
    of 10^11 costs nothing (an array of one count per distance took 745 GiB there).
    """
    def tri(n: int) -> int:  # 1 + 2 + ... + n
        return n * (n + 1) // 2 if n > 0 else 0

    def near(lo: int, hi: int) -> int:  # sum of L - d over d in [lo, hi)
        return tri(max_len - lo) - tri(max_len - hi) if lo < hi else 0

    if window is None:
        return near(start, max_len)
    edge = min(window, max_len)
    far = max_len - max(start, edge)  # distances from max(start, window) on: min(sinks, L - d) = min(sinks, j), j <= far
    beyond = tri(min(sinks, far)) + sinks * max(0, far - sinks) if far > 0 else 0
    return near(start, edge) + beyond


def zero_share(zero_distance: int | None, max_len: int, window: int | None = None, sinks: int = 0) -> float:
    """Share of the visible causal (query, key) pairs of a length-``max_len`` sequence at a
    distance ``>= zero_distance`` (0.0 when ``zero_distance`` is None).

    Raises:
        ValueError: ``max_len < 1``.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if zero_distance is None or zero_distance >= max_len:
        return 0.0
    return _pairs_from(zero_distance, max_len, window, sinks) / _pairs_from(0, max_len, window, sinks)


def bias_clamp_limit(
    path: SoftmaxPath, slopes: torch.Tensor | list[float] | None = None, row_len: int | None = None
) -> float:
    """Largest ``model.bias_clamp`` (``|bias|``, rounded down to 1e-3) that keeps every weight
    from the bias alone at or above the smallest normal of ``path.weight_dtype``.

    Without ``slopes`` the rule is the weight ratio: ``exp(-c)`` (the bias rounded and ``exp``
    evaluated as along ``path``, no normaliser) ``>= smallest normal``; e.g. 87.25 for bf16
    (the bias is rounded to bf16's 0.5 spacing there), 87.336 for fp32, 9.707 for fp16 (-9.703
    after rounding to fp16). With ``slopes`` each head's normaliser ``Z`` over rows of
    ``row_len`` keys (None: any length) is included when ``path.normalized``, so the limit is
    lower by ``ln Z`` of the flattest head (``Z`` is at most ``row_len``). Leave headroom for
    score differences between keys. Heads of slope 0 (free heads) have no bias to clamp and
    set no limit; with only such heads the rule is the weight ratio, as without ``slopes``.
    """
    normal = replace(path, floor="normal")
    slope_list = [] if slopes is None else [float(s) for s in torch.as_tensor(slopes, dtype=torch.float64).flatten()]
    slope_list = [m for m in slope_list if m != 0.0]
    if not slope_list:
        normal = replace(normal, normalized=False)
        slope_list = [1.0]

    def ok(c: float) -> bool:
        return all(_first_gone(m, normal, c, row_len) is None for m in slope_list)

    lo, hi = 0.0, 1.0
    while ok(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 2e-4:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return math.floor(lo * 1000) / 1000


def min_max_bias(
    n_heads: int,
    max_len: int,
    path: SoftmaxPath,
    window: int | None = None,
    sinks: int = 0,
    head: int | None = None,
) -> float | None:
    """Smallest ``max_bias`` (to 0.01, rounded up) for which no head of the fixed slope scheme
    (:func:`recsys_alibi.model.alibi.alibi_slopes`), or only head ``head``, loses a visible key
    at ``max_len``.

    Every slope falls as ``max_bias`` grows (flatter), so the answer is found by bisection. It
    is below the default 8 when nothing is blind at 8 (steeper slopes would still do). None when
    even ``max_bias = 64`` is not enough.
    """

    def ok(max_bias: float) -> bool:
        slopes = alibi_slopes(n_heads, max_bias)
        slope = float(slopes.max() if head is None else slopes[head])
        return zero_share(path_zero_distance(slope, path, row_len=max_len), max_len, window, sinks) == 0.0

    lo, hi = 0.0, 64.0
    if not ok(hi):
        return None
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return math.ceil(hi * 100) / 100


