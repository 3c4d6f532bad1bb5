"""The daily choice record (``OUTPUT/popularity_prior.json``): what ``read_record`` takes, and the damage it refuses
with one line before a pipeline appends anything (``check_prior_data``)."""

from __future__ import annotations

import json
import math

import pytest

from pipelines.prior_choice import check_prior_data, grid_labels, read_record
from recsys_alibi.config import load_config
from recsys_alibi.data.ingest import DataError

G = len(grid_labels())


def _write(path, days, grid=None) -> None:
    path.write_text(json.dumps({"grid": grid_labels() if grid is None else grid, "days": days}))


def test_a_whole_record_is_read_as_written(tmp_path):
    record = tmp_path / "popularity_prior.json"
    assert read_record(record) == {}  # absent: nothing recorded yet
    days = {"1000": {"users": 3, "ndcg_sum": [0.5] * G}, "2000": {"users": 1, "ndcg_sum": [0, *[1.0] * (G - 1)]}}
    _write(record, days)
    assert read_record(record) == days


@pytest.mark.parametrize("damage", [
    {"grid": "none"}, {"grid": None}, {"grid": [[1, 2, 3]]}, {"days": "garbage"}, {"day": [1, 2]}, {"users": -7}, {"users": True}, {"users": 0}, {"users": 2.5},
    {"sum": None}, {"sum": "0.5"}, {"sum": math.nan}, {"sum": math.inf}, {"sum": 4.0}, {"sum": -0.1},
    {"boundary": "yesterday"}, {"boundary": "1_000"}, {"boundary": "-5"}, {"length": G - 1},
])  # fmt: skip
def test_a_damaged_record_is_refused_with_one_line_naming_it(tmp_path, damage):
    record = tmp_path / "popularity_prior.json"
    sums = [0.5] * G
    if "sum" in damage:
        sums[5] = damage["sum"]
    day = {"users": damage.get("users", 3), "ndcg_sum": sums[: damage.get("length", G)]}
    _write(record, {damage.get("boundary", "1000"): damage.get("day", day)})
    if "grid" in damage:  # no grid, or not one of [weight, half-life] points: not a record of this tool
        record.write_text(json.dumps({"days": {"1000": day}} if damage["grid"] == "none" else
                                     {"grid": damage["grid"], "days": {"1000": day}}))  # fmt: skip
    if "days" in damage:
        record.write_text(json.dumps({"grid": grid_labels(), "days": damage["days"]}))
    before = record.read_bytes()
    with pytest.raises(DataError) as refused:
        read_record(record)
    message = str(refused.value)
    assert message.startswith(f"{record} is damaged (") and "delete it to start the choice over" in message
    assert "\n" not in message and record.read_bytes() == before  # nothing of it used or overwritten


def test_the_pipeline_refuses_a_damaged_record_or_a_folder_in_its_place_before_any_work(tmp_path):
    config = load_config(None, ["data.append=true"])
    record = tmp_path / "popularity_prior.json"
    record.mkdir()
    with pytest.raises(DataError, match="is damaged \\(not a regular file\\)"):
        check_prior_data(config, tmp_path / "prepared", record)
    record.rmdir()
    record.write_text('{"grid": ')
    with pytest.raises(DataError, match="is damaged"):
        check_prior_data(config, tmp_path / "prepared", record)
    check_prior_data(load_config(None, ["data.append=true", "score.popularity_prior.choose=false"]),
                     tmp_path / "prepared", record)  # the choice off: the record is not read


def test_a_record_of_another_grid_is_set_aside_whole_and_the_choice_starts_over(tmp_path, caplog):
    config = load_config(None, ["data.append=true"])
    record = tmp_path / "popularity_prior.json"
    _write(record, {"1000": {"users": 2, "ndcg_sum": [0.5] * (G - 1)}}, grid_labels()[:-1])
    before = record.read_bytes()
    assert read_record(record) == {}  # its sums do not compare with this version's points
    check_prior_data(config, tmp_path / "prepared", record)
    assert not record.exists()
    (aside,) = tmp_path.glob("popularity_prior.json.other-grid-*")
    assert aside.read_bytes() == before and "set aside as popularity_prior.json.other-grid-" in caplog.text
    _write(record, {}, grid_labels()[:-2])  # a second one at once: beside the first, never onto it
    check_prior_data(config, tmp_path / "prepared", record)
    assert sorted(p.read_bytes() == before for p in tmp_path.glob("popularity_prior.json.other-grid-*")) == [False, True]



def test_the_champion_of_learned_positions_reads_its_last_max_len_events_when_the_prior_is_chosen():
    # day 2 of a SASRec (learned positions) pipeline failed after the append: "learned positions cover 4 items"
    import numpy as np
    import polars as pl
    import torch

    from pipelines.prior_choice import example_grid_metrics
    from recsys_alibi.config import ModelConfig
    from recsys_alibi.data.splits import HISTORY, TARGETS
    from recsys_alibi.evaluation.popularity_prior import HALF_LIVES
    from recsys_alibi.model.transformer import AlibiRanker
    from recsys_alibi.tracking import LoadedRanker

    torch.manual_seed(0)
    model = AlibiRanker(ModelConfig(d_model=8, n_heads=2, n_layers=1, max_len=4, position="learned", dropout=0.0), 10)
    loaded = LoadedRanker(model=model.eval(), items=pl.DataFrame(), run_id=None)
    prior = np.log1p(np.arange(11, dtype=np.float64))[None].repeat(len(HALF_LIVES), 0)  # (H, N + 1)
    # the first three events repeat in the last four: the seen items are the same either way
    whole = pl.DataFrame({HISTORY: [[1, 2, 3, 1, 2, 3, 4], [5, 6]], TARGETS: [[7], [8]]})
    cut = pl.DataFrame({HISTORY: [[1, 2, 3, 4], [5, 6]], TARGETS: [[7], [8]]})
    got = example_grid_metrics(loaded, whole, prior)
    assert got.shape == (2, got.shape[1], 2) and np.array_equal(got, example_grid_metrics(loaded, cut, prior))
