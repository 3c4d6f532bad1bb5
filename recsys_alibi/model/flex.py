"""The flex backend: compiled FlexAttention with ALiBi in a ``score_mod`` and a ``BlockMask``.

The bias ``-slope[h] * (i - j)`` is computed inside the fused kernel from the (H,) slope
tensor; nothing of size L x L is materialised. Visibility (causal, padding, packed sequences,
window, sinks) is a ``BlockMask``: blocks of 128 x 128 that no query sees are skipped, blocks
that every query sees run without the ``mask_mod``.

Shapes are bucketed: Lq and Lk are padded to multiples of 128 and B to the next power of two
(the padding is masked, costs no attention blocks, and is cut off again), and every rule is
passed as a tensor (window, sinks, clamp, causal flag, sequence ids), so one compiled kernel
serves every call of one padded shape. The compiled callable and the block masks that depend
only on the shape are cached in a :class:`FlexAlibi` object.

The BlockMask is built here (:func:`build_block_mask`) from the same visibility rules as the
other backends, one slab of query blocks at a time, and handed to ``BlockMask.from_kv_blocks``:
``create_block_mask`` uncompiled holds B x L x L booleans (1.7 GB at L=4096), compiled it costs
a ~17 s compile per shape on this CPU; the slab build costs neither.

CPU (torch 2.13): forward only; ``backend="auto"`` uses sdpa when gradients are needed.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from recsys_alibi.model.attention import needs_grad, sdpa_attention
from recsys_alibi.model.masks import MaskSpec, zero_rows_of

__all__ = ["BLOCK", "FlexAlibi", "flex_alibi_attention", "flex_runner"]

logger = logging.getLogger(__name__)

BLOCK = 128  # flex block size; Lq and Lk are padded to multiples of it
_NO_WINDOW = 1 << 30


def _round_up(n: int, m: int = BLOCK) -> int:
    return -(-n // m) * m


def _bucket_batch(b: int) -> int:
    """Batch size bucket: the next power of two (bounds recompiles across last batches)."""
    return 1 << max(0, b - 1).bit_length()


def build_block_mask(
    spec: MaskSpec, batch: int, batch_pad: int, q_pad: int, k_pad: int, mask_mod, device: torch.device
) -> BlockMask:
    """BlockMask of ``spec`` on a (batch_pad, q_pad, k_pad) grid, built block-row by block-row.

    Evaluates :meth:`MaskSpec.visible` on slabs of query blocks (bounded memory: never B x L x L)
    and classifies each 128 x 128 block as empty, partial (``mask_mod`` applied) or full. Batch
    rows ``>= batch`` (bucket padding) are empty.

    Returns:
        BlockMask with batch dim ``batch_pad`` (always, so that one compiled kernel serves calls
        with and without per-row rules) and head dim 1.
    """
    per_row = spec.has_batch_data
    rows_b = batch if per_row else 1
    n_qb, n_kb = q_pad // BLOCK, k_pad // BLOCK
    k_pos = torch.arange(spec.k_len, device=device)
    slab = max(1, (8 << 20) // max(1, rows_b * BLOCK * k_pad))  # query blocks per slab (~8 MB)
    counts = []
    for qb0 in range(0, n_qb, slab):
        r0, r1 = qb0 * BLOCK, min(n_qb, qb0 + slab) * BLOCK
        q_pos = torch.arange(spec.q_offset + r0, spec.q_offset + min(r1, spec.q_len), device=device)
        if len(q_pos) == 0:
            counts.append(torch.zeros(rows_b, (r1 - r0) // BLOCK, n_kb, dtype=torch.int32, device=device))
            continue
        vis = spec.visible(q_pos, k_pos, batch=per_row)[:, 0]  # (Bm, n, Lk)
        vis = F.pad(vis, (0, k_pad - spec.k_len, 0, (r1 - r0) - len(q_pos)))  # (Bm, r1 - r0, k_pad)
        vis = vis.expand(rows_b, -1, -1).reshape(rows_b, (r1 - r0) // BLOCK, BLOCK, n_kb, BLOCK)
        counts.append(vis.sum(dim=(2, 4), dtype=torch.int32))  # (Bm, n_blocks, n_kb)
    count = torch.cat(counts, dim=1)[:, None].expand(batch, -1, -1, -1)  # (B, 1, n_qb, n_kb)
    count = F.pad(count, (0, 0, 0, 0, 0, 0, 0, batch_pad - batch))  # (B_pad, 1, n_qb, n_kb)
    full = count == BLOCK * BLOCK
    partial = (count > 0) & ~full

    def ordered(blocks: Tensor) -> tuple[Tensor, Tensor]:
        num = blocks.sum(dim=-1, dtype=torch.int32)  # (Bm, 1, n_qb)
        idx = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return num, idx  # selected block indices first, ascending

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(q_pad, k_pad)
    )


class FlexAlibi:
    """Compiled ALiBi FlexAttention with per-shape caches.

    Holds one ``torch.compile(flex_attention, dynamic=False)`` callable (dynamo keys its
    graphs by padded shape), the shape-only block masks (LRU), and the set of fallback
    warnings already logged.
    """

    def __init__(self, max_cached_masks: int = 16) -> None:
        self._compiled = torch.compile(flex_attention, dynamic=False)
        self._masks: OrderedDict[tuple, BlockMask] = OrderedDict()
        self._max_masks = max_cached_masks
        self._warned: set[str] = set()
        self.failed: set[tuple] = set()  # signatures that failed to compile or run

    def warn_once(self, key: str, message: str) -> None:
        """Log ``message`` as a warning the first time ``key`` is seen."""
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        slopes: Tensor,
        spec: MaskSpec,
        *,
        bias_clamp: float | None = None,
        scale: float | None = None,
        with_bias: bool = True,
    ) -> Tensor:
        """Run flex attention; see :func:`flex_alibi_attention`. ``with_bias=False``: no ALiBi."""
        b, h, lq, d = q.shape
        lk = spec.k_len
        b_pad, q_pad, k_pad = _bucket_batch(b), _round_up(lq), _round_up(lk)
        dev = q.device
        meta = self._meta(spec, b, b_pad, q_pad, k_pad, dev)
        q_off = torch.tensor(spec.q_offset, device=dev)
        causal = torch.tensor(spec.causal, device=dev)
        window = torch.tensor(spec.window if spec.window is not None else _NO_WINDOW, device=dev)
        sinks = torch.tensor(spec.sinks, device=dev)
        q_seq, k_seq, k_pos = meta

        def mask_mod(b, h, q_idx, kv_idx):
            qs = q_seq[b, q_idx]
            ok = (qs == k_seq[b, kv_idx]) & (qs != 0)
            dist = q_idx + q_off - kv_idx
            ok = ok & ((dist >= 0) | ~causal)
            dist = torch.where(causal, dist, dist.abs())
            return ok & ((dist < window) | (k_pos[b, kv_idx] < sinks))

        key = (b, b_pad, lq, lk, spec.causal, spec.window, spec.sinks, str(dev))
        if spec.has_batch_data:
            block_mask = build_block_mask(spec, b, b_pad, q_pad, k_pad, mask_mod, dev)
        else:
            block_mask = self._masks.get(key)
            if block_mask is None:
                block_mask = build_block_mask(spec, b, b_pad, q_pad, k_pad, mask_mod, dev)
                self._masks[key] = block_mask
                if len(self._masks) > self._max_masks:
                    self._masks.popitem(last=False)
            self._masks.move_to_end(key)

        score_mod = None
        if with_bias:
            # own tensors, never shared with mask_mod: a cached block mask holds tensors of an
            # earlier call, and dynamo guards on aliasing (sharing would change the graph)
            s_off, s_causal = q_off.clone(), causal.clone()
            m = slopes.to(device=dev, dtype=torch.float32)
            clamp = torch.tensor(math.inf if bias_clamp is None else float(bias_clamp), device=dev)

            def score_mod(score, b, h, q_idx, kv_idx):
                dist = q_idx + s_off - kv_idx
                dist = torch.where(s_causal, dist, dist.abs())
                penalty = m[h] * dist  # -bias
                # min(penalty, clamp) as a where, not torch.minimum: at a tie (penalty == clamp)
                # minimum splits the slope gradient in half, clamp() in the eager and sdpa masks
                # passes all of it; where passes all of it too, so the backends agree on ties
                return score - torch.where(penalty > clamp, clamp, penalty)

        pad_b, pad_q, pad_k = b_pad - b, q_pad - lq, k_pad - lk
        qp = F.pad(q, (0, 0, 0, pad_q, 0, 0, 0, pad_b)) if pad_q or pad_b else q  # (B_pad, H, q_pad, D)
        kp = F.pad(k, (0, 0, 0, pad_k, 0, 0, 0, pad_b)) if pad_k or pad_b else k  # (B_pad, H, k_pad, D)
        vp = F.pad(v, (0, 0, 0, pad_k, 0, 0, 0, pad_b)) if pad_k or pad_b else v
        # one graph per padded shape; allow more than dynamo's default 8 before it gives up
        with torch._dynamo.config.patch(recompile_limit=64):
            out = self._compiled(qp, kp, vp, score_mod=score_mod, block_mask=block_mask, scale=scale)
        return out[:b, :, :lq]

    @staticmethod
    def _meta(
        spec: MaskSpec, b: int, b_pad: int, q_pad: int, k_pad: int, dev: torch.device
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Per-row tensors read by ``mask_mod``: query seq ids (B_pad, q_pad), key seq ids and
        key positions within their sequence (B_pad, k_pad); seq id 0 marks padding of any kind."""
        lk = spec.k_len
        if spec.seq_ids is not None:
            seq = spec.seq_ids.clone()
            pos = spec.pos_in_seq
        else:
            seq = torch.ones(b, lk, dtype=torch.int64, device=dev)
            pos = torch.arange(lk, device=dev).expand(b, lk)
        if spec.lengths is not None:
            seq = seq.masked_fill(torch.arange(lk, device=dev)[None] >= spec.lengths[:, None], 0)
        k_seq = F.pad(seq, (0, k_pad - lk, 0, b_pad - b))
        k_pos = F.pad(pos, (0, k_pad - lk, 0, b_pad - b))
        q_seq = F.pad(seq[:, spec.q_offset :], (0, q_pad - spec.q_len, 0, b_pad - b))
        return q_seq, k_seq, k_pos


