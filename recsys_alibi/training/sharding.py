"""The item table sharded row-wise over the training processes (``model.shard_embeddings=true``).

torchrec's planner places the rows (``ROW_WISE``: rank r holds a contiguous block, about N / W
rows) and ``DistributedModelParallel`` replaces the ``EmbeddingCollection`` of
``ItemEmbeddings`` by its sharded version. No rank holds the whole table during training:

- **Lookups** go through the sharded collection (a ``KeyedJaggedTensor`` of ids; torchrec's
  all-to-all brings each row from its owner). A training step looks up, once, the unique ids of
  its inputs, targets and sampled negatives (:class:`PrefetchedRows` serves them to the loss);
  so only losses over sampled candidates can run (``ROW_LOOKUP_LOSSES``).
- **Optimiser**: the rows are updated inside the backward pass by torchrec's fused optimizer
  (fbgemm ``EXACT_ROWWISE_ADAGRAD``, the one of its CPU optimizers with a per-row state; fbgemm
  has no Adam on CPU, and its ``dense`` kernel, which would let AdamW see the rows, is refused
  by torchrec's planner for row-wise sharding and returns wrong shapes on CPU). Its learning rate
  follows the run's warm-up/cosine schedule (:meth:`ShardedItemTable.set_lr`). The dense
  parameters keep AdamW and DDP, which is told to ignore the table.
- **Validation** ranks the held-out item against the whole catalog by summing, over ranks, the
  local items that score strictly higher than it (:func:`sharded_target_ranks`), under the one
  seen-item rule of ``recsys_alibi.evaluation.ranking`` (whole history masked, a seen target a miss).
- **Checkpoints** hold the gathered table and its optimizer state (rank 0 writes one ordinary
  file): the same layout as an unsharded run (:func:`insert_table_slot`), so a checkpoint resumes
  on any number of processes, sharded or not, and loads into a plain ``AlibiRanker``.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import Tensor

from recsys_alibi.evaluation.ranking import MISS_RANK, mask_seen
from recsys_alibi.model.embeddings import ITEM_TABLE, ItemEmbeddings

log = logging.getLogger(__name__)

ROW_LOOKUP_LOSSES = ("sampled_softmax", "bce", "gbce")  # losses that only need the rows of some ids
TABLE_KEY = "model.items.collection.embeddings.item_table.weight"  # the table in RankerModule's state dict
TABLE_STATE = "sharded_item_table"  # checkpoint entry: the fused optimizer's gathered state
TABLE_OPTIMIZER = "exact_rowwise_adagrad"
ADAGRAD_EPS = 1e-8


class ShardedItemTable:
    """Shards ``items.collection`` row-wise in place and gives access to this rank's rows.

    Args:
        items: the model's ``ItemEmbeddings`` (N + 1 rows, D columns, the same initial weights on
            every rank: the shards are copied from it).
        lr: the fused optimizer's initial learning rate (``set_lr`` changes it).
        weight_decay: decoupled weight decay of the rows (as AdamW's for the replicated table).
        device: this rank's device (CPU with gloo, ``cuda:<local rank>`` with NCCL).

    Attributes: ``offset`` (first row held here), ``rows`` (how many), ``n_rows`` (N + 1),
    ``world_size``, ``rank``.

    Raises:
        RuntimeError: no process group is initialised.
    """

    def __init__(self, items: ItemEmbeddings, lr: float, weight_decay: float, device: torch.device) -> None:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.tbe.config.optimizer_config import WeightDecayMode
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.distributed.embedding_types import ShardingType
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
        from torchrec.distributed.planner.types import ParameterConstraints

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("sharding the item table needs an initialised process group")
        self.items = items
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.n_rows = items.n_items + 1
        fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": lr, "eps": ADAGRAD_EPS}
        if weight_decay:
            fused |= {"weight_decay": weight_decay, "weight_decay_mode": WeightDecayMode.DECOUPLE}
        sharders = [EmbeddingCollectionSharder(fused_params=fused)]
        constraints = {ITEM_TABLE: ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value])}
        topology = Topology(world_size=self.world_size, compute_device=device.type)
        planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
        plan = planner.collective_plan(items, sharders, dist.GroupMember.WORLD)
        # replaces items.collection by the sharded collection (the shards copy the current rows);
        # no DDP around it: Lightning's DDP wraps the dense parameters
        DistributedModelParallel(items, device=device, plan=plan, sharders=sharders, init_data_parallel=False)
        self.plan = plan
        shard = self._weight_state().local_shards()[0]
        self.offset = int(shard.metadata.shard_offsets[0])
        self.rows = int(shard.metadata.shard_sizes[0])

    @property
    def optimizer(self):
        """torchrec's fused optimizer of the table (a ``KeyedOptimizer``)."""
        return self.items.collection.fused_optimizer

    def local_weight(self) -> Tensor:
        """(rows, D) float32: this rank's rows ``offset .. offset + rows - 1`` (a view, no grad)."""
        return self._weight_state().local_shards()[0].tensor

    def set_lr(self, lr: float) -> None:
        """Learning rate of the next fused update (applied in the next backward pass)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()  # torchrec's fused step only hands the learning rate to fbgemm

    def _weight_state(self):
        return self.items.collection.state_dict()[f"embeddings.{ITEM_TABLE}.weight"]  # ShardedTensor

    def _momentum_state(self):
        (state,) = self.optimizer.state_dict()["state"].values()
        (key,) = [k for k in state if k.endswith("momentum1")]
        return state[key]  # ShardedTensor (N + 1,)

    def gather_weight(self) -> Tensor | None:
        """The whole (N + 1, D) float32 table on rank 0 (None elsewhere). Call on every rank."""
        return _gather(self._weight_state(), (self.n_rows, self.items.d_model), self.rank)

    def gather_momentum(self) -> Tensor | None:
        """The (N + 1,) float32 row-wise Adagrad state on rank 0 (None elsewhere). Every rank calls."""
        return _gather(self._momentum_state(), (self.n_rows,), self.rank)

    @torch.no_grad()
    def load_weight(self, full: Tensor) -> None:
        """Copy this rank's rows of a whole (N + 1, D) table into the shard."""
        _check_rows(full, self.n_rows, "table")
        self.local_weight().copy_(full[self.offset : self.offset + self.rows])

    @torch.no_grad()
    def load_momentum(self, full: Tensor | None) -> None:
        """Copy this rank's rows of an (N + 1,) Adagrad state into the fused optimizer (None: zeros)."""
        local = self._momentum_state().local_shards()[0].tensor
        if full is None:
            local.zero_()
        else:
            _check_rows(full, self.n_rows, "optimizer state")
            local.copy_(full[self.offset : self.offset + self.rows])

    def state_for_load(self) -> object:
        """The collection's own ``ShardedTensor``: what ``load_state_dict`` expects for the table."""
        return self._weight_state()


def _gather(sharded, shape: tuple[int, ...], rank: int) -> Tensor | None:
    local = sharded.local_shards()[0].tensor
    out = torch.zeros(shape, dtype=local.dtype, device=local.device) if rank == 0 else None
    sharded.gather(dst=0, out=out)
    return out.cpu() if out is not None else None


def _check_rows(full: Tensor, n_rows: int, what: str) -> None:
    if full.shape[0] != n_rows:
        raise ValueError(f"the checkpoint's {what} has {full.shape[0]} rows, this model {n_rows}")


class PrefetchedRows:
    """Stands for the (N + 1, D) table inside a loss: serves the rows of ids looked up beforehand.

    Args:
        ids: (U,) int64 sorted unique item indices.
        rows: (U, D) float32 their rows (from the sharded lookup; gradients flow back to it).
        n_rows: N + 1, what ``shape[0]`` reports.

    ``rows_of[index]`` for an int64 index tensor of any shape returns ``(*index.shape, D)``.

    Raises:
        KeyError: an index was not looked up (the loss drew other negatives than prefetched).
    """

    def __init__(self, ids: Tensor, rows: Tensor, n_rows: int) -> None:
        self.ids, self.rows = ids, rows
        self.shape = torch.Size((n_rows, rows.shape[1]))

    def __getitem__(self, index: Tensor) -> Tensor:
        pos = torch.searchsorted(self.ids, index).clamp(max=max(self.ids.numel() - 1, 0))
        if index.numel() and not bool((self.ids[pos] == index).all()):
            raise KeyError("PrefetchedRows: an item index was not looked up before the loss")
        return self.rows[pos]


# ---- validation: the rank of each held-out item over all shards ---------------------------


def local_target_scores(scores: Tensor, targets: Tensor, offset: int) -> Tensor:
    """(B,) float32: each target's score when its row is in this block of columns, else 0.

    Args:
        scores: (B, C) float32 scores of items ``offset .. offset + C - 1``.
        targets: (B,) int64 item indices.
    """
    cols = targets - offset
    owned = (cols >= 0) & (cols < scores.shape[1])
    out = torch.zeros(targets.shape[0], dtype=scores.dtype, device=scores.device)
    rows = torch.arange(targets.shape[0], device=scores.device)
    out[owned] = scores[rows[owned], cols[owned]]
    return out


def count_higher(scores: Tensor, target_scores: Tensor) -> Tensor:
    """(B,) int64: columns of ``scores`` (B, C) strictly above ``target_scores`` (B,)."""
    return (scores > target_scores[:, None]).sum(dim=1)


def ranks_from_counts(target_scores: Tensor, higher: Tensor) -> Tensor:
    """(B,) int64 ranks from the targets' scores (B,) and the counts of items above them (B,):
    ``1 + higher``, or ``MISS_RANK`` for a target at -inf (masked: ``ranking``'s seen-item rule)."""
    return torch.where(torch.isneginf(target_scores), MISS_RANK, 1 + higher)


def block_scores(hidden: Tensor, rows: Tensor, seen: Tensor, offset: int, exclude_seen: bool) -> Tensor:
    """(B, C) float32 masked scores of users (B, D) against table rows ``offset .. offset + C - 1``.

    Seen items (``seen`` (B, S) int64, the whole histories) are -inf when ``exclude_seen``,
    targets included; column 0 (padding) is -inf when the block starts at 0: as ``mask_seen``.
    """
    with torch.autocast(hidden.device.type, enabled=False):
        scores = hidden.float() @ rows.float().T
    return mask_seen(scores, seen, exclude_seen=exclude_seen, offset=offset)


@torch.no_grad()
def sharded_target_ranks(hidden: Tensor, history: Tensor, targets: Tensor, table: ShardedItemTable,
                         exclude_seen: bool, chunk: int) -> Tensor:  # fmt: skip
    """1-based full-catalog ranks of every rank's held-out items; call on every rank.

    Each rank scores all ranks' users (hidden states all-gathered) against its own rows, takes
    the target's score from the rank that holds it, and counts its items strictly above it; the
    counts are summed over ranks: rank = 1 + count, the optimistic rank of ``target_ranks`` on
    the whole (masked) score matrix; a masked (seen) target is a miss, ``MISS_RANK``, as there.

    Args:
        hidden: (U_r, D) float32 this rank's users' last hidden states.
        history: (U_r, S_r) int64 their whole right-padded histories (the seen items).
        targets: (U_r,) int64 their held-out items.
        chunk: users scored at once (memory: chunk x rows float32).

    Returns:
        (U,) int64 ranks of all users, in rank order (rank 0's users first); the same on every rank.
    """
    hidden, history, targets = all_gather_padded(hidden), all_gather_padded(history), all_gather_padded(targets)
    rows = table.local_weight()
    ranks = []
    for start in range(0, targets.shape[0], chunk):
        h, seen, y = hidden[start : start + chunk], history[start : start + chunk], targets[start : start + chunk]
        scores = block_scores(h, rows, seen, table.offset, exclude_seen)  # (c, rows)
        target_scores = local_target_scores(scores, y, table.offset)
        dist.all_reduce(target_scores)  # only the owner contributes a non-zero (-inf when masked)
        higher = count_higher(scores, target_scores)
        dist.all_reduce(higher)
        ranks.append(ranks_from_counts(target_scores, higher))
    return torch.cat(ranks) if ranks else torch.zeros(0, dtype=torch.int64)


def all_gather_padded(tensor: Tensor) -> Tensor:
    """Concatenate along dim 0 the tensors of all ranks, whose sizes may differ (dims > 0: padded
    with 0 to the largest). Call on every rank with the same dtype and number of dims."""
    world = dist.get_world_size()
    shape = torch.tensor(tensor.shape, dtype=torch.int64, device=tensor.device)
    shapes = [torch.zeros_like(shape) for _ in range(world)]
    dist.all_gather(shapes, shape)
    largest = torch.stack(shapes).amax(dim=0).tolist()
    padded = tensor.new_zeros(largest)
    padded[tuple(slice(0, s) for s in tensor.shape)] = tensor
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([part[: int(s[0])] for part, s in zip(parts, shapes)])


# ---- checkpoints in the unsharded layout --------------------------------------------------


def insert_table_slot(state: dict) -> dict:
    """An optimizer state dict of the dense parameters in the unsharded layout: the table first.

    The unsharded AdamW holds the table as parameter 0, first of the weight-decay group
    (``RankerModule.configure_optimizers``); the sharded run's AdamW lacks it. This shifts every
    index by one and puts the table at 0 with no state (AdamW starts a fresh state for it when a
    replicated run resumes). Returns a new dict; ``state`` is left unchanged.
    """
    groups = [dict(g, params=[i + 1 for i in g["params"]]) for g in state["param_groups"]]
    groups[0]["params"] = [0, *groups[0]["params"]]
    return {"state": {i + 1: s for i, s in state["state"].items()}, "param_groups": groups}


def remove_table_slot(state: dict) -> dict:
    """The inverse of :func:`insert_table_slot`: drop parameter 0 (the table) and its AdamW state.

    Raises:
        ValueError: parameter 0 is not the first of the first group (not this layout).
    """
    groups = state["param_groups"]
    if not groups or not groups[0]["params"] or groups[0]["params"][0] != 0:
        raise ValueError("optimizer state: the item table is not parameter 0 of the first group")
    new_groups = [dict(g, params=[i - 1 for i in g["params"] if i != 0]) for g in groups]
    return {"state": {i - 1: s for i, s in state["state"].items() if i != 0}, "param_groups": new_groups}
