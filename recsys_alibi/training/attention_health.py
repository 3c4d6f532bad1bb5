"""Attention health during training: per-layer, per-head entropy and share of zero weights.

ALiBi's bias ``-m_h * (i - j)`` (Press et al. 2022) grows without bound, so in low precision the
softmax gives far keys exactly zero weight (and zero gradient): the head "goes blind" there (see
:mod:`recsys_alibi.diagnostics`). :class:`AttentionHealth` watches for it on a fixed validation
batch and logs, per layer ``l`` and head ``h``:

- ``attn/l{l}_h{h}_entropy``: mean attention entropy over valid query rows, nats
  (``ln n`` for uniform attention over ``n`` keys, 0 for attention on one key);
- ``attn/l{l}_h{h}_zero_share``: share of exactly-zero weights among the (query, key) pairs the
  head may see (causal, both positions valid, inside the window or a sink).

The weights come from the eager reference backend (``AlibiRanker.attention_weights``) under
the trainer's precision context (bf16 autocast with ``precision="bf16-mixed"``), so they are
rounded like the training run's. Fused backends differ slightly (``docs/numerics.md``).
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from torch import Tensor

from recsys_alibi.data.buckets import LongestFirst
from recsys_alibi.model.masks import MaskSpec

__all__ = ["AttentionHealth", "attention_entropy", "first_rows", "health_batch", "health_metrics", "visible_pairs", "zero_weight_share"]

log = logging.getLogger(__name__)


def visible_pairs(lengths: Tensor, max_len: int, window: int | None = None, sinks: int = 0) -> Tensor:
    """(B, 1, L, L) bool: query ``i`` may see key ``j`` (causal, both ``< length``, window/sinks).

    Args:
        lengths: (B,) int, valid positions per right-padded row.
        max_len: L, the padded length.
        window, sinks: as ``model.window`` / ``model.sinks``.
    """
    spec = MaskSpec(q_len=max_len, k_len=max_len, causal=True, window=window, sinks=sinks,
                    lengths=lengths.to(torch.int64))  # fmt: skip
    pos = torch.arange(max_len, device=lengths.device)
    return spec.visible(pos, pos, batch=True)


def _pairs_mask(weights: Tensor, valid: Tensor | None, visible: Tensor | None) -> Tensor:
    """(B | 1, 1, L, L) bool pairs to count, from ``visible`` or causal x valid."""
    b, _, lq, lk = weights.shape
    if visible is not None:
        return visible.to(torch.bool).reshape(visible.shape[0] if visible.dim() == 4 else 1, 1, lq, lk)
    causal = torch.ones(lq, lk, dtype=torch.bool, device=weights.device).tril(lk - lq)  # (L, L)
    mask = causal[None, None]
    if valid is not None:
        valid = valid.to(torch.bool)  # (B, L)
        mask = mask & valid[:, None, -lq:, None] & valid[:, None, None, :]
    return mask


def attention_entropy(weights: Tensor, valid: Tensor | None = None) -> Tensor:
    """Mean entropy of the attention rows, per head.

    ``H_i = -sum_j w_ij ln w_ij`` (``0 ln 0 = 0``), averaged over the valid query rows of all
    batch rows. Computed in float64.

    Args:
        weights: (B, H, L, L) attention weights, rows summing to 1 (any float dtype).
        valid: (B, L) bool, True at real (non-padding) positions; None: all valid.

    Returns:
        (H,) float64, nats. NaN for a head when no row is valid.

    Example:
        >>> w = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # (B=1, H=1, L=2, L=2)
        >>> round(float(attention_entropy(w)[0]), 4)  # (0 + ln 2) / 2
        0.3466
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be (B, H, L, L), got shape {tuple(weights.shape)}")
    w = weights.to(torch.float64)
    ent = -torch.where(w > 0, w * torch.log(w), torch.zeros_like(w)).sum(dim=-1)  # (B, H, L)
    b, h, lq, _ = w.shape
    rows = torch.ones(b, lq, dtype=torch.bool, device=w.device) if valid is None else valid.to(torch.bool)[:, -lq:]
    rows = rows[:, None, :].expand(b, h, lq)  # (B, H, L)
    total = torch.where(rows, ent, torch.zeros_like(ent)).sum(dim=(0, 2))
    return total / rows.sum(dim=(0, 2)).to(torch.float64)