@functools.lru_cache(maxsize=1)
def flex_runner() -> FlexAlibi:
    """The process-wide :class:`FlexAlibi` (created on first use)."""
    return FlexAlibi()


def flex_alibi_attention(
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
    with_bias: bool = True,
) -> Tensor:
    """ALiBi attention with compiled FlexAttention; falls back to sdpa with one warning.

    Arguments and result as :func:`recsys_alibi.model.attention.alibi_attention`;
    ``with_bias=False`` drops the ALiBi bias (benchmarks: the cost of the bias itself).
    Falls back when gradients are needed on CPU (no flex backward there in torch 2.13) or when
    compiling fails for a shape (remembered: that shape is not tried again).

    Returns:
        (B, H, Lq, D) in ``q.dtype``; padded and empty rows are zeros.
    """
    kw = dict(causal=causal, lengths=lengths, window=window, seq_ids=seq_ids, sinks=sinks, bias_clamp=bias_clamp)
    spec = MaskSpec.from_inputs(q, k, v, slopes, **kw)
    runner = flex_runner()
    fallback_slopes = slopes if with_bias else torch.zeros_like(slopes)
    if q.device.type == "cpu" and needs_grad(q, k, v, slopes):
        runner.warn_once(
            "cpu-grad", "flex attention has no backward on CPU (torch 2.13); using sdpa for inputs that need gradients"
        )
        return sdpa_attention(q, k, v, fallback_slopes, scale=scale, **kw)
    b, h, lq, d = q.shape
    signature = (_bucket_batch(b), h, _round_up(lq), _round_up(spec.k_len), d, q.dtype, str(q.device))
    if signature not in runner.failed:
        try:
            out = runner(q, k, v, slopes, spec, bias_clamp=bias_clamp, scale=scale, with_bias=with_bias)
            return zero_rows_of(out, spec.zero_rows(spec.q_positions(q.device)))
        except Exception as err:  # compile/codegen failures surface as many exception types
            runner.failed.add(signature)
            runner.warn_once(
                f"fail-{type(err).__name__}",
                f"flex attention failed for shape {tuple(q.shape)} ({type(err).__name__}: {err}); using sdpa",
            )
    return sdpa_attention(q, k, v, fallback_slopes, scale=scale, **kw)
