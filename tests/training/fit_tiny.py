"""Fit the tiny training config with one item-table backend; run alone or by test_plain_table.

Usage: ``python fit_tiny.py PREPARED OUTPUT BACKEND`` (e.g. under ``tests/without_modules.py``
with torchrec hidden). Prints one line ``RESULT {json}``: the item table in use, the training loss
of every step, the best validation NDCG@10 and the best checkpoint's path.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from training_fixtures import tiny_config  # noqa: E402

from recsys_alibi.training.datamodule import SequenceDataModule  # noqa: E402
from recsys_alibi.training.fit import fit_ranker  # noqa: E402


class StepLosses(L.Callback):
    """Collects the training loss of every step (a float per step, read after the step)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def fit(prepared: Path, output: Path, backend: str) -> dict:
    """Fit ``tiny_config`` (packed batches) with ``model.embedding_backend=backend``; the RESULT dict."""
    torch.set_num_threads(1)
    config = tiny_config(output, f"model.embedding_backend={backend}", "train.packing=true", "train.accelerator=cpu")
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    losses = StepLosses()
    result = fit_ranker(config, datamodule, output / "checkpoints", callbacks=[losses], progress=False)
    return {
        "backend": result.module.model.items.backend,
        "losses": losses.losses,
        "best_val_ndcg_at_10": result.best_val_ndcg_at_10,
        "best_checkpoint": result.best_checkpoint,
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(fit(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])))
