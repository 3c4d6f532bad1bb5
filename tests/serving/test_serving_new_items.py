"""Same-day scoring of items the model never saw (``score --items``, the pyfunc's ``items``): an item in
the item table but not in the model's vocabulary is ranked from its features alone and reaches the users
whose histories are in its category; an id-only model refuses ``--items`` with one line."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import polars as pl
import torch
import pytest
from engine_fixtures import assert_same_rankings
from serving_fixtures import dot_product_rankings, score_config, tiny_model, vocabulary, write_prepared

from pipelines.cli import main
from recsys_alibi.data.errors import DataError
from serving.pyfunc import rules_config
from serving.score import score_with_model

GENRES = ["drama", "comedy", "action"]
FEATURES = ["--set", "data.item_features.categorical=[genre]"]
TRAIN = [
    "model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=8", "model.attention_backend=sdpa",
    "train.max_epochs=6", "train.batch_size=16", "train.warmup_steps=1", "train.lr=0.01",
    "train.attention_health=false", "model.item_features.enabled=true",
]  # fmt: skip


def _sets(items: list[str]) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def _genre_of(user: pl.Expr) -> pl.Expr:
    return user.str.slice(1).cast(pl.Int64) % 3


def _write_data(folder) -> None:
    """90 users, each watching 8 of the 10 items of one genre (user u: genre u % 3); items 0..29 have events,
    the item table also lists 30 (drama), 31 (comedy) and 32 (action), which have none."""
    rng = np.random.default_rng(0)
    rows = [f"u{u},{int(i)},{t}" for u in range(90)
            for t, i in enumerate(rng.choice([i for i in range(30) if i % 3 == u % 3], size=8, replace=False))]  # fmt: skip
    (folder / "events.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    (folder / "items.csv").write_text("item_id,genre\n" + "\n".join(f"{i},{GENRES[i % 3]}" for i in range(33)) + "\n")
    (folder / "today.csv").write_text("item_id,genre\n40,comedy\n41,comedy|western\n42,western\n40,comedy\n7,drama\n")


def _trained(tmp_path, capsys, *data: str) -> tuple:
    """:func:`_write_data` prepared (every event kept; ``data``: more ``data.*`` settings) and a feature model trained
    on it: (prepared dir, model URI)."""
    _write_data(tmp_path)
    prepared = tmp_path / "prep"
    assert main(["prepare", "--quiet", "--input", str(tmp_path / "events.csv"), "--output", str(prepared),
                 "--items", str(tmp_path / "items.csv"), *_sets(["data.min_events_per_user=1",
                 "data.min_events_per_item=1", *data]), *FEATURES]) == 0  # fmt: skip
    assert main(["train", "--quiet", "--prepared", str(prepared), "--set", f"output={tmp_path / 'job'}", *_sets(TRAIN)]) == 0
    return prepared, f"runs:/{capsys.readouterr().out.strip().splitlines()[-1].split()[-1]}/model"


def test_unseen_items_are_ranked_for_users_of_their_category(tmp_path, mlflow_store, one_torch_thread, capsys, caplog):
    prepared, uri = _trained(tmp_path, capsys)

    # default: the prepared input's item table; 30, 31, 32 are in it without events (not in the vocabulary)
    assert main(["score", "--quiet", "--model-uri", uri, "--input", str(prepared), "--output", str(tmp_path / "r1"),
                 "--k", "3"]) == 0  # fmt: skip
    assert (f"new items ranked from their features alone (not in the model's vocabulary): 3 from {prepared}; "
            "its rows rejected: 0; ranking rows that hold one: 90\n") in capsys.readouterr().out
    rankings = pl.read_parquet(tmp_path / "r1" / "part-*.parquet")
    reached = rankings.filter(pl.col("item_id") >= 30).group_by("item_id").agg(_genre_of(pl.col("user_id")).unique().sort())
    assert sorted(reached.rows()) == [(30, [0]), (31, [1]), (32, [2])]  # each only to users of its genre
    assert rankings.filter(pl.col("item_id") >= 30).height == 90  # ... and to every one of them (top 3)
    # export writes the vectors score ranked with, the new items' too: top 3 by dot product is score's ranking
    assert main(["export", "--quiet", "--model-uri", uri, "--input", str(prepared), "--output", str(tmp_path / "ex")]) == 0
    assert "exported 33 item vectors (3 of them new, from their features alone) and 90 user vectors" in capsys.readouterr().out
    exported = pl.read_parquet(tmp_path / "ex" / "items.parquet")
    assert exported["item_id"].to_list()[-3:] == [30, 31, 32] and exported.height == 33
    assert_same_rankings(dot_product_rankings(tmp_path / "ex", prepared, 3), rankings, atol=1e-4)

    # a table of the day: 40 is a duplicate (rejected), 41 is a comedy with a genre the model never saw,
    # 42 has only that genre (zero vector), 7 is known (ranked by its trained vector, not as new)
    assert main(["score", "--quiet", "--model-uri", uri, "--input", str(prepared), "--output", str(tmp_path / "r2"),
                 "--k", "3", "--items", str(tmp_path / "today.csv")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "new items ranked from their features alone (not in the model's vocabulary): 2 from" in out
    assert f"today.csv; its rows rejected: 2 (listed in {tmp_path / 'r2' / '_input' / 'item_rejects.parquet'})" in out
    kept = pl.read_parquet(tmp_path / "r2" / "_input" / "item_rejects.parquet")  # both rows of the duplicate 40
    assert kept["item_id"].to_list() == ["40", "40"] and kept["reject_reason"].unique().len() == 1
    plain = pl.read_parquet(tmp_path / "r2" / "part-*.parquet")
    today = plain.filter(pl.col("item_id") == 41)
    assert today.height == 30 and today.select(_genre_of(pl.col("user_id")).unique()).item() == 1

    # score.new_item_slots=1, top 2: each user's 2 unseen items of its genre lead, so a new item (41 or 42) takes the
    # second place of the users who did not have one there, and the first places stay as they were
    slotted = {}
    for name, extra in (("plain", []), ("slot", ["--set", "score.new_item_slots=1"])):
        assert main(["score", "--quiet", "--model-uri", uri, "--input", str(prepared), "--output", str(tmp_path / name),
                     "--k", "2", "--items", str(tmp_path / "today.csv"), *extra]) == 0  # fmt: skip
        slotted[name] = pl.read_parquet(tmp_path / name / "part-*.parquet")
    captured = capsys.readouterr()
    held = slotted["slot"].filter(pl.col("item_id") >= 40).height  # the rows that hold a new item, counted here
    assert f"; ranking rows that hold one: {held} (score.new_item_slots=1)" in captured.out and held >= 90
    assert "holds every place" not in caplog.text
    pl.DataFrame({"item_id": list(range(30))}).write_parquet(tmp_path / "known.parquet")  # allows no new item
    assert main(["score", "--quiet", "--model-uri", uri, "--input", str(prepared), "--output", str(tmp_path / "known"),
                 "--k", "2", "--items", str(tmp_path / "today.csv"), "--set", "score.new_item_slots=1",
                 "--set", f"score.allow={tmp_path / 'known.parquet'}"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "; ranking rows that hold one: 0 (score.new_item_slots=1)" in out and out.strip().endswith(
        "score.new_item_slots=1: no place held (the allow / deny rules and seen-item exclusion left no user a new item)")
    assert main(["score", "--quiet", "--model-uri", uri, "--input", str(prepared), "--output", str(tmp_path / "all"),
                 "--k", "2", "--items", str(tmp_path / "today.csv"), "--set", "score.new_item_slots=2"]) == 0  # fmt: skip
    assert "score.new_item_slots=2 holds every place of the top 2" in caplog.text
    plain, slot = slotted["plain"], slotted["slot"]
    had = plain.filter(pl.col("item_id") >= 40)["user_id"]
    assert slot.filter(pl.col("item_id") >= 40)["user_id"].sort().to_list() == sorted(plain["user_id"].unique())
    moved = slot.join(plain, on=["user_id", "rank", "item_id"], how="anti")  # rows that differ from the plain ones
    assert moved.height == 90 - had.len() > 0 and moved["rank"].unique().to_list() == [2]
    assert not moved["user_id"].is_in(had.to_list()).any()
    slotted = slot

    # raw events given with the day's table (data.items): the table the staged prepare reads is ranked too
    assert main(["score", "--quiet", "--model-uri", uri, "--input", str(tmp_path / "events.csv"), "--output",
                 str(tmp_path / "r3"), "--k", "3", "--set", f"data.items={tmp_path / 'today.csv'}", *FEATURES,
                 *_sets(["data.min_events_per_user=1", "data.min_events_per_item=1"])]) == 0  # fmt: skip
    assert f"not in the model's vocabulary): 2 from {tmp_path / 'today.csv'}; its rows rejected: 2 (listed in" in capsys.readouterr().out
    assert pl.read_parquet(tmp_path / "r3" / "part-*.parquet").filter(pl.col("item_id") == 41).height == 30

    # the pyfunc, given the table when loaded, ranks it the same way
    pyfunc = mlflow.pyfunc.load_model(uri, model_config={"items": str(tmp_path / "today.csv")})
    histories = pl.read_parquet(prepared / "events.parquet").group_by("user_id").agg("item_id")
    served = pyfunc.predict(histories.to_pandas(), params={"k": 3})
    comedy = served[served["item_id"] == 41]["user_id"].str.slice(1).astype(int) % 3
    assert len(comedy) == 30 and set(comedy) == {1}
    pyfunc = mlflow.pyfunc.load_model(uri, model_config={"items": str(tmp_path / "today.csv"), "new_item_slots": 1})
    served = pl.from_pandas(pyfunc.predict(histories.to_pandas(), params={"k": 2}))
    assert served.sort("user_id", "rank").equals(slotted.sort("user_id", "rank"))  # what score wrote


def test_items_with_an_id_only_model_are_refused(tmp_path, capsys):
    prepared = write_prepared(tmp_path / "prepared")
    (tmp_path / "items.csv").write_text("item_id,genre\n1,drama\n")
    with pytest.raises(Exception, match="this model reads no item features"):
        score_with_model(score_config(items=str(tmp_path / "items.csv")), tiny_model(), vocabulary(), prepared,
                         tmp_path / "out", progress=False)  # fmt: skip
    assert not list((tmp_path / "out").glob("part-*.parquet"))
    with pytest.raises(Exception, match=r"score.new_item_slots=1: this model reads no item features"):
        score_with_model(score_config(new_item_slots=1), tiny_model(), vocabulary(), prepared, tmp_path / "out",
                         progress=False)  # fmt: skip


@pytest.mark.parametrize("config", [{"new_item_slots": 1}, {"items": "t.csv", "new_item_slots": -1},
                                    {"items": "t.csv", "new_item_slots": "1"}, {"items": "t.csv", "new_item_slots": True}])
def test_pyfunc_new_item_slots_are_refused_without_a_table_or_as_no_whole_number(config):
    with pytest.raises(DataError, match="pyfunc model_config 'new_item_slots'"):
        rules_config(config)
    assert rules_config({"items": "t.csv", "new_item_slots": np.int64(2)}).new_item_slots == 2


def test_a_new_item_in_a_history_or_removed_by_the_k_core_is_not_served(tmp_path, mlflow_store, one_torch_thread, capsys):
    """Item 30 (drama) is new to the model and in the histories of u0 and u3 (a later prepare): ranked from its
    features for the other drama users, never for those two (their events on it are dropped from the model's
    input, not from the seen items). Item 33 (drama) has one event, which the k-core (min 2 per item) removes:
    it is not a new item and is served to nobody, by score and by the pyfunc; so is item 4, known to the model, whose
    events but one that k-core removes too (who had it is gone with them)."""
    _, uri = _trained(tmp_path, capsys)
    lines = (tmp_path / "events.csv").read_text().splitlines(keepends=True)
    fours = [i for i, line in enumerate(lines) if line.split(",")[1:2] == ["4"]]  # item 4, known to the model
    later = "".join(line for i, line in enumerate(lines) if i not in fours[1:])  # one event left: the k-core's
    later += "u0,30,100\nu3,30,101\nu6,33,102\n"
    (tmp_path / "later.csv").write_text(later)
    (tmp_path / "items2.csv").write_text((tmp_path / "items.csv").read_text() + "33,drama\n")
    assert main(["prepare", "--input", str(tmp_path / "later.csv"), "--output", str(tmp_path / "prep2"), "--items",
                 str(tmp_path / "items2.csv"), *_sets(["data.min_events_per_user=1", "data.min_events_per_item=2"]),
                 *FEATURES]) == 0  # fmt: skip
    assert "item table: 34 items (2 without events, 2 whose events the k-core removed: not ranked)" in capsys.readouterr().out
    assert main(["score", "--quiet", "--model-uri", uri, "--input", str(tmp_path / "prep2"), "--output",
                 str(tmp_path / "r"), "--k", "3"]) == 0  # fmt: skip
    rankings = pl.read_parquet(tmp_path / "r" / "part-*.parquet")
    got_30 = set(rankings.filter(pl.col("item_id") == 30)["user_id"])
    drama = {f"u{u}" for u in range(0, 90, 3)}
    assert drama - {"u0", "u3"} <= got_30 and not {"u0", "u3"} & got_30  # every other drama user, never those two
    assert rankings.filter(pl.col("item_id") == 33).height == 0
    assert rankings.filter(pl.col("item_id") == 4).height == 0  # known, but who had it is gone with its events
    histories = pl.read_parquet(tmp_path / "prep2" / "events.parquet").group_by("user_id").agg("item_id")
    pyfunc = mlflow.pyfunc.load_model(uri, model_config={"items": str(tmp_path / "prep2")})
    served = pl.from_pandas(pyfunc.predict(histories.to_pandas(), params={"k": 3}))
    pyfunc_30 = set(served.filter(pl.col("item_id") == 30)["user_id"])
    assert drama - {"u0", "u3"} <= pyfunc_30 and not {"u0", "u3"} & pyfunc_30
    assert served.filter(pl.col("item_id") == 33).height == 0  # the prepared table knows what its k-core removed
    # the day's table as a file, with the prepared input: the input's k-core decides (withheld for every user)
    assert main(["score", "--quiet", "--model-uri", uri, "--input", str(tmp_path / "prep2"), "--output",
                 str(tmp_path / "r2"), "--k", "3", "--items", str(tmp_path / "items2.csv")]) == 0  # fmt: skip
    assert pl.read_parquet(tmp_path / "r2" / "part-*.parquet").equals(rankings)
    assert "their features alone (not in the model's vocabulary): 3 from" in capsys.readouterr().out  # 30, 31, 32
    assert main(["export", "--quiet", "--model-uri", uri, "--input", str(tmp_path / "prep2"), "--output",
                 str(tmp_path / "ex"), "--set", f"score.items={tmp_path / 'items2.csv'}"]) == 0  # fmt: skip
    assert "exported 32 item vectors (3 of them new, from their features alone)" in capsys.readouterr().out  # 4, 33 held
    exported = json.loads((tmp_path / "ex" / "export.json").read_text())
    assert (exported["items"], exported["new_items"]) == (32, 3)
    assert_same_rankings(dot_product_rankings(tmp_path / "ex", tmp_path / "prep2", 3), rankings, atol=1e-4)


@pytest.mark.parametrize("id_type", ["auto", "str"])
def test_item_ids_of_the_other_type_match_the_vocabulary_with_new_items(tmp_path, mlflow_store, one_torch_thread, capsys,
                                                                       id_type):  # fmt: skip
    """Integer ids on a model of text ids, or the reverse, with new items in play (``--items``, the pyfunc's
    ``items``): 41 and "41" are one id, so the rankings are those of the input in the model's own type (was a
    polars SchemaError from the join of the input's vocabulary with the new items)."""
    _, uri = _trained(tmp_path, capsys, f"data.id_type={id_type}")
    events = pl.read_csv(tmp_path / "events.csv", schema_overrides={"item_id": pl.String})
    events = pl.concat([events, pl.DataFrame({"user_id": ["u1"], "item_id": ["41"], "timestamp": [100]})])  # new, seen
    own, other = (pl.Int64, pl.String) if id_type == "auto" else (pl.String, pl.Int64)
    rankings = {}
    for dtype in (own, other):
        path = tmp_path / f"events_{dtype}.parquet"
        events.with_columns(pl.col("item_id").cast(dtype)).write_parquet(path)
        assert main(["score", "--quiet", "--model-uri", uri, "--input", str(path), "--output", str(tmp_path / str(dtype)),
                     "--k", "3", "--items", str(tmp_path / "today.csv")]) == 0  # fmt: skip
        rankings[dtype] = pl.read_parquet(tmp_path / str(dtype) / "part-*.parquet")
    assert rankings[other].equals(rankings[own]) and rankings[own].schema["item_id"] == own
    on_41 = rankings[own].filter(pl.col("item_id").cast(pl.String) == "41")["user_id"]
    assert on_41.len() == 29 and "u1" not in on_41.to_list()  # the comedy users but u1, who saw it
    pyfunc = mlflow.pyfunc.load_model(uri, model_config={"items": str(tmp_path / "today.csv")})
    histories = events.group_by("user_id", maintain_order=True).agg("item_id")
    served = {dtype: pyfunc.predict(histories.with_columns(pl.col("item_id").cast(pl.List(dtype))).to_pandas(),
                                    params={"k": 3}) for dtype in (own, other)}  # fmt: skip
    assert pl.from_pandas(served[other]).equals(pl.from_pandas(served[own]))
    assert pl.from_pandas(served[own]).sort("user_id", "rank").equals(rankings[own].sort("user_id", "rank"))


