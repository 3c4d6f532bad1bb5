"""Train a config to its test metrics without MLflow (a GPU box has none): fit, then leave-one-out test.

The same library steps as ``recsys-alibi train`` + ``evaluate`` (``fit_ranker``, ``evaluate``), with
no tracking: the result is one JSON file. The item table is whatever ``model.embedding_backend``
resolves to there (the plain ``nn.Embedding`` where torchrec cannot be imported). Needs polars
(the data module); ``benchmarks/gpu_training.sh`` carries its wheel.

Usage (from the repository root):

    python benchmarks/gpu_fit.py --config configs/movielens-1m.yaml --prepared runs/ml1m/prepared \
        --output /tmp/fit --json /tmp/fit/gpu-fit.json [--set train.max_minutes=6 ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from recsys_alibi.atomic import write_text_atomic
from recsys_alibi.config import load_config
from recsys_alibi.data.prepare import read_sequences
from recsys_alibi.data.splits import leave_one_out
from recsys_alibi.evaluation.evaluator import evaluate
from recsys_alibi.model.scorer import RankerScorer
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.data_rules import resolve_max_len
from recsys_alibi.training.fit import fit_ranker


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--prepared", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    config = resolve_max_len(load_config(args.config, [*args.overrides, f"output={args.output}"]), args.prepared)
    started = time.perf_counter()
    datamodule = SequenceDataModule(args.prepared, config.model, config.train, config.seed)
    fit = fit_ranker(config, datamodule, args.output / "checkpoints", logger=None, progress=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    test = leave_one_out(read_sequences(args.prepared), "test")
    scorer = RankerScorer(fit.module.model, name=config.model.position, device=device)
    result = evaluate(scorer, test, datamodule.n_items, config.evaluate, protocol_name="leave_one_out")
    report = {
        "config": str(args.config),
        "overrides": args.overrides,
        "item_table": fit.module.model.items.backend,
        "attention_backend": config.model.attention_backend,
        "precision": config.train.precision,
        "epochs": fit.epochs,
        "train_seconds": fit.train_seconds,
        "seconds_per_epoch_with_validation": fit.train_seconds / max(fit.epochs, 1),
        "best_val_ndcg_at_10": fit.best_val_ndcg_at_10,
        "test": {k: result.metrics[k] for k in ("HR@10", "NDCG@10", "MRR") if k in result.metrics},
        "wall_seconds": time.perf_counter() - started,
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "device": device,
                    "gpu": torch.cuda.get_device_name() if device == "cuda" else None},  # fmt: skip
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.json, json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
