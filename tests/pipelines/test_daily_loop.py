"""The daily loop on tiny data: day 1 `pipeline` (cold), day 2 `pipeline` with data.append and a warm start."""

from __future__ import annotations

import mlflow
import polars as pl
import pytest

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


def test_the_second_day_chooses_the_popularity_prior_on_the_appended_events(tmp_path, mlflow_store, capsys, caplog):
    """score.popularity_prior.choose: the day-1 champion ranked the appended events, counted by hand (each
    returning user's first day-2 item not in its history and in the champion's catalog, ranked over that catalog,
    seen items out);
    the rankings used the recorded best point; a re-run of the same day records nothing twice."""
    import json
    import math

    import numpy as np
    import torch

    from recsys_alibi.evaluation.popularity_prior import GRID, INF_WEIGHT
    from recsys_alibi.tracking import load_ranker

    assert main(["generate", "--users", "60", "--items", "40", "--set", "generate.min_events=8", "--set",
                 "generate.max_events=60", "--output", str(tmp_path / "log.parquet")]) == 0  # fmt: skip
    # two days of the same users (the generator's --days draws new ones): each user's last 30 % of events moved,
    # in order, to after the first day's newest event
    log = pl.read_parquet(tmp_path / "log.parquet").sort("user_id", "timestamp").with_columns(
        late=pl.int_range(pl.len()).over("user_id") >= 0.7 * pl.len().over("user_id"))  # fmt: skip
    first_day, second_day = log.filter(~pl.col("late")).drop("late"), log.filter(pl.col("late")).drop("late")
    shift = int(first_day["timestamp"].max()) + 3600 - int(second_day["timestamp"].min())
    first_day.write_parquet(tmp_path / "day-001.parquet")
    second_day.with_columns(pl.col("timestamp") + shift).write_parquet(tmp_path / "day-002.parquet")
    out = tmp_path / "daily"
    assert main(_pipeline(out, tmp_path / "day-001.parquet")) == 0  # the choice is on by default
    assert "popularity prior" not in capsys.readouterr().out  # a run that does not append: nothing to choose
    assert not (out / "popularity_prior.json").exists()
    first = mlflow.MlflowClient().get_model_version_by_alias(NAME, "champion")
    boundary = int(pl.read_parquet(out / "prepared" / "sequences.parquet")["timestamp"].list.max().max()) + 1
    assert main(_pipeline(out, tmp_path / "day-002.parquet", "data.append=true")) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "popularity_prior.json").read_text())
    assert list(record["days"]) == [str(boundary)]
    day = record["days"][str(boundary)]
    champion = load_ranker(f"models:/{NAME}/{first.version}")
    index = dict(zip(champion.items["item_id"].to_list(), champion.items["item_idx"].to_list()))
    prepared = pl.read_parquet(out / "prepared" / "sequences.parquet")
    item_of = dict(zip(*pl.read_parquet(out / "prepared" / "items.parquet").select("item_idx", "item_id").to_dict().values()))
    users, total = 0, 0.0
    for items, times in zip(prepared["item_idx"].to_list(), prepared["timestamp"].to_list()):
        history = [item_of[i] for i, t in zip(items, times) if t < boundary]
        later = [item_of[i] for t, i in sorted(zip(times, items)) if t >= boundary]  # one second: by item_idx
        later = [i for i in later if i not in history and i in index]  # unseen, in the champion's catalog
        if not history or not later:
            continue
        users += 1
        h = torch.tensor([[index[i] for i in history]])
        with torch.no_grad():
            scores = champion.model.eval().score(h, torch.tensor([h.shape[1]]))[0].double()
        scores[0] = -math.inf
        scores[h[0]] = -math.inf
        rank = int((scores > scores[index[later[0]]]).sum()) + 1
        total += 1 / np.log2(rank + 1) if rank <= 10 else 0.0
    assert day["users"] == users >= 20
    assert day["ndcg_sum"][GRID.index((0.0, None))] == pytest.approx(total, abs=1e-6)  # weight 0: the model alone
    best = int(np.argmax(np.array(day["ndcg_sum"])))
    beta, half_life = GRID[best]
    line = next(line for line in printed.splitlines() if line.startswith("popularity prior: weight "))
    days = "null (plain counts)" if half_life is None else f"{half_life:g} day{'' if half_life == 1 else 's'}"
    assert line.startswith("popularity prior: weight 0 (no prior), chosen on 1 appended day(s)" if beta == 0 else
                           f"popularity prior: weight {'inf' if math.isinf(beta) else f'{beta:g}'}, half-life {days}, ")
    identity = json.loads((out / "rankings" / "_manifest.json").read_text())["identity"]
    if beta == 0:  # the model alone: no prior in the rankings
        assert "popularity_prior" not in identity
    else:
        assert identity["popularity_prior"]["weight"] == (INF_WEIGHT if math.isinf(beta) else beta)
        assert identity["popularity_prior"]["half_life_days"] == half_life
    assert main(_pipeline(out, tmp_path / "day-002.parquet", "data.append=true")) == 0  # again
    assert json.loads((out / "popularity_prior.json").read_text()) == record  # nothing appended: nothing recorded
    again = capsys.readouterr()
    assert line in again.out  # the same choice
    assert "pipeline: nothing new was appended (every input file is already prepared): training again" in caplog.text
    off = ("data.append=true", "score.popularity_prior.choose=false")
    assert main(_pipeline(out, tmp_path / "day-002.parquet", *off)) == 0
    assert "popularity prior" not in capsys.readouterr().out
    assert "popularity_prior" not in json.loads((out / "rankings" / "_manifest.json").read_text())["identity"]


def test_pipeline_refuses_generate_days_with_one_line(tmp_path, mlflow_store, capsys):
    args = ["pipeline", "--output", str(tmp_path / "out"), "--set", "generate.enabled=true", "--set", "generate.days=3"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: generate.days writes daily files with `recsys-alibi generate")
    assert not (tmp_path / "out" / "events.parquet").exists()
