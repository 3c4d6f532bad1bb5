"""A thin LightningModule around ``AlibiRanker``: loss, validation ranking, optimiser, schedule.

Validation is full-catalog ranking of each user's held-out validation item; its NDCG@10
(``val/ndcg_at_10``) chooses the checkpoint and drives early stopping. The model reads the last
``max_len`` events; with ``exclude_seen`` the items of the *whole* history before the target
(the batch's ``seen``, not only the input window) are masked, and a seen target is a miss: the
one seen-item rule of ``recsys_alibi.evaluation.ranking``, so the logged value equals what
``evaluate`` reports for the same model, examples and context.

Under data-parallel training every rank validates its own users; the per-user sums and the
user count are all-reduced before dividing (:func:`validation_sums`), so W processes report
exactly the one-process value for the same weights (up to float64 summation order). The
random state of each step (dropout, sampled negatives) is re-seeded from
``(seed, global step, rank)``, so a run resumed from a checkpoint repeats the uninterrupted one.

With ``model.shard_embeddings=true`` on several processes the item table is sharded row-wise
when the trainer configures the model (``recsys_alibi.training.sharding``): training looks up
the rows it needs through the sharded table, validation sums per-shard counts, the table has its
own fused optimizer, and checkpoints hold the gathered table in the unsharded layout.
"""

from __future__ import annotations

import logging
import math

import lightning as L
import numpy as np
import torch
import torch.distributed as dist

from recsys_alibi.config import ModelConfig, TrainConfig
from recsys_alibi.evaluation.metrics import per_user_metrics
from recsys_alibi.evaluation.ranking import mask_seen, target_ranks
from recsys_alibi.model.item_features import CatalogFeatures, ItemFeatures
from recsys_alibi.model.transformer import AlibiRanker
from recsys_alibi.training.context_schedule import scheduled_steps
from recsys_alibi.training.losses import build_loss
from recsys_alibi.training.sharding import (
    TABLE_KEY,
    TABLE_OPTIMIZER,
    TABLE_STATE,
    PrefetchedRows,
    ShardedItemTable,
    insert_table_slot,
    remove_table_slot,
    sharded_target_ranks,
)