def test_the_sequences_file_of_a_prepared_dir_reads_its_item_table_as_the_dir_does(tmp_path, mlflow_store,
                                                                                   one_torch_thread, capsys):  # fmt: skip
    """``--input PREPARED/sequences.parquet`` ranks (and exports) the prepared item table's new items 30, 31, 32 as
    ``--input PREPARED`` does (they were dropped without a word)."""
    prepared, uri = _trained(tmp_path, capsys)
    for name, given in (("dir", prepared), ("file", prepared / "sequences.parquet")):
        assert main(["score", "--quiet", "--model-uri", uri, "--input", str(given), "--output", str(tmp_path / name),
                     "--k", "3"]) == 0  # fmt: skip
        assert (f"new items ranked from their features alone (not in the model's vocabulary): 3 from {prepared}; "
                "its rows rejected: 0; ranking rows that hold one: 90\n") in capsys.readouterr().out
    by_dir, by_file = (pl.read_parquet(tmp_path / name / "part-*.parquet") for name in ("dir", "file"))
    assert by_file.equals(by_dir) and by_file.filter(pl.col("item_id") >= 30).height == 90
    assert main(["export", "--quiet", "--model-uri", uri, "--input", str(prepared / "sequences.parquet"), "--output",
                 str(tmp_path / "ex")]) == 0  # fmt: skip
    assert "exported 33 item vectors (3 of them new, from their features alone) and 90 user vectors" in capsys.readouterr().out


