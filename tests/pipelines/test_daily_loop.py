"""The daily loop on tiny data: day 1 `pipeline` (cold), day 2 `pipeline` with data.append and a warm start."""

from __future__ import annotations

import mlflow
import polars as pl

from pipelines.cli import main
from test_pipeline_end_to_end import TINY

NAME = "recsys-alibi-ranker"


def _pipeline(out, day, *extra: str) -> list[str]:
    args = ["pipeline", "--output", str(out), "--quiet"]
    settings = [item for item in TINY if not item.startswith("generate.")]
    settings += ["generate.enabled=false", f"data.input={day}", "train.max_epochs=1", "train.init_from=champion",
                 "evaluate.context_lengths=[]", *extra]  # fmt: skip
    for item in settings:
        args += ["--set", item]
    return args


def _vocabulary(prepared) -> tuple[set, set, int]:
    sequences = pl.read_parquet(prepared / "sequences.parquet")
    items = pl.read_parquet(prepared / "items.parquet")
    return set(sequences["user_id"].to_list()), set(items["item_id"].to_list()), int(sequences["length"].sum())


def test_second_day_warm_starts_from_the_champion_and_counts_what_is_new(tmp_path, mlflow_store, capsys):
    days = tmp_path / "days"
    assert main(["generate", "--days", "2", "--users", "60", "--items", "40", "--set", "generate.min_events=8",
                 "--set", "generate.max_events=60", "--output", str(days)]) == 0  # fmt: skip
    out = tmp_path / "daily"
    assert main(_pipeline(out, days / "day-001.parquet")) == 0
    printed = capsys.readouterr().out
    assert f"cold start: train.init_from=champion and models:/{NAME}@champion does not exist yet" in printed
    client = mlflow.MlflowClient()
    first = client.get_model_version_by_alias(NAME, "champion")
    users1, items1, events1 = _vocabulary(out / "prepared")

    assert main(_pipeline(out, days / "day-002.parquet", "data.append=true")) == 0
    printed = capsys.readouterr().out
    users2, items2, events2 = _vocabulary(out / "prepared")
    new_items, new_users = len(items2 - items1), len(users2 - users1)
    assert new_items > 0 and new_users > 0 and items1 <= items2 and users1 <= users2  # the day brought both
    run_id = next(line for line in printed.splitlines() if line.startswith("mlflow_run_id: ")).split(": ")[1]
    tags = client.get_run(run_id).data.tags
    assert tags["lineage.init_from"] == f"models:/{NAME}/{first.version}"
    assert tags["lineage.parent_run_id"] == first.run_id
    assert (tags["lineage.new_items"], tags["lineage.new_users"]) == (str(new_items), str(new_users))
    assert tags["lineage.new_events"] == str(events2 - events1)
    assert (
        f"warm start from models:/{NAME}/{first.version} (run {first.run_id}): {len(items1)} items kept, "
        f"{new_items} new, 0 dropped; {new_users} new users, {events2 - events1} new events" in printed
    )
    assert printed.strip().splitlines()[-1].startswith("pipeline: data ")  # the decision line stays last


def test_pipeline_refuses_generate_days_with_one_line(tmp_path, mlflow_store, capsys):
    args = ["pipeline", "--output", str(tmp_path / "out"), "--set", "generate.enabled=true", "--set", "generate.days=3"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: generate.days writes daily files with `recsys-alibi generate")
    assert not (tmp_path / "out" / "events.parquet").exists()
