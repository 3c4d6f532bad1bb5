"""Popularity baseline: counts, tie-break and ranks on a hand-built example."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from recsys_alibi.config import EvaluateConfig
from recsys_alibi.evaluation.baselines import PopularityScorer
from recsys_alibi.evaluation.evaluator import evaluate

# counts: item 1 -> 1, item 2 -> 2, item 3 -> 3, item 4 -> 0, item 5 -> 2
TRAIN = [[1, 2, 3], [3, 2, 3], [5, 5]]


IDS = pl.Series("item_id", ["a", "b", "c", "d", "e"])  # raw ids of items 1..5


def _fit(train=TRAIN, **kw) -> PopularityScorer:
    return PopularityScorer(**kw).fit(train, n_items=5, item_ids=IDS)


@pytest.mark.parametrize(
    "train",
    [
        TRAIN,
        [np.array(h, dtype=np.int32) for h in TRAIN],
        pl.DataFrame({"item_idx": TRAIN}, schema={"item_idx": pl.List(pl.Int32)}),
        pl.DataFrame({"history": TRAIN}),
        pl.Series("item_idx", TRAIN),
    ],
)
def test_counts_from_any_input(train):
    pop = _fit(train)
    assert pop.counts.tolist() == [0, 1, 2, 3, 0, 2]
    assert pop.n_items == 5


def test_scores_rank_by_count_then_raw_id():
    pop = _fit()
    scores = pop.score(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    assert scores.shape == (2, 6) and scores.dtype == torch.float32
    # order: 3 (3), 2 (2, id "b"), 5 (2, id "e"), 1 (1), 4 (0) -> scores 5, 4, 3, 2, 1
    assert scores[0].tolist() == [0.0, 2.0, 4.0, 5.0, 1.0, 3.0]
    assert torch.equal(scores[0], scores[1])
    raw = _fit(tie_break=False).score(torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int64))
    assert raw[0].tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 2.0]


def test_popularity_ranks_in_the_evaluator():
    examples = pl.DataFrame(
        {"user_id": [1, 2, 3], "history": [[3], [], [3, 2]], "targets": [[1], [4], [5]]},
        schema={"user_id": pl.Int64, "history": pl.List(pl.Int32), "targets": pl.List(pl.Int32)},
    )
    result = evaluate(_fit(), examples, 5, EvaluateConfig(ks=[1, 2]), protocol_name="loo")
    # user 1: 3 masked; order 2, 5, 1 -> rank 3. user 2: 3, 2, 5, 1, 4 -> rank 5. user 3: 5 first -> rank 1
    ranks = [3, 5, 1]
    assert result.metrics["MRR"] == pytest.approx(sum(1 / r for r in ranks) / 3)
    assert result.metrics["HR@2"] == pytest.approx(1 / 3)
    assert result.metrics["NDCG@2"] == pytest.approx(1 / 3)
    assert result.tied_share == 0.0
    assert result.metrics["Coverage@1"] == pytest.approx(3 / 5)  # top-1 lists: 2, 3, 5
    assert result.metrics["Coverage@2"] == pytest.approx(4 / 5)  # top-2 adds 1


def test_errors():
    with pytest.raises(RuntimeError, match="not fitted"):
        PopularityScorer().score(torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="1..5"):
        PopularityScorer().fit([[6]], n_items=5)
    with pytest.raises(ValueError, match="item_idx"):
        PopularityScorer().fit(pl.DataFrame({"x": [[1]]}), n_items=5)


def test_fit_returns_the_fitted_instance():
    fitted = PopularityScorer().fit(pl.Series("history", TRAIN), 5)  # as the evaluate job calls it
    assert isinstance(fitted, PopularityScorer) and fitted.counts.tolist() == [0, 1, 2, 3, 0, 2]
    raw = PopularityScorer(tie_break=False)
    assert raw.fit(TRAIN, 5) is raw and not raw.tie_break


def _order(pop: PopularityScorer) -> list[int]:
    scores = pop.score(torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int64))[0]
    return [int(i) for i in torch.argsort(scores[1:], descending=True) + 1]


def test_popularity_ties_go_to_the_item_seen_last_in_training_never_to_the_lower_index():
    # items 2 and 5 both have 2 training events; 5's last one (t=40) is after 2's last (t=31)
    seen = pl.DataFrame(
        {"history": TRAIN, "timestamp": [[10, 11, 12], [30, 31, 32], [39, 40]]},
        schema={"history": pl.List(pl.Int32), "timestamp": pl.List(pl.Int64)},
    )
    assert _order(PopularityScorer().fit(seen, n_items=5, item_ids=IDS)) == [3, 5, 2, 1, 4]
    # no times: the raw id decides (item 2 is "y", before item 1 "z"), not the index
    ids = pl.Series("item_id", ["z", "y", "x", "w", "v"])
    assert _order(PopularityScorer().fit([[1, 2], [1, 2]], n_items=5, item_ids=ids)) == [2, 1, 5, 4, 3]
    with pytest.raises(ValueError, match="one per event"):
        PopularityScorer().fit(seen.with_columns(pl.col("timestamp").list.head(1)), n_items=5)
    with pytest.raises(ValueError, match="raw ids of the 5 items"):
        PopularityScorer().fit(TRAIN, n_items=5, item_ids=IDS.head(4))