def test_a_prepared_table_with_ids_the_model_cannot_hold_counts_them_as_a_table_file_does(tmp_path, mlflow_store,
                                                                                          one_torch_thread, capsys):  # fmt: skip
    """An integer-id model given a prepared directory of text ids (``007``, ``051``: not integers that read back the
    same) rejects those rows as ``bad_item_id``, counted and kept in ``_input/item_rejects.parquet`` as with the
    same table given as a file (they were dropped without a count: "its rows rejected: 0")."""
    _, uri = _trained(tmp_path, capsys)
    (tmp_path / "text.csv").write_text("user_id,item_id,timestamp\nx1,007,1\nx1,50,2\nx1,051,3\n")
    table = tmp_path / "text_items.csv"
    table.write_text("item_id,genre\n007,comedy\n50,comedy\n051,drama\n60,action\n")
    text_prepared = tmp_path / "text_prep"
    assert main(["prepare", "--quiet", "--input", str(tmp_path / "text.csv"), "--output", str(text_prepared),
                 "--items", str(table), *_sets(["data.min_events_per_user=1", "data.min_events_per_item=1",
                 "data.id_type=str"]), *FEATURES]) == 0  # fmt: skip
    capsys.readouterr()
    rejects = {}
    for name, items in (("dir", text_prepared), ("file", table)):
        assert main(["score", "--model-uri", uri, "--input", str(tmp_path / "prep"), "--output", str(tmp_path / name),
                     "--k", "3", "--items", str(items)]) == 0  # fmt: skip
        assert f"2 from {items}; its rows rejected: 2 (listed in " in capsys.readouterr().out
        rejects[name] = pl.read_parquet(tmp_path / name / "_input" / "item_rejects.parquet")
    for found in rejects.values():
        assert found.sort("item_id").select("item_id", "reject_reason").rows() == [("007", "bad_item_id"),
                                                                                    ("051", "bad_item_id")]  # fmt: skip
    assert rejects["dir"].schema == rejects["file"].schema
    ranked = {name: pl.read_parquet(tmp_path / name / "part-*.parquet") for name in rejects}
    assert ranked["dir"].equals(ranked["file"]) and set(ranked["dir"]["item_id"].to_list()) >= {50, 60}


