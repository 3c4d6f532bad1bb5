"""One seen-item rule for reports and serving (issue 31, defect 3): ``evaluate``'s HR@K is the hit rate
of the top-K that ``score`` serves, on data where many held-out items were consumed before."""

from __future__ import annotations

import polars as pl
import pytest
from serving_fixtures import read_rankings, score_config, tiny_model, vocabulary, write_prepared

from recsys_alibi.config import EvaluateConfig
from recsys_alibi.data import schema
from recsys_alibi.evaluation.evaluator import evaluate
from recsys_alibi.model.scorer import RankerScorer
from serving.score import score_with_model

K = 10


def _held_out(prepared, path):
    """Examples (history, [last event]) of every user with 2+ events, and a prepared dir of their histories."""
    sequences = pl.read_parquet(prepared / schema.SEQUENCES_FILE).filter(pl.col(schema.LENGTH) >= 2)
    examples = sequences.select(
        pl.col(schema.USER_ID).alias("user_id"),
        pl.col(schema.ITEM_IDX).list.head(pl.col(schema.LENGTH) - 1).alias("history"),
        pl.col(schema.ITEM_IDX).list.tail(1).alias("targets"),
    )
    path.mkdir()
    sequences.with_columns(
        pl.col(schema.ITEM_IDX).list.head(pl.col(schema.LENGTH) - 1),
        pl.col(schema.TIMESTAMP).list.head(pl.col(schema.LENGTH) - 1),
        pl.col(schema.LENGTH) - 1,
    ).write_parquet(path / schema.SEQUENCES_FILE)
    vocabulary().write_parquet(path / schema.ITEMS_FILE)
    return examples, path


@pytest.mark.parametrize("exclude_seen", [True, False])
def test_evaluated_hit_rate_equals_the_hit_rate_of_the_served_top_k(tmp_path, exclude_seen):
    examples, histories = _held_out(write_prepared(tmp_path / "prepared", n_users=40), tmp_path / "histories")
    repeats = examples.select(pl.col("targets").list.set_intersection("history").list.len() > 0).sum().item()
    assert repeats >= 10  # many targets are items the user consumed before
    model = tiny_model()
    score_with_model(score_config(k=K, exclude_seen=exclude_seen), model, vocabulary(), histories, tmp_path / "out",
                     progress=False)  # fmt: skip
    served = read_rankings(tmp_path / "out").group_by(schema.USER_ID).agg(pl.col(schema.ITEM_ID))
    truth = examples.select(pl.col("user_id").alias(schema.USER_ID), (pl.col("targets").list.first() + 1000).alias("t"))
    hits = truth.join(served, on=schema.USER_ID, how="left").select(
        pl.col(schema.ITEM_ID).fill_null([]).list.contains(pl.col("t")).mean()
    ).item()
    cfg = EvaluateConfig(ks=[K], exclude_seen=exclude_seen, context_lengths=[])
    result = evaluate(RankerScorer(model), examples, vocabulary().height, cfg, protocol_name="loo")
    assert result.n_users == examples.height == 40
    assert result.metrics[f"HR@{K}"] == pytest.approx(hits, abs=1e-12)
    assert 0 < hits < 1
