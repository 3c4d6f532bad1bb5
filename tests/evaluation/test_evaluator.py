"""The evaluator on tiny hand-built examples: ranks, masking, buckets, context sweep."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
import torch

from recsys_alibi.config import EvaluateConfig
from recsys_alibi.evaluation.baselines import PopularityScorer
from recsys_alibi.evaluation.evaluator import EvaluationResult, Scorer, bucket_labels, bucket_names, evaluate


def _examples(rows: list[tuple[list[int], list[int]]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "user_id": list(range(len(rows))),
            "history": [h for h, _ in rows],
            "targets": [t for _, t in rows],
        },
        schema={"user_id": pl.Int64, "history": pl.List(pl.Int32), "targets": pl.List(pl.Int32)},
    )


class FixedScorer:
    """The same scores for every user; records every (history, lengths) it is given."""

    name = "fixed"

    def __init__(self, weights: list[float], max_context: int | None = None) -> None:
        self.weights = torch.tensor(weights, dtype=torch.float32)  # (N+1,)
        self.max_context = max_context
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def score(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        self.calls.append((history.clone(), lengths.clone()))
        return self.weights.expand(history.shape[0], -1).clone()

    def histories(self) -> list[list[int]]:
        """Every history received, as the valid prefix of its row."""
        return [row[:n].tolist() for h, lens in self.calls for row, n in zip(h, lens.tolist())]


# items 1..6, item 1 best
WEIGHTS = [0.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]


def cfg(**kw) -> EvaluateConfig:
    base = dict(ks=[1, 3], batch_size=2, history_buckets=[1, 2])
    return EvaluateConfig(**(base | kw))


def test_scorers_satisfy_protocol():
    assert isinstance(FixedScorer(WEIGHTS), Scorer)
    assert isinstance(PopularityScorer(), Scorer)


def test_hand_built_leave_one_out():
    examples = _examples(
        [
            ([1, 2], [3]),  # 1, 2 masked -> item 3 first: rank 1
            ([4], [2]),  # item 1 above: rank 2
            ([1], [6]),  # 2, 3, 4, 5 above: rank 5
            ([6, 5], [1]),  # rank 1
            ([3, 1], [3]),  # re-consumption: 3 is seen, masked like 1: a miss
        ]
    )
    result = evaluate(FixedScorer(WEIGHTS), examples, 6, cfg(), protocol_name="leave_one_out")
    ranks = [1, 2, 5, 1]  # and a miss: no hit at any K, reciprocal rank 0
    assert result.n_users == 5 and result.protocol == "leave_one_out" and result.scorer == "fixed"
    assert result.metrics["HR@1"] == pytest.approx(2 / 5)
    assert result.metrics["HR@3"] == pytest.approx(3 / 5)
    assert result.metrics["Recall@3"] == pytest.approx(3 / 5)
    assert result.metrics["NDCG@3"] == pytest.approx(sum(1 / math.log2(r + 1) for r in ranks if r <= 3) / 5)
    assert result.metrics["MRR"] == pytest.approx(sum(1 / r for r in ranks) / 5)
    # top-1 lists: 3, 1, 2, 1, 2 -> {1, 2, 3}; top-3 adds 4, 5 (user 3 -> 1, 2, 3; user 1 -> 1, 2, 3 ...)
    assert result.metrics["Coverage@1"] == pytest.approx(3 / 6)
    assert result.metrics["Coverage@3"] == pytest.approx(5 / 6)
    assert list(result.metrics) == [
        "HR@1", "NDCG@1", "Recall@1", "HR@3", "NDCG@3", "Recall@3", "MRR", "Coverage@1", "Coverage@3",
    ]
    assert result.tied_share == 0.0


def test_seen_item_never_counts_as_a_hit_not_even_a_repeated_target():
    # item 1 is scored highest and was seen; the target ranks first only because item 1 is masked
    examples = _examples([([1, 3], [2]), ([1], [1])])
    result = evaluate(FixedScorer(WEIGHTS), examples, 6, cfg(ks=[1]), protocol_name="loo")
    assert result.metrics["HR@1"] == pytest.approx(1 / 2)  # user 0: 2 is first; user 1: target 1 seen, a miss
    assert result.metrics["MRR"] == pytest.approx((1 + 0) / 2)
    assert "1 of 2 users (50.0%) have a target already in their history" in " ".join(result.notes)
    unmasked = evaluate(FixedScorer(WEIGHTS), examples, 6, cfg(ks=[1], exclude_seen=False), protocol_name="loo")
    assert unmasked.metrics["HR@1"] == pytest.approx(1 / 2)  # user 0's target now behind item 1, user 1's first
    assert unmasked.metrics["MRR"] == pytest.approx((1 / 2 + 1) / 2)
    assert not unmasked.notes


def test_multi_target_temporal_user():
    # history [1]; targets 2 and 5 (5 listed twice): ranks 1 and 4 among 2, 3, 4, 5, 6
    examples = _examples([([1], [2, 5, 5])])
    result = evaluate(FixedScorer(WEIGHTS), examples, 6, cfg(ks=[3]), protocol_name="temporal")
    assert result.metrics["HR@3"] == 1.0
    assert result.metrics["Recall@3"] == pytest.approx(1 / 2)
    assert result.metrics["NDCG@3"] == pytest.approx(1 / (1 + 1 / math.log2(3)))
    assert result.metrics["MRR"] == 1.0


def test_users_without_target_are_skipped_with_a_note():
    examples = _examples([([1], [2]), ([2], [])])
    result = evaluate(FixedScorer(WEIGHTS), examples, 6, cfg(), protocol_name="temporal")
    assert result.n_users == 1
    assert any("without a target" in note for note in result.notes)


def test_history_length_buckets():
    assert bucket_names([20, 50, 200, 1000]) == ["1-20", "21-50", "51-200", "201-1000", ">1000"]
    labels = bucket_labels([1, 20, 21, 50, 51, 1000, 1001], [20, 50, 200, 1000]).tolist()
    assert labels == ["1-20", "1-20", "21-50", "21-50", "51-200", "201-1000", ">1000"]
    examples = _examples([([2], [1]), ([1, 3], [2]), ([4, 5], [6]), ([2, 3, 4], [1])])
    result = evaluate(FixedScorer(WEIGHTS), examples, 6, cfg(history_buckets=[1, 2, 10]), protocol_name="loo")
    assert result.history_bucket_sizes == {"1-1": 1, "2-2": 2, "3-10": 1, ">10": 0}
    assert list(result.by_history_length) == ["1-1", "2-2", "3-10"]  # empty bucket left out
    assert result.by_history_length["1-1"]["MRR"] == 1.0  # rank 1
    assert result.by_history_length["2-2"]["MRR"] == pytest.approx((1 + 1 / 4) / 2)  # ranks 1 (item 2), 4 (item 6: 1, 2, 3 above)
    assert result.by_history_length["3-10"]["HR@1"] == 1.0


def test_context_sweep_truncates_to_last_events():
    examples = _examples([([5, 4, 3, 2, 1], [6]), ([3, 2], [1])])
    scorer = FixedScorer(WEIGHTS)
    result = evaluate(scorer, examples, 6, cfg(), protocol_name="loo", context_lengths=[1, 3, None, 10])
    received = scorer.histories()
    assert received[:2] == [[5, 4, 3, 2, 1], [3, 2]]  # default pass: whole history
    assert [[5, 4, 3, 2, 1][-1:], [2]] == received[2:4]  # context 1: last event only
    assert [[3, 2, 1], [3, 2]] == received[4:6]  # context 3
    assert len(received) == 6  # "full" and 10 (>= every history) reuse the default pass
    assert list(result.by_context_length) == ["1", "3", "full", "10"]
    # masking still uses the whole history: items 1..5 of user 0 stay masked at every context
    for metrics in result.by_context_length.values():
        assert metrics == result.metrics


def test_max_context_stops_the_sweep():
    examples = _examples([([5, 4, 3, 2], [6]), ([3], [1])])
    scorer = FixedScorer(WEIGHTS, max_context=2)
    result = evaluate(scorer, examples, 6, cfg(), protocol_name="loo", context_lengths=[1, 2, 3, "full"])
    assert max(len(h) for h in scorer.histories()) == 2  # never more than max_context
    assert scorer.histories()[0] == [3, 2]  # the last two events
    assert all(v is None for v in result.by_context_length["3"].values())
    assert result.by_context_length["full"] == result.metrics
    assert result.by_context_length["2"] == result.metrics
    assert any("max_context=2" in note and "context 3" in note for note in result.notes)
    assert list(result.to_json()["by_context_length"]) == ["1", "2", "full"]  # the contract's {metric: float}: 3 left out


def test_config_context_lengths_are_the_default_sweep():
    examples = _examples([([1, 2, 3], [4])])
    result = evaluate(FixedScorer(WEIGHTS), examples, 6, cfg(context_lengths=[2]), protocol_name="loo")
    assert list(result.by_context_length) == ["2"]


def test_ties_are_counted_and_rule_is_configurable():
    flat = FixedScorer([0.0] + [1.0] * 6)
    examples = _examples([([1], [4])])
    optimistic = evaluate(flat, examples, 6, cfg(), protocol_name="loo")
    pessimistic = evaluate(flat, examples, 6, cfg(ties="pessimistic"), protocol_name="loo")
    assert optimistic.metrics["MRR"] == 1.0 and pessimistic.metrics["MRR"] == pytest.approx(1 / 5)
    assert optimistic.tied_share == 1.0
    assert any("tied" in note for note in optimistic.notes)


class BadScorer(FixedScorer):
    def __init__(self, out: torch.Tensor) -> None:
        super().__init__(WEIGHTS)
        self.out = out

    def score(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.out[: history.shape[0]]


@pytest.mark.parametrize(
    "out, message",
    [(torch.zeros(4, 5), "shape"), (torch.full((4, 7), float("nan")), "NaN")],
)
def test_bad_scores_fail_clearly(out, message):
    with pytest.raises(ValueError, match=message):
        evaluate(BadScorer(out), _examples([([1], [2])]), 6, cfg(), protocol_name="loo")


@pytest.mark.parametrize(
    "rows, message",
    [([([1], [7])], "outside 1..6"), ([([0], [2])], "outside 1..6"), ([([1], [])], "no users")],
)
def test_bad_examples_fail_clearly(rows, message):
    with pytest.raises(ValueError, match=message):
        evaluate(FixedScorer(WEIGHTS), _examples(rows), 6, cfg(), protocol_name="loo")


class MeanEmbeddingScorer:
    """A small 'model': mean of history item vectors dotted with the item table."""

    name = "mean-embedding"
    max_context = None

    def __init__(self, n_items: int, dim: int = 32) -> None:
        gen = torch.Generator().manual_seed(0)
        self.table = torch.randn(n_items + 1, dim, generator=gen)

    def score(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        vecs = self.table[history] * (history > 0).unsqueeze(-1)  # (B, L, D)
        user = vecs.sum(1) / lengths.clamp(min=1).unsqueeze(-1)  # (B, D)
        return user @ self.table.T  # (B, N+1)


def test_movielens_sized_run_counts_every_user():
    """A MovieLens-sized run (6,040 users, ~0.9M events) goes through. Its speed is not checked here: a unit
    test's time follows the machine's load; benchmarks/ measure time."""
    rng = np.random.default_rng(0)
    n_users, n_items = 6040, 3416
    lengths = np.clip(rng.lognormal(4.5, 1.0, n_users).astype(np.int64), 3, 2300)  # ~0.9M events
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = pa.array(rng.integers(1, n_items + 1, int(offsets[-1])).astype(np.int32))
    hist_off = offsets - np.arange(n_users + 1)  # every user's last event is the target
    last = offsets[1:] - 1
    keep = np.ones(int(offsets[-1]), dtype=bool)
    keep[last] = False
    examples = pl.DataFrame(
        {
            "user_id": np.arange(n_users),
            "history": pl.from_arrow(pa.LargeListArray.from_arrays(hist_off, values.filter(pa.array(keep)))),
            "targets": pl.from_arrow(pa.LargeListArray.from_arrays(np.arange(n_users + 1), values.take(last))),
        }
    )
    result = evaluate(MeanEmbeddingScorer(n_items), examples, n_items, EvaluateConfig(), protocol_name="loo")
    assert result.n_users == n_users
    assert sum(result.history_bucket_sizes.values()) == n_users
    assert isinstance(EvaluationResult.from_json(result.to_json()), EvaluationResult)


class CachedScorer(FixedScorer):
    """Returns a view of its own tensor: the evaluator must not write into it."""

    def score(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.weights.expand(history.shape[0], -1)


def test_scorer_output_is_not_modified():
    scorer = CachedScorer(WEIGHTS)
    result = evaluate(scorer, _examples([([1, 2], [3]), ([4], [2])]), 6, cfg(), protocol_name="loo")
    assert scorer.weights.tolist() == WEIGHTS
    assert result.metrics["MRR"] == pytest.approx((1 + 1 / 2) / 2)


class GapScorer(FixedScorer):
    """A time-gap scorer: records the gaps it is given beside each history."""

    uses_time_gaps = True

    def score(self, history: torch.Tensor, lengths: torch.Tensor, gaps: torch.Tensor | None = None) -> torch.Tensor:
        assert gaps is not None and gaps.shape == history.shape
        self.gaps = getattr(self, "gaps", []) + [row[:n].tolist() for row, n in zip(gaps, lengths.tolist())]
        return super().score(history, lengths)


def test_time_gap_scorer_gets_the_history_gaps_cut_like_the_history():
    examples = _examples([([2, 3, 4], [1]), ([5], [6])]).with_columns(
        pl.Series("history_time_gaps", [[1, 9, 7], [1]], dtype=pl.List(pl.Int32))
    )
    scorer = GapScorer(WEIGHTS)
    evaluate(scorer, examples, 6, cfg(), protocol_name="t", context_lengths=[2])
    pairs = sorted(zip(scorer.histories(), scorer.gaps))
    assert [5] in scorer.histories() and [3, 4] in scorer.histories()  # context 2 keeps the last two
    assert ([3, 4], [9, 7]) in pairs and ([2, 3, 4], [1, 9, 7]) in pairs and ([5], [1]) in pairs
    with pytest.raises(ValueError, match="history_time_gaps"):
        evaluate(GapScorer(WEIGHTS), _examples([([2], [1])]), 6, cfg(), protocol_name="t")


def test_token_budget_splits_batches_by_the_longest_context_and_keeps_every_metric():
    # users sorted longest first: 5, 2, 2, 1 events; a budget of 4 padded events per batch
    rows = [([5, 4, 3, 2, 1], [6]), ([3, 2], [1]), ([2, 6], [3]), ([4], [2])]
    wide = FixedScorer(WEIGHTS)
    reference = evaluate(wide, _examples(rows), 6, cfg(batch_size=8), protocol_name="loo")
    assert [len(lens) for _, lens in wide.calls] == [4]  # one batch of all four users
    tight = FixedScorer(WEIGHTS)
    result = evaluate(tight, _examples(rows), 6, cfg(batch_size=8, batch_tokens=4), protocol_name="loo")
    # the 5-event user alone (over the budget), then 2 x 2 events, then the last user
    assert [len(lens) for _, lens in tight.calls] == [1, 2, 1]
    assert sorted(map(tuple, tight.histories())) == sorted(map(tuple, wide.histories()))
    assert result.metrics == reference.metrics
    capped = FixedScorer(WEIGHTS)  # at context 2 every history counts 2 events: 2 users per batch
    evaluate(capped, _examples(rows), 6, cfg(batch_size=8, batch_tokens=4), protocol_name="loo", context_lengths=[2])
    assert [len(lens) for _, lens in capped.calls][3:] == [2, 2]
