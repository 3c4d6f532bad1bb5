"""The FlexAttention ``BlockMask`` of one batch, built once on the device and shared by every layer.

The flex kernel works on a padded grid: B is bucketed to the next power of two, Lq and Lk to
multiples of :data:`BLOCK` (128), so that one compiled kernel serves every batch of a bucket.
Each 128 x 128 block of the grid is empty (skipped), partial (the ``mask_mod`` decides each
pair) or full (every pair visible: the kernel skips the ``mask_mod``; ``full_kv_num_blocks`` /
``full_kv_indices``).

How the blocks are classified, exactly and without a B x L x L tensor or a Python loop: under
the rules of :mod:`recsys_alibi.model.masks` the keys a query ``i`` sees are one run of its own
sequence ``[start, end]``, cut by causality and the window to one interval ``W``, plus the
sink interval ``S`` at the start of the run. The number of visible keys of query ``i`` in key
block ``[k0, k0 + 127]`` is ``|W ∩ K| + |S ∩ K| - |W ∩ S ∩ K|``, an O(1) sum of interval
lengths; summing it over the 128 queries of a block gives that block's exact count of visible
pairs. Memory: B x Lq x (Lk / 128) int32 (32 MiB at B = 4, L = 16,384).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

from recsys_alibi.model.masks import MaskSpec, positions_in_sequence
from recsys_alibi.model.score_mods import MaskModKey, visibility_mask_mod

__all__ = ["BLOCK", "FlexMask", "block_counts", "bucket_batch", "build_flex_mask", "round_up"]

BLOCK = 128  # sparse block size of the BlockMask; Lq and Lk are padded to multiples of it


def round_up(n: int, m: int = BLOCK) -> int:
    """``n`` rounded up to a multiple of ``m``."""
    return -(-n // m) * m


def bucket_batch(b: int) -> int:
    """Batch size bucket: the next power of two (bounds recompiles across last batches)."""
    return 1 << max(0, b - 1).bit_length()


@dataclass(frozen=True)
class FlexMask:
    """One batch's visibility on the padded flex grid.

    Attributes:
        block_mask: the BlockMask, batch dim ``batch_pad``, head dim 1, blocks of 128 x 128, with
            full blocks marked and its ``mask_mod`` specialised by ``mask_key``.
        mask_key: the :class:`MaskModKey` of ``block_mask.mask_mod``.
        spec: the rules it was built from. batch, batch_pad, q_pad, k_pad: the grid.
        offset: 0-dim int64 ``Lk - Lq`` on the device when decoding (read by the mods), else None
            (no host-to-device copy for the self-attention of training).
    """

    block_mask: BlockMask
    mask_key: MaskModKey
    spec: MaskSpec
    batch: int
    batch_pad: int
    q_pad: int
    k_pad: int
    offset: Tensor | None


def _runs(spec: MaskSpec, rows: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per position of the Lk keys: sequence id (0 = padding), run start, run end (inclusive) and
    position within the run; each (rows, Lk) int64."""
    lk = spec.k_len
    idx = torch.arange(lk, device=device).expand(rows, lk)
    if spec.seq_ids is not None:
        seq = spec.seq_ids
        pos = spec.pos_in_seq
        start = idx - pos
        end = idx + positions_in_sequence(seq.flip(1)).flip(1)  # distance to the run's last key
    else:
        seq = torch.ones(rows, lk, dtype=torch.int64, device=device)
        pos, start = idx, torch.zeros_like(idx)
        end = torch.full_like(idx, lk - 1)
    if spec.lengths is not None:
        n = spec.lengths[:, None]  # (B, 1)
        seq = seq.masked_fill(idx >= n, 0)
        end = torch.minimum(end, n - 1)
    return seq, start, end, pos


def _overlap(lo: Tensor, hi: Tensor, k0: Tensor) -> Tensor:
    """Keys of [lo, hi] (R, Q, 1) in the key blocks starting at k0 (1, 1, n_kb): (R, Q, n_kb) int32."""
    return (torch.minimum(hi, k0 + BLOCK - 1) - torch.maximum(lo, k0) + 1).clamp_(min=0).to(torch.int32)


