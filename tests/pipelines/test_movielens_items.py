"""benchmarks/movielens_items.py: the MovieLens item tables against u.item and movies.dat, checked by hand."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from benchmark_scripts import load_benchmark

movielens_items = load_benchmark("movielens_items")


def _folder(shared_data: Path, name: str, files: tuple[str, ...]) -> Path:
    folder = shared_data / name
    for file in files:
        if not (folder / file).is_file():
            pytest.skip(f"{folder / file} not found (MovieLens metadata in ../shared/data)")
    return folder


def test_ml100k_table_reads_the_genre_flags_and_the_release_year(shared_data, tmp_path):
    folder = _folder(shared_data, "ml-100k", ("u.item", "u.genre"))
    table = movielens_items.ml100k_items(folder)
    assert table.height == 1682 and table["item_id"].to_list() == list(range(1, 1683))
    rows = {r["item_id"]: r for r in table.iter_rows(named=True)}
    # u.item line 1: Toy Story, 01-Jan-1995, flags 3, 4, 5 set (u.genre: Animation, Children's, Comedy)
    assert rows[1]["genres"] == ["Animation", "Children's", "Comedy"] and rows[1]["year"] == 1995.0
    assert rows[10]["genres"] == ["Drama", "War"] and rows[10]["year"] == 1996.0  # Richard III (1995), released 22-Jan-1996, flags 8 and 17
    assert table["year"].null_count() == 1  # the 'unknown' entry has no release date
    out = tmp_path / "items.parquet"
    movielens_items.main(["--dataset", "ml-100k", "--data", str(shared_data), "--output", str(out)])
    assert pl.read_parquet(out).equals(table)


def test_ml1m_table_reads_genres_and_the_year_of_the_title(shared_data):
    folder = _folder(shared_data, "ml-1m", ("movies.dat",))
    table = movielens_items.ml1m_items(folder)
    assert table.height == 3883 and table["year"].null_count() == 0
    first = table.row(0, named=True)  # 1::Toy Story (1995)::Animation|Children's|Comedy
    assert first == {"item_id": 1, "genres": ["Animation", "Children's", "Comedy"], "year": 1995.0}
