"""The two unfused ALiBi attention backends: the eager reference and SDPA with an additive mask.

- ``eager``: plain masked softmax in the input dtype; can return the attention weights.
- ``sdpa``: :func:`torch.nn.functional.scaled_dot_product_attention` with an additive float
  mask (the CPU flash kernel). Causal + right padding shares one (1, H, L, L) mask across the
  batch (padded keys never reach real queries under causal masking). Without gradients a large
  mask is built and used in query chunks, so no (B, H, L, L) tensor is ever held. Causal
  self-attention on the CPU (the training path) goes to the same flash kernel with its causal
  flag as well (:func:`causal_flash_cpu`): the key blocks above the diagonal are skipped, not
  computed and masked; the plain call stays beside it as the path everywhere else.

Both read the visibility rules of :class:`recsys_alibi.model.masks.MaskSpec`. The flex backend
(:mod:`recsys_alibi.model.flex`) falls back to :func:`sdpa_attention`; the dispatcher
(:mod:`recsys_alibi.model.attention`) imports both, so imports run attention -> flex -> sdpa.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from recsys_alibi.model.masks import MaskSpec, zero_rows_of

__all__ = ["causal_flash_cpu", "causal_kernel_applies", "eager_attention", "needs_grad", "sdpa_attention"]

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

    Arguments as :func:`recsys_alibi.model.attention.alibi_attention`. Materialises
    (B, H, Lq, Lk): for tests, diagnostics and small inputs.

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


# The CPU flash kernel behind scaled_dot_product_attention takes a causal flag and an additive mask
# together (the public function refuses both); with the flag it skips the key blocks above the
# diagonal instead of computing them and masking them with the mask's -inf. None where absent.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def causal_kernel_applies(q: Tensor, spec: MaskSpec, batch: bool, slopes: Tensor) -> bool:
    """Whether :func:`causal_flash_cpu` computes this call: the CPU kernel exists, q is float32 or
    bfloat16 on the CPU, attention is causal with Lq == Lk (the kernel's causal diagonal is
    top-left; ours is bottom-right: the same only then), one mask serves the batch (no
    ``seq_ids``), and the mask needs no gradient (the kernel gives none for it: learnable slopes
    take the plain path)."""
    return (
        _FLASH_CPU is not None and q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16)
        and spec.causal and spec.q_len == spec.k_len and not batch and not needs_grad(slopes)
    )  # fmt: skip


def causal_flash_cpu(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float | None) -> Tensor:
    """Causal attention with an additive ``mask`` by the CPU flash kernel, upper blocks skipped.

    The same sums as ``scaled_dot_product_attention(q, k, v, attn_mask=mask)`` when ``mask`` is
    ``-inf`` above the diagonal (every skipped term is ``exp(-inf) = 0``): the outputs are equal
    bit for bit and the gradients to fp32 round-off (tests/model/test_causal_flash.py), at about
    half the score FLOPs for long windows (docs/benchmarks.md, "Epoch cost").

    The kernel reads its inputs as if their last dim had stride 1, returns NaN for a scale
    <= 0 and dies (SIGFPE) on empty inputs (H = 0): such k, q or v are made contiguous first,
    and a scale <= 0 or an empty input goes to the public function with the same mask.

    Args:
        q, k, v: (B, H, L, D) float32 or bfloat16 on the CPU (the same dtype), any strides.
        mask: (1 | B, H, L, L) additive mask in q's dtype, ``-inf`` at ``j > i``.
        scale: score scale, None: ``1 / sqrt(D)``.

    Returns:
        (B, H, L, D) in q's dtype; differentiable in q, k, v (not in ``mask``).
    """
    if (scale is not None and scale <= 0) or q.numel() == 0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return _FLASH_CPU(q, k, v, 0.0, True, attn_mask=mask, scale=scale)[0]


def _key_range(spec: MaskSpec, first: int, last: int) -> tuple[int, int]:
    """Keys [lo, hi) that queries at positions first..last can see (before per-row rules)."""
    lo, hi = 0, spec.k_len
    if spec.causal:
        hi = min(hi, last + 1)
    if spec.window is not None:
        if not spec.causal:
            # sinks beyond the window stay visible: those of a row are 0 .. sinks-1; a packed
            # sequence of a query at <= last starts at <= last, so its sinks lie below last + sinks
            reach = last + spec.window
            if spec.sinks:
                reach = max(reach, spec.sinks if spec.seq_ids is None else last + spec.sinks)
            hi = min(hi, reach)
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

    Arguments as :func:`recsys_alibi.model.attention.alibi_attention`, plus ``query_chunk``:
    compute the queries in chunks of this many rows, each with only the keys it can reach
    (causal, window), so the mask is (1 | B, H, query_chunk, <= Lk). ``None`` chunks
    automatically when no gradient is needed and the full mask would exceed 64 MiB; ``0`` never
    chunks.

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
    if query_chunk == lq and causal_kernel_applies(q, spec, batch, slopes):
        # one shared (1, H, L, L) mask; the kernel skips the key blocks above the diagonal
        mask, empty = spec.additive_mask(slopes, q_pos_all, torch.arange(spec.k_len, device=q.device), **mask_kw)
        out = causal_flash_cpu(q, k, v, mask, scale)  # (B, H, L, D)
        return zero_rows_of(out, empty, spec.zero_rows(q_pos_all))
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
