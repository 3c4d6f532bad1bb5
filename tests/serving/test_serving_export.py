"""``recsys-alibi export``: top-K by dot product of the exported vectors is score's ranking; the FAISS index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from engine_fixtures import ML1M_SCORE, assert_same_rankings, ml1m_prepared
from serving_fixtures import dot_product_rankings, read_rankings, score_config, tiny_model, vocabulary

from pipelines.cli import main
from recsys_alibi.config import with_overrides
from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from serving import export as export_module
from serving.export import export_model
from recsys_alibi.staging import held_temp, release
from serving.score import score_with_model

TINY = [
    "generate.users=80", "generate.items=50", "generate.min_events=5", "generate.max_events=40",
    "data.min_events_per_user=2", "data.min_events_per_item=1", "model.d_model=16", "model.n_heads=2",
    "model.n_layers=1", "model.max_len=16", "train.max_epochs=1", "train.batch_size=32", "train.warmup_steps=1",
    "train.attention_health=false", "score.shard_users=30", "score.attention_backend=sdpa", "score.device=cpu",
]  # fmt: skip


def _sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def test_export_of_a_trained_model_ranks_every_user_like_score_on_default_data(tmp_path, mlflow_store, capsys):
    assert main(["generate", "--output", str(tmp_path / "events.parquet"), *_sets(TINY)]) == 0
    assert main(["prepare", "--input", str(tmp_path / "events.parquet"), "--output", str(tmp_path / "prep"), *_sets(TINY)]) == 0
    assert main(["train", "--prepared", str(tmp_path / "prep"), "--quiet", *_sets(TINY), "--set", f"output={tmp_path / 'run'}"]) == 0
    uri = f"runs:/{capsys.readouterr().out.split('mlflow_run_id: ')[1].split()[0]}/model"
    common = ["--model-uri", uri, "--input", str(tmp_path / "prep"), "--quiet", *_sets(TINY)]
    assert main(["score", *common, "--output", str(tmp_path / "rankings"), "--k", "10"]) == 0
    assert main(["export", *common, "--output", str(tmp_path / "export")]) == 0
    printed = capsys.readouterr().out
    assert "\nexported 50 item vectors and " in printed and "(D=16, inner product)" in printed
    assert_same_rankings(dot_product_rankings(tmp_path / "export", tmp_path / "prep", 10), read_rankings(tmp_path / "rankings"), atol=1e-4)
    manifest = json.loads((tmp_path / "export" / "export.json").read_text())
    assert manifest["model"]["model_uri"] == uri and manifest["width"] == 16 and manifest["similarity"] == "inner_product"
    assert manifest["users"] + manifest["users_without_vector"] == pl.read_parquet(tmp_path / "prep" / "sequences.parquet").height
    items = pl.read_parquet(tmp_path / "export" / "items.parquet")
    assert items.schema["vector"] == pl.Array(pl.Float32, 16) and items.height == 50  # padding row not exported
    # the same scoring again with --changed-since: the model and every history are the same, so all rows carry over
    assert main(["score", *common, "--output", str(tmp_path / "again"), "--k", "10", "--changed-since", str(tmp_path / "rankings")]) == 0
    assert "carried over (history unchanged since the previous output): " in capsys.readouterr().out
    assert read_rankings(tmp_path / "again").equals(read_rankings(tmp_path / "rankings"))


def test_export_on_ml1m_ranks_like_score(shared_data, tmp_path):
    prepared = ml1m_prepared(shared_data, tmp_path / "prep")
    model, items = tiny_model(n_items=3_416, seed=5), pl.read_parquet(prepared / "items.parquet")
    config = score_config(**{**ML1M_SCORE, "max_context": 50})  # histories beyond 50 events: the window with sinks
    score_with_model(config, model, items, prepared, tmp_path / "rankings", progress=False)
    result = export_model(config, model, items, prepared, tmp_path / "export")
    assert (result.items, result.users, result.users_without_vector) == (3_416, 6_040, 0)
    assert_same_rankings(dot_product_rankings(tmp_path / "export", prepared, 10), read_rankings(tmp_path / "rankings"), atol=1e-4)


def test_faiss_index_exact_for_small_catalogs_hnsw_above_with_recall_measured(prepared, tmp_path):
    faiss = pytest.importorskip("faiss", reason="faiss-cpu is not installed (optional extra: requirements/faiss.lock.txt)")
    config = with_overrides(score_config(), export={"index": "faiss", "hnsw_above": 1_000, "recall_k": 5})
    exact = export_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "exact")
    assert exact.index["type"] == "IndexFlatIP" and exact.index["recall"] == 1.0 and exact.index["recall_queries"] == 23
    index = faiss.read_index(str(tmp_path / "exact" / "items.faiss"))
    users = pl.read_parquet(tmp_path / "exact" / "users.parquet").get_column("vector").to_numpy()
    items = pl.read_parquet(tmp_path / "exact" / "items.parquet").get_column("vector").to_numpy()
    _, found = index.search(users, 5)
    assert (found == np.argsort(-(users @ items.T), axis=1, kind="stable")[:, :5]).mean() > 0.99  # ids = item rows
    n_items = 3_000
    big = with_overrides(config, export={"hnsw_above": 1_000, "recall_k": 100, "hnsw_m": 16, "ef_search": 200})
    hnsw = export_model(big, tiny_model(n_items=n_items), vocabulary(n_items), prepared, tmp_path / "hnsw")
    assert hnsw.index["type"] == "IndexHNSWFlat" and hnsw.index["recall_k"] == 100 and 0.9 <= hnsw.index["recall"] <= 1.0
    saved = json.loads((tmp_path / "hnsw" / "export.json").read_text())["index"]
    assert saved["recall"] == hnsw.index["recall"] and saved["metric"] == "inner_product"
    assert faiss.read_index(str(tmp_path / "hnsw" / "items.faiss")).ntotal == n_items


def strict_json(path: Path) -> dict:
    """``path`` parsed as JSON proper: a bare NaN, Infinity or -Infinity fails, as in strict parsers."""

    def refuse(constant: str):
        raise ValueError(f"{path} holds {constant}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_faiss_index_without_recall_queries_writes_null_not_nan(prepared, tmp_path):
    """Issue 41, defect 5: export.recall_queries=0 (an accepted value) wrote a bare NaN into export.json."""
    pytest.importorskip("faiss", reason="faiss-cpu is not installed (optional extra: requirements/faiss.lock.txt)")
    config = with_overrides(score_config(), export={"index": "faiss", "recall_queries": 0})
    result = export_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "export")
    saved = strict_json(tmp_path / "export" / "export.json")["index"]
    assert (saved["recall"], saved["queries_per_second"], saved["recall_queries"]) == (None, None, 0)
    assert "recall@30 not measured (export.recall_queries=0)" in result.summary()


def test_failed_export_leaves_the_previous_export_whole(prepared, tmp_path, monkeypatch):
    config = score_config()
    export_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "export")
    before = {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()}

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module, "_write_users", broken)
    with pytest.raises(OSError):
        export_model(config, tiny_model(seed=3), vocabulary(), prepared, tmp_path / "export")
    assert {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left
    killed, held = held_temp(tmp_path / "export", directory=True)  # a staging folder as a hard kill leaves it
    release(held)
    monkeypatch.undo()
    export_model(config, tiny_model(seed=3), vocabulary(), prepared, tmp_path / "export")
    assert not killed.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert (tmp_path / "export" / "users.parquet").read_bytes() != before["users.parquet"]  # the new model's vectors


def test_export_index_faiss_without_faiss_is_a_one_line_error(prepared, tmp_path):
    from without_modules import run_without

    args = ["export", "--model-uri", "runs:/0/model", "--input", str(prepared), "--output", str(tmp_path / "x"), "--index", "faiss"]
    code = f"import sys; from pipelines.cli import main; print('exit', main({args!r}))"
    done = run_without("faiss", "-c", code)
    assert done.stdout.strip() == "exit 2"
    assert done.stderr.strip() == f"error: {export_module.FAISS_MISSING}"
    assert not (tmp_path / "x").exists()


def test_export_never_removes_the_staging_of_another_running_export(prepared, tmp_path, monkeypatch):
    """Issue 41, defect 7: `export --output ex` swept `.ex.*.tmp`, the staging folder of a concurrent
    `export --output ex.v2`, which then failed. Now each export sweeps only its own output's stale
    staging folders: never another output's, never one a running export holds."""
    config = score_config()
    original, started = export_module._write_users, []

    def meanwhile(*args, **kwargs):  # while ex.v2 is being written, two other exports start and end
        if not started:
            started.append(True)
            export_model(config, tiny_model(seed=1), vocabulary(), prepared, tmp_path / "ex")
            export_model(config, tiny_model(seed=2), vocabulary(), prepared, tmp_path / "ex.v2.next")
        return original(*args, **kwargs)

    monkeypatch.setattr(export_module, "_write_users", meanwhile)
    result = export_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "ex.v2")
    monkeypatch.undo()
    assert result.users == 23 and started
    for name, seed in (("ex", 1), ("ex.v2", 0), ("ex.v2.next", 2)):
        expected = tmp_path / f"expected-{name}"
        export_model(config, tiny_model(seed=seed), vocabulary(), prepared, expected)
        assert (tmp_path / name / "users.parquet").read_bytes() == (expected / "users.parquet").read_bytes(), name
    other_killed, held = held_temp(tmp_path / "ex.v2", directory=True)  # killed, but not ex's
    release(held)
    running, held = held_temp(tmp_path / "ex", directory=True)  # an export of ex still running
    export_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "ex")
    assert other_killed.is_dir() and running.is_dir()
    release(held)