def test_raw_events_scored_with_data_items_and_another_declaration_warn_and_use_the_models(tmp_path, mlflow_store,
                                                                                           one_torch_thread, capsys,
                                                                                           caplog):  # fmt: skip
    """``score`` of raw events with ``data.items`` and a declaration other than the model's: the table is read with
    the model's declaration (the columns its encoder knows), as ``--items`` reads it, and a warning names both (the
    given one was ignored without a word); ``data.items`` without a declaration names ``score --items``."""
    _, uri = _trained(tmp_path, capsys)
    events, today = str(tmp_path / "events.csv"), str(tmp_path / "today.csv")
    base = ["score", "--quiet", "--model-uri", uri, "--input", events, "--k", "3"]
    assert main([*base, "--output", str(tmp_path / "given"), "--items", today]) == 0
    other = ["--set", f"data.items={today}", "--set", "data.item_features.categorical=[genre]",
             "--set", "data.item_features.separator=null"]  # fmt: skip
    with caplog.at_level("WARNING"):
        assert main([*base, "--output", str(tmp_path / "declared"), *other]) == 0
    warned = [r.getMessage() for r in caplog.records if "differs from the model's declaration" in r.getMessage()]
    assert warned == ["score: data.item_features differs from the model's declaration (separator None against '|'); "
                      "item tables are read with the model's, the columns it was trained on"]  # fmt: skip
    # a declaration the table cannot satisfy (genre as a number) is not used either: it was refused by the staged prepare
    swapped = ["--set", f"data.items={today}", "--set", "data.item_features.numeric=[genre]"]
    assert main([*base, "--output", str(tmp_path / "swapped"), *swapped]) == 0
    ranked = [pl.read_parquet(tmp_path / name / "part-*.parquet") for name in ("given", "declared", "swapped")]
    assert ranked[0].equals(ranked[1]) and ranked[0].equals(ranked[2]) and ranked[0].filter(pl.col("item_id") == 41).height > 0
    capsys.readouterr()
    assert main([*base, "--output", str(tmp_path / "undeclared"), "--set", f"data.items={today}"]) == 2
    assert "to score with an item table, pass score --items PATH" in capsys.readouterr().err


