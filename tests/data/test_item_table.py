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
    # the same table again (a catalog snapshot) with one row changed: 1 updated, not every row of it (was 3)
    (inputs / "day4.csv").write_text("user_id,item_id,timestamp\n6,20,300\n")
    (inputs / "third.csv").write_text("item_id,genre,year\n20,Western|Noir|Drama,2001\n11,Action,1992\n21,Noir,1999\n")
    result = append(_cfg(inputs / "third.csv"), inputs / "day4.csv", inputs / "prep")
    assert result.stats["item_table"]["updated"] == 1


def test_an_append_with_a_table_and_no_declaration_takes_the_directorys(inputs, capsys):
    # `prepare --append --items T` was refused unless the declaration was repeated on the command line
    prepare(_cfg(inputs / "items.csv"), inputs / "events.csv", inputs / "prep")
    (inputs / "day2.csv").write_text("user_id,item_id,timestamp\n4,20,100\n4,10,101\n")
    (inputs / "second.csv").write_text("item_id,genre,year\n20,Western|Drama,2001\n")
    assert main(["prepare", "--input", str(inputs / "day2.csv"), "--items", str(inputs / "second.csv"), "--append",
                 "--output", str(inputs / "prep"), "--set", "data.min_events_per_user=1",
                 "--set", "data.min_events_per_item=1"]) == 0  # fmt: skip
    rows, _, feats = read_item_features(inputs / "prep")
    assert feats.categorical == ["genre"] and feats.numeric == ["year"]
    assert rows.filter(pl.col("item_id") == 20).select("genre", "year").rows() == [(["Western", "Drama"], 2001.0)]
    (inputs / "bare").mkdir()  # a directory with no item table has no declaration to take
    prepare(_cfg(None), inputs / "events.csv", inputs / "bare")
    with pytest.raises(DataError, match="has no item table whose declaration an append could take"):
        append(DataConfig(min_events_per_user=1, min_events_per_item=1, items=str(inputs / "second.csv"), append=True),
               inputs / "day2.csv", inputs / "bare")


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


def test_a_folder_or_glob_of_files_is_one_item_table(inputs, capsys):
    """A Spark folder (part files beside _SUCCESS and hidden .crc) and a glob: rejects name their file and its row."""
    folder = inputs / "tdir"
    folder.mkdir()
    pl.DataFrame({"item_id": [10, 11], "genre": ["Drama", "Action"], "year": [1990.0, 1991.0]}).write_parquet(folder / "part-00000.parquet")
    pl.DataFrame({"item_id": [12, 13], "genre": ["Comedy", None], "year": [None, float("nan")]}).write_parquet(folder / "part-00001.parquet")
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / ".part-00000.parquet.crc").write_bytes(b"crc\x00")
    for given in (folder, folder / "*.parquet"):
        result = prepare(_cfg(given), inputs / "events.csv", inputs / "prep")
        rows, _, _ = read_item_features(inputs / "prep")
        assert rows.select("item_id", "item_idx", "genre", "year").rows() == [
            (10, 1, ["Drama"], 1990.0), (11, 2, ["Action"], 1991.0), (12, 3, ["Comedy"], None)]  # fmt: skip
        rejects = pl.read_parquet(inputs / "prep" / "item_rejects.parquet")
        assert rejects.drop("record").rows() == [(str(folder / "part-00001.parquet"), 1, "13", "non_finite:year")]
        assert json.loads(rejects.get_column("record")[0]) == {"item_id": 13, "genre": None, "year": "NaN"}
        assert result.stats["item_table"]["sources"] == [str(given)] and result.stats["item_table"]["rows"] == 4
    # an append names the same folder: an earlier source, so the warning of a table not read compares it whole
    (folder / "part-00002.csv").write_text("item_id,genre,year\n14,Drama,1\n")
    with pytest.raises(DataError) as err:
        prepare(_cfg(folder), inputs / "events.csv", inputs / "prep2")
    assert str(err.value) == (f"item table '{folder}' mixes formats: '{folder / 'part-00000.parquet'}' is parquet, "
                              f"'{folder / 'part-00002.csv'}' csv; give files of one format")  # fmt: skip
    (folder / "part-00002.csv").unlink()
    (inputs / "empty").mkdir()
    argv = ["prepare", "--input", str(inputs / "events.csv"), "--output", str(inputs / "out"), "--items",
            str(inputs / "empty"), *FEATURES, "--set", "data.min_events_per_user=1", "--set", "data.min_events_per_item=1"]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: empty item table: directory '{inputs / 'empty'}' holds no files; point --items (data.items) at its files")
    with pytest.raises(DataError, match=r"^no file is named '.*nothing\*.csv' and no files match it as a glob pattern; "
                                        r"check the path given as --items \(data.items\)$"):  # fmt: skip
        prepare(_cfg(inputs / "nothing*.csv"), inputs / "events.csv", inputs / "prep3")


def test_csv_folders_need_one_header(inputs):
    folder = inputs / "csvs"
    folder.mkdir()
    (folder / "a.csv").write_text("item_id,genre,year\n10,Drama,1990\n")
    (folder / "b.csv").write_text("item_id,year,genre\n11,1991,Action\n")
    with pytest.raises(DataError) as err:
        prepare(_cfg(folder), inputs / "events.csv", inputs / "prep")
    assert str(err.value) == (f"item table '{folder / 'b.csv'}' has other columns than '{folder / 'a.csv'}' "
                              "(['item_id', 'year', 'genre'] against ['item_id', 'genre', 'year']); every file of one "
                              "table has the same columns")  # fmt: skip


