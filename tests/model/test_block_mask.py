"""The BlockMask built once per batch: exact block classes, equal to the per-call mask block for
block, full blocks marked, shared by every layer of the ranker."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask

import pytest

from recsys_alibi.config import ModelConfig
from recsys_alibi.model import attention as attention_module
from recsys_alibi.model.alibi import alibi_slopes
from recsys_alibi.model.attention import alibi_attention, batch_mask
from recsys_alibi.model.block_mask import BLOCK, block_counts, build_flex_mask, round_up
from recsys_alibi.model.masks import MaskSpec
from recsys_alibi.model.transformer import AlibiRanker

CPU = torch.device("cpu")


def per_call_block_mask(spec: MaskSpec, batch: int, batch_pad: int) -> BlockMask:
    """The per-call builder this project used before (dense visibility, one slab of query blocks
    at a time, counted per 128 x 128 block), kept here as the reference."""
    q_pad, k_pad = round_up(spec.q_len), round_up(spec.k_len)
    per_row = spec.has_batch_data
    rows_b = batch if per_row else 1
    n_qb, n_kb = q_pad // BLOCK, k_pad // BLOCK
    k_pos = torch.arange(spec.k_len)
    counts = []
    for qb in range(n_qb):
        r0, r1 = qb * BLOCK, (qb + 1) * BLOCK
        q_pos = torch.arange(spec.q_offset + r0, spec.q_offset + min(r1, spec.q_len))
        if len(q_pos) == 0:
            counts.append(torch.zeros(rows_b, 1, n_kb, dtype=torch.int32))
            continue
        vis = spec.visible(q_pos, k_pos, batch=per_row)[:, 0]  # (Bm, n, Lk)
        vis = F.pad(vis, (0, k_pad - spec.k_len, 0, BLOCK - len(q_pos)))
        vis = vis.expand(rows_b, -1, -1).reshape(rows_b, 1, BLOCK, n_kb, BLOCK)
        counts.append(vis.sum(dim=(2, 4), dtype=torch.int32))
    count = torch.cat(counts, dim=1)[:, None].expand(batch, -1, -1, -1)
    count = F.pad(count, (0, 0, 0, 0, 0, 0, 0, batch_pad - batch))
    full = count == BLOCK * BLOCK
    partial = (count > 0) & ~full

    def ordered(blocks):
        num = blocks.sum(dim=-1, dtype=torch.int32)
        return num, torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)

    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=BLOCK, seq_lengths=(q_pad, k_pad))


def _packed_rows(b: int, lk: int, seed: int) -> torch.Tensor:
    """Rows of contiguous runs of random lengths (1..300), some runs padding (id 0)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(b):
        ids, s = [], 1
        while len(ids) < lk:
            n = int(torch.randint(1, 300, (1,), generator=g))
            ids += [s if float(torch.rand(1, generator=g)) > 0.15 else 0] * n
            s += 1
        rows.append(ids[:lk])
    return torch.tensor(rows)


VARIANTS = {
    "causal": dict(b=3, lq=520, lk=520),
    "bidir_window_sinks": dict(b=2, lq=400, lk=400, causal=False, window=150, sinks=3),
    "causal_window": dict(b=2, lq=700, lk=700, window=200),
    "padded": dict(b=3, lq=390, lk=390, lengths=[390, 0, 129]),
    "bidir_padded": dict(b=2, lq=300, lk=300, causal=False, lengths=[256, 77]),
    "packed": dict(b=3, lq=640, lk=640, seq_ids=1),
    "packed_window_sinks": dict(b=2, lq=700, lk=700, seq_ids=2, window=100, sinks=4),
    "packed_bidir_padded": dict(b=2, lq=500, lk=500, causal=False, seq_ids=3, lengths=[450, 500]),
    "decoding": dict(b=2, lq=70, lk=600),
    "decoding_window_sinks": dict(b=2, lq=130, lk=333, window=90, sinks=2, lengths=[333, 200]),
}


def _spec(variant: str) -> tuple[MaskSpec, int]:
    kw = dict(VARIANTS[variant])
    b, lq, lk = kw.pop("b"), kw.pop("lq"), kw.pop("lk")
    if "lengths" in kw:
        kw["lengths"] = torch.tensor(kw["lengths"])
    if "seq_ids" in kw:
        kw["seq_ids"] = _packed_rows(b, lk, kw["seq_ids"])
    return MaskSpec.build(b, lq, lk, CPU, **kw), b


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_batch_mask_equals_per_call_mask_block_for_block(variant):
    spec, b = _spec(variant)
    got = build_flex_mask(spec, b, CPU)
    want = per_call_block_mask(spec, b, got.batch_pad)
    assert got.block_mask.shape == want.shape
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        torch.testing.assert_close(getattr(got.block_mask, name), getattr(want, name), rtol=0, atol=0, msg=name)
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        n, gi, wi = getattr(want, num), getattr(got.block_mask, idx), getattr(want, idx)
        used = torch.arange(gi.shape[-1]) < n[..., None]  # the indices the kernel reads
        assert torch.equal(gi[used], wi[used]), idx


