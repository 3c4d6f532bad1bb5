"""The ranker: item embeddings -> causal transformer with ALiBi -> tied scoring head.

A SASRec-style next-item model (Kang & McAuley, ICDM 2018) whose only position signal is ALiBi
(Press, Smith & Lewis, ICLR 2022). ``position="learned"`` adds SASRec's table of ``max_len``
position vectors instead (the baseline, same code); ``position="none"`` has no position signal.
Blocks are pre-LayerNorm. The output logits are dot products with the item table (tied), so the
padding column 0 is never ranked by callers that mask it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from recsys_alibi.config import ModelConfig
from recsys_alibi.model.alibi import AlibiSlopes, free_head_query_scale
from recsys_alibi.model.attention import BatchMask, alibi_attention, batch_mask, eager_attention, needs_grad
from recsys_alibi.model.embeddings import ItemEmbeddings
from recsys_alibi.model.frequency import LowPassRescale
from recsys_alibi.model.item_features import ItemFeatures
from recsys_alibi.model.masks import MaskSpec


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention whose scores carry the ALiBi bias.

    Args:
        cfg: model config (``d_model``, ``n_heads``, backend, window, sinks, bias clamp).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, length, _ = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.cfg.n_heads, -1)  # (B, L, 3, H, D/H)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, L, D/H)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        slopes: torch.Tensor,
        lengths: torch.Tensor | None,
        seq_ids: torch.Tensor | None = None,
        backend: str | None = None,
        mask: BatchMask | None = None,
        query_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L, D) float -> (B, L, D); ``slopes`` (H,) float32 (zeros: no bias).

        ``mask``: the batch's :class:`BatchMask` (built once by :meth:`AlibiRanker.encode`);
        when given, ``lengths``, ``seq_ids`` and ``backend`` are not read. ``query_scale``:
        (B or 1, H, L, 1) factors on the queries (:func:`recsys_alibi.model.alibi.free_head_query_scale`).
        """
        q, k, v = self._heads(x)
        if query_scale is not None:
            q = q * query_scale.to(q.dtype)
        if mask is not None:
            attended = alibi_attention(q, k, v, slopes, bias_clamp=self.cfg.bias_clamp, mask=mask)  # (B, H, L, D/H)
            batch, _, length, _ = attended.shape
            return self.out(attended.transpose(1, 2).reshape(batch, length, -1))
        attended = alibi_attention(
            q, k, v, slopes,
            causal=True,
            lengths=lengths if seq_ids is None else None,
            seq_ids=seq_ids,
            window=self.cfg.window,
            sinks=self.cfg.sinks,
            bias_clamp=self.cfg.bias_clamp,
            backend=backend or self.cfg.attention_backend,
        )  # (B, H, L, D/H)
        batch, _, length, _ = attended.shape
        return self.out(attended.transpose(1, 2).reshape(batch, length, -1))

    def weights(
        self, x: torch.Tensor, slopes: torch.Tensor, lengths: torch.Tensor, query_scale: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention weights (B, H, L, L) float32 from the eager reference (diagnostics only)."""
        q, k, v = self._heads(x)
        if query_scale is not None:
            q = q * query_scale.to(q.dtype)
        _, weights = eager_attention(
            q, k, v, slopes, causal=True, lengths=lengths, window=self.cfg.window,
            sinks=self.cfg.sinks, bias_clamp=self.cfg.bias_clamp, return_weights=True,
        )
        return weights


class TransformerBlock(nn.Module):
    """Pre-LN block: x + Attn(LN(x)), then x + FFN(LN(x)); GELU feed-forward of width ffn_mult*D.

    With ``model.lowpass_window`` w > 0 the first half is ``x + a * F(LN(x)) + (1 - a) * Attn(LN(x))``,
    ``F`` the causal low-pass rescaling (:class:`recsys_alibi.model.frequency.LowPassRescale`), ``a`` =
    ``model.lowpass_mix`` (BSARec, AAAI 2024).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.lowpass = LowPassRescale(cfg.d_model, cfg.lowpass_window) if cfg.lowpass_window else None
        self.lowpass_mix = cfg.lowpass_mix
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.ffn = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.ffn_mult * cfg.d_model),
            nn.GELU(),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.ffn_mult * cfg.d_model, cfg.d_model),
        )
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self, x, slopes, lengths, seq_ids=None, backend=None, mask=None, query_scale=None, positions=None
    ) -> torch.Tensor:
        """(B, L, D) -> (B, L, D); ``mask``, ``query_scale`` as in :meth:`CausalSelfAttention.forward`;
        ``positions`` (B or 1, L) int64 (:func:`query_positions`), required with the low-pass branch."""
        normed = self.attn_norm(x)
        mixed = self.attn(normed, slopes, lengths, seq_ids, backend, mask, query_scale)
        if self.lowpass is not None:
            mixed = self.lowpass_mix * self.lowpass(normed, positions) + (1 - self.lowpass_mix) * mixed
        x = x + self.dropout(mixed)
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


