"""The item table (``prepare --items``, ``data.items``): rejects and counts, vocabularies across appends,
declarations refused with one line (exit 2), real item metadata (ml-latest-small movies.csv)."""

from __future__ import annotations

import lzma

import json

import polars as pl
import pytest

from pipelines.cli import main
from recsys_alibi.config import DataConfig, load_config
from recsys_alibi.data.append import append
from recsys_alibi.data.errors import DataError
from recsys_alibi.data.item_features import read_item_features
from recsys_alibi.data.prepare import prepare

EVENTS = "user_id,item_id,timestamp\n" + "".join(f"{u},{i},{u * 10 + t}\n" for u in (1, 2, 3) for t, i in enumerate((10, 11, 12)))
TABLE = """item_id,genre,year
10,Action|Comedy,1995
11,Drama,1990
11,Drama,1991
12,,
13,Action,abc
14,Action,inf
15,Drama|Action,2000
x7,Drama,1
16,Drama,1e39
"""
FEATURES = ["--set", "data.item_features.categorical=[genre]", "--set", "data.item_features.numeric=[year]"]


def _cfg(items, **extra) -> DataConfig:
    return DataConfig(min_events_per_user=1, min_events_per_item=1, items=str(items) if items else None,
                      item_features={"categorical": ["genre"], "numeric": ["year"], **extra})  # fmt: skip


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "events.csv").write_text(EVENTS)
    (tmp_path / "items.csv").write_text(TABLE)
    return tmp_path


def test_rejects_and_counts(inputs):
    result = prepare(_cfg(inputs / "items.csv"), inputs / "events.csv", inputs / "prep")
    rows, vocab, feats = read_item_features(inputs / "prep")
    assert rows.to_dicts() == [
        {"item_id": 10, "item_idx": 1, "genre": ["Action", "Comedy"], "year": 1995.0},
        {"item_id": 12, "item_idx": 3, "genre": [], "year": None},
        {"item_id": 15, "item_idx": None, "genre": ["Drama", "Action"], "year": 2000.0},
    ]
    assert vocab.rows() == [("genre", "Action", 1, 2), ("genre", "Comedy", 2, 1), ("genre", "Drama", 3, 1)]
    assert feats.categorical == ["genre"] and feats.numeric == ["year"]
    rejects = pl.read_parquet(inputs / "prep" / "item_rejects.parquet")
    assert rejects.select("row", "item_id", "reject_reason").rows() == [
        (1, "11", "duplicate_item_id"), (2, "11", "duplicate_item_id"), (4, "13", "bad_number:year"),
        (5, "14", "non_finite:year"), (7, "x7", "bad_item_id"), (8, "16", "out_of_range:year"),
    ]  # fmt: skip
    assert json.loads(rejects.get_column("record")[2]) == {"item_id": "13", "genre": "Action", "year": "abc"}
    stats = result.stats["item_table"]
    assert {k: stats[k] for k in ("rows", "rejected", "items", "items_without_events", "items_without_row", "updated")} == {
        "rows": 9, "rejected": 6, "items": 3, "items_without_events": 1, "items_without_row": 1, "updated": 0}
    assert stats["missing"] == {"year": 1, "genre": 1} and stats["values"] == {"genre": 3}
    assert "item table: 3 items (1 without events), 6 rows rejected" in result.summary()


def test_declared_range_and_parquet_lists(inputs):
    table = pl.DataFrame({"item_id": [10, 11, 12], "tags": [["a", "b", "a"], [], None], "price": [1.0, -2.0, None]})
    table.write_parquet(inputs / "items.parquet")
    cfg = DataConfig(min_events_per_user=1, min_events_per_item=1, items=str(inputs / "items.parquet"),
                     item_features={"categorical": ["tags"], "numeric": ["price"], "ranges": {"price": [0, 100]}})  # fmt: skip
    prepare(cfg, inputs / "events.csv", inputs / "prep")
    rows, vocab, _ = read_item_features(inputs / "prep")
    assert rows.select("item_id", "tags", "price").rows() == [(10, ["a", "b"], 1.0), (12, [], None)]
    assert vocab.select("value", "value_idx").rows() == [("a", 1), ("b", 2)]
    reasons = pl.read_parquet(inputs / "prep" / "item_rejects.parquet").get_column("reject_reason").to_list()
    assert reasons == ["out_of_range:price"]


