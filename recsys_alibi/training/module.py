"""A thin LightningModule around ``AlibiRanker``: loss, validation ranking, optimiser, schedule.

Validation is full-catalog ranking of each user's held-out validation item with the items
already in the history excluded; its NDCG@10 (``val/ndcg_at_10``) chooses the checkpoint and
drives early stopping.
"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import torch

from recsys_alibi.config import ModelConfig, TrainConfig
from recsys_alibi.evaluation.metrics import hit_rate_at_k, mrr, ndcg_at_k
from recsys_alibi.evaluation.ranking import mask_seen, target_ranks
from recsys_alibi.model.transformer import AlibiRanker
from recsys_alibi.training.losses import build_loss

VAL_MONITOR = "val/ndcg_at_10"


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """Learning-rate factor: linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class RankerModule(L.LightningModule):
    """Trains ``AlibiRanker`` on next-item prediction at every position of each window.

    Args:
        model_cfg: the model config.
        train_cfg: loss, optimiser and schedule.
        n_items: catalog size N.
        item_counts: (N + 1,) int64 training counts per item (sampled-softmax logQ).
        exclude_seen: validation ranks exclude the history's items, as ``evaluate.exclude_seen``.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        n_items: int,
        item_counts: torch.Tensor,
        exclude_seen: bool = True,
    ) -> None:
        super().__init__()
        self.model_cfg = model_cfg
        self.train_cfg = train_cfg
        self.exclude_seen = exclude_seen
        self.model = AlibiRanker(model_cfg, n_items)
        self.loss = build_loss(train_cfg, item_counts)
        self._val_ranks: list[torch.Tensor] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        hidden = self.model.encode(batch["inputs"], batch["lengths"], batch.get("seq_ids"))  # (B, L, D)
        supervised = batch["targets"] > 0  # (B, L)
        loss = self.loss(hidden[supervised], batch["targets"][supervised], self.model.items.weight)
        self.log("train/loss", loss, prog_bar=True, batch_size=int(supervised.sum()))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        scores = self.model.score(batch["history"], batch["lengths"])  # (B, N + 1)
        scores = mask_seen(scores, batch["history"], exclude_seen=self.exclude_seen, keep=batch["targets"])
        self._val_ranks.append(target_ranks(scores, batch["targets"]).cpu())

    def on_validation_epoch_end(self) -> None:
        if not self._val_ranks:
            return
        ranks = torch.cat(self._val_ranks).numpy()
        self._val_ranks.clear()
        self.log_dict(validation_metrics(ranks), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        decay, no_decay = [], []
        for name, param in self.named_parameters():
            (no_decay if param.ndim < 2 or "norm" in name else decay).append(param)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.train_cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.train_cfg.lr,
            betas=(0.9, 0.98),
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = min(self.train_cfg.warmup_steps, total // 2)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_cosine(step, warmup, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def validation_metrics(ranks: np.ndarray) -> dict[str, float]:
    """Validation NDCG@10, HR@10 and MRR from (U,) 1-based ranks; MLflow-safe names."""
    return {
        VAL_MONITOR: ndcg_at_k(ranks, 10),
        "val/hr_at_10": hit_rate_at_k(ranks, 10),
        "val/mrr": mrr(ranks),
    }