def _position_table(cfg: ModelConfig) -> nn.Embedding:
    """The learned position table, (max_len, d_model) float32 (``model.position=learned``, the SASRec baseline).

    Raises:
        ValueError: the table cannot be allocated (``model.max_len`` far beyond any history), naming its size.
    """
    try:
        return nn.Embedding(cfg.max_len, cfg.d_model)
    except (RuntimeError, MemoryError) as err:  # torch: "DefaultCPUAllocator: can't allocate memory"
        size = cfg.max_len * cfg.d_model * 4
        raise ValueError(f"model.max_len={cfg.max_len} with model.position=learned needs a position table of "
                         f"{size / 2**30:,.1f} GiB (max_len x d_model float32), which cannot be allocated here "
                         f"({type(err).__name__}); lower model.max_len (auto sets it from the history lengths)") from None


class AlibiRanker(nn.Module):
    """Next-item ranker over a catalog of N items (indices 1..N; 0 = padding).

    Args:
        cfg: the model config, ``max_len`` resolved (``auto`` is replaced by ``train``:
            recsys_alibi.training.data_rules).
        n_items: catalog size N.

    Raises:
        ValueError: ``cfg.max_len`` is still ``auto``.

    Shapes: histories are right-padded (B, L) int64 with (B,) lengths; ``encode`` returns
    (B, L, D); ``score`` returns (B, N + 1) float32 logits for the next item after each history.

    Example:
        >>> model = AlibiRanker(ModelConfig(d_model=16, n_heads=2, n_layers=1), n_items=50)
        >>> model.score(torch.tensor([[3, 7, 0]]), torch.tensor([2])).shape  # (B=1, N+1=51)
        torch.Size([1, 51])
    """

    def __init__(self, cfg: ModelConfig, n_items: int, item_features: ItemFeatures | None = None) -> None:
        super().__init__()
        if cfg.max_len == "auto":
            raise ValueError("model.max_len=auto is set from the training data by `train`; give a number to build a model")
        self.cfg = cfg
        self.n_items = n_items
        self.items = ItemEmbeddings(
            n_items, cfg.d_model, time_gap_buckets=cfg.time_gap_buckets,
            backend=cfg.embedding_backend, sharded=cfg.shard_embeddings,
        )  # fmt: skip
        self.slopes = AlibiSlopes.from_config(cfg)
        self.positions = _position_table(cfg) if cfg.position == "learned" else None
        self.input_dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model)
        if item_features is not None:  # built last: a model without features draws exactly as before
            self.item_features = item_features

    @property
    def features(self) -> ItemFeatures | None:
        """The item feature encoder and catalog (``model.item_features``), None for an id-only model."""
        return self._modules.get("item_features")

    def item_vectors(self) -> torch.Tensor:
        """(N + 1, D) float32 item vectors: the tied table of inputs and output scores.

        Id-only model: the item table itself. With item features: ``id_keep * id_row + f(features)``
        (:mod:`recsys_alibi.model.item_features`); row 0 (padding) is zeros either way. In training mode,
        ``model.item_features.id_dropout`` > 0 also zeroes the id part of that share of the items, drawn
        afresh at each call (one call per training step: the same items lose it in inputs and scores).
        """
        features = self.features
        if features is None:
            return self.items.weight
        keep = features.id_keep  # (N + 1,)
        dropout = self.cfg.item_features.id_dropout if self.training else 0.0
        if dropout > 0:
            keep = keep * (torch.rand_like(keep) >= dropout).to(keep.dtype)
        return self.items.weight * keep[:, None] + features.vectors()

    def feature_inputs(
        self, item_idx: torch.Tensor, lengths: torch.Tensor, gaps: torch.Tensor | None = None,
        vectors: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L, D) input rows of a feature model: each position's item vector (+ its time-gap row), zeros
        at padding; ``vectors`` (N + 1, D): :meth:`item_vectors`, computed here when not given."""
        vectors = self.item_vectors() if vectors is None else vectors
        valid = torch.arange(item_idx.shape[1], device=item_idx.device)[None, :] < lengths[:, None]  # (B, L)
        rows = F.embedding(item_idx, vectors).float()  # (B, L, D)
        if gaps is not None:
            rows = rows + self.items.gap_rows(gaps)
        return rows.masked_fill(~valid[..., None], 0.0)

    @property
    def max_context(self) -> int | None:
        """Longest history the model accepts (items): ``max_len`` for learned positions, else None."""
        return self.cfg.max_len if self.positions is not None else None

    def _head_slopes(self) -> torch.Tensor:
        slopes = self.slopes()  # (H,)
        return slopes if self.cfg.position == "alibi" else torch.zeros_like(slopes)

    @property
    def uses_time_gaps(self) -> bool:
        """True when the model reads time-gap buckets beside the items (``model.time_gap_buckets``)."""
        return self.items.time_gap_buckets > 0

    def _embed(
        self,
        item_idx: torch.Tensor,
        lengths: torch.Tensor,
        embedded: torch.Tensor | None = None,
        gaps: torch.Tensor | None = None,
        seq_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L, D) float32 scaled item rows, plus each token's learned position in its own sequence
        (counted from the start of its packed run when ``seq_ids`` (B, L) is given, as SASRec reads an
        unpacked row), before input dropout."""
        if embedded is None and self.features is not None:
            embedded = self.feature_inputs(item_idx, lengths, gaps)
        rows = self.items(item_idx, lengths, gaps) if embedded is None else embedded  # (B, L, D)
        x = rows * math.sqrt(self.cfg.d_model)
        if self.positions is not None:
            length = item_idx.shape[1]
            if length > self.cfg.max_len:
                raise ValueError(
                    f"learned positions cover {self.cfg.max_len} items; got a history of {length}: "
                    "truncate to model.max_len or use model.position=alibi"
                )
            x = x + self.positions(query_positions(length, seq_ids, x.device))  # (B or 1, L, D)
        return self.input_dropout(x)

    def encode(
        self,
        item_idx: torch.Tensor,
        lengths: torch.Tensor,
        seq_ids: torch.Tensor | None = None,
        backend: str | None = None,
        embedded: torch.Tensor | None = None,
        gaps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states (B, L, D) float32 of right-padded rows.

        Args:
            item_idx: (B, L) int64, right-padded with 0.
            lengths: (B,) int64 non-padding positions per row.
            seq_ids: optional (B, L) int64 for packed rows (several users per row, 0 = padding).
            backend: overrides ``cfg.attention_backend`` (e.g. ``"eager"``).
            embedded: optional (B, L, D) float32 item rows already looked up (zeros at padding),
                used instead of ``self.items(item_idx, lengths)`` (sharded training).
            gaps: (B, L) int64 time-gap buckets aligned with ``item_idx``, required exactly when
                ``uses_time_gaps`` (``recsys_alibi.data.time_gaps``); ValueError otherwise.
        """
        slopes = self._head_slopes()
        x = self._embed(item_idx, lengths, embedded, gaps, seq_ids)
        mask = self.batch_mask(x, slopes, lengths, seq_ids, backend)
        positions = self._positions(item_idx.shape[1], seq_ids, x.device)
        query_scale = self._query_scale(positions)
        for block in self.blocks:
            x = block(x, slopes, lengths, seq_ids, backend, mask, query_scale, positions)
        return self.final_norm(x)

    def _positions(self, length: int, seq_ids: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
        """Each query's (B or 1, L) position in its sequence (:func:`query_positions`) when the free-head
        scale or the low-pass branch reads it, else None (no per-step work for the plain model)."""
        if self.cfg.free_head_scale == "none" and not self.cfg.lowpass_window:
            return None
        return query_positions(length, seq_ids, device)

    def _query_scale(self, positions: torch.Tensor | None) -> torch.Tensor | None:
        """The free heads' (B or 1, H, L, 1) query factors at ``positions`` (B or 1, L), or None when
        ``model.free_head_scale`` is off."""
        if self.cfg.free_head_scale == "none":
            return None
        return free_head_query_scale(self.cfg, positions)

    def batch_mask(
        self,
        x: torch.Tensor,
        slopes: torch.Tensor,
        lengths: torch.Tensor,
        seq_ids: torch.Tensor | None = None,
        backend: str | None = None,
    ) -> BatchMask:
        """The attention visibility of a batch, built once and shared by every layer (and the
        backward pass): for flex the BlockMask on the device. ``x`` (B, L, D) is the embedded
        input (its device, and whether it needs a gradient, decide the "auto" backend)."""
        batch, length, _ = x.shape
        spec = MaskSpec.build(
            batch, length, length, x.device, causal=True, lengths=lengths if seq_ids is None else None,
            seq_ids=seq_ids, window=self.cfg.window, sinks=self.cfg.sinks, check_lengths=False,
        )  # fmt: skip  (no host read in the step: the sdpa/eager backends check lengths per call)
        backend = backend or self.cfg.attention_backend
        return batch_mask(spec, batch, x.device, backend=backend, grad=needs_grad(x, slopes, *self.parameters()))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) hidden states -> (..., N + 1) float32 scores against the tied item table.

        Always float32, also under bf16 autocast: bfloat16 scores (8 significant bits) would tie
        many items and change the ranks.
        """
        with torch.autocast(hidden.device.type, enabled=False):
            return hidden.float() @ self.item_vectors().float().T

    def last_hidden(
        self, item_idx: torch.Tensor, lengths: torch.Tensor, backend: str | None = None, gaps: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, D) hidden state at each row's last event (position ``lengths - 1``); ``gaps`` as in ``encode``."""
        hidden = self.encode(item_idx, lengths, backend=backend, gaps=gaps)  # (B, L, D)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return hidden[rows, (lengths - 1).clamp(min=0)]

    def score(self, item_idx: torch.Tensor, lengths: torch.Tensor, gaps: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N + 1) float32 next-item scores for right-padded histories (B, L); ``gaps`` as in ``encode``."""
        return self.logits(self.last_hidden(item_idx, lengths, gaps=gaps)).float()

    @torch.no_grad()
    def attention_weights(
        self, item_idx: torch.Tensor, lengths: torch.Tensor, gaps: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Per layer, the (B, H, L, L) attention weights from the eager reference backend."""
        slopes = self._head_slopes()
        x = self._embed(item_idx, lengths, gaps=gaps)
        positions = self._positions(item_idx.shape[1], None, x.device)
        query_scale = self._query_scale(positions)
        weights = []
        for block in self.blocks:
            weights.append(block.attn.weights(block.attn_norm(x), slopes, lengths, query_scale))
            x = block(x, slopes, lengths, None, "eager", None, query_scale, positions)
        return weights


def query_positions(length: int, seq_ids: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Each query's position inside its own sequence: (1, L) ``0..L-1`` for right-padded rows, or
    (B, L) int64 counted from the start of each packed run of equal ``seq_ids`` (no host sync)."""
    steps = torch.arange(length, device=device)
    if seq_ids is None:
        return steps[None, :]
    starts = torch.ones_like(seq_ids, dtype=torch.bool)
    starts[:, 1:] = seq_ids[:, 1:] != seq_ids[:, :-1]
    first = torch.where(starts, steps[None, :], torch.zeros_like(steps)[None, :])  # (B, L)
    return steps[None, :] - torch.cummax(first, dim=1).values
