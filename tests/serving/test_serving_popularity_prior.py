"""score.popularity_prior: recency-weighted counts by hand, and the ranking it gives against the model's scores."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from serving_fixtures import N_ITEMS, read_rankings, score_config, tiny_model, vocabulary, write_prepared

from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from recsys_alibi.evaluation.popularity_prior import item_bias, item_popularity, weighted_counts
from serving.manifest import OutputDirError
from serving.rank import ShardRanker
from serving.score import score_with_model
from serving.topk import chunked_topk

DAY = 86_400


def test_weighted_counts_halve_every_half_life():
    items, times = np.array([1, 1, 2, 3]), np.array([10 * DAY, 9 * DAY, 8 * DAY, 7 * DAY])
    counts = weighted_counts(items, times, 10 * DAY, 4, (1.0, 2.0, None))
    assert counts[0].tolist() == [0.0, 1.5, 0.25, 0.125, 0.0]  # ages 0 and 1 day; 2 days; 3 days; item 4: none
    assert counts[1] == pytest.approx([0.0, 1 + 2**-0.5, 0.5, 2**-1.5, 0.0])
    assert counts[2].tolist() == [0.0, 2.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="half-lives"):
        weighted_counts(items, times, 10 * DAY, 4, (0.0,))
    with pytest.raises(ValueError, match="1..2"):
        weighted_counts(items, times, 10 * DAY, 2, (None,))


def _timed_prepared(tmp_path):
    """The scoring fixture's prepared dir with event times in whole days: user u's event j at day u + j."""
    path = write_prepared(tmp_path / "prepared")
    sequences = pl.read_parquet(path / schema.SEQUENCES_FILE)
    times = [[(u + j) * DAY for j in range(n)] for u, n in enumerate(sequences[schema.LENGTH].to_list())]
    sequences.with_columns(pl.Series(schema.TIMESTAMP, times, dtype=pl.List(pl.Int64))).write_parquet(
        path / schema.SEQUENCES_FILE)  # fmt: skip
    return path, sequences, times


def _hand_counts(sequences: pl.DataFrame, times: list, half_life: float) -> np.ndarray:
    """(N + 1,) counts as of one second after the newest event, event by event."""
    as_of = max(t for ts in times for t in ts) + 1
    counts = np.zeros(N_ITEMS + 1)
    for history, ts in zip(sequences[schema.ITEM_IDX].to_list(), times):
        for item, t in zip(history, ts):
            counts[item] += 0.5 ** ((as_of - t) / DAY / half_life)
    return counts


def test_item_popularity_of_a_prepared_input_is_as_of_its_newest_event(tmp_path):
    path, sequences, times = _timed_prepared(tmp_path)
    popularity = item_popularity(path / schema.SEQUENCES_FILE, vocabulary(), 3.0)
    counts = _hand_counts(sequences, times, 3.0)
    got = dict(zip(popularity["item_id"].to_list(), popularity["popularity"].to_list()))
    assert got == pytest.approx({1000 + i: counts[i] for i in range(1, N_ITEMS + 1) if counts[i] > 0})
    bias = item_bias(popularity, pl.concat([pl.Series([None], dtype=pl.Int64), vocabulary()["item_id"], pl.Series([7])]), 2.0)
    assert bias[0] == 0.0 and bias[-1] == 0.0  # padding, and an item without events (a new item)
    assert bias[1:-1] == pytest.approx(2.0 * np.log1p(counts[1:]))


def test_a_prior_needs_event_times(tmp_path):
    path = write_prepared(tmp_path / "prepared")
    pl.read_parquet(path / schema.SEQUENCES_FILE).drop(schema.TIMESTAMP).write_parquet(tmp_path / "bare.parquet")
    with pytest.raises(DataError, match="needs event times"):
        item_popularity(tmp_path / "bare.parquet", vocabulary(), 7.0)


def _prepare_log(tmp_path, line_order: bool, out):
    """6 users x 5 events (one 5 days apart), prepared into ``out``: as SASRec ``user item`` lines (time is the
    line order) or as a CSV with real timestamps."""
    from recsys_alibi.config import DataConfig
    from recsys_alibi.data.prepare import prepare

    lines = [(u, (u + 2 * j) % 9, 100 + 5 * j * DAY) for u in range(6) for j in range(5)]
    if line_order:
        source, fmt = tmp_path / "log.txt", "sasrec"
        source.write_text("".join(f"{u} {i}\n" for u, i, _ in lines))
    else:
        source, fmt = tmp_path / "log.csv", "csv"
        source.write_text("user_id,item_id,timestamp\n" + "".join(f"{u},{i},{t}\n" for u, i, t in lines))
    prepare(DataConfig(format=fmt, min_events_per_user=1, min_events_per_item=1), source, out)


@pytest.mark.parametrize("line_order", [True, False])
def test_a_sequences_file_copied_out_of_its_folder_still_says_where_time_came_from(tmp_path, line_order):
    """A SASRec-format log (``user item`` lines: the line order is the time) prepared, then its sequences.parquet
    copied alone elsewhere: the folder's stats.json is gone, the file's footer still says line order, so the prior
    (and a time-gap model) refuses it; the same copy of a log with real times is counted."""
    import shutil

    from recsys_alibi.data.sequences import read_items
    from recsys_alibi.data.time_gaps import sequences_have_real_timestamps

    _prepare_log(tmp_path, line_order, tmp_path / "prepared")
    copied = tmp_path / "elsewhere" / "histories.parquet"
    copied.parent.mkdir()
    shutil.copy(tmp_path / "prepared" / schema.SEQUENCES_FILE, copied)
    assert sequences_have_real_timestamps(copied) is not line_order
    assert sequences_have_real_timestamps(tmp_path / "prepared" / schema.SEQUENCES_FILE) is not line_order
    items = read_items(tmp_path / "prepared")
    if line_order:
        with pytest.raises(DataError, match="needs event times .* line order"):
            item_popularity(copied, items, 7.0)
    else:  # 5 events of each user, every item counted once per event (plain counts)
        assert item_popularity(copied, items, None)["popularity"].sum() == 30.0


def test_a_file_placed_in_another_prepare_s_folder_is_judged_by_its_own_footer(tmp_path):
    """A real-time sequences file copied into a line-order prepared folder is real time (its footer carries its
    own prepare id and no line-order key), a line-order file copied into a real-time folder is line order; a
    missing file is a one-line DataError."""
    import shutil

    from recsys_alibi.data.time_gaps import sequences_have_real_timestamps

    _prepare_log(tmp_path, True, tmp_path / "sas")
    _prepare_log(tmp_path, False, tmp_path / "csv")
    shutil.copy(tmp_path / "csv" / schema.SEQUENCES_FILE, tmp_path / "sas" / "real.parquet")
    shutil.copy(tmp_path / "sas" / schema.SEQUENCES_FILE, tmp_path / "csv" / "line_order.parquet")
    assert sequences_have_real_timestamps(tmp_path / "sas" / "real.parquet") is True
    assert sequences_have_real_timestamps(tmp_path / "sas" / schema.SEQUENCES_FILE) is False
    assert sequences_have_real_timestamps(tmp_path / "csv" / "line_order.parquet") is False
    with pytest.raises(DataError, match=r"missing\.parquet not found"):
        sequences_have_real_timestamps(tmp_path / "csv" / "missing.parquet")


def test_the_job_ranks_by_the_model_score_plus_the_prior(tmp_path):
    path, sequences, times = _timed_prepared(tmp_path)
    model = tiny_model()
    config = score_config(k=10, popularity_prior={"weight": 3.0, "half_life_days": 2.0})
    score_with_model(config, model, vocabulary(), path, tmp_path / "out", progress=False)
    rankings = read_rankings(tmp_path / "out")
    bias = torch.from_numpy(3.0 * np.log1p(_hand_counts(sequences, times, 2.0))).float()  # (N + 1,)
    plain = score_with_model(score_config(k=10), model, vocabulary(), path, tmp_path / "plain", progress=False)
    assert plain.rows == rankings.height
    changed = 0
    for user, history in zip(sequences[schema.USER_ID].to_list(), sequences[schema.ITEM_IDX].to_list()):
        h = torch.tensor(history, dtype=torch.int64)
        with torch.no_grad():
            scores = model.logits(model.last_hidden(h[None], torch.tensor([len(history)]), backend="eager"))[0] + bias
        scores[0] = float("-inf")
        scores[h] = float("-inf")
        order = torch.sort(scores, descending=True, stable=True)
        want = order.indices[: min(10, int(torch.isfinite(scores).sum()))]
        got = rankings.filter(pl.col(schema.USER_ID) == user)
        assert got[schema.ITEM_ID].to_list() == (want + 1000).tolist(), user
        assert got[schema.SCORE].to_numpy() == pytest.approx(order.values[: len(want)].numpy(), abs=1e-4)
        changed += got[schema.ITEM_ID].to_list() != read_rankings(tmp_path / "plain").filter(
            pl.col(schema.USER_ID) == user)[schema.ITEM_ID].to_list()  # fmt: skip
    assert changed > 0  # the prior moved some ranking


def test_the_prior_is_part_of_the_job_identity(tmp_path):
    path, _, _ = _timed_prepared(tmp_path)
    ranker = ShardRanker(tiny_model(), vocabulary(), score_config().score, k=10)
    assert "popularity_prior" not in ranker.settings()  # off: the identity of every earlier job is unchanged
    score_with_model(score_config(popularity_prior={"weight": 1.0}), tiny_model(), vocabulary(), path, tmp_path / "o",
                     progress=False)  # fmt: skip
    with pytest.raises(OutputDirError):  # the same output with another weight is another job
        score_with_model(score_config(popularity_prior={"weight": 2.0}), tiny_model(), vocabulary(), path,
                         tmp_path / "o", progress=False)  # fmt: skip


def test_a_bias_of_the_wrong_length_is_refused():
    table = torch.randn(N_ITEMS + 1, 4)
    with pytest.raises(ValueError, match="bias"):
        chunked_topk(torch.randn(2, 4), table, torch.zeros(2, 0, dtype=torch.int64), 3, chunk=7, bias=torch.zeros(N_ITEMS))


def test_grid_metrics_rank_the_target_under_each_weight_by_hand():
    from recsys_alibi.evaluation.popularity_prior import GRID, grid_metrics

    inf = float("-inf")
    scores = torch.tensor([[inf, 2.0, 1.0, 0.5, inf], [inf, 2.0, 1.0, 0.5, inf]])  # item 4 seen
    prior = torch.tensor([[0.0, 0.0, 0.0, 1.0, 5.0]] * 6, dtype=torch.float64)  # log(1 + c), every half-life
    got = grid_metrics(scores, torch.tensor([3, 4]), prior)  # user 0: item 3; user 1: its seen item 4
    ndcg = {beta: got[0, GRID.index((beta, 3.0)), 0] for beta in (0.0, 1.0, 2.0, 3.0, float("inf"))}
    # beta 0: 2.0 > 1.0 > 0.5, rank 3; beta 1: 2.0 > 1.5 > 1.0, rank 2; beta 2: 2.5 first; inf: the count first
    assert ndcg == pytest.approx({0.0: 1 / np.log2(4), 1.0: 1 / np.log2(3), 2.0: 1.0, 3.0: 1.0, float("inf"): 1.0})
    assert got[0, GRID.index((0.0, 3.0)), 1] == 1.0 and (got[1] == 0).all()  # a seen target is a miss everywhere


def test_a_prior_refused_for_want_of_times_leaves_no_job_behind(tmp_path):
    path = write_prepared(tmp_path / "prepared")
    bare = tmp_path / "bare"
    bare.mkdir()
    pl.read_parquet(path / schema.SEQUENCES_FILE).drop(schema.TIMESTAMP).write_parquet(bare / schema.SEQUENCES_FILE)
    with pytest.raises(DataError, match="needs event times"):
        score_with_model(score_config(popularity_prior={"weight": 1.0}), tiny_model(), vocabulary(),
                         bare / schema.SEQUENCES_FILE, tmp_path / "out", progress=False)  # fmt: skip
    assert not (tmp_path / "out").exists()  # refused like any bad input: the same --output is free for the fix
    done = score_with_model(score_config(), tiny_model(), vocabulary(), bare / schema.SEQUENCES_FILE, tmp_path / "out",
                            progress=False)  # fmt: skip
    assert done.users_scored == 23


def test_a_weight_beyond_float32_reach_is_refused():
    from recsys_alibi.config import ConfigError, load_config

    with pytest.raises((ConfigError, ValueError)):
        load_config(None, ["score.popularity_prior.weight=1e39"])


def test_a_damaged_choice_record_is_one_line_naming_it(tmp_path):
    import json

    from pipelines.prior_choice import grid_labels, read_record

    record = tmp_path / "popularity_prior.json"
    bad_day = json.dumps({"grid": grid_labels(), "days": {"1": {"users": 1}}})
    for text in ('{"grid": ', "[]", bad_day):
        record.write_text(text)
        with pytest.raises(DataError, match="popularity_prior.json is damaged") as err:
            read_record(record)
        assert "\n" not in str(err.value)
    record.write_text(json.dumps({"grid": [], "days": {"1": {"users": 1}}}))
    assert read_record(record) == {}  # another grid's record is set aside, not an error


def test_the_pipeline_refuses_a_prior_on_line_order_time_before_any_work(tmp_path):
    import json

    from pipelines.prior_choice import check_prior_data, chosen_prior
    from recsys_alibi.config import with_overrides

    path = write_prepared(tmp_path / "prepared")
    (path / "stats.json").write_text(json.dumps({"time_from_line_order": True}))  # a SASRec-style prepare
    config = with_overrides(score_config(popularity_prior={"weight": 2.0}), data={"append": True})
    with pytest.raises(DataError, match="line order"):
        check_prior_data(config, path, tmp_path / "popularity_prior.json")
    off = with_overrides(score_config(), data={"append": True})  # the default: weight 0, choose on
    check_prior_data(off, path, tmp_path / "popularity_prior.json")
    assert chosen_prior(off, path, tmp_path / "popularity_prior.json") == ({"weight": 0.0, "half_life_days": 7.0}, (
        f"popularity prior: off (the time of {path} came from line order: there is no recent popularity to choose)"))
