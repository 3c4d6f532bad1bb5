"""One scoring job on a tiny model: the rows of each user, long histories, batching."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from serving_fixtures import N_ITEMS, read_rankings, score_config, tiny_model, vocabulary

from recsys_alibi.data import schema
from recsys_alibi.data.loader import FlatSequences
from serving.rank import ShardRanker, context_window, plan_batches
from serving.score import score_with_model


def test_rows_per_user_ranks_and_scores(prepared, tmp_path):
    result = score_with_model(score_config(k=10), tiny_model(), vocabulary(), prepared, tmp_path / "out", progress=False)
    rankings = read_rankings(tmp_path / "out")
    assert rankings.columns == [schema.USER_ID, schema.RANK, schema.ITEM_ID, schema.SCORE]
    assert rankings.schema[schema.RANK] == pl.Int32 and rankings.schema[schema.SCORE] == pl.Float32
    sequences = pl.read_parquet(prepared / schema.SEQUENCES_FILE)
    want = sequences.select(
        schema.USER_ID, pl.min_horizontal(pl.lit(10), N_ITEMS - pl.col(schema.ITEM_IDX).list.n_unique()).alias("want")
    )
    per_user = rankings.group_by(schema.USER_ID).agg(
        pl.len().alias("rows"),
        (pl.col(schema.RANK) == pl.int_range(1, pl.len() + 1, dtype=pl.Int32)).all().alias("ranks_1_to_k"),
        (pl.col(schema.SCORE).diff().fill_null(0) <= 0).all().alias("non_increasing"),
    )
    joined = want.join(per_user, on=schema.USER_ID, how="left")
    assert joined["rows"].to_list() == joined["want"].to_list()
    assert joined["ranks_1_to_k"].all() and joined["non_increasing"].all()
    assert joined.filter(pl.col(schema.USER_ID) == "u000")["rows"].item() == 3  # saw 27 of 30 items
    seen = sequences.explode(schema.ITEM_IDX).select(schema.USER_ID, (pl.col(schema.ITEM_IDX).cast(pl.Int64) + 1000).alias(schema.ITEM_ID))
    assert rankings.join(seen, on=[schema.USER_ID, schema.ITEM_ID], how="semi").height == 0
    assert result.rows == rankings.height and result.users == result.users_scored == 23 and result.shards == 5
    assert "users/s" in result.summary() and "unknown items: 0" in result.summary()


def test_without_seen_exclusion_every_user_gets_k_rows(prepared, tmp_path):
    score_with_model(score_config(k=12, exclude_seen=False), tiny_model(), vocabulary(), prepared, tmp_path / "o", progress=False)
    counts = read_rankings(tmp_path / "o").group_by(schema.USER_ID).len()["len"]
    assert counts.len() == 23 and (counts == 12).all()


def test_context_window_keeps_sinks_and_the_last_events():
    history = np.arange(1, 11)
    assert context_window(history, 10, 2).tolist() == history.tolist()
    assert context_window(history, 6, 2).tolist() == [1, 2, 7, 8, 9, 10]
    assert context_window(history, 4, 0).tolist() == [7, 8, 9, 10]


def test_long_history_is_scored_on_its_window_but_masked_on_all_of_it():
    model = tiny_model()
    cfg = score_config(k=5, max_context=6, sinks=2, catalog_chunk=4).score
    ranker = ShardRanker(model, vocabulary(), cfg, k=5)
    history = np.array([3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], dtype=np.int64)  # 12 events > C = 6
    rankings, skipped = ranker.rank(pl.Series(schema.USER_ID, [7]), FlatSequences(history, np.array([0, 12])))
    assert skipped == 0
    window = torch.tensor([[3, 4, 11, 12, 13, 14]])
    with torch.no_grad():
        scores = model.logits(model.last_hidden(window, torch.tensor([6]), backend="eager"))[0]
    scores[0] = float("-inf")
    scores[torch.from_numpy(history)] = float("-inf")  # items 5..10 are outside the window, still seen
    want = torch.sort(scores, descending=True, stable=True).indices[:5] + 1000
    assert rankings[schema.ITEM_ID].to_list() == want.tolist()


def test_histories_longer_than_training_are_scored_whole_up_to_max_context():
    model = tiny_model()  # trained length 8
    ranker = ShardRanker(model, vocabulary(), score_config(k=5, max_context=64).score, k=5)
    history = np.arange(1, 21, dtype=np.int64)  # 20 events
    rankings, _ = ranker.rank(pl.Series(schema.USER_ID, [1]), FlatSequences(history, np.array([0, 20])))
    with torch.no_grad():
        scores = model.logits(model.last_hidden(torch.from_numpy(history)[None], torch.tensor([20]), backend="eager"))[0]
    scores[: 21] = float("-inf")
    assert rankings[schema.ITEM_ID].to_list() == (torch.sort(scores, descending=True, stable=True).indices[:5] + 1000).tolist()


def test_batches_respect_users_and_tokens():
    lengths = np.array([1, 2, 2, 3, 5, 8, 40])
    batches = list(plan_batches(lengths, max_users=3, max_tokens=10))
    assert batches == [(0, 3), (3, 5), (5, 6), (6, 7)]  # 40 > 10 tokens: alone
    assert sum(e - s for s, e in batches) == len(lengths)


def test_sinks_must_be_below_the_context():
    with pytest.raises(ValueError, match="score.sinks"):
        ShardRanker(tiny_model(), vocabulary(), score_config(max_context=4, sinks=4).score, k=3)


def test_batching_does_not_change_the_rankings(prepared, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    score_with_model(score_config(batch_size=1, catalog_chunk=1), tiny_model(), vocabulary(), prepared, a, progress=False)
    score_with_model(score_config(batch_size=64, catalog_chunk=1000, batch_tokens=64), tiny_model(), vocabulary(), prepared, b, progress=False)
    left, right = read_rankings(a), read_rankings(b)
    assert left.drop(schema.SCORE).equals(right.drop(schema.SCORE))
    np.testing.assert_allclose(left[schema.SCORE].to_numpy(), right[schema.SCORE].to_numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(torch.cuda.device_count() > 3, reason="needs a machine with at most 3 CUDA devices")
def test_a_device_this_machine_lacks_is_a_config_error_before_scoring():
    from recsys_alibi.config import ConfigError
    from serving.rank import resolve_device

    with pytest.raises(ConfigError, match=r"score.device=cuda:3 but this machine has \d CUDA device"):
        resolve_device("cuda:3")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("window", [None, 256])
@pytest.mark.parametrize("k_len", [200, 4096, 8192])
def test_scoring_auto_backend_is_the_library_rule(device, window, k_len):
    from recsys_alibi.model.attention import choose_backend
    from serving.rank import resolve_backend

    name = resolve_backend("auto")
    assert name == "auto"  # passed through: the model's batch_mask resolves it
    got = choose_backend(name, device, k_len=k_len, grad=False, window=window)
    expected = "flex" if (device == "cuda" and (window is not None or k_len > 4096)) or (
        device == "cpu" and window is not None and k_len >= 2048
    ) else "sdpa"
    assert got == expected
    assert resolve_backend("model") is None