def test_export_holds_the_popularity_prior_as_one_more_coordinate(prepared, tmp_path):
    """score.popularity_prior was dropped by export without a word (70 % of top-10s differed): the item's
    weight * log(1 + recent count) is now the vectors' last coordinate, with 1 on the user side."""
    config = score_config(popularity_prior={"weight": 2.0, "half_life_days": 3.0})
    model = tiny_model()
    score_with_model(config, model, vocabulary(), prepared, tmp_path / "rankings", progress=False)
    result = export_model(config, model, vocabulary(), prepared, tmp_path / "export")
    assert result.width == 17 and "score.popularity_prior (weight 2) is in the vectors: coordinate 16" in result.summary()
    manifest = json.loads((tmp_path / "export" / "export.json").read_text())
    assert (manifest["width"], manifest["popularity_prior"]["coordinate"], manifest["new_item_slots"]) == (17, 16, None)
    users = pl.read_parquet(tmp_path / "export" / "users.parquet")["vector"].to_numpy()
    assert (users[:, 16] == 1.0).all()
    plain = export_model(score_config(), model, vocabulary(), prepared, tmp_path / "plain")
    assert plain.width == 16 and json.loads((tmp_path / "plain" / "export.json").read_text())["popularity_prior"] is None
    prior_ranked = dot_product_rankings(tmp_path / "export", prepared, 10)
    assert_same_rankings(prior_ranked, read_rankings(tmp_path / "rankings"), atol=1e-4)
    assert not prior_ranked.equals(dot_product_rankings(tmp_path / "plain", prepared, 10))  # the prior changes them


