"""The README's ways of reading a rankings folder work on a real one (part files beside
``_manifest.json``, ``_skipped/`` and ``_input/``) and give exactly the part files' rows."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
from serving_fixtures import score_config, tiny_model, vocabulary

from recsys_alibi.data import schema
from serving.score import score_with_model

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_block() -> str:
    """The Python block of the README's "Reading the rankings" section."""
    section = README.read_text().split("## Reading the rankings", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_ways_of_reading_the_rankings_folder_give_the_part_files_rows(tmp_path, monkeypatch):
    events = pl.DataFrame({  # raw events: one row rejected (_input/ keeps it; its user d, of no other row, and c, a user
        # of unknown items, in _skipped/)
        schema.USER_ID: ["a", "a", "b", "b", "c", "d"], schema.ITEM_ID: [1001, 1002, 1003, 1004, 99_999, 1005],
        schema.TIMESTAMP: [1, 2, 1, 2, 1, -1],
    })  # fmt: skip
    events.write_csv(tmp_path / "events.csv")
    result = score_with_model(score_config(k=5), tiny_model(), vocabulary(), tmp_path / "events.csv",
                              tmp_path / "rankings", progress=False)  # fmt: skip
    assert (result.rows, result.skipped_users, result.rejected_rows) == (10, 2, 1)
    assert (tmp_path / "rankings" / "_manifest.json").is_file() and (tmp_path / "rankings" / "_input").is_dir()
    expected = pl.concat([pl.read_parquet(p) for p in sorted((tmp_path / "rankings").glob("part-*.parquet"))])
    key = [schema.USER_ID, schema.RANK]
    monkeypatch.chdir(tmp_path)
    found: dict = {}
    exec(_readme_block(), found)  # noqa: S102 - the README's own code, run as a reader would
    assert found["rankings"].sort(key).equals(expected.sort(key))
    assert found["lazy"].collect().sort(key).equals(expected.sort(key))
    assert pl.from_arrow(found["table"]).sort(key).equals(expected.sort(key))
    assert pl.from_pandas(found["frame"]).sort(key).equals(expected.sort(key))
    assert sorted(found["skipped"].select(schema.USER_ID, "reason").rows()) == [("c", "no_known_item"),
                                                                               ("d", "every_event_rejected")]
    try:
        import duckdb
    except ImportError:  # not installed here: the README's query is not run
        return
    query = re.search(r"DuckDB: `(.*?)`", README.read_text()).group(1)
    assert pl.from_arrow(duckdb.sql(query).arrow()).sort(key).equals(expected.sort(key))
