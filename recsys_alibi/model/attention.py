"""ALiBi attention with three backends that agree to fp32 round-off.

- ``eager``: plain masked softmax in the input dtype; can return the attention weights.
- ``sdpa``: :func:`torch.nn.functional.scaled_dot_product_attention` with an additive float
  mask (the CPU flash kernel). Causal + right padding shares one (1, H, L, L) mask across the
  batch (padded keys never reach real queries under causal masking). Without gradients a large
  mask is built and used in query chunks, so no (B, H, L, L) tensor is ever held.
- ``flex``: :mod:`torch.nn.attention.flex_attention` compiled, ALiBi in a ``score_mod``, a
  ``BlockMask`` that skips invisible blocks (:mod:`recsys_alibi.model.flex`). Forward only on
  CPU (torch 2.13); training and scoring on GPU.

ALiBi: Press, Smith & Lewis, "Train Short, Test Long", ICLR 2022. Sink tokens: Xiao et al.,
"Efficient Streaming Language Models with Attention Sinks" (StreamingLLM), 2023.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from recsys_alibi.model.masks import MaskSpec, zero_rows_of

__all__ = [
    "BACKENDS",
    "Backend",
    "alibi_attention",
    "eager_attention",
    "needs_grad",
    "resolve_backend",
    "sdpa_attention",
]

Backend = Literal["auto", "flex", "sdpa", "eager"]

FLEX_CPU_MIN_LEN = 2048  # auto picks flex on CPU (no grad, windowed) from this many keys on
_CHUNK_MASK_BYTES = 32 << 20  # no-grad SDPA: chunk queries when the mask exceeds 2x this


def needs_grad(*tensors: Tensor) -> bool:
    """True when autograd is on and any of ``tensors`` requires a gradient."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def eager_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slopes: Tensor,
    *,
    causal: bool = True,
    lengths: Tensor | None = None,
    window: int | None = None,
    seq_ids: Tensor | None = None,
    sinks: int = 0,
    bias_clamp: float | None = None,
    scale: float | None = None,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Reference ALiBi attention: explicit scores, bias, mask and softmax in ``q.dtype``.

    Arguments as :func:`alibi_attention`. Materialises (B, H, Lq, Lk): for tests, diagnostics
    and small inputs.

    Returns:
        out (B, H, Lq, D) in ``q.dtype``; with ``return_weights`` also the attention weights
        (B, H, Lq, Lk) in ``q.dtype``, rows summing to 1, or to 0 for rows with no visible key
        (padding), which also get zero output, never NaN.
    """
    spec = MaskSpec.from_inputs(
        q, k, v, slopes, causal=causal, lengths=lengths, window=window,
        seq_ids=seq_ids, sinks=sinks, bias_clamp=bias_clamp,
    )  # fmt: skip
    q_pos = spec.q_positions(q.device)
    k_pos = torch.arange(spec.k_len, device=q.device)
    mask, _ = spec.additive_mask(slopes, q_pos, k_pos, bias_clamp=bias_clamp, batch=True, dtype=q.dtype)
    vis = spec.visible(q_pos, k_pos, batch=True)  # (Bm, 1, Lq, Lk)
    live = vis.any(dim=-1, keepdim=True)  # (Bm, 1, Lq, 1) rows with a visible key
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale + mask  # (B, H, Lq, Lk)
    weights = torch.softmax(scores, dim=-1).masked_fill(~(vis & live), 0.0)
    out = torch.matmul(weights, v)  # (B, H, Lq, D)
    return (out, weights) if return_weights else out


def _key_range(spec: MaskSpec, first: int, last: int) -> tuple[int, int]:
    """Keys [lo, hi) that queries at positions first..last can see (before per-row rules)."""
    lo, hi = 0, spec.k_len
    if spec.causal:
        hi = min(hi, last + 1)
    if spec.window is not None:
        if not spec.causal:
            hi = min(hi, last + spec.window)
        if spec.sinks == 0:
            lo = max(0, first - spec.window + 1)
    return lo, hi


def _shift_invariant(spec: MaskSpec, batch: bool) -> bool:
    """Whether the chunk masks are slices of one (causal, no per-row rule, no sinks)."""
    return spec.causal and not batch and (spec.window is None or spec.sinks == 0)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slopes: Tensor,
    *,
    causal: bool = True,
    lengths: Tensor | None = None,
    window: int | None = None,
    seq_ids: Tensor | None = None,
    sinks: int = 0,
    bias_clamp: float | None = None,
    scale: float | None = None,
    query_chunk: int | None = None,
) -> Tensor:
    """ALiBi attention through ``scaled_dot_product_attention`` with an additive float mask.

    Arguments as :func:`alibi_attention`, plus ``query_chunk``: compute the queries in chunks
    of this many rows, each with only the keys it can reach (causal, window), so the mask is
    (1 | B, H, query_chunk, <= Lk). ``None`` chunks automatically when no gradient is needed
    and the full mask would exceed 64 MiB; ``0`` never chunks.

    The mask is (1, H, Lq, Lk) unless a per-row rule needs more (seq_ids, or lengths without
    causal masking): then (B, H, Lq, Lk).

    Returns:
        (B, H, Lq, D) in ``q.dtype``; padded query rows are zero.
    """
    spec = MaskSpec.from_inputs(
        q, k, v, slopes, causal=causal, lengths=lengths, window=window,
        seq_ids=seq_ids, sinks=sinks, bias_clamp=bias_clamp,
    )  # fmt: skip
    batch = spec.needs_batch_mask
    b, h, lq, _ = q.shape
    if query_chunk is None:
        rows = b if batch else 1
        full_bytes = rows * h * lq * spec.k_len * q.element_size()
        query_chunk = 0
        if full_bytes > 2 * _CHUNK_MASK_BYTES and not needs_grad(q, k, v, slopes):
            per_row = rows * h * spec.k_len * q.element_size()
            query_chunk = max(64, (_CHUNK_MASK_BYTES // per_row) // 64 * 64)
    if query_chunk <= 0 or query_chunk >= lq:
        query_chunk = lq
    q_pos_all = spec.q_positions(q.device)
    mask_kw = dict(bias_clamp=bias_clamp, batch=batch, dtype=q.dtype)
    template = None
    if query_chunk < lq and _shift_invariant(spec, batch):
        # causal, same for every row, no sinks: the mask only depends on i - j, so the mask of
        # the last chunk (all keys) holds every other chunk's mask as a slice; build it once
        last = torch.arange(spec.k_len - query_chunk, spec.k_len, device=q.device)
        template, no_rows = spec.additive_mask(slopes, last, torch.arange(spec.k_len, device=q.device), **mask_kw)
    outs = []
    for r0 in range(0, lq, query_chunk):
        q_pos = q_pos_all[r0 : r0 + query_chunk]
        p0, n = int(q_pos[0]), len(q_pos)
        lo, hi = _key_range(spec, p0, int(q_pos[-1]))
        if template is not None:
            row0 = query_chunk - n  # a short last chunk takes the template's last rows
            col0 = lo + spec.k_len - query_chunk + row0 - p0
            mask, empty = template[:, :, row0 : row0 + n, col0 : col0 + hi - lo], no_rows[:, :, :n]
        else:
            k_pos = torch.arange(lo, hi, device=q.device)
            mask, empty = spec.additive_mask(slopes, q_pos, k_pos, **mask_kw)
        out = F.scaled_dot_product_attention(
            q[:, :, r0 : r0 + query_chunk], k[:, :, lo:hi], v[:, :, lo:hi], attn_mask=mask, scale=scale
        )  # (B, H, chunk, D)
        outs.append(zero_rows_of(out, empty, spec.zero_rows(q_pos)))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def _flex(q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, **kw) -> Tensor:
    from recsys_alibi.model.flex import flex_alibi_attention

    return flex_alibi_attention(q, k, v, slopes, **kw)


BACKENDS: dict[str, Callable[..., Tensor]] = {
    "eager": eager_attention,
    "sdpa": sdpa_attention,
    "flex": _flex,
}


def resolve_backend(backend: str, q: Tensor, *grad_inputs: Tensor, window: int | None = None, k_len: int = 0) -> str:
    """The concrete backend for ``backend`` ("auto" resolved).

    ``auto``: flex on CUDA. On CPU, sdpa, except flex for inputs that need no gradient (flex has
    no CPU backward in torch 2.13) when a sliding window makes its block skipping pay
    (``window`` set and ``k_len >= FLEX_CPU_MIN_LEN``). Without a window flex is still the
    faster forward once compiled (docs/benchmarks.md: 2.5 s vs 3.9 s for chunked sdpa at
    L = 8192), but each new padded shape costs 5-30 s of compilation on CPU, while sdpa without
    gradients works in query chunks and never holds a (B, H, L, L) tensor.

    Raises:
        ValueError: unknown backend name.
    """
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; use one of auto, {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if q.device.type == "cuda":
        return "flex"
    if window is not None and k_len >= FLEX_CPU_MIN_LEN and not needs_grad(q, *grad_inputs):
        return "flex"
    return "sdpa"


def alibi_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slopes: Tensor,
    *,
    causal: bool = True,
    lengths: Tensor | None = None,
    window: int | None = None,
    backend: Backend = "auto",
    seq_ids: Tensor | None = None,
    sinks: int = 0,
    bias_clamp: float | None = None,
    scale: float | None = None,
) -> Tensor:
    """Multi-head attention whose only position signal is the ALiBi bias (Press et al. 2022).

    Score of query ``i`` and key ``j`` in head ``h``: ``q.k * scale - slopes[h] * (i - j)``
    (``|i - j|`` when not causal), over the keys it may see:

    Args:
        q: (B, H, Lq, D) float. Queries are the LAST Lq of the Lk positions (KV-cache decoding).
        k, v: (B, H, Lk, D), same dtype and device as q, Lk >= Lq.
        slopes: (H,) floating, e.g. :func:`recsys_alibi.model.alibi.alibi_slopes` or the output
            of :class:`recsys_alibi.model.alibi.AlibiSlopes` (gradients flow into it).
        causal: mask keys after the query (``j > i``).
        lengths: (B,) int, valid positions per row, right padding: keys ``>= length`` are masked
            and output rows ``>= length`` are zeros.
        window: mask keys with ``i - j >= window`` (``|i - j| >= window`` when not causal).
        backend: "auto" | "flex" | "sdpa" | "eager" (see :func:`resolve_backend`). A backend
            that cannot run falls back to sdpa with one logged warning.
        seq_ids: (B, Lk) int, packed rows: attention only between equal ids; id 0 is padding
            (output zero). Each sequence is one contiguous run; no position offsets are needed
            because ALiBi only sees distances.
        sinks: the first ``sinks`` positions of each sequence stay visible outside the window
            (StreamingLLM, Xiao et al. 2023). No effect without a window.
        bias_clamp: ``bias = max(-slope * dist, -bias_clamp)``, bounds the bias so exp() does
            not underflow in low precision.
        scale: score scale, default ``1 / sqrt(D)``.

    Returns:
        (B, H, Lq, D) in ``q.dtype``. Rows with no visible key are zeros, never NaN.

    Raises:
        ValueError: shapes or arguments out of range, unknown backend.
    """
    kw = dict(
        causal=causal, lengths=lengths, window=window, seq_ids=seq_ids,
        sinks=sinks, bias_clamp=bias_clamp, scale=scale,
    )  # fmt: skip
    name = resolve_backend(backend, q, k, v, slopes, window=window, k_len=k.shape[-2])
    return BACKENDS[name](q, k, v, slopes, **kw)