def test_csv_rows_with_another_field_count_are_rejected(inputs):
    (inputs / "ragged.csv").write_text('item_id,genre,year,brand,price\n10,Drama,1990,B,1\n14,Drama,B\n'
                                       '11,"Action,Drama",1991,B,2\n12,Drama,1992,B,3,extra\n')
    result = prepare(_cfg(inputs / "ragged.csv"), inputs / "events.csv", inputs / "prep")
    rows, _, _ = read_item_features(inputs / "prep")
    assert rows.select("item_id", "genre", "year").rows() == [(10, ["Drama"], 1990.0), (11, ["Action,Drama"], 1991.0)]
    rejects = pl.read_parquet(inputs / "prep" / "item_rejects.parquet")
    assert rejects.select("row", "item_id", "reject_reason").rows() == [
        (1, "14", "bad_field_count"), (3, "12", "bad_field_count")]  # fmt: skip
    assert json.loads(rejects.get_column("record")[1]) == {"item_id": "12", "genre": "Drama", "year": "1992",
                                                            "brand": "B", "price": "3"}  # fmt: skip
    stats = result.stats["item_table"]
    assert (stats["rows"], stats["rejected"], stats["rejects_by_reason"]) == (4, 2, {"bad_field_count": 2})
    assert "2 rows rejected (bad_field_count: 2)" in result.summary()


def test_ndjson_cells_of_another_type_are_read_or_rejected_per_row(inputs):
    lines = [{"item_id": i, "genre": ["Drama"], "year": 1990} for i in range(100, 250)]  # past any inference window
    lines += [
        {"item_id": 10, "genre": ["Action", 7, True], "year": "1995"},   # a number as text: parsed as in a CSV
        {"item_id": 1501.0, "genre": "Comedy|Drama", "year": 1990.5},    # 1501.0 is the id 1501
        {"item_id": 11, "genre": [["x"]], "year": 1991},                 # a nested list: no category
        {"item_id": 12, "genre": {"a": 1}, "year": 1992},
        {"item_id": 13, "genre": "[not json", "year": "abc"},
        {"item_id": [14], "genre": "Drama", "year": 1993},
        {"item_id": 15.5, "genre": "Drama", "year": 1994},
        {"item_id": 16, "genre": "[\"kept\"]", "year": 1995},           # text that reads as a JSON list: text
    ]
    (inputs / "items.ndjson").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (inputs / "events.csv").write_text(EVENTS + "4,1501,1\n4,16,2\n")
    result = prepare(_cfg(inputs / "items.ndjson"), inputs / "events.csv", inputs / "prep")
    rows, _, _ = read_item_features(inputs / "prep")
    assert rows.filter(pl.col("item_id").is_in([10, 1501, 16])).select("item_id", "genre", "year").rows() == [
        (10, ["Action", "7", "true"], 1995.0), (16, ['["kept"]'], 1995.0), (1501, ["Comedy", "Drama"], 1990.5)]
    rejects = pl.read_parquet(inputs / "prep" / "item_rejects.parquet")
    assert rejects.select("row", "item_id", "reject_reason").rows() == [
        (152, "11", "bad_category:genre"), (153, "12", "bad_category:genre"), (154, "13", "bad_number:year"),
        (155, "[14]", "bad_item_id"), (156, "15.5", "bad_item_id")]  # fmt: skip
    assert json.loads(rejects.get_column("record")[0]) == {"item_id": "11", "genre": '[["x"]]', "year": "1991"}
    assert result.stats["item_table"]["rows"] == 158


def test_ndjson_nested_lists_among_lists_are_rejected(inputs):
    lines = [{"item_id": 10, "genre": ["Drama", "[a]"]}, {"item_id": 11, "genre": ["Action", ["x"]]},
             {"item_id": 12, "genre": [{"a": 1}]}, {"item_id": 9007199254740993, "genre": ["Drama"]},
             {"item_id": 1501.0, "genre": ["Drama"]}]  # ids of floats: read as text, no digit lost  # fmt: skip
    (inputs / "items.ndjson").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    cfg = DataConfig(min_events_per_user=1, min_events_per_item=1, items=str(inputs / "items.ndjson"),
                     item_features={"categorical": ["genre"]})  # fmt: skip
    prepare(cfg, inputs / "events.csv", inputs / "prep")
    rows, _, _ = read_item_features(inputs / "prep")
    assert rows.select("item_id", "genre").rows() == [(10, ["Drama", "[a]"]), (1501, ["Drama"]),
                                                      (9007199254740993, ["Drama"])]  # fmt: skip
    rejects = pl.read_parquet(inputs / "prep" / "item_rejects.parquet")
    assert rejects.select("row", "item_id", "reject_reason").rows() == [
        (1, "11", "bad_category:genre"), (2, "12", "bad_category:genre")]  # fmt: skip


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
    assert str(err.value) == (f"item table '{inputs / 'u_item.csv'}': no column 'item_id' (the item id column "
                              "(data.item_features.id_column)); its columns are ['10|Toy Story (1995)|01-Jan-1995']; "
                              "an item table .csv is comma-separated (.tsv: tab-separated) with a header row")  # fmt: skip


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