def test_export_with_no_user_to_export_is_refused_and_keeps_the_earlier_export(prepared, tmp_path):
    """An input whose users know no item of the model exited 0 and replaced a good export with an empty users.parquet."""
    export_model(score_config(), tiny_model(), vocabulary(), prepared, tmp_path / "export")
    before = {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()}
    pl.DataFrame({schema.USER_ID: ["a", "b"], schema.ITEM_IDX: [[], []]},
                 schema={schema.USER_ID: pl.String, schema.ITEM_IDX: pl.List(pl.Int32)}).write_parquet(tmp_path / "empty.parquet")  # fmt: skip
    with pytest.raises(DataError, match="no user of the input has an event on an item the model knows"):
        export_model(score_config(), tiny_model(), vocabulary(), tmp_path / "empty.parquet", tmp_path / "export")
    assert {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()} == before


@pytest.mark.parametrize("held", ["items_table", "score_items", "data_items"])
def test_export_never_replaces_an_item_table_in_its_output(prepared, tmp_path, capsys, held):
    """export --output DIR replaced DIR/items.parquet, an item table it read (score.items, data.items) or one that
    was merely there (generate's): refused before any work, the table left as it was."""
    out = tmp_path / "out"
    out.mkdir()
    table = pl.DataFrame({"item_id": [1, 2], "genre": ["a", "b"]})
    table.write_parquet(out / "items.parquet")
    extra = {"items_table": [], "score_items": ["--set", f"score.items={out / 'items.parquet'}"],
             "data_items": ["--set", f"data.items={out / 'items.parquet'}", "--set", "data.item_features.categorical=[genre]"]}[held]
    code = main(["export", "--model-uri", "runs:/0/model", "--input", str(prepared), "--output", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "items.parquet" in err and "choose another --output" in err
    assert pl.read_parquet(out / "items.parquet").equals(table)


def test_export_with_new_item_slots_says_how_to_apply_them(tmp_path, mlflow_store, one_torch_thread, capsys, caplog):
    from test_serving_new_items import _trained

    prepared, uri = _trained(tmp_path, capsys)
    caplog.clear()
    assert main(["export", "--quiet", "--model-uri", uri, "--input", str(prepared), "--output", str(tmp_path / "ex"),
                 "--set", "score.new_item_slots=1"]) == 0  # fmt: skip
    assert "score.new_item_slots=1 is not in the vectors: apply it as export.json's new_item_slots says" in capsys.readouterr().out
    slots = json.loads((tmp_path / "ex" / "export.json").read_text())["new_item_slots"]
    assert (slots["slots"], slots["first_new_row"]) == (1, 30)
    assert "holds every place" not in caplog.text  # the export's own top-1 ranker holds no slot
    assert pl.read_parquet(tmp_path / "ex" / "items.parquet")["item_id"].to_list()[30:] == [30, 31, 32]  # the new items
