"""The item table sharded row-wise by torchrec (``model.shard_embeddings=true``), 2 gloo processes.

- the primitive (``torchrun_shard.py``): the planner and ``DistributedModelParallel`` shard
  ``ItemEmbeddings`` row-wise; lookups equal the unsharded table; the fused optimizer updates
  the owning shard by the rank-averaged gradient;
- the pieces of sharded training, on one process against their unsharded references: the
  losses fed prefetched rows, the rank of a held-out item summed over blocks of rows, the
  optimizer-state layout of checkpoints;
- training end to end (``torchrun_sharded_fit.py``, tiny config, sampled softmax).

Tolerances: the same weights validated sharded (2 processes) and unsharded (1 process), and a
sharded run killed and resumed on 2 processes against the uninterrupted run: ``EXACT_TOL`` (float
noise; measured identical). A sharded run resumed on one unsharded process: the table's
optimizer changes from fused row-wise Adagrad to AdamW with a fresh state, and the one process
sees other batches, so SGD takes another path: ``SGD_TOL`` = 0.06 on validation NDCG@10, the
1-vs-2-process tolerance of test_distributed_training.py (seed-to-seed spread of this config:
0.060 max - min, docs/scaling.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from training_fixtures import tiny_config, validate_initial, write_walks

from recsys_alibi.config import ConfigError, load_config
from recsys_alibi.evaluation.ranking import MISS_RANK, mask_seen, target_ranks
from recsys_alibi.model.embeddings import ItemEmbeddings
from recsys_alibi.model.transformer import AlibiRanker
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.fit import check_sharding, fit_ranker
from recsys_alibi.training.losses import build_loss
from recsys_alibi.training.module import RankerModule
from recsys_alibi.training.sharding import (
    TABLE_KEY,
    TABLE_STATE,
    PrefetchedRows,
    block_scores,
    count_higher,
    insert_table_slot,
    local_target_scores,
    ranks_from_counts,
    remove_table_slot,
)

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "torchrun_shard.py"
EXACT_TOL = 1e-6
SGD_TOL = 0.06
MONITOR = "val/ndcg_at_10"
QUIET_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
SAMPLED = ["train.loss=sampled_softmax", "train.num_negatives=16"]


def _torchrun(script: Path, *args: str, nproc: int = 2, cwd: Path | None = None, env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           str(script), *args]  # fmt: skip
    proc = subprocess.run(cmd, env=env or QUIET_ENV, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


# ---- the torchrec primitive --------------------------------------------------------------


def _check(result: dict, nproc: int) -> None:
    assert result["sharding_type"] == "row_wise" and result["update_ok"]
    ranks = result["ranks"]
    assert all(r["lookup_equals_table"] for r in ranks)
    assert sum(r["shard_rows"] for r in ranks) == 101
    assert [r["shard_offset"] for r in ranks] == sorted(r["shard_offset"] for r in ranks)
    assert all(r["shard_bytes"] == r["shard_rows"] * 16 * 4 for r in ranks)
    assert [r["weight_shape"] for r in ranks] == [[r["shard_rows"], 16] for r in ranks]  # not the whole table


def test_row_wise_sharding_on_two_cpu_processes():
    result = _torchrun(RUNNER, "cpu")
    _check(result, 2)
    assert [r["shard_rows"] for r in result["ranks"]] == [51, 50]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_row_wise_sharding_on_gpus():
    nproc = min(2, torch.cuda.device_count())  # NCCL needs one GPU per rank
    _check(_torchrun(RUNNER, "cuda", nproc=nproc), nproc)


# ---- the pieces, on one process ----------------------------------------------------------


def test_a_sharded_table_needs_a_loss_over_sampled_candidates():
    check_sharding(load_config())  # the default: replicated table
    for loss in ("sampled_softmax", "bce", "gbce"):
        check_sharding(load_config(None, ["model.shard_embeddings=true", f"train.loss={loss}"]))
    with pytest.raises(ConfigError, match="train.loss=sampled_softmax") as err:
        check_sharding(load_config(None, ["model.shard_embeddings=true", "train.loss=softmax"]))
    assert "\n" not in str(err.value) and "docs/scaling.md" in str(err.value)


@pytest.mark.parametrize("loss", ["sampled_softmax", "bce", "gbce"])
def test_losses_on_prefetched_rows_equal_the_losses_on_the_table(loss):
    """What sharded training does (negatives drawn first, rows looked up once) against ``forward``."""
    config = load_config(None, [f"train.loss={loss}", *([] if loss == "bce" else ["train.num_negatives=7"])])
    counts = torch.arange(31, dtype=torch.int64)
    fn = build_loss(config.train, counts)
    table = torch.randn(31, 8, requires_grad=True)
    hidden = torch.randn(12, 8)
    targets = torch.randint(1, 31, (12,))
    torch.manual_seed(3)
    expected = fn(hidden, targets, table)
    (expected_grad,) = torch.autograd.grad(expected, table)

    torch.manual_seed(3)
    negatives = fn.negative_ids(targets, 30)
    ids = torch.unique(torch.cat([targets, negatives.reshape(-1)]))
    rows = table[ids]
    got = fn(hidden, targets, PrefetchedRows(ids, rows, 31), negatives=negatives)
    (got_grad,) = torch.autograd.grad(got, table)
    assert torch.allclose(got, expected, atol=1e-6)
    assert torch.allclose(got_grad, expected_grad, atol=1e-6)
    with pytest.raises(KeyError):
        PrefetchedRows(ids, rows, 31)[torch.tensor([int(ids.max()) + 1])]


def test_ranks_summed_over_blocks_of_rows_equal_the_full_catalog_rank():
    """Vocabulary-parallel validation: blocks of rows (0-12, 13-30) against ``target_ranks``."""
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(31, 8, generator=gen)
    table[17] = table[5]  # an item tied with a target
    hidden = torch.randn(6, 8, generator=gen)
    history = torch.tensor([[1, 2, 5, 0], [5, 9, 20, 30], [3, 0, 0, 0], [13, 12, 14, 0], [7, 7, 8, 0], [1, 2, 3, 4]])
    targets = torch.tensor([5, 5, 17, 13, 7, 30])  # re-consumed targets (rows 0, 1, 3, 4): misses when seen is excluded
    for exclude_seen in (True, False):
        full = mask_seen(hidden @ table.T, history, exclude_seen=exclude_seen)
        expected = target_ranks(full, targets)
        assert (expected == MISS_RANK).tolist() == [exclude_seen, exclude_seen, False, exclude_seen, exclude_seen, False]
        blocks = [(0, 13), (13, 31)]
        scores = [block_scores(hidden, table[a:b], history, a, exclude_seen) for a, b in blocks]
        target_scores = sum(local_target_scores(s, targets, a) for s, (a, _) in zip(scores, blocks))
        got = ranks_from_counts(target_scores, sum(count_higher(s, target_scores) for s in scores))
        assert torch.equal(got, expected), exclude_seen


def test_checkpoint_optimizer_layout_puts_the_table_first_as_an_unsharded_run():
    config = tiny_config(Path("unused"), *SAMPLED)
    module = RankerModule(config.model, config.train, n_items=40)
    name, param = next(iter(module.named_parameters()))
    assert name == TABLE_KEY and param.ndim == 2  # parameter 0, first of AdamW's weight-decay group
    groups = [{"params": [0, 1], "lr": 1}, {"params": [2, 3]}]
    dense = {"state": {0: {"step": 1}, 3: {"step": 2}}, "param_groups": groups}
    canonical = insert_table_slot(dense)
    assert canonical["param_groups"][0]["params"] == [0, 1, 2] and canonical["param_groups"][1]["params"] == [3, 4]
    assert set(canonical["state"]) == {1, 4} and canonical["param_groups"][0]["lr"] == 1
    assert remove_table_slot(canonical) == dense
    with pytest.raises(ValueError, match="parameter 0"):
        remove_table_slot(dense | {"param_groups": [{"params": [1]}]})


def test_item_lookup_equals_the_table_rows():
    items = ItemEmbeddings(n_items=20, d_model=4)
    ids = torch.tensor([3, 3, 20, 0, 7])
    assert torch.equal(items.lookup(ids), items.weight[ids])
    assert items.lookup(ids[:0]).shape == (0, 4)


# ---- training end to end, 2 processes ----------------------------------------------------


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory, new_store) -> dict:
    """``torchrun_sharded_fit.py`` once: validate, train job, killed fit, resumed fit (2 processes)."""
    root = tmp_path_factory.mktemp("sharded")
    prepared = write_walks(root / "prepared")
    uri = new_store(root / "mlflow.db")
    env = {**QUIET_ENV, "MLFLOW_TRACKING_URI": uri}
    result = _torchrun(HERE / "torchrun_sharded_fit.py", str(prepared), str(root / "out"), cwd=root, env=env)
    return result | {"prepared": prepared, "uri": uri, "root": root}


def test_sharded_training_runs_end_to_end_and_logs_one_unsharded_model(sharded_run):
    assert sharded_run["epochs"] == 3 and sharded_run["world_size"] == 2
    assert 0.3 < sharded_run["best"] <= 1.0  # it learned: the initial weights score 0.18
    mlflow.set_tracking_uri(sharded_run["uri"])
    try:
        from recsys_alibi.tracking import load_ranker

        loaded = load_ranker(sharded_run["model_uri"])
        (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    finally:
        mlflow.set_tracking_uri(None)
    assert run.info.run_id == sharded_run["run_id"] and run.info.status == "FINISHED"
    assert run.data.metrics["train.world_size"] == 2.0
    model = loaded.model
    assert isinstance(model, AlibiRanker) and type(model.items.collection).__name__ == "EmbeddingCollection"
    assert model.items.weight.shape == (41, 16)  # the whole table
    checkpoint = torch.load(sharded_run["best_checkpoint"], map_location="cpu", weights_only=False)
    assert torch.equal(model.items.weight, checkpoint["state_dict"][TABLE_KEY])
    assert checkpoint[TABLE_STATE]["momentum1"].shape == (41,)
    scores = model.score(torch.tensor([[1, 2, 3, 0], [5, 6, 0, 0]]), torch.tensor([3, 2]))
    assert scores.shape == (2, 41) and torch.isfinite(scores).all()


def test_sharded_validation_equals_the_unsharded_one_for_the_same_weights(sharded_run, tmp_path):
    """Initial weights (same seed) and the trained best checkpoint, each against 1 process."""
    config = tiny_config(tmp_path, *SAMPLED)
    single = validate_initial(config, sharded_run["prepared"])
    for name, value in single.items():
        assert sharded_run["validate"][name] == pytest.approx(value, abs=EXACT_TOL), name

    import lightning as L

    datamodule = SequenceDataModule(sharded_run["prepared"], config.model, config.train, config.seed)
    module = RankerModule(config.model, config.train, datamodule.n_items, seed=config.seed)
    state = torch.load(sharded_run["best_checkpoint"], map_location="cpu", weights_only=False)["state_dict"]
    module.load_state_dict(state, strict=False)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    (metrics,) = trainer.validate(module, datamodule=datamodule, verbose=False)
    assert metrics[MONITOR] == pytest.approx(sharded_run["best"], abs=EXACT_TOL)


def test_sharded_run_resumed_on_two_processes_equals_the_uninterrupted_run(sharded_run):
    assert sharded_run["resumed_epochs"] == 3
    assert sharded_run["resumed_best"] == pytest.approx(sharded_run["best"], abs=EXACT_TOL)
    mlflow.set_tracking_uri(sharded_run["uri"])
    try:
        metrics = mlflow.get_run(sharded_run["run_id"]).data.metrics
    finally:
        mlflow.set_tracking_uri(None)
    for name in (MONITOR, "val/hr_at_10", "val/mrr"):
        assert sharded_run["resumed_metrics"][name] == pytest.approx(metrics[name], abs=EXACT_TOL), name


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL: one GPU per rank)")
def test_sharded_training_on_two_gpus(tmp_path):
    prepared = write_walks(tmp_path / "prepared")
    env = {**QUIET_ENV, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    result = _torchrun(HERE / "torchrun_sharded_fit.py", str(prepared), str(tmp_path / "out"), "gpu", cwd=tmp_path,
                       env=env)  # fmt: skip
    assert result["epochs"] == 3 and result["world_size"] == 2 and 0.3 < result["best"] <= 1.0
    assert result["resumed_best"] == pytest.approx(result["best"], abs=EXACT_TOL)


def test_sharded_checkpoint_resumes_on_one_unsharded_process(sharded_run, tmp_path):
    killed = Path(sharded_run["killed_last"])
    assert torch.load(killed, map_location="cpu", weights_only=False)["epoch"] == 1  # epochs 0 and 1 done
    run_dir = tmp_path / "ckpt"
    run_dir.mkdir()
    last = run_dir / "last.ckpt"
    last.write_bytes(killed.read_bytes())
    config = tiny_config(tmp_path, *SAMPLED, "model.shard_embeddings=true")  # one process: not sharded
    datamodule = SequenceDataModule(sharded_run["prepared"], config.model, config.train, config.seed)
    resumed = fit_ranker(config, datamodule, run_dir, progress=False, resume_from=last)
    assert resumed.module.table is None and resumed.epochs == 3
    assert np.isfinite(resumed.val_metrics[MONITOR])
    assert resumed.val_metrics[MONITOR] == pytest.approx(sharded_run["resumed_metrics"][MONITOR], abs=SGD_TOL)