def test_block_counts_are_exact_on_random_rules():
    g = torch.Generator().manual_seed(11)
    for trial in range(40):
        b, lk = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 600, (1,), generator=g))
        lq = lk if trial % 3 else int(torch.randint(1, lk + 1, (1,), generator=g))
        window = None if trial % 4 == 0 else int(torch.randint(1, 300, (1,), generator=g))
        kw = dict(causal=bool(trial % 2), window=window, sinks=int(torch.randint(0, 5, (1,), generator=g)))
        if trial % 5 in (1, 3):
            kw["lengths"] = torch.randint(0, lk + 1, (b,), generator=g)
        if trial % 5 in (2, 3):
            kw["seq_ids"] = _packed_rows(b, lk, trial)
        spec = MaskSpec.build(b, lq, lk, CPU, **kw)
        got = block_counts(spec, round_up(lq), round_up(lk), CPU)
        vis = spec.visible(spec.q_positions(CPU), torch.arange(lk), batch=spec.has_batch_data)[:, 0]
        vis = F.pad(vis, (0, round_up(lk) - lk, 0, round_up(lq) - lq))
        want = vis.reshape(vis.shape[0], round_up(lq) // BLOCK, BLOCK, -1, BLOCK).sum(dim=(2, 4), dtype=torch.int32)
        assert torch.equal(got, want), (trial, kw)


def test_full_blocks_are_marked():
    spec = MaskSpec.build(1, 384, 384, CPU, causal=True)
    bm = build_flex_mask(spec, 1, CPU).block_mask
    # causal, 3 x 3 blocks: the diagonal is partial (mask_mod), the blocks below it are full
    assert bm.kv_num_blocks[0, 0].tolist() == [1, 1, 1]
    assert bm.full_kv_num_blocks[0, 0].tolist() == [0, 1, 2]
    assert bm.kv_indices[0, 0, :, 0].tolist() == [0, 1, 2]
    assert bm.full_kv_indices[0, 0, 2, :2].tolist() == [0, 1]
    # packed: two users of 128 in one row of 256 -> two full diagonal blocks under the
    # bidirectional rule, nothing across them
    seq = torch.tensor([[1] * 128 + [2] * 128])
    bm = build_flex_mask(MaskSpec.build(1, 256, 256, CPU, causal=False, seq_ids=seq), 1, CPU).block_mask
    assert bm.kv_num_blocks[0, 0].tolist() == [0, 0] and bm.full_kv_num_blocks[0, 0].tolist() == [1, 1]
    assert bm.full_kv_indices[0, 0, :, 0].tolist() == [0, 1]


def test_encode_builds_one_block_mask_per_batch_for_every_layer(monkeypatch):
    cfg = ModelConfig(d_model=32, n_heads=2, n_layers=3, dropout=0.0, attention_backend="flex", window=40, sinks=2)
    torch.manual_seed(0)
    model = AlibiRanker(cfg, n_items=30).eval()
    builds, masks = [], []
    real_build, real_flex = attention_module.build_flex_mask, attention_module.flex_alibi_attention

    def counting_build(*a, **kw):
        builds.append(1)
        return real_build(*a, **kw)

    def recording_flex(*a, mask=None, **kw):
        masks.append(mask)
        return real_flex(*a, mask=mask, **kw)

    monkeypatch.setattr(attention_module, "build_flex_mask", counting_build)
    monkeypatch.setattr(attention_module, "flex_alibi_attention", recording_flex)
    items = torch.randint(1, 31, (2, 100))
    seq_ids = torch.tensor([[1] * 60 + [2] * 40, [3] * 100])
    with torch.no_grad():
        got = model.encode(items, torch.tensor([100, 100]), seq_ids=seq_ids)
        want = model.encode(items, torch.tensor([100, 100]), seq_ids=seq_ids, backend="eager")
    assert len(builds) == 1 and len(masks) == 3 and all(m is masks[0] for m in masks)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_batch_mask_misuse_is_refused():
    q = k = v = torch.randn(2, 4, 64, 8)
    mask = batch_mask(MaskSpec.build(2, 64, 64, CPU), 2, CPU, backend="sdpa")
    with pytest.raises(ValueError, match="not both"):
        alibi_attention(q, k, v, alibi_slopes(4), mask=mask, window=8)
    with pytest.raises(ValueError, match="mask is for"):
        alibi_attention(q[:, :, :32], k[:, :, :32], v[:, :, :32], alibi_slopes(4), mask=mask)
    with pytest.raises(ValueError, match="slopes"):
        alibi_attention(q, k, v, alibi_slopes(3), mask=mask)
    torch.testing.assert_close(alibi_attention(q, k, v, alibi_slopes(4), mask=mask),
                               alibi_attention(q, k, v, alibi_slopes(4), backend="sdpa"))  # fmt: skip
