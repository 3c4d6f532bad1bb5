"""Run by ``torchrun`` in test_sharded_table: torchrec row-wise sharding of ``ItemEmbeddings``.

Usage: ``torchrun --standalone --nproc-per-node W torchrun_shard.py cpu|cuda``

Shards the item table of ``ItemEmbeddings`` (101 rows, D=16) row-wise over the W ranks with
torchrec's planner and ``DistributedModelParallel`` (fused exact SGD, lr 0.5), looks up
different items on each rank, backpropagates ``sum(out)``, and prints on rank 0 one line
``RESULT {json}``: the plan, per-rank shard rows and bytes, whether each rank's lookups equal
the unsharded table, whether the update equals ``-lr * count / W`` (torchrec averages the
gradient over ranks, as DDP does), and what ``ItemEmbeddings.weight`` returns once sharded.
"""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_types import ShardingType
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints

from recsys_alibi.model.embeddings import ITEM_TABLE, ItemEmbeddings

LR = 0.5
LOOKUPS = [[1, 2, 3, 99, 50], [50, 51, 7]]  # rank r looks up LOOKUPS[r % 2]


def main(device_kind: str) -> None:
    dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{rank}") if device_kind == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    items = ItemEmbeddings(n_items=100, d_model=16)
    reference = items.weight.detach().clone().to(device)  # (101, 16), the same on every rank
    sharders = [EmbeddingCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR})]
    constraints = {ITEM_TABLE: ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value])}
    topology = Topology(world_size=world, compute_device=device.type)
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    plan = planner.collective_plan(items, sharders, dist.GroupMember.WORLD)
    sharded = DistributedModelParallel(items, device=device, plan=plan, sharders=sharders)

    ids = torch.tensor(LOOKUPS[rank % 2], device=device)
    out = sharded(ids[None, :], torch.tensor([len(ids)], device=device))  # (1, L, D)
    lookup_ok = bool(torch.allclose(out[0], reference[ids]))
    weight = sharded.module.weight  # what the tied output layer would get
    weight_shape = list(weight.shape)
    out.sum().backward()  # the fused optimizer updates the owning shards here

    table = sharded.state_dict()["collection.embeddings.item_table.weight"]  # ShardedTensor
    shard = table.local_shards()[0]
    full = torch.zeros(101, 16, device=device) if rank == 0 else None
    table.gather(dst=0, out=full)
    counts = torch.zeros(101, device=device)
    for r in range(world):
        looked_up = torch.tensor(LOOKUPS[r % 2], device=device)
        counts.index_add_(0, looked_up, torch.ones(len(looked_up), device=device))
    mine = {
        "rank": rank,
        "lookup_equals_table": lookup_ok,
        "shard_offset": shard.metadata.shard_offsets[0],
        "shard_rows": shard.metadata.shard_sizes[0],
        "shard_bytes": shard.tensor.numel() * shard.tensor.element_size(),
        "weight_shape": weight_shape,
        "weight_type": type(weight).__name__,
    }
    ranks: list = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        expected = reference - LR * counts[:, None] / world
        sharding = plan.plan["collection"][ITEM_TABLE].sharding_type
        update_ok = bool(torch.allclose(full, expected, atol=1e-6))
        print("RESULT " + json.dumps({"sharding_type": sharding, "ranks": ranks, "update_ok": update_ok}), flush=True)
    # ``out`` keeps the lookup's autograd graph, whose saved all-to-all requests hold gloo work: a
    # process that exits with them alive aborts now and then ("terminate called without an active
    # exception", 2 of 10 runs here), so drop them before the group goes
    del out, sharded, items, table
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