log = logging.getLogger(__name__)

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
        exclude_seen: validation masks every item of the whole history (a seen target is a miss),
            as ``evaluate.exclude_seen`` (``ranking``'s seen-item rule).
        seed: base of the per-epoch random state (see the module doc).
        catalog: the catalog's item features (``model.item_features.enabled``,
            :func:`recsys_alibi.data.feature_rows.catalog_features`); None: an id-only model.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        n_items: int,
        item_counts: torch.Tensor | None = None,
        exclude_seen: bool = True,
        seed: int = 0,
        catalog: CatalogFeatures | None = None,
    ) -> None:
        super().__init__()
        self.model_cfg = model_cfg
        self.train_cfg = train_cfg
        self.exclude_seen = exclude_seen
        self.seed = seed
        self.model = AlibiRanker(model_cfg, n_items)
        if catalog is not None:  # built after the ranker: its weights are drawn as without features
            self.model.item_features = ItemFeatures(catalog, model_cfg.d_model, model_cfg.embedding_backend)
        self._counts_from_data = item_counts is None
        counts = item_counts if item_counts is not None else torch.zeros(n_items + 1, dtype=torch.int64)
        self.loss = build_loss(train_cfg, counts)
        self._val_ranks: list[torch.Tensor] = []
        self.table: ShardedItemTable | None = None  # set by configure_model when sharding
        self._val_batches: list[dict[str, torch.Tensor]] = []  # sharded validation: ranked at epoch end
        self._schedule = (0, 1)  # (warm-up steps, total steps), set by configure_optimizers

    def setup(self, stage: str) -> None:
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        features = self.model.features
        if stage == "fit" and (self._counts_from_data or features is not None) and hasattr(datamodule, "item_counts"):
            counts = datamodule.item_counts().to(torch.float64)  # this rank's users
            if self.trainer.world_size > 1:
                strategy = self.trainer.strategy
                counts = strategy.reduce(counts.to(strategy.root_device), reduce_op="sum")
            counts = counts.round().to(torch.int64).cpu()
            if self._counts_from_data:
                self.loss = build_loss(self.train_cfg, counts)
            if features is not None:  # model.item_features.id_min_events: rare items are their features alone
                dropped = features.set_id_counts(counts, self.model_cfg.item_features.id_min_events)
                if self.model_cfg.item_features.id_min_events > 0:
                    log.info("item features: %d of %d items have no id part (fewer than %d training events)", dropped,
                             self.model.n_items, self.model_cfg.item_features.id_min_events)  # fmt: skip
                if self.model_cfg.item_features.id_dropout > 0:
                    log.info("item features: id dropout %g per training step", self.model_cfg.item_features.id_dropout)

    def configure_model(self) -> None:
        """Shard the item table row-wise when ``model.shard_embeddings`` and W > 1 (once)."""
        if not self.model_cfg.shard_embeddings or self.table is not None or self._trainer is None:
            return
        if self.trainer.world_size == 1:
            log.warning("model.shard_embeddings=true on one process: the item table is not sharded")
            return
        self.table = ShardedItemTable(
            self.model.items, self.train_cfg.lr, self.train_cfg.weight_decay, self.trainer.strategy.root_device
        )
        # Lightning's DDP keeps the dense parameters in step; the table's rows differ per rank
        self._ddp_params_and_buffers_to_ignore = [
            f"model.items.{name}" for name, _ in self.model.items.named_parameters()
        ] + [f"model.items.{name}" for name, _ in self.model.items.named_buffers()]
        log.info(
            "item table sharded row-wise over %d processes: rank %d holds rows %d..%d",
            self.table.world_size, self.table.rank, self.table.offset, self.table.offset + self.table.rows - 1,
        )  # fmt: skip

    def on_train_batch_start(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        # dropout and sampled negatives of this step depend on (seed, step, rank) only
        torch.manual_seed(step_seed(self.seed, self.global_step, self.global_rank))
        if self.table is not None:  # the fused table update follows the dense schedule
            self.table.set_lr(self.train_cfg.lr * warmup_cosine(self.global_step, *self._schedule))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.table is not None:
            return self._sharded_training_step(batch)
        vectors = self.model.item_vectors()  # (N + 1, D): the item table, or id rows + feature encodings
        embedded = None if self.model.features is None else self.model.feature_inputs(
            batch["inputs"], batch["lengths"], batch.get("gaps"), vectors)  # fmt: skip
        hidden = self.model.encode(
            batch["inputs"], batch["lengths"], batch.get("seq_ids"), embedded=embedded, gaps=batch.get("gaps")
        )  # (B, L, D)
        rows = batch["targets"].shape[0]
        hidden, targets = hidden.flatten(0, 1), batch["targets"].flatten()  # (B * L, D), (B * L,); 0 = no target
        where = batch.get("target_positions")  # (T,) made on the host by the collate
        if where is not None:  # a gather of known size; a boolean selection would wait for the GPU
            hidden, targets = hidden.index_select(0, where), targets.index_select(0, where)
        # without the index every position goes to the loss, which ignores target 0
        loss = self.loss(hidden, targets, vectors)
        # a per-step value (on_step only): batch_size, which weights epoch means, is not needed
        self.log("train/loss", loss, prog_bar=True, batch_size=rows)
        return loss

    def _sharded_training_step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One lookup of the step's unique items (inputs, targets, negatives) through the shards."""
        inputs, lengths = batch["inputs"], batch["lengths"]  # (B, L), (B,)
        supervised = batch["targets"] > 0  # (B, L)
        targets = batch["targets"][supervised]  # (T,)
        negatives = self.loss.negative_ids(targets, self.model.n_items)
        valid = torch.arange(inputs.shape[1], device=inputs.device)[None, :] < lengths[:, None]  # (B, L)
        inputs_flat = inputs[valid]
        ids, inverse = torch.unique(torch.cat([inputs_flat, targets, negatives.reshape(-1)]), return_inverse=True)
        rows = self.model.items.lookup(ids)  # (U, D); the backward applies the fused update once
        embedded = rows.new_zeros(*inputs.shape, rows.shape[1])  # (B, L, D)
        embedded[valid] = rows[inverse[: inputs_flat.numel()]]
        hidden = self.model.encode(inputs, lengths, batch.get("seq_ids"), embedded=embedded)
        table = PrefetchedRows(ids, rows, self.model.n_items + 1)
        loss = self.loss(hidden[supervised], targets, table, negatives=negatives)
        self.log("train/loss", loss, prog_bar=True, batch_size=int(supervised.sum()))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        if self.table is not None:  # ranked over all shards at the end of the epoch
            self._val_batches.append({k: batch[k] for k in ("history", "lengths", "targets", "seen")})
            return
        scores = self.model.score(batch["history"], batch["lengths"], batch.get("history_gaps"))  # (B, N + 1)
        scores = mask_seen(scores, batch["seen"], exclude_seen=self.exclude_seen)  # the whole history; targets too
        self._val_ranks.append(target_ranks(scores, batch["targets"]).cpu())

    def on_validation_epoch_end(self) -> None:
        if self.table is not None:
            ranks = self._sharded_validation_ranks().cpu().numpy()
            metrics = metrics_from_sums(validation_sums(ranks))  # all users' ranks, on every rank
            if metrics:
                self.log_dict(metrics, prog_bar=True, sync_dist=True)
            return
        ranks = torch.cat(self._val_ranks).numpy() if self._val_ranks else np.zeros(0, dtype=np.int64)
        self._val_ranks.clear()
        sums = torch.from_numpy(validation_sums(ranks))
        if self.trainer.world_size > 1:  # every rank takes part, also one without validation users
            sums = self.trainer.strategy.reduce(sums.to(self.device), reduce_op="sum").cpu()
        metrics = metrics_from_sums(sums.numpy())
        if metrics:  # the same global value on every rank: the sync below leaves it unchanged
            self.log_dict(metrics, prog_bar=True, sync_dist=True)

    def _sharded_validation_ranks(self) -> torch.Tensor:
        """(U,) int64 ranks of every rank's validation users (``sharding.sharded_target_ranks``)."""
        batches, self._val_batches = self._val_batches, []
        steps = torch.tensor(len(batches), device=self.device)
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)  # lookups are collective: as many on every rank
        hidden, histories, targets = [], [], []
        for i in range(int(steps)):
            if i < len(batches):
                batch = batches[i]
                hidden.append(self.model.last_hidden(batch["history"], batch["lengths"]).float())
                histories.append(batch["seen"])  # the whole history: the seen set
                targets.append(batch["targets"])
            else:  # this rank has fewer batches: take part in the lookup with one dummy row
                one = torch.ones(1, 1, dtype=torch.int64, device=self.device)
                self.model.last_hidden(one, one[0])
        width = max((h.shape[1] for h in histories), default=1)
        history = torch.cat([torch.nn.functional.pad(h, (0, width - h.shape[1])) for h in histories]) if histories \
            else torch.zeros(0, width, dtype=torch.int64, device=self.device)  # fmt: skip
        hidden_all = torch.cat(hidden) if hidden else torch.zeros(0, self.model_cfg.d_model, device=self.device)
        target_all = torch.cat(targets) if targets else torch.zeros(0, dtype=torch.int64, device=self.device)
        return sharded_target_ranks(
            hidden_all, history, target_all, self.table, self.exclude_seen, self.train_cfg.val_batch_size
        )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Sharded: write the gathered table and its optimizer state in the unsharded layout.

        Called on every rank (the gathers are collective); rank 0's dict is the one written.
        """
        if self.table is None:
            return
        weight, momentum = self.table.gather_weight(), self.table.gather_momentum()
        if weight is not None:
            checkpoint["state_dict"][TABLE_KEY] = weight  # (N + 1, D), as an unsharded run writes it
        else:
            checkpoint["state_dict"].pop(TABLE_KEY, None)
        if "optimizer_states" in checkpoint:
            checkpoint["optimizer_states"] = [insert_table_slot(s) for s in checkpoint["optimizer_states"]]
        checkpoint[TABLE_STATE] = {"optimizer": TABLE_OPTIMIZER, "momentum1": momentum}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Sharded: take this rank's rows (and Adagrad state) out of a checkpoint of any run.

        A checkpoint of an unsharded run has no ``TABLE_STATE``: the table's optimizer state
        then starts from zero (docs/scaling.md).
        """
        if self.table is None:
            return
        state = checkpoint["state_dict"]
        self.table.load_weight(state[TABLE_KEY].to(self.table.local_weight().device))
        state[TABLE_KEY] = self.table.state_for_load()
        if "optimizer_states" in checkpoint:
            checkpoint["optimizer_states"] = [remove_table_slot(s) for s in checkpoint["optimizer_states"]]
        saved = checkpoint.get(TABLE_STATE) or {}
        momentum = saved.get("momentum1") if saved.get("optimizer") == TABLE_OPTIMIZER else None
        if momentum is None and "optimizer_states" in checkpoint:
            log.warning("the checkpoint has no %s state for the sharded table: it starts from zero", TABLE_OPTIMIZER)
        self.table.load_momentum(momentum)

    def configure_optimizers(self):
        sharded = {id(p) for p in self.model.items.parameters()} if self.table is not None else set()
        decay, no_decay = [], []
        for name, param in self.named_parameters():
            if id(param) in sharded:  # updated by the table's fused optimizer
                continue
            (no_decay if param.ndim < 2 or "norm" in name else decay).append(param)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.train_cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.train_cfg.lr,
            betas=(0.9, 0.98),
        )
        total = max(1, scheduled_steps(self.trainer))  # over all epochs, also across a train.context_schedule switch
        warmup = min(self.train_cfg.warmup_steps, total // 2)
        self._schedule = (warmup, total)
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
