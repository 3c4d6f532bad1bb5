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


def _fit(train=TRAIN, **kw) -> PopularityScorer:
    return PopularityScorer(**kw).fit(train, n_items=5)


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


def test_scores_rank_by_count_then_index():
    pop = _fit()
    scores = pop.score(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    assert scores.shape == (2, 6) and scores.dtype == torch.float32
    # order: 3 (3), 2 (2), 5 (2, higher index), 1 (1), 4 (0) -> scores 5, 4, 3, 2, 1
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
