"""benchmarks/cold_items.py: the ML-1M item table by hand, the held-out split, and a whole --tiny run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from benchmark_scripts import load_benchmark

cold = load_benchmark("cold_items", "cold_items_benchmark")


@pytest.fixture
def ml1m(shared_data) -> Path:
    folder = shared_data / "ml-1m"
    for name in ("ml-1m.txt.gz", "movies.dat", "sas_to_original_items.txt"):
        if not (folder / name).is_file():
            pytest.skip(f"{folder / name} not found (ML-1M SASRec file, movies.dat and the SASRec id map)")
    return folder


def test_item_table_of_the_sasrec_ids(ml1m):
    table = cold.load_item_table(ml1m)
    assert table.height == 3416 and table.get_column("item_id").to_list() == list(range(1, 3417))
    assert table.get_column("genres").null_count() == 0 and table.get_column("year").null_count() == 0
    movie = dict(pl.read_csv(ml1m / "sas_to_original_items.txt", separator=" ", has_header=False).rows())
    toy_story = table.filter(pl.col("item_id") == next(s for s, m in movie.items() if m == 1)).row(0)
    assert toy_story[1:] == (["Animation", "Children's", "Comedy"], 1995.0)  # movies.dat line 1


def test_tiny_run_writes_every_field(ml1m, tmp_path, one_torch_thread, monkeypatch):
    result = cold.main(["--tiny", "--output", str(tmp_path / "cold.json"), "--workdir", str(tmp_path / "work")])
    assert json.loads((tmp_path / "cold.json").read_text()) == json.loads(json.dumps(result))
    assert result["held_out_items"] == round(0.1 * (result["items"])) and set(result["runs"]) == {
        "id_only", "features_id_min_events_0", "features_id_min_events_20", "features_id_dropout_0.1", "features_id_dropout_0.25", "features_id_dropout_0.5"}
    test = result["test"]
    assert test["id_only"]["users"] == test["features"]["users"] == 300
    held = test["HR@10 held-out targets"]
    assert held["n_users"] == test["id_only"]["held_targets"] > 0
    assert held["ci95"][0] <= held["difference"] <= held["ci95"][1]
    assert result["chosen_on_validation"] in result["runs"] and result["machine"].endswith(f"1 torch thread, torch {torch.__version__}")
    assert result["command"] == f"python -m benchmarks.cold_items --tiny --output {tmp_path / 'cold.json'} --workdir {tmp_path / 'work'}"
    assert np.isfinite(test["NDCG@10 all"]["difference"])
    # one place held for the best held-out item: a held-out target in the top 10 keeps its place
    for side in ("id_only", "features"):
        assert test[side]["HR@10 held-out targets, one slot"] >= test[side]["HR@10 held-out targets"]
    assert test["HR@10 held-out targets, one slot each"]["n_users"] == held["n_users"]
    # figures of an earlier version (no slot figures) are scored again from the kept model, not trained again
    saved = tmp_path / "work" / result["chosen_on_validation"] / "figures.npz"
    with np.load(saved) as f:
        old = {k: f[k] for k in f.files if "slot" not in k}
    np.savez(saved, **old)
    # started again with the same command: every setting is read back, none trained again
    monkeypatch.setattr(cold, "train", lambda *a, **k: pytest.fail("a finished setting was trained again"))
    again = cold.main(["--tiny", "--output", str(tmp_path / "again.json"), "--workdir", str(tmp_path / "work")])
    assert again["runs"] == result["runs"] and again["test"] == result["test"]