def test_vocabularies_kept_across_appends(inputs):
    (inputs / "first.csv").write_text("item_id,genre,year\n10,Drama,1990\n11,Action|Drama,1991\n12,Comedy,\n")
    prepare(_cfg(inputs / "first.csv"), inputs / "events.csv", inputs / "prep")
    _, before, _ = read_item_features(inputs / "prep")
    assert before.select("value", "value_idx", "count").rows() == [("Drama", 1, 2), ("Action", 2, 1), ("Comedy", 3, 1)]
    (inputs / "day2.csv").write_text("user_id,item_id,timestamp\n4,20,100\n4,10,101\n")
    (inputs / "second.csv").write_text("item_id,genre,year\n20,Western|Noir|Drama,2001\n11,Action,1992\n21,Noir,\n")
    result = append(_cfg(inputs / "second.csv"), inputs / "day2.csv", inputs / "prep")
    rows, vocab, _ = read_item_features(inputs / "prep")
    # existing values keep their index (counts are the union's), new ones follow by count desc, value asc
    assert vocab.select("value", "value_idx", "count").rows() == [
        ("Drama", 1, 2), ("Action", 2, 1), ("Comedy", 3, 1), ("Noir", 4, 2), ("Western", 5, 1)]
    assert rows.select("item_id", "item_idx", "genre", "year").rows() == [
        (10, 1, ["Drama"], 1990.0), (11, 2, ["Action"], 1992.0), (12, 3, ["Comedy"], None),
        (20, 4, ["Western", "Noir", "Drama"], 2001.0), (21, None, ["Noir"], None)]  # fmt: skip
    assert result.stats["item_table"]["updated"] == 1 and result.stats["item_table"]["rows"] == 6
    # an append without a table keeps the rows (item 21 gets its index once it has events)
    (inputs / "day3.csv").write_text("user_id,item_id,timestamp\n5,21,200\n")
    append(_cfg(None), inputs / "day3.csv", inputs / "prep")
    rows, again, _ = read_item_features(inputs / "prep")
    assert again.equals(vocab) and rows.filter(pl.col("item_id") == 21).get_column("item_idx").to_list() == [5]


