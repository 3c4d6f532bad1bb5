"""Run by ``torchrun`` in test_sharded_table: training with the item table sharded row-wise.

Usage: ``torchrun --standalone --nproc-per-node 2 torchrun_sharded_fit.py PREPARED OUTPUT [cpu|gpu]``

With ``model.shard_embeddings=true`` and ``train.loss=sampled_softmax`` (``SHARDED`` below) on 2
gloo processes it runs, in order:

1. ``validate``: validation metrics of the seed's initial weights (the table sharded);
2. ``train``: the ``train`` job (``pipelines.train.run_train``, MLflow store given by
   ``MLFLOW_TRACKING_URI``) for 3 epochs, uninterrupted;
3. a fit killed at the start of epoch 2 (its ``last.ckpt`` is kept), then
4. ``resumed``: the same fit resumed from that ``last.ckpt`` on 2 processes.

Rank 0 prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from training_fixtures import Killed, KillAt, tiny_config, validate_initial  # noqa: E402

from pipelines.train import run_train  # noqa: E402
from recsys_alibi.training.datamodule import SequenceDataModule  # noqa: E402
from recsys_alibi.training.fit import fit_ranker  # noqa: E402

SHARDED = ["model.shard_embeddings=true", "train.loss=sampled_softmax", "train.num_negatives=16",
           "train.devices=2", "train.strategy=ddp"]  # fmt: skip


def main(argv: list[str]) -> None:
    prepared, output = Path(argv[0]), Path(argv[1])
    accelerator = argv[2] if len(argv) > 2 else "cpu"
    torch.set_num_threads(1)
    config = tiny_config(output, *SHARDED, f"train.accelerator={accelerator}")
    validate = validate_initial(config, prepared)
    job = run_train(config, prepared, progress=False)

    killed_dir = output / "killed"
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    try:
        fit_ranker(config, datamodule, killed_dir, callbacks=[KillAt(2)], progress=False)
    except Killed:
        pass
    last = killed_dir / "last.ckpt"
    kept = output / "killed_at_2.ckpt"  # the resumed fit overwrites last.ckpt
    if torch.distributed.get_rank() == 0:
        kept.write_bytes(last.read_bytes())
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    resumed = fit_ranker(config, datamodule, killed_dir, progress=False, resume_from=last)
    if torch.distributed.get_rank() == 0:
        result = {
            "validate": validate,
            "run_id": job.run_id,
            "model_uri": job.model.uri,
            "best_checkpoint": job.checkpoint,
            "best": job.best_val_ndcg_at_10,
            "epochs": job.epochs,
            "world_size": job.world_size,
            "killed_last": str(kept),
            "resumed_best": resumed.best_val_ndcg_at_10,
            "resumed_epochs": resumed.epochs,
            "resumed_metrics": resumed.val_metrics,
            "resumed_module_type": type(resumed.module.model.items.collection).__name__,
        }
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
