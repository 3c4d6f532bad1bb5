"""A thin LightningModule around ``AlibiRanker``: loss, validation ranking, optimiser, schedule.

Validation is full-catalog ranking of each user's held-out validation item with the items
already in the history excluded; its NDCG@10 (``val/ndcg_at_10``) chooses the checkpoint and
drives early stopping.

Under data-parallel training every rank validates its own users; the per-user sums and the
user count are all-reduced before dividing (:func:`validation_sums`), so W processes report
exactly the one-process value for the same weights (up to float64 summation order). The
random state of each step (dropout, sampled negatives) is re-seeded from
``(seed, global step, rank)``, so a run resumed from a checkpoint repeats the uninterrupted one.
"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import torch

from recsys_alibi.config import ModelConfig, TrainConfig
from recsys_alibi.evaluation.metrics import hit_rate_at_k, mrr, ndcg_at_k, per_user_metrics
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
        item_counts: (N + 1,) int64 training counts per item (sampled-softmax logQ), or None:
            at ``setup("fit")`` the counts come from the datamodule's ``item_counts()``, summed
            over all ranks.
        exclude_seen: validation ranks exclude the history's items, as ``evaluate.exclude_seen``.
        seed: base of the per-epoch random state (see the module doc).
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        n_items: int,
        item_counts: torch.Tensor | None = None,
        exclude_seen: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.model_cfg = model_cfg
        self.train_cfg = train_cfg
        self.exclude_seen = exclude_seen
        self.seed = seed
        self.model = AlibiRanker(model_cfg, n_items)
        self._counts_from_data = item_counts is None
        counts = item_counts if item_counts is not None else torch.zeros(n_items + 1, dtype=torch.int64)
        self.loss = build_loss(train_cfg, counts)
        self._val_ranks: list[torch.Tensor] = []

    def setup(self, stage: str) -> None:
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if stage == "fit" and self._counts_from_data and hasattr(datamodule, "item_counts"):
            counts = datamodule.item_counts().to(torch.float64)  # this rank's users
            if self.trainer.world_size > 1:
                strategy = self.trainer.strategy
                counts = strategy.reduce(counts.to(strategy.root_device), reduce_op="sum")
            self.loss = build_loss(self.train_cfg, counts.round().to(torch.int64).cpu())

    def on_train_batch_start(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        # dropout and sampled negatives of this step depend on (seed, step, rank) only
        torch.manual_seed(step_seed(self.seed, self.global_step, self.global_rank))

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
        ranks = torch.cat(self._val_ranks).numpy() if self._val_ranks else np.zeros(0, dtype=np.int64)
        self._val_ranks.clear()
        sums = torch.from_numpy(validation_sums(ranks))
        if self.trainer.world_size > 1:  # every rank takes part, also one without validation users
            sums = self.trainer.strategy.reduce(sums.to(self.device), reduce_op="sum").cpu()
        metrics = metrics_from_sums(sums.numpy())
        if metrics:  # the same global value on every rank: the sync below leaves it unchanged
            self.log_dict(metrics, prog_bar=True, sync_dist=True)

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


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed of one training step on one rank: a function of its arguments only (63 bits)."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1, np.uint64)[0] >> np.uint64(1))


_SUMMED = (VAL_MONITOR, "val/hr_at_10", "val/mrr")


def validation_sums(ranks: np.ndarray) -> np.ndarray:
    """(4,) float64: sums over users of NDCG@10, HR@10 and reciprocal rank, then the user count.

    Args:
        ranks: (U,) int 1-based ranks of the held-out items (U may be 0).
    """
    if len(ranks) == 0:
        return np.zeros(len(_SUMMED) + 1)
    per_user = per_user_metrics(ranks, [10])
    return np.array([per_user["NDCG@10"].sum(), per_user["HR@10"].sum(), per_user["MRR"].sum(), len(ranks)])


def metrics_from_sums(sums: np.ndarray) -> dict[str, float]:
    """Validation metrics from (4,) summed ``validation_sums`` of every rank ({} when no user)."""
    count = float(sums[-1])
    if count == 0:
        return {}
    return {name: float(total / count) for name, total in zip(_SUMMED, sums[:-1])}


def validation_metrics(ranks: np.ndarray) -> dict[str, float]:
    """Validation NDCG@10, HR@10 and MRR from (U,) 1-based ranks; MLflow-safe names."""
    return {
        VAL_MONITOR: ndcg_at_k(ranks, 10),
        "val/hr_at_10": hit_rate_at_k(ranks, 10),
        "val/mrr": mrr(ranks),
    }
