"""Screen (issue 42): the parent's AdamW state carried into a warm run (``train.warm.optimizer_state``).

A warm run starts a fresh AdamW: its first and second moments are built again from the new run's
gradients (bias-corrected from step 1). The candidate starts instead from the moments of the parent's
kept checkpoint (``best.ckpt``): every parameter's ``exp_avg``, ``exp_avg_sq`` and ``step``; the item
table's rows follow the vocabulary map (a shared item keeps its moments at whatever index), and a new
item's rows start with ``exp_avg`` 0 and ``exp_avg_sq`` the per-dimension mean of the old rows' (so its
first updates have the size of a typical item's). The learning-rate schedule is the warm one (the
optimizer's ``param_groups`` are not loaded). With betas (0.9, 0.98) a carried second moment weighs
``0.98 ** t`` after ``t`` steps: about a third of a 125-200-step warm run's learning-rate mass.
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import numpy as np
import torch

from recsys_alibi.training.warm_start import ITEM_TABLE_KEY

log = logging.getLogger(__name__)


def parent_checkpoint(run_id: str) -> Path:
    """The kept checkpoint of an MLflow training run: ``<params.output>/checkpoints/<run_id>/best.ckpt``.

    Raises:
        FileNotFoundError: the run's checkpoint is not on this machine.
    """
    import mlflow

    output = mlflow.MlflowClient().get_run(run_id).data.params.get("output")
    path = Path(str(output)) / "checkpoints" / run_id / "best.ckpt"
    if not path.is_file():
        raise FileNotFoundError(f"train.warm.optimizer_state: the parent's checkpoint {path} does not exist")
    return path


def remap_rows(moment: torch.Tensor, rows: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """(N_new + 1, D) moment rows: ``moment[rows]``, new items (rows 0 but index 0) set to ``fill`` (D,)."""
    out = moment[rows].clone()
    new = rows == 0
    new[0] = False
    out[new] = fill.to(out.dtype)
    return out


class CarriedOptimizerState(L.Callback):
    """Put the parent's AdamW moments into the new run's optimizer before its first step (module doc).

    Args:
        saved: the parent checkpoint's ``optimizer_states[0]["state"]`` ({flat index: moments}).
        rows: (N_new + 1,) int64 new item index -> the parent's, 0 for a new item.
    """

    def __init__(self, saved: dict, rows: np.ndarray) -> None:
        self.saved, self.rows = saved, torch.as_tensor(np.asarray(rows, dtype=np.int64))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        optimizer = trainer.optimizers[0]
        names = {id(p): name for name, p in pl_module.named_parameters()}
        saved, rows = self.saved, self.rows
        index = 0
        for group in optimizer.param_groups:
            for param in group["params"]:
                old = saved.get(index)
                index += 1
                if old is None:
                    continue
                state = {"step": old["step"].clone()}
                for key in ("exp_avg", "exp_avg_sq"):
                    moment = old[key]
                    if names[id(param)].endswith(ITEM_TABLE_KEY):
                        fill = moment[1:].mean(dim=0) if key == "exp_avg_sq" else torch.zeros(moment.shape[1])
                        moment = remap_rows(moment, rows, fill)
                    if moment.shape != param.shape:
                        raise ValueError(f"train.warm.optimizer_state: {names[id(param)]} has another shape")
                    state[key] = moment.to(param.device, param.dtype).clone()
                optimizer.state[param] = state
        log.info("train.warm.optimizer_state: %d parameters' AdamW moments carried from the parent", len(saved))