def test_append_with_another_declaration_refused(inputs):
    prepare(_cfg(inputs / "items.csv"), inputs / "events.csv", inputs / "prep")
    (inputs / "day2.csv").write_text("user_id,item_id,timestamp\n4,10,100\n")
    other = DataConfig(min_events_per_user=1, min_events_per_item=1, items=str(inputs / "items.csv"),
                       item_features={"categorical": ["genre"]})  # fmt: skip
    with pytest.raises(DataError, match="its item table was declared"):
        append(other, inputs / "day2.csv", inputs / "prep")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.item_features.categorical=[colour]"], "no column 'colour' (declared in data.item_features)"),
        (["data.item_features.categorical=[genre]", "data.item_features.numeric=[genre]"], "in both"),
        (["data.item_features.numeric=[genre]"], "column 'genre' is declared numeric"),
        (["data.item_features.categorical=[genre]", "data.item_features.id_column=movie"], "no column 'movie'"),
        ([], "data.items needs its columns declared"),
    ],
)
def test_bad_declarations_refused(inputs, capsys, overrides, message):
    argv = ["prepare", "--input", str(inputs / "events.csv"), "--output", str(inputs / "prep"),
            "--items", str(inputs / "items.csv"), "--set", "data.min_events_per_user=1",
            "--set", "data.min_events_per_item=1"] + [a for o in overrides for a in ("--set", o)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (inputs / "prep" / "item_features.parquet").exists()


def test_declaration_without_table_refused():
    with pytest.raises(Exception, match="data.item_features takes effect only with data.items"):
        load_config(None, ["data.item_features.categorical=[genre]"])


def test_real_movies_csv(shared_data, tmp_path):
    """ml-latest-small: every rated movie has a row in movies.csv; the genres are '|'-joined."""
    folder = shared_data / "ml-latest-small"
    if not (folder / "movies.csv").is_file():
        pytest.skip(f"{folder / 'movies.csv'} not found")
    cfg = DataConfig(items=str(folder / "movies.csv"), columns={"user_id": "userId", "item_id": "movieId"},
                     item_features={"categorical": ["genres"], "id_column": "movieId"})  # fmt: skip
    result = prepare(cfg, folder / "ratings.csv", tmp_path / "prep")
    stats = result.stats["item_table"]
    assert stats["rows"] == 9742 and stats["rejected"] == 0 and stats["items_without_row"] == 0
    assert stats["items"] == 9742 and stats["items_with_events"] == result.counts["items"]
    _, vocab, _ = read_item_features(tmp_path / "prep")
    assert vocab.head(1).select("value", "value_idx").rows() == [("Drama", 1)]
    assert stats["values"]["genres"] == vocab.height == 20  # 19 genres + "(no genres listed)"


def test_a_directory_given_as_the_item_table_is_named_as_such(tmp_path):
    """An item table is one file: the refusal of a directory does not say directories are read."""
    from recsys_alibi.data.errors import DataError
    from recsys_alibi.data.item_table import read_item_table

    (tmp_path / "tables").mkdir()
    with pytest.raises(DataError) as err:
        read_item_table(tmp_path / "tables")
    assert "is a directory, not a regular file: only regular files are read" in str(err.value)


def test_a_latin1_item_table_is_named_with_its_line_byte_and_the_fix(inputs):
    (inputs / "latin.csv").write_bytes("item_id,genre,year\n10,Com\xe9dy,1995\n".encode("latin-1"))
    with pytest.raises(DataError) as err:
        prepare(_cfg(inputs / "latin.csv"), inputs / "events.csv", inputs / "out")
    assert str(err.value) == (f"item table '{inputs / 'latin.csv'}' is not UTF-8 text: byte 0xe9 at line 2 (offset 25); "
                              f"convert it to UTF-8 (from its real encoding), e.g. iconv -f latin1 -t utf-8 "
                              f"'{inputs / 'latin.csv'}' > '{inputs / 'latin.utf8.csv'}'")  # fmt: skip


def test_an_item_table_in_another_layout_says_the_layout_it_needs(inputs):
    # MovieLens u.item: '|'-separated, no header: polars' schema error alone does not say what to change
    (inputs / "u_item.csv").write_text("10|Toy Story (1995)|01-Jan-1995\n11|American President, The (1995)|01-Jan-1995\n")
    with pytest.raises(DataError) as err:
        prepare(_cfg(inputs / "u_item.csv"), inputs / "events.csv", inputs / "out")
    assert str(err.value).startswith(f"cannot read item table '{inputs / 'u_item.csv'}' as csv: ")
    assert str(err.value).endswith("; an item table .csv is comma-separated (.tsv: tab-separated) with a header row")


def test_an_ndjson_item_table_names_its_bad_line_and_a_compressed_one_its_compression(inputs):
    (inputs / "items.ndjson").write_text('{"item_id": 10, "genre": "Comedy"}\n{"item_id": 11, "genre": Drama}\n')
    with pytest.raises(DataError) as err:
        prepare(_cfg(inputs / "items.ndjson"), inputs / "events.csv", inputs / "out")
    assert str(err.value).startswith(f"item table '{inputs / 'items.ndjson'}' line 2 is not valid JSON (")
    (inputs / "items.csv").write_bytes(lzma.compress(b"item_id,genre\n10,Comedy\n"))  # xz under a .csv name
    with pytest.raises(DataError) as err:
        prepare(_cfg(inputs / "items.csv"), inputs / "events.csv", inputs / "out")
    assert str(err.value) == (f"cannot read '{inputs / 'items.csv'}': it is xz-compressed and only gzip (.gz) is read; "
                              f"decompress it first (xz -dc '{inputs / 'items.csv'}' > 'items.plain.csv') or recompress it with gzip")


def test_text_ids_are_stripped_in_the_table_as_in_the_events(tmp_path):
    # text ids: "b " in the events' CSV is item "b"; the table's "b " must be its row, not an item without events
    (tmp_path / "events.csv").write_text("user_id,item_id,timestamp\n1,a,1\n1,b ,2\n2, b,3\n")
    (tmp_path / "items.csv").write_text("item_id,genre,year\na,x,1\nb ,y,2\n")
    prepare(_cfg(tmp_path / "items.csv"), tmp_path / "events.csv", tmp_path / "out")
    rows, _, _ = read_item_features(tmp_path / "out")
    assert rows.select("item_id", "item_idx", "genre").sort("item_id").rows() == [("a", 2, ["x"]), ("b", 1, ["y"])]
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())["item_table"]
    assert (stats["items_without_events"], stats["items_without_row"], stats["rejected"]) == (0, 0, 0)
