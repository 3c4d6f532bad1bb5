"""FlexAttention ``score_mod`` and ``mask_mod`` functions, specialised per attention call shape.

Each function is built for one combination of the rules a call needs and does only that work:
the choices (causal or symmetric distance, clamp or none, decoding offset or none, window,
sinks, per-row sequence ids) are Python branches taken when the function is built, and the
window, sink count and clamp are Python numbers that ``torch.compile`` (``dynamic=False``)
folds into the kernel. What varies from call to call stays a tensor: the slopes, the
per-row sequence ids and the decoding offset ``Lk - Lq`` (a Python constant would compile one
kernel per decoding length).

Slopes: a (H,) float32 tensor read once per head. Fixed slopes are passed detached (a constant
of the backward: no gradient is accumulated for them); only slopes that require a gradient
(learnable, :class:`recsys_alibi.model.alibi.AlibiSlopes`) make flex's backward reduce one
per head. Zero slopes are valid (no bias in that head).

Visibility is the rule of :mod:`recsys_alibi.model.masks`, written element-wise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["MaskModKey", "ScoreModKey", "alibi_score_mod", "visibility_mask_mod"]

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class ScoreModKey:
    """Which ALiBi ``score_mod`` to build.

    Attributes:
        causal: distance ``i - j`` (True) or ``|i - j|`` (False).
        clamp: ``bias = -min(slope * dist, clamp)`` when set (> 0), else no clamp at all.
        offset: queries sit after ``Lk - Lq`` keys (decoding): add a (0-dim int) offset tensor.
    """

    causal: bool = True
    clamp: float | None = None
    offset: bool = False


def alibi_score_mod(key: ScoreModKey, slopes: Tensor, offset: Tensor | None = None) -> ScoreMod:
    """The ALiBi ``score_mod`` for ``key``: ``score - min(slopes[h] * dist, clamp)``.

    Args:
        key: the specialisation.
        slopes: (H,) float32 on the device of the call; detach fixed slopes first.
        offset: 0-dim int tensor ``Lk - Lq`` when ``key.offset``, else ignored.

    Returns:
        ``score_mod(score, b, h, q_idx, kv_idx)`` for :func:`flex_attention`.

    The clamp is a ``where``, not ``torch.minimum``: at a tie ``minimum`` splits the slope
    gradient in half, while the eager and sdpa masks (``clamp``) pass all of it.
    """
    if key.offset and offset is None:
        raise ValueError("an offset score_mod needs the offset tensor")
    causal, clamp, off = key.causal, key.clamp, offset if key.offset else None

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        dist = q_idx - kv_idx if off is None else q_idx + off - kv_idx
        if not causal:
            dist = dist.abs()
        penalty = slopes[h] * dist  # -bias, float32
        if clamp is not None:
            penalty = torch.where(penalty > clamp, clamp, penalty)
        return score - penalty

    return score_mod


@dataclass(frozen=True)
class MaskModKey:
    """Which visibility ``mask_mod`` to build.

    Attributes:
        causal: mask ``j > i``.
        window: mask ``i - j >= window`` (``|i - j|`` when not causal), or None.
        sinks: keys at the first ``sinks`` positions of their sequence stay visible outside the
            window (only with a window).
        rows: per-row sequence ids decide visibility (packing, right padding, bucket padding);
            False only when every (b, i, j) of the padded grid is a real position.
        offset: queries sit after ``Lk - Lq`` keys (decoding).
    """

    causal: bool = True
    window: int | None = None
    sinks: int = 0
    rows: bool = True
    offset: bool = False


def visibility_mask_mod(
    key: MaskModKey,
    *,
    q_seq: Tensor | None = None,
    k_seq: Tensor | None = None,
    k_pos: Tensor | None = None,
    offset: Tensor | None = None,
) -> MaskMod:
    """The ``mask_mod`` for ``key`` (True = visible).

    Args:
        key: the specialisation.
        q_seq: (B, Lq_pad) int64 sequence id of each query, 0 = padding (needed with ``rows``).
        k_seq: (B, Lk_pad) int64 sequence id of each key, 0 = padding (needed with ``rows``).
        k_pos: (B, Lk_pad) int64 position of each key within its sequence (needed with sinks).
        offset: 0-dim int tensor ``Lk - Lq`` (needed with ``key.offset``).

    Returns:
        ``mask_mod(b, h, q_idx, kv_idx) -> bool`` for :class:`BlockMask`.

    Raises:
        ValueError: a tensor the key needs is missing.
    """
    causal, window, rows = key.causal, key.window, key.rows
    sinks = key.sinks if window is not None else 0
    need = {"q_seq": rows, "k_seq": rows, "k_pos": sinks > 0, "offset": key.offset}
    given = {"q_seq": q_seq, "k_seq": k_seq, "k_pos": k_pos, "offset": offset}
    missing = [n for n, needed in need.items() if needed and given[n] is None]
    if missing:
        raise ValueError(f"mask_mod {key} needs {', '.join(missing)}")
    off = offset if key.offset else None

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        dist = q_idx - kv_idx if off is None else q_idx + off - kv_idx
        ok = None
        if rows:
            qs = q_seq[b, q_idx]
            ok = (qs == k_seq[b, kv_idx]) & (qs != 0)
        if causal:
            ok = dist >= 0 if ok is None else ok & (dist >= 0)
        if window is not None:
            near = (dist if causal else dist.abs()) < window
            if sinks > 0:
                near = near | (k_pos[b, kv_idx] < sinks)
            ok = near if ok is None else ok & near
        if ok is None:  # bidirectional, no window, no padding: everything is visible
            ok = dist == dist
        return ok

    return mask_mod