def test_events_on_new_items_count_as_known_and_a_user_with_only_those_is_listed(tmp_path, mlflow_store,
                                                                                 one_torch_thread, capsys):  # fmt: skip
    """Events on the new items 30, 31, 32 of the item table are on items the job knows: 6 of 8 events on them is
    not "another catalog" (score.max_unknown_share=0.5), and a user with only such events is listed in _skipped/
    (score) or gets no rows (pyfunc), never a refusal of the whole input or request."""
    prepared, uri = _trained(tmp_path, capsys)
    rows = [("a", 0, 1), ("a", 30, 2), ("a", 31, 3), ("a", 32, 4), ("b", 1, 1), ("b", 30, 2), ("b", 31, 3),
            ("b", 32, 4), ("c", 30, 1), ("c", 31, 2)]  # fmt: skip
    pl.DataFrame(rows, schema=["user_id", "item_id", "timestamp"], orient="row").write_parquet(tmp_path / "ev.parquet")
    assert main(["score", "--quiet", "--model-uri", uri, "--input", str(tmp_path / "ev.parquet"), "--output",
                 str(tmp_path / "r"), "--k", "3", "--items", str(prepared)]) == 0  # fmt: skip
    assert "ranked 2 of 3 users" in capsys.readouterr().out
    rankings = pl.read_parquet(tmp_path / "r" / "part-*.parquet")
    assert rankings["user_id"].to_list() == ["a"] * 3 + ["b"] * 3 and rankings.filter(pl.col("item_id") >= 30).height == 0
    skipped = pl.read_parquet(tmp_path / "r" / "_skipped" / "*.parquet")
    assert skipped.rows() == [("c", "no_known_item", 2)]
    assert main(["export", "--quiet", "--model-uri", uri, "--input", str(tmp_path / "ev.parquet"), "--output",
                 str(tmp_path / "ex"), "--set", f"score.items={prepared}"]) == 0  # the same input: not another catalog
    assert pl.read_parquet(tmp_path / "ex" / "users.parquet")["user_id"].to_list() == ["a", "b"]
    only_new = tmp_path / "only_new.parquet"
    pl.DataFrame(rows[-2:], schema=["user_id", "item_id", "timestamp"], orient="row").write_parquet(only_new)
    assert main(["score", "--model-uri", uri, "--input", str(only_new), "--output", str(tmp_path / "r2"), "--k", "3",
                 "--items", str(prepared)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "no user was ranked: none of the 1 users" in err and "catalog" not in err and "model trained on this" not in err
    pyfunc = mlflow.pyfunc.load_model(uri, model_config={"items": str(prepared)})
    assert len(pyfunc.predict(pl.DataFrame({"user_id": ["c"], "item_id": [[30, 31]]}).to_pandas(), params={"k": 3})) == 0
    mixed = pyfunc.predict(pl.DataFrame({"user_id": ["c", "a"], "item_id": [[30], [0, 30, 31, 32]]}).to_pandas(),
                           params={"k": 3})  # fmt: skip
    assert pl.from_pandas(mixed).equals(rankings.filter(pl.col("user_id") == "a"))


def test_a_number_far_outside_the_training_items_is_warned_about(caplog):
    """One popularity of 1e9 (training: mean -1, sd 0.5) put a new item first for every user without a word."""
    from types import SimpleNamespace

    from serving.new_items import _warn_far_numbers

    encoder = SimpleNamespace(numeric_mean=torch.tensor([-1.0, 10.0]), numeric_std=torch.tensor([0.5, 2.0]))
    numbers = torch.tensor([[1e9, 10.0], [-1.5, float("nan")], [-1.0, 31.0]])  # z: (2e9, 0), (1, -), (0, 10.5)
    with caplog.at_level("WARNING", logger="serving.new_items"):
        _warn_far_numbers(numbers, encoder, ["popularity", "price"], "today.csv")
    (warned,) = [r.getMessage() for r in caplog.records]
    assert "2 new items hold a number more than 10 standard deviations" in warned and "(worst: popularity, 2e+09 sd)" in warned
    caplog.clear()
    with caplog.at_level("WARNING", logger="serving.new_items"):
        _warn_far_numbers(numbers[1:2], encoder, ["popularity", "price"], "today.csv")
    assert caplog.records == []
