"""Run by ``torchrun`` in test_distributed_training: validate fixed weights, then a killed fit.

Usage: ``torchrun --standalone --nproc-per-node 2 torchrun_fit.py PREPARED OUTPUT KILL_AT``

Prints, on rank 0, one line ``RESULT {json}``: ``validate`` (the metrics of the seed's initial
weights on all ranks' validation users) and ``last`` (the ``last.ckpt`` the killed fit left).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from training_fixtures import Killed, KillAt, tiny_config, validate_initial  # noqa: E402

from recsys_alibi.training.datamodule import SequenceDataModule  # noqa: E402
from recsys_alibi.training.fit import fit_ranker  # noqa: E402


def main(argv: list[str]) -> None:
    prepared, output, kill_at = Path(argv[0]), Path(argv[1]), int(argv[2])
    torch.set_num_threads(1)
    config = tiny_config(output, "train.devices=2", "train.strategy=ddp", "train.accelerator=cpu")
    validate = validate_initial(config, prepared)
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    try:
        fit_ranker(config, datamodule, output / "checkpoints", callbacks=[KillAt(kill_at)], progress=False)
    except Killed:
        pass
    if torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps({"validate": validate, "last": str(output / "checkpoints" / "last.ckpt")}))


if __name__ == "__main__":
    main(sys.argv[1:])
