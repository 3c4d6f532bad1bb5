"""Which keys each query may see, and the additive ALiBi mask built from it.

One definition of visibility shared by the eager and SDPA backends and by the flex block-mask
builder (:mod:`recsys_alibi.model.block_mask`; the flex ``mask_mod`` in
:mod:`recsys_alibi.model.score_mods` restates it element-wise; tests hold each against an
independent reference).

Positions: keys sit at ``0 .. Lk - 1`` and the queries are the LAST ``Lq`` of them (KV-cache
decoding). Query at position ``i`` sees key ``j`` when all of these hold:

- causal: ``j <= i``;
- lengths (right padding): ``i < length[b]`` and ``j < length[b]``;
- seq_ids (packed rows): ``seq[b, i] == seq[b, j] != 0`` (id 0 is padding);
- window: ``i - j < window`` (``|i - j| < window`` when not causal), unless ``j`` is one of
  the first ``sinks`` positions of its sequence (StreamingLLM sinks, Xiao et al. 2023).

A packed sequence must occupy one contiguous run of its row (that is what
:mod:`recsys_alibi.model.packing` produces); its first position is where its run starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from recsys_alibi.model.alibi import check_slopes, int_arg

__all__ = ["MaskSpec", "check_call", "positions_in_sequence", "zero_rows_of"]


def positions_in_sequence(seq_ids: Tensor) -> Tensor:
    """Index of each position within its run of equal sequence ids.

    Args:
        seq_ids: (B, L) integer.

    Returns:
        (B, L) int64: 0 at the first position of every run, then 1, 2, ...
    """
    _, length = seq_ids.shape
    idx = torch.arange(length, device=seq_ids.device).expand_as(seq_ids)
    start = torch.ones_like(seq_ids, dtype=torch.bool)
    start[:, 1:] = seq_ids[:, 1:] != seq_ids[:, :-1]
    run_start = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - run_start


def check_call(q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, bias_clamp: float | None) -> None:
    """Validate the tensors of an attention call: q (B, H, Lq, D) floating with D >= 1, k and v
    (B, H, Lk, D) of q's dtype and device, slopes (H,) floating, finite and >= 0
    (:func:`recsys_alibi.model.alibi.check_slopes`: values read on the CPU only), ``bias_clamp``
    > 0 or None. H = 0 or B = 0 is allowed (an empty result).

    Raises:
        TypeError: a non-tensor argument, a q that is not floating, k or v of another dtype
            than q, slopes not a floating tensor.
        ValueError: naming the argument that does not fit.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        shapes = f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        raise ValueError(f"q, k, v must be (B, H, L, D); got {shapes}")
    if not q.is_floating_point():
        raise TypeError(f"q must be a floating tensor, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"k and v must have q's dtype {q.dtype}; got k {k.dtype}, v {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"k and v must be on q's device {q.device}; got k {k.device}, v {v.device}")
    b, h, lq, d = q.shape
    lk = k.shape[2]
    if d < 1:
        raise ValueError(f"the head size D of q, k, v must be >= 1, got q {tuple(q.shape)}")
    if k.shape != (b, h, lk, d) or v.shape != (b, h, lk, d):
        shapes = f"{tuple(k.shape)}, {tuple(v.shape)}"
        raise ValueError(f"k, v must be (B, H, Lk, D) matching q {tuple(q.shape)}; got {shapes}")
    check_slopes(slopes)
    if slopes.device != q.device:
        raise ValueError(f"slopes must be on q's device {q.device}, got {slopes.device}")
    if slopes.shape != (h,):
        raise ValueError(f"slopes must be (H,) = ({h},), got {tuple(slopes.shape)}")
    if bias_clamp is not None and not bias_clamp > 0:
        raise ValueError(f"bias_clamp must be > 0 or None, got {bias_clamp}")


@dataclass(frozen=True)
class MaskSpec:
    """Visibility rules of one attention call (see the module docstring).

    Attributes:
        q_len: Lq. k_len: Lk >= Lq.
        causal, window (>= 1 or None), sinks (>= 0).
        lengths: (B,) int64 or None. seq_ids: (B, Lk) int64 or None.
        pos_in_seq: (B, Lk) int64 from :func:`positions_in_sequence`, set when seq_ids is.
    """

    q_len: int
    k_len: int
    causal: bool = True
    window: int | None = None
    sinks: int = 0
    lengths: Tensor | None = None
    seq_ids: Tensor | None = None
    pos_in_seq: Tensor | None = None

    @classmethod
    def from_inputs(
        cls,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        slopes: Tensor,
        *,
        causal: bool,
        lengths: Tensor | None,
        window: int | None,
        seq_ids: Tensor | None,
        sinks: int,
        bias_clamp: float | None,
    ) -> MaskSpec:
        """Validate the inputs of an attention call and gather its visibility rules.

        Args: as :func:`recsys_alibi.model.attention.alibi_attention`.

        Raises:
            TypeError: as :func:`check_call` and :meth:`build` (dtypes, non-integer arguments).
            ValueError: shapes that do not match (B, H, Lq, D) / (B, H, Lk, D) / (H,), Lq > Lk,
                lengths outside [0, Lk] (checked on CPU only: no device sync), window < 1,
                sinks < 0, bias_clamp <= 0, seq_ids not (B, Lk).
        """
        check_call(q, k, v, slopes, bias_clamp)
        b, _, lq, _ = q.shape
        lk = k.shape[2]
        return cls.build(
            b, lq, lk, q.device, causal=causal, lengths=lengths, window=window, seq_ids=seq_ids, sinks=sinks
        )

    @classmethod
    def build(
        cls,
        batch: int,
        q_len: int,
        k_len: int,
        device: torch.device,
        *,
        causal: bool = True,
        lengths: Tensor | None = None,
        window: int | None = None,
        seq_ids: Tensor | None = None,
        sinks: int = 0,
        check_lengths: bool = True,
    ) -> MaskSpec:
        """The visibility rules of a batch of B rows, Lq queries and Lk keys, before q, k, v exist
        (one spec, and one block mask, per batch: :func:`recsys_alibi.model.attention.batch_mask`).

        ``check_lengths=False`` skips reading ``lengths`` on the host (the range check), for a
        caller whose lengths are valid by construction and whose step must not read tensors
        on the host (the ranker's ``encode``; the sdpa and eager backends still check per call).

        Raises:
            TypeError: window, sinks, Lq or Lk not an integer (2.5, NaN); lengths or seq_ids
                not of an integer dtype (float lengths are not truncated).
            ValueError: window < 1, sinks < 0, lengths not (B,) or outside [0, Lk] (checked on
                CPU only: no device sync), seq_ids not (B, Lk).
        """
        q_len, k_len = int_arg("Lq", q_len), int_arg("Lk", k_len)
        if q_len < 1 or k_len < q_len:
            raise ValueError(f"need 1 <= Lq <= Lk (queries are the last Lq positions); got Lq={q_len}, Lk={k_len}")
        window = None if window is None else int_arg("window", window)
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None, got {window}")
        sinks = int_arg("sinks", sinks)
        if sinks < 0:
            raise ValueError(f"sinks must be >= 0, got {sinks}")
        if lengths is not None:
            lengths = _integer_tensor("lengths", lengths, device)
            if lengths.shape != (batch,):
                raise ValueError(f"lengths must be (B,) = ({batch},), got {tuple(lengths.shape)}")
            on_cpu = check_lengths and lengths.device.type == "cpu" and lengths.numel() > 0
            if on_cpu and (int(lengths.min()) < 0 or int(lengths.max()) > k_len):
                raise ValueError(f"lengths must lie in [0, Lk={k_len}]")
        pos_in_seq = None
        if seq_ids is not None:
            seq_ids = _integer_tensor("seq_ids", seq_ids, device)
            if seq_ids.shape != (batch, k_len):
                raise ValueError(f"seq_ids must be (B, Lk) = ({batch}, {k_len}), got {tuple(seq_ids.shape)}")
            pos_in_seq = positions_in_sequence(seq_ids)
        return cls(
            q_len=q_len, k_len=k_len, causal=causal, window=window, sinks=sinks,
            lengths=lengths, seq_ids=seq_ids, pos_in_seq=pos_in_seq,
        )  # fmt: skip

    def rules(self) -> dict:
        """The visibility arguments of :func:`recsys_alibi.model.attention.alibi_attention` that
        this spec was built from: causal, lengths, window, seq_ids, sinks."""
        return dict(
            causal=self.causal, lengths=self.lengths, window=self.window, seq_ids=self.seq_ids, sinks=self.sinks
        )

    @property
    def q_offset(self) -> int:
        """Position of the first query among the keys, ``Lk - Lq``."""
        return self.k_len - self.q_len

    @property
    def has_batch_data(self) -> bool:
        """Whether visibility differs between batch rows at all."""
        return self.lengths is not None or self.seq_ids is not None

    @property
    def needs_batch_mask(self) -> bool:
        """Whether the rows that are not zeroed need a per-batch-row mask.

        Under causal masking with right padding a real query never reaches a padded key, so
        one (1, H, Lq, Lk) mask serves the batch; only seq_ids or non-causal padding need B.
        """
        return self.seq_ids is not None or (self.lengths is not None and not self.causal)

    def q_positions(self, device: torch.device) -> Tensor:
        """(Lq,) int64 positions of the queries among the keys."""
        return torch.arange(self.q_offset, self.k_len, device=device)

    def visible(self, q_pos: Tensor, k_pos: Tensor, *, batch: bool = True) -> Tensor:
        """Visibility of keys ``k_pos`` from queries ``q_pos``.

        Args:
            q_pos: (lq,) int64 query positions. k_pos: (lk,) int64 key positions.
            batch: apply the per-row rules (lengths, seq_ids). ``batch=False`` is exact for
                the rows that are not zeroed only when ``not needs_batch_mask``.

        Returns:
            (B, 1, lq, lk) bool when per-row rules apply, else (1, 1, lq, lk).
        """
        d = q_pos.to(torch.int32)[:, None] - k_pos.to(torch.int32)[None, :]  # (lq, lk)
        return self._rules(d, q_pos, k_pos, batch)

    def _rules(self, d: Tensor, q_pos: Tensor, k_pos: Tensor, batch: bool) -> Tensor:
        """:meth:`visible` given the signed distances ``d = i - j`` (lq, lk), int or float."""
        if not batch and self.seq_ids is not None:
            raise ValueError("seq_ids make visibility depend on the batch row")
        vis = d >= 0 if self.causal else torch.ones_like(d, dtype=torch.bool)
        if self.window is not None:
            dist = d if self.causal else d.abs()
            in_window = dist < self.window  # (lq, lk)
            if self.sinks > 0:
                if self.pos_in_seq is not None:
                    is_sink = self.pos_in_seq[:, k_pos] < self.sinks  # (B, lk)
                    in_window = in_window[None] | is_sink[:, None, :]  # (B, lq, lk)
                else:
                    in_window = in_window | (k_pos < self.sinks)[None, :]
            vis = vis & in_window
        vis = vis.reshape(-1, 1, len(q_pos), len(k_pos))  # (1 | B, 1, lq, lk)
        if batch and self.lengths is not None:
            n = self.lengths[:, None]  # (B, 1)
            vis = vis & ((q_pos[None, :] < n)[:, None, :, None] & (k_pos[None, :] < n)[:, None, None, :])
        if batch and self.seq_ids is not None:
            qs = self.seq_ids[:, q_pos]  # (B, lq)
            ks = self.seq_ids[:, k_pos]  # (B, lk)
            same = (qs[:, :, None] == ks[:, None, :]) & (qs != 0)[:, :, None]  # (B, lq, lk)
            vis = vis & same[:, None]
        return vis

    def zero_rows(self, q_pos: Tensor) -> Tensor | None:
        """Query rows whose output is zero by definition (padding), or None.

        Returns:
            (B, 1, lq, 1) bool, or None when no per-row rule applies.
        """
        zero = None
        if self.lengths is not None:
            zero = q_pos[None, :] >= self.lengths[:, None]  # (B, lq)
        if self.seq_ids is not None:
            pad = self.seq_ids[:, q_pos] == 0
            zero = pad if zero is None else zero | pad
        return None if zero is None else zero[:, None, :, None]

    def padded_keys(self, device: torch.device) -> Tensor | None:
        """(B, 1, Lk, 1) bool, the keys at or beyond each row's length (masked for every query),
        or None without ``lengths``."""
        if self.lengths is None:
            return None
        return (torch.arange(self.k_len, device=device)[None, :] >= self.lengths[:, None])[:, None, :, None]

    def additive_mask(
        self,
        slopes: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        *,
        bias_clamp: float | None,
        batch: bool,
        dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        """ALiBi bias with ``-inf`` at invisible keys; rows with no visible key get zeros.

        Args:
            slopes: (H,) floating; the mask is differentiable with respect to it.
            q_pos, k_pos, batch: as in :meth:`visible`.
            bias_clamp: ``bias = max(-slope * dist, -bias_clamp)`` when set.
            dtype: dtype of the returned mask.

        Returns:
            mask: (1 | B, H, lq, lk) ``dtype``; finite everywhere in a row with no visible key.
            empty: (1 | B, 1, lq, 1) bool, the rows with no visible key (their output must be
            zeroed by the caller).
        """
        ct = torch.promote_types(dtype, torch.float32)  # bias computed in >= float32
        d = q_pos.to(ct)[:, None] - k_pos.to(ct)[None, :]  # (lq, lk) signed i - j
        vis = self._rules(d, q_pos, k_pos, batch)  # (Bm, 1, lq, lk)
        empty = ~vis.any(dim=-1, keepdim=True)  # (Bm, 1, lq, 1)
        if q_pos.device.type != "cpu" or empty.any():  # (no host sync on a GPU)
            vis = vis | empty  # keep softmax finite; the caller zeroes these rows
        # 0 where visible, -inf elsewhere: adding the (finite) bias keeps -inf, never NaN
        blocked = torch.zeros(vis.shape, dtype=ct, device=vis.device).masked_fill_(~vis, float("-inf"))
        dist = d.abs_()  # (lq, lk)
        neg_slopes = -slopes.to(ct)[:, None, None]  # (H, 1, 1)
        if bias_clamp is None:
            mask = torch.addcmul(blocked, dist, neg_slopes)  # (Bm, H, lq, lk), one pass
        else:
            mask = (dist * neg_slopes).clamp(min=-bias_clamp) + blocked
        return mask.to(dtype), empty


def _integer_tensor(name: str, value: Tensor, device: torch.device) -> Tensor:
    """``value`` as an int64 tensor on ``device``; TypeError (naming ``name``) unless its dtype is integer."""
    t = torch.as_tensor(value, device=device)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
    return t.to(torch.int64)


def zero_rows_of(out: Tensor, *masks: Tensor | None) -> Tensor:
    """Zero the rows of ``out`` (B, H, Lq, D) flagged by any (1 | B, 1, Lq, 1) mask."""
    for m in masks:
        if m is not None:
            out = out.masked_fill(m, 0.0)
    return out
