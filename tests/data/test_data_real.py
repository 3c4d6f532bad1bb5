"""Real public logs (../shared/data beside the checkout, never copied in): counts from its README."""

from __future__ import annotations

from pathlib import Path

import pytest

from recsys_alibi.config import ColumnMap, DataConfig, load_config
from recsys_alibi.data.prepare import prepare, read_sequences
from recsys_alibi.training.data_rules import resolve_max_len

REPO = Path(__file__).resolve().parents[2]

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def _path(relative: str) -> Path:
    path = DATA / relative
    if not path.is_file():
        pytest.skip(f"real data file not found: {path} (the ../shared/data folder beside the checkout)")
    return path


def _clean(c: dict) -> None:
    assert c["rejected"] == c["deduplicated"] == c["filtered"] == 0
    assert c["input_rows"] == c["kept"]


def test_ml1m_sasrec_gz(tmp_path):
    cfg = DataConfig(min_events_per_user=5, min_events_per_item=5)  # the file already is a 5-core
    result = prepare(cfg, _path("ml-1m/ml-1m.txt.gz"), tmp_path)
    c = result.counts
    assert result.stats["format"] == "sasrec" and result.stats["time_from_line_order"]
    assert (c["events"], c["users"], c["items"], c["kcore_rounds"]) == (999_611, 6_040, 3_416, 0)
    _clean(c)
    h = result.stats["history_length"]
    assert (h["min"], h["p50"], h["max"]) == (18, 96, 2277)
    # the recipe's max_len: auto (75 % quantile of the fit lengths, 206 events) is the measured 200
    assert resolve_max_len(load_config(REPO / "configs" / "movielens-1m.yaml", []), tmp_path).model.max_len == 200
    first = read_sequences(tmp_path).row(0, named=True)
    assert first["user_id"] == 1 and first["length"] == len(first["item_idx"])


def test_ml100k_udata(tmp_path):
    cfg = DataConfig(min_events_per_user=1, min_events_per_item=1)
    result = prepare(cfg, _path("ml-100k/u.data"), tmp_path)
    c, s = result.counts, result.stats
    assert (c["input_rows"], c["users"], c["items"]) == (100_000, 943, 1_682)
    _clean(c)
    assert (s["timestamp_min"], s["timestamp_max"]) == (874_724_710, 893_286_638)
    assert (s["history_length"]["min"], s["history_length"]["p50"], s["history_length"]["max"]) == (20, 65, 737)
    liked = prepare(cfg.model_copy(update={"min_value": 4.0}), _path("ml-100k/u.data"), tmp_path / "liked")
    assert liked.counts["filtered_min_value"] == 6_110 + 11_370 + 27_145  # ratings 1..3
    assert liked.counts["events"] == 34_174 + 21_201


def test_amazon_beauty_s3rec(tmp_path):
    cfg = DataConfig(min_events_per_user=5, min_events_per_item=5)
    result = prepare(cfg, _path("amazon-beauty/Beauty.txt"), tmp_path)
    c = result.counts
    assert result.stats["format"] == "s3rec"
    assert (c["events"], c["users"], c["items"]) == (198_502, 22_363, 12_101)
    _clean(c)
    h = result.stats["history_length"]
    assert (h["min"], h["p50"], h["max"]) == (5, 6, 204)
    # the recipe's max_len: auto (75 % quantile 8 events) is the measured 50
    assert resolve_max_len(load_config(REPO / "configs" / "beauty.yaml", []), tmp_path).model.max_len == 50


@pytest.mark.parametrize(
    "cfg",
    [
        # the GroupLens header is recognised: a MovieLens recipe reads ratings.csv with no column map
        DataConfig(min_events_per_user=1, min_events_per_item=1),
        DataConfig(format="csv", columns=ColumnMap(user_id="userId", item_id="movieId", value="rating"),
                   min_events_per_user=1, min_events_per_item=1),
    ],
    ids=["auto", "csv-columns"],
)  # fmt: skip
def test_ml_latest_small_csv(tmp_path, cfg):
    result = prepare(cfg, _path("ml-latest-small/ratings.csv"), tmp_path)
    c, s = result.counts, result.stats
    assert s["format"] == ("movielens" if cfg.format == "auto" else "csv")
    assert (c["input_rows"], c["users"], c["items"]) == (100_836, 610, 9_724)
    _clean(c)
    assert (s["timestamp_min"], s["timestamp_max"]) == (828_124_615, 1_537_799_250)
    assert s["history_length"]["p50"] == 70.5
    # a MovieLens log the ML-1M recipe was not sized on: its max_len: auto (quantile 167 events) is 150
    assert resolve_max_len(load_config(REPO / "configs" / "movielens-1m.yaml", []), tmp_path).model.max_len == 150


def test_ml1m_raw_ratings_dat_gz(tmp_path):
    cfg = DataConfig(min_events_per_user=1, min_events_per_item=1)
    result = prepare(cfg, _path("ml-1m/ratings_users1-2999.dat.gz"), tmp_path)
    c, s = result.counts, result.stats
    assert s["format"] == "movielens"
    assert (c["input_rows"], c["users"], c["items"]) == (487_650, 2_999, 3_615)
    _clean(c)
    assert (s["timestamp_min"], s["timestamp_max"]) == (970_620_734, 1_046_388_675)