def block_counts(spec: MaskSpec, q_pad: int, k_pad: int, device: torch.device) -> Tensor:
    """Exact number of visible (query, key) pairs in every 128 x 128 block of the padded grid.

    Args:
        spec: the visibility rules. q_pad, k_pad: Lq and Lk padded to multiples of 128.
        device: where to compute.

    Returns:
        (R, q_pad / 128, k_pad / 128) int32, R = B when per-row rules apply, else 1. Padded
        queries and keys see nothing.
    """
    rows = spec.lengths.shape[0] if spec.lengths is not None else 1
    rows = spec.seq_ids.shape[0] if spec.seq_ids is not None else rows
    seq, start, end, _ = _runs(spec, rows, device)
    pos = torch.arange(spec.q_offset, spec.k_len, device=device)  # (Lq,) query positions
    live = seq[:, pos] != 0  # (R, Lq)
    st, en = start[:, pos], end[:, pos]  # (R, Lq) the run of each query
    i = pos.expand_as(st)
    w_lo, w_hi = st, en
    if spec.causal:
        w_hi = torch.minimum(w_hi, i)
    if spec.window is not None:
        w_lo = torch.maximum(w_lo, i - spec.window + 1)
        if not spec.causal:
            w_hi = torch.minimum(w_hi, i + spec.window - 1)
    w_hi = torch.where(live, w_hi, -1)  # dead queries: the empty interval [lo, -1]
    k0 = torch.arange(0, k_pad, BLOCK, device=device)[None, None]  # (1, 1, n_kb)
    count = _overlap(w_lo[..., None], w_hi[..., None], k0)  # (R, Lq, n_kb)
    if spec.window is not None and spec.sinks > 0:
        s_hi = torch.minimum(en, st + spec.sinks - 1)
        if spec.causal:
            s_hi = torch.minimum(s_hi, i)
        s_hi = torch.where(live, s_hi, -1)
        both_lo, both_hi = torch.maximum(w_lo, st), torch.minimum(w_hi, s_hi)  # W ∩ S
        count += _overlap(st[..., None], s_hi[..., None], k0) - _overlap(both_lo[..., None], both_hi[..., None], k0)
    count = F.pad(count, (0, 0, 0, q_pad - spec.q_len))  # (R, q_pad, n_kb)
    return count.view(rows, q_pad // BLOCK, BLOCK, -1).sum(dim=2, dtype=torch.int32)


def _ordered(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Count and indices (selected blocks first, ascending) of the True blocks of each row."""
    num = blocks.sum(dim=-1, dtype=torch.int32)  # (B, 1, n_qb)
    idx = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num, idx


def _mask_mod_tensors(spec: MaskSpec, b: int, b_pad: int, q_pad: int, k_pad: int, dev) -> tuple[Tensor, ...]:
    """Query seq ids (B_pad, q_pad), key seq ids and key positions in their run (B_pad, k_pad);
    seq id 0 marks padding of any kind (right padding, bucket padding, packing)."""
    rows = b if spec.has_batch_data else 1
    seq, _, _, pos = _runs(spec, rows, dev)
    seq, pos = seq.expand(b, -1), pos.expand(b, -1)
    k_seq = F.pad(seq, (0, k_pad - spec.k_len, 0, b_pad - b))
    k_pos = F.pad(pos, (0, k_pad - spec.k_len, 0, b_pad - b))
    q_seq = F.pad(seq[:, spec.q_offset :], (0, q_pad - spec.q_len, 0, b_pad - b))
    return q_seq, k_seq, k_pos


def build_flex_mask(spec: MaskSpec, batch: int, device: torch.device) -> FlexMask:
    """Build the :class:`FlexMask` of one batch on ``device`` (no host sync, no Python loop).

    Args:
        spec: visibility rules of the batch (from :meth:`MaskSpec.build` or ``from_inputs``).
        batch: B, rows of the batch.
        device: the device of q, k, v.

    Returns:
        :class:`FlexMask` on the grid (bucket_batch(B), round_up(Lq), round_up(Lk)); bucket rows
        ``>= B`` are empty.
    """
    b_pad, q_pad, k_pad = bucket_batch(batch), round_up(spec.q_len), round_up(spec.k_len)
    padded = b_pad != batch or q_pad != spec.q_len or k_pad != spec.k_len
    mask_key = MaskModKey(
        causal=spec.causal, window=spec.window, sinks=spec.sinks if spec.window is not None else 0,
        rows=spec.has_batch_data or padded, offset=spec.q_offset != 0,
    )  # fmt: skip
    offset = torch.tensor(spec.q_offset, device=device) if spec.q_offset else None
    q_seq, k_seq, k_pos = _mask_mod_tensors(spec, batch, b_pad, q_pad, k_pad, device)
    mask_mod = visibility_mask_mod(mask_key, q_seq=q_seq, k_seq=k_seq, k_pos=k_pos, offset=offset)
    count = block_counts(spec, q_pad, k_pad, device)[:, None].expand(batch, -1, -1, -1)  # (B, 1, n_qb, n_kb)
    count = F.pad(count, (0, 0, 0, 0, 0, 0, 0, b_pad - batch))  # (B_pad, 1, n_qb, n_kb)
    full = count == BLOCK * BLOCK
    kv_num, kv_idx = _ordered((count > 0) & ~full)
    full_num, full_idx = _ordered(full)
    block_mask = BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(q_pad, k_pad)
    )
    return FlexMask(block_mask, mask_key, spec, batch, b_pad, q_pad, k_pad, offset)