def zero_weight_share(weights: Tensor, valid: Tensor | None = None, visible: Tensor | None = None) -> Tensor:
    """Share of exactly-zero weights among the (query, key) pairs a head may see, per head.

    Args:
        weights: (B, H, L, L) attention weights.
        valid: (B, L) bool, real positions; pairs count when causal (``j <= i``) and both valid.
        visible: (B | 1, 1, L, L) bool, overrides ``valid``: exactly the pairs to count (e.g.
            :func:`visible_pairs` with the model's window and sinks, where masked keys are zero
            on purpose and must not count).

    Returns:
        (H,) float64 in [0, 1]; NaN for a head with no pair.
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be (B, H, L, L), got shape {tuple(weights.shape)}")
    pairs = _pairs_mask(weights, valid, visible)  # (B | 1, 1, L, L)
    zero = (weights == 0) & pairs  # (B, H, L, L)
    n = pairs.expand_as(weights).sum(dim=(0, 2, 3)).to(torch.float64)
    return zero.sum(dim=(0, 2, 3)).to(torch.float64) / n


def health_metrics(
    layer_weights: list[Tensor], lengths: Tensor, window: int | None = None, sinks: int = 0
) -> dict[str, float]:
    """``attn/l{l}_h{h}_entropy`` and ``attn/l{l}_h{h}_zero_share`` for each layer's (B, H, L, L)
    weights of right-padded rows with (B,) ``lengths``."""
    out: dict[str, float] = {}
    for layer, w in enumerate(layer_weights):
        length = w.shape[-1]
        valid = torch.arange(length, device=w.device)[None, :] < lengths.to(w.device)[:, None]  # (B, L)
        vis = visible_pairs(lengths.to(w.device), length, window, sinks)
        entropy = attention_entropy(w, valid)
        zeros = zero_weight_share(w, visible=vis)
        for h in range(w.shape[1]):
            out[f"attn/l{layer}_h{h}_entropy"] = float(entropy[h])
            out[f"attn/l{layer}_h{h}_zero_share"] = float(zeros[h])
    return out


def first_rows(loader: Any, max_rows: int) -> dict[str, Tensor] | None:
    """The first validation batch, or None: with validation batches served longest first
    (:class:`recsys_alibi.data.buckets.LongestFirst`), the first ``max_rows`` users in the
    dataset's order instead, so that the callback watches the same users as with batches in
    dataset order (random validation users), not the longest ones."""
    if isinstance(getattr(loader, "batch_sampler", None), LongestFirst):
        n = min(len(loader.dataset), max_rows)
        return loader.collate_fn([loader.dataset[i] for i in range(n)]) if n else None
    return next(iter(loader), None)


def health_batch(batch: dict[str, Tensor], n_heads: int, max_rows: int, max_bytes: int) -> dict[str, Tensor] | None:
    """The rows of a validation batch that :class:`AttentionHealth` watches: its first ``max_rows``
    rows, fewer when ``rows x H x L x L`` float32 weights would exceed ``max_bytes``.

    Args:
        batch: a validation batch: ``history`` (B, L) int64, ``lengths`` (B,) int64, optionally
            ``history_gaps`` (B, L) int64.
        n_heads: H.

    Returns:
        ``history``, ``lengths`` (and ``history_gaps``) of the kept rows, cut to their batch's
        longest history; None for a batch without events.
    """
    history, lengths = batch["history"], batch["lengths"]
    width = int(lengths.max()) if len(lengths) else 0
    if width < 1:
        return None
    per_row = n_heads * width * width * 4
    rows = max(1, min(max_rows, max_bytes // per_row))
    kept = {"history": history[:rows, :width].clone(), "lengths": lengths[:rows].clone()}
    if "history_gaps" in batch:  # a time-gap model reads them beside the items
        kept["history_gaps"] = batch["history_gaps"][:rows, :width].clone()
    return kept


class AttentionHealth(L.Callback):
    """Log per-layer, per-head attention entropy and zero-weight share at each validation end.

    The first batch of the first validation dataloader is kept (its first ``max_rows`` rows,
    fewer when ``B * H * L * L`` weights would exceed ``max_bytes`` per layer; the first users
    in the dataset's order when the loader serves the longest first: :func:`first_rows`) and reused every
    epoch, so the figures are comparable across epochs. Metrics go through
    ``pl_module.log_dict`` (MLflow-safe names, see the module docstring). The first time a head's
    zero share exceeds ``zero_share_threshold`` one warning is logged for that head.

    Args:
        zero_share_threshold: warn above this share of exactly-zero visible weights, in [0, 1].
        max_rows: most validation rows kept.
        max_bytes: memory bound of one layer's float32 weights.

    Attributes:
        last: the latest metrics dict. warned: the (layer, head) pairs already warned about.
    """

    def __init__(self, zero_share_threshold: float = 0.05, max_rows: int = 32, max_bytes: int = 256 << 20) -> None:
        super().__init__()
        if not 0.0 <= zero_share_threshold <= 1.0:
            raise ValueError(f"zero_share_threshold must lie in [0, 1], got {zero_share_threshold}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.zero_share_threshold = zero_share_threshold
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.batch: dict[str, Tensor] | None = None
        self.last: dict[str, float] = {}
        self.warned: set[tuple[int, int]] = set()

    def _keep_batch(self, trainer: L.Trainer, n_heads: int) -> dict[str, Tensor] | None:
        loaders = trainer.val_dataloaders
        if loaders is None:
            return None
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        batch = first_rows(loader, self.max_rows)
        return None if batch is None else health_batch(batch, n_heads, self.max_rows, self.max_bytes)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        model = pl_module.model
        if self.batch is None:
            self.batch = self._keep_batch(trainer, model.cfg.n_heads)
            if self.batch is None:
                log.warning("AttentionHealth: no validation batch; attention health is not logged")
                return
        history = self.batch["history"].to(pl_module.device)
        lengths = self.batch["lengths"].to(pl_module.device)
        was_training = model.training
        model.eval()
        with trainer.precision_plugin.forward_context():
            gaps = self.batch.get("history_gaps")
            gaps = gaps.to(pl_module.device) if gaps is not None else None
            weights = model.attention_weights(history, lengths, gaps)  # per layer (B, H, L, L)
        model.train(was_training)
        metrics = health_metrics(weights, lengths, model.cfg.window, model.cfg.sinks)
        self.last = metrics
        pl_module.log_dict(metrics, on_epoch=True, batch_size=int(lengths.shape[0]), sync_dist=True)  # mean over ranks
        self._warn(metrics, model.cfg.n_layers, model.cfg.n_heads, trainer.current_epoch)

    def _warn(self, metrics: dict[str, float], n_layers: int, n_heads: int, epoch: int) -> None:
        for layer in range(n_layers):
            for h in range(n_heads):
                share = metrics.get(f"attn/l{layer}_h{h}_zero_share", 0.0)
                if share > self.zero_share_threshold and (layer, h) not in self.warned:
                    self.warned.add((layer, h))
                    log.warning(
                        "attention layer %d head %d: %.1f%% of visible weights are exactly zero at epoch %d "
                        "(threshold %.1f%%): the head is blind to far events; see `recsys-alibi diagnose` "
                        "(model.bias_clamp, model.window, model.max_bias)",
                        layer, h, 100 * share, epoch, 100 * self.zero_share_threshold,
                    )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"warned": sorted(self.warned)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.warned = {tuple(x) for x in state_dict.get("warned", [])}
