"""torchrec row-wise sharding of the item table: what works (2 gloo processes) and what is refused.

``DistributedModelParallel`` with the planner shards ``ItemEmbeddings`` row-wise on CPU (torchrec
1.8, fbgemm-gpu-cpu 1.8): lookups equal the unsharded table and the fused optimizer updates the
owning shard. But once sharded, ``ItemEmbeddings.weight`` (the tied output layer) is only this
rank's rows, so the trainer refuses ``model.shard_embeddings=true`` (docs/scaling.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recsys_alibi.config import ConfigError, load_config
from recsys_alibi.training.fit import check_sharding

RUNNER = Path(__file__).resolve().parent / "torchrun_shard.py"


def _run(nproc: int, device: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           str(RUNNER), device]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def _check(result: dict, nproc: int) -> None:
    assert result["sharding_type"] == "row_wise" and result["update_ok"]
    ranks = result["ranks"]
    assert all(r["lookup_equals_table"] for r in ranks)
    assert sum(r["shard_rows"] for r in ranks) == 101
    assert [r["shard_offset"] for r in ranks] == sorted(r["shard_offset"] for r in ranks)
    assert all(r["shard_bytes"] == r["shard_rows"] * 16 * 4 for r in ranks)
    assert [r["weight_shape"] for r in ranks] == [[r["shard_rows"], 16] for r in ranks]  # not the whole table


def test_row_wise_sharding_on_two_cpu_processes():
    result = _run(2, "cpu")
    _check(result, 2)
    assert [r["shard_rows"] for r in result["ranks"]] == [51, 50]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_row_wise_sharding_on_gpus():
    nproc = min(2, torch.cuda.device_count())  # NCCL needs one GPU per rank
    _check(_run(nproc, "cuda"), nproc)


def test_trainer_refuses_a_sharded_table_with_the_reason():
    check_sharding(load_config())  # the default: replicated table
    with pytest.raises(ConfigError, match="tied output layer") as err:
        check_sharding(load_config(None, ["model.shard_embeddings=true"]))
    assert "\n" not in str(err.value) and "docs/scaling.md" in str(err.value)
