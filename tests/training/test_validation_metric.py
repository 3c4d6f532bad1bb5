"""Training validation measures what ``evaluate`` measures (issue 31, defect 2).

The checkpoint, early stopping and the logged ``best_val_ndcg_at_10`` follow ``val/ndcg_at_10``: it
must mask the user's whole history before the validation target (and count a seen target as a miss),
not only the model's input window of ``max_len`` events.
"""

from __future__ import annotations

import lightning as L
import polars as pl
import pytest
from training_fixtures import tiny_config, write_walks

from recsys_alibi.data import schema
from recsys_alibi.data.splits import fit_split
from recsys_alibi.evaluation.evaluator import evaluate
from recsys_alibi.model.scorer import RankerScorer
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.module import RankerModule

MAX_LEN = 4  # histories of 3..30 events: most validation histories are longer than the window


def _validated(config, prepared):
    L.seed_everything(config.seed, verbose=False)
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    module = RankerModule(config.model, config.train, datamodule.n_items, exclude_seen=config.evaluate.exclude_seen,
                          seed=config.seed)  # fmt: skip
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    (metrics,) = trainer.validate(module, datamodule=datamodule, verbose=False)
    return module, metrics


@pytest.mark.parametrize("exclude_seen", [True, False])
def test_validation_metrics_equal_the_evaluator_on_the_same_model_and_examples(tmp_path, exclude_seen):
    prepared = write_walks(tmp_path / "prepared", n_users=80)
    config = tiny_config(tmp_path / "runs", f"model.max_len={MAX_LEN}", f"evaluate.exclude_seen={str(exclude_seen).lower()}")
    module, logged = _validated(config, prepared)
    examples = fit_split(pl.read_parquet(prepared / schema.SEQUENCES_FILE), "valid")
    repeats = examples.select(pl.col("targets").list.set_intersection("history").list.len() > 0).sum().item()
    earlier = examples.select(  # the target seen only before the model's window
        pl.col("targets").list.set_intersection(pl.col("history").list.head(pl.col("history").list.len() - MAX_LEN))
        .list.len() > 0
    ).sum().item()
    assert repeats > 10 and earlier > 5 and examples.height == 80  # the case the defect is about
    scorer = RankerScorer(module.model, name="same")
    scorer.max_context = MAX_LEN  # the model input of validation: the last max_len events
    cfg = config.evaluate.model_copy(update={"ks": [10], "context_lengths": []})
    result = evaluate(scorer, examples, 40, cfg, protocol_name="leave_one_out/valid")
    assert logged["val/ndcg_at_10"] == pytest.approx(result.metrics["NDCG@10"], abs=1e-6)
    assert logged["val/hr_at_10"] == pytest.approx(result.metrics["HR@10"], abs=1e-6)
    assert logged["val/mrr"] == pytest.approx(result.metrics["MRR"], abs=1e-6)
