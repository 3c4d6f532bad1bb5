"""The synthetic item table: features derived from the generator's latent catalog, written by ``generate``
beside the events and per day by ``generate --days``, prepared without a reject."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from pipelines.data_steps import run_generate, run_generate_days
from recsys_alibi.config import DataConfig, JobConfig
from recsys_alibi.data.item_features import read_item_features
from recsys_alibi.data.prepare import prepare
from recsys_alibi.data.synthetic import TASTE_DIM, latent_items
from recsys_alibi.data.synthetic_items import DECLARATION, item_table

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"  # declares the synthetic table


def test_table_by_hand():
    vectors = np.array([[1.5, -0.2, -1.1], [0.3, 0.9, 2.0]])
    table = item_table(vectors, np.array([3, 0]), np.array([1, 4]))
    assert table.rows() == [(1, "topic-03", ["d00+", "d02-"], 0.0), (2, "topic-00", ["d02+"], -np.log(4.0))]


def _config(tmp_path, **generate) -> JobConfig:
    return JobConfig(output=str(tmp_path), generate={"enabled": True, "users": 60, "items": 120, "min_events": 10,
                                                     "max_events": 60, "item_table": True, **generate})  # fmt: skip


def test_generate_writes_the_table_of_its_latent_catalog(tmp_path):
    config = _config(tmp_path)
    result = run_generate(config, tmp_path / "events.parquet")
    assert result.item_table == tmp_path / "items.parquet" and "item table -> " in result.summary()
    table = pl.read_parquet(result.item_table)
    latent = latent_items(120, config.seed)
    assert table.get_column("item_id").to_list() == list(range(1, 121))
    assert table.get_column("topic").to_list() == [f"topic-{t:02d}" for t in latent.topic]
    strong = (np.abs(latent.vectors) > 1).sum(axis=1)
    assert table.get_column("tags").list.len().to_list() == strong.tolist()
    # the tags carry the generator's long-term taste: the signed tags of a user's first and second half of
    # events point the same way (mean cosine 0.31), another user's second half hardly (0.08)
    signs = np.zeros((121, TASTE_DIM))
    for item, tags in table.select("item_id", "tags").iter_rows():
        for tag in tags:
            signs[item, int(tag[1:3])] += 1.0 if tag[3] == "+" else -1.0
    halves = []
    for ids in pl.read_parquet(result.path).group_by("user_id", maintain_order=True).agg("item_id")["item_id"]:
        ids = np.asarray(ids)
        halves.append((signs[ids[: len(ids) // 2]].sum(0), signs[ids[len(ids) // 2 :]].sum(0)))
    cosine = lambda a, b: float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-9))  # noqa: E731
    same = np.mean([cosine(a, b) for a, b in halves])
    other = np.mean([cosine(halves[i][0], halves[i - 1][1]) for i in range(len(halves))])
    assert same > 0.25 and abs(other) < 0.1
    prepared = prepare(DataConfig(items=str(result.item_table), item_features=DECLARATION), result.path, tmp_path / "p")
    stats = prepared.stats["item_table"]
    assert stats["rejected"] == 0 and stats["items_without_row"] == 0 and stats["items"] == 120
    assert read_item_features(tmp_path / "p")[2].columns == ["topic", "tags", "popularity"]


def test_no_table_unless_asked(tmp_path):
    result = run_generate(JobConfig(generate={"users": 5, "items": 20, "max_events": 30}), tmp_path / "events.parquet")
    assert result.item_table is None and sorted(p.name for p in tmp_path.iterdir()) == ["events.parquet"]


def test_generate_days_brings_new_items_with_features(tmp_path):
    config = _config(tmp_path, days=3)
    result = run_generate_days(config, tmp_path / "days")
    assert [p.name for p in result.item_tables] == ["day-001.parquet", "day-002.parquet", "day-003.parquet"]
    tables = [pl.read_parquet(p) for p in result.item_tables]
    assert sum(t.height for t in tables) == 120 and pl.concat(tables).get_column("item_id").n_unique() == 120
    assert [t.height for t in tables[1:]] == list(result.new_items[1:])  # each later day: exactly its new items
    for day, table in zip(result.files[1:], tables[1:]):
        seen_before = pl.concat([pl.read_parquet(f) for f in result.files[: result.files.index(day)]])
        assert not set(table.get_column("item_id")) & set(seen_before.get_column("item_id"))
        assert set(table.get_column("item_id")) <= set(pl.read_parquet(day).get_column("item_id"))


def test_a_config_declaring_the_table_s_columns_gets_the_table_and_reads_it(tmp_path):
    """configs/default.yaml declares topic, tags and popularity with no data.items: generate writes the table
    (generate.item_table left off), and the pipeline's and quality.py's config reads it; '{}' drops it."""
    from pipelines.data_steps import reading_generated_table
    from recsys_alibi.config import load_config

    default = DEFAULT_CONFIG
    small = ["generate.users=5", "generate.items=20", "generate.max_events=30"]
    config = load_config(default, small)
    assert config.generate.item_table is False and config.data.item_features.columns == ["topic", "tags", "popularity"]
    result = run_generate(config, tmp_path / "a" / "events.parquet")
    assert result.item_table == tmp_path / "a" / "items.parquet" and pl.read_parquet(result.item_table).height == 20
    assert reading_generated_table(config, result).data.items == str(result.item_table)
    days = run_generate_days(load_config(default, [*small, "generate.days=2"]), tmp_path / "days")
    assert [p.name for p in days.item_tables] == ["day-001.parquet", "day-002.parquet"]
    plain = load_config(default, [*small, "data.item_features={}", "model.item_features.enabled=false"])
    bare = run_generate(plain, tmp_path / "b" / "events.parquet")
    assert bare.item_table is None and reading_generated_table(plain, bare) is plain


def test_prepare_refuses_a_declared_table_it_was_not_given(tmp_path, capsys):
    """configs/default.yaml on generated events without --items: one line (exit 2), not a silent id-only prepare."""
    from pipelines.cli import main

    default = str(DEFAULT_CONFIG)
    small = ["--set", "generate.users=5", "--set", "generate.items=20", "--set", "generate.max_events=30"]
    assert main(["generate", "--config", default, *small, "--output", str(tmp_path / "e.parquet")]) == 0
    capsys.readouterr()
    assert main(["prepare", "--config", default, *small, "--input", str(tmp_path / "e.parquet"),
                 "--output", str(tmp_path / "p")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "declares topic, tags, popularity but prepare has no item table" in err[0]
    assert not (tmp_path / "p").exists()
    assert main(["prepare", "--config", default, *small, "--input", str(tmp_path / "e.parquet"),
                 "--items", str(tmp_path / "items.parquet"), "--output", str(tmp_path / "p")]) == 0  # fmt: skip
    assert (tmp_path / "p" / "item_features.parquet").exists()


def test_a_table_of_another_catalog_is_refused_and_so_is_an_encoder_with_no_table(tmp_path, capsys, caplog):
    """Ids that match no event item (or an empty table): prepare warns (a day's table of items still without
    events is such a table), train refuses a feature model that would read nothing (one line, exit 2); a pipeline
    whose encoder is on while it prepares no table is refused before it writes anything."""
    import logging
    from pipelines.cli import main

    default = str(DEFAULT_CONFIG)
    small = ["--set", "generate.users=5", "--set", "generate.items=20", "--set", "generate.max_events=30"]
    assert main(["generate", "--config", default, *small, "--output", str(tmp_path / "e.parquet")]) == 0
    table = pl.read_parquet(tmp_path / "items.parquet")
    table.with_columns(pl.col("item_id") + 1000).write_parquet(tmp_path / "other.parquet")
    table.head(0).write_parquet(tmp_path / "empty.parquet")
    capsys.readouterr()
    for name, accepted in (("other", 20), ("empty", 0)):
        with caplog.at_level(logging.WARNING):
            assert main(["prepare", "--config", default, *small, "--input", str(tmp_path / "e.parquet"),
                         "--items", str(tmp_path / f"{name}.parquet"), "--output", str(tmp_path / name)]) == 0  # fmt: skip
        assert any(f"none of its {accepted} accepted rows" in r.getMessage() for r in caplog.records)
        caplog.clear()
    tiny = ["--set", "model.d_model=8", "--set", "train.max_epochs=1", "--set", f"output={tmp_path / 'job'}"]
    capsys.readouterr()
    assert main(["train", "--config", default, *small, *tiny, "--prepared", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its item table has no row for any of the" in err[0]
    pl.read_parquet(tmp_path / "e.parquet").write_csv(tmp_path / "e.csv")
    argv = ["pipeline", "--config", default, *small, "--set", "generate.enabled=false",
            "--set", f"data.input={tmp_path / 'e.csv'}", "--set", "data.item_features={}", "--output", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.item_features.enabled=true reads an item table" in err[0]
    assert not (tmp_path / "run").exists()


def test_an_item_table_given_with_events_already_prepared_is_said_to_be_unread(tmp_path, caplog):
    """Re-running a day to add a forgotten table appends no events and so reads no table: said in a warning."""
    import logging

    from recsys_alibi.data.append import append

    config = _config(tmp_path, days=2)
    result = run_generate_days(config, tmp_path / "days")
    declared = DataConfig(item_features=DECLARATION, min_events_per_user=1, min_events_per_item=1)
    prepare(declared.model_copy(update={"items": str(result.item_tables[0])}), result.files[0], tmp_path / "p")
    append(declared, result.files[1], tmp_path / "p")  # the day's table forgotten
    with caplog.at_level(logging.WARNING):
        again = append(declared.model_copy(update={"items": str(result.item_tables[1])}), result.files[1], tmp_path / "p")
    assert again.appended is False
    assert any("was not read: an append merges a table with new events" in r.getMessage() for r in caplog.records)


def test_days_generated_again_without_tables_leave_no_table_of_the_earlier_days(tmp_path):
    run_generate_days(_config(tmp_path, days=2), tmp_path / "days")
    assert sorted(p.name for p in (tmp_path / "days" / "_items").iterdir()) == ["day-001.parquet", "day-002.parquet"]
    again = run_generate_days(_config(tmp_path, days=2, item_table=False), tmp_path / "days")
    assert again.item_tables == () and list((tmp_path / "days" / "_items").iterdir()) == []
