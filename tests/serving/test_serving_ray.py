"""``score --engine ray``: the Ray Data job gives score's rankings and resumes a killed run exactly.

One local Ray instance for the module, started here: 2 CPUs, loopback, no dashboard. A job costs a few seconds
of actor start-up (a process importing torch): tests of what the actors compute use one actor (``ONE_ACTOR``);
the kill, resume and pool tests keep the default two.
"""

from __future__ import annotations

import logging

import mlflow
import pytest
from engine_fixtures import ML1M_SCORE, assert_same_rankings, check_spelled_rules, ml1m_prepared, spelled_prepared, user_7_rules
from serving_fixtures import Killed, kill_at, killed_temp, read_rankings, score_config, snapshot, tiny_model, vocabulary

from pipelines.cli import main
from recsys_alibi.data.ingest import DataError
from recsys_alibi.tracking import log_ranker, setup_tracking
from serving.ray_job import loopback_env, score_with_ray
from serving.score import score_with_model

ray = pytest.importorskip("ray", reason="ray is not installed (optional extra: requirements/ray.lock.txt)")
ONE_ACTOR = {"actors": 1}


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    """A local Ray instance for this module's tests (reused by the jobs, shut down at the end), loopback only."""
    with loopback_env():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 _node_ip_address="127.0.0.1")  # fmt: skip
    yield
    ray.shutdown()


def test_ray_job_equals_score_on_ml1m(shared_data, tmp_path):
    import polars as pl

    prepared = ml1m_prepared(shared_data, tmp_path / "prep")
    model, items = tiny_model(n_items=3_416, seed=5), pl.read_parquet(prepared / "items.parquet")
    config = score_config(**ML1M_SCORE)
    score_with_model(config, model, items, prepared, tmp_path / "local", progress=False)
    result = score_with_ray(config, model, items, prepared, tmp_path / "ray", progress=False)
    assert (result.users, result.shards, result.rows) == (6_040, 7, 60_400)
    assert_same_rankings(read_rankings(tmp_path / "ray"), read_rankings(tmp_path / "local"))


def test_ray_job_killed_part_way_and_rerun_equals_an_uninterrupted_one(prepared, tmp_path):
    """Killed after a part file is in place but before it is recorded (the hardest moment)."""
    config = score_config()
    point, shard = "written", 2
    score_with_ray(config, tiny_model(), vocabulary(), prepared, tmp_path / "clean", progress=False)
    with pytest.raises(Killed):
        score_with_ray(config, tiny_model(), vocabulary(), prepared, tmp_path / "killed", progress=False,
                       hook=kill_at(point, shard))  # fmt: skip
    killed_temp(tmp_path / "killed" / "part-00004.parquet")  # an actor killed mid-write
    resumed = score_with_ray(config, tiny_model(), vocabulary(), prepared, tmp_path / "killed", progress=False)
    assert snapshot(tmp_path / "killed") == snapshot(tmp_path / "clean")  # parts and manifest, byte for byte
    assert resumed.shards_skipped <= 4 and resumed.users == 23  # (a complete job is not scored again: the manifest
    # rule both engines share, tested on the local one in test_serving_resume; a fourth Ray instance here cost ~20 s)


def test_ray_job_killed_then_finished_by_the_local_engine(prepared, tmp_path):
    config = score_config()
    with pytest.raises(Killed):
        score_with_ray(config, tiny_model(), vocabulary(), prepared, tmp_path / "out", progress=False,
                       hook=kill_at("recorded", 1))  # fmt: skip
    finished = score_with_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "out", progress=False)
    assert finished.shards_skipped >= 1  # shard 1 at least: results stream back in completion order
    local = score_with_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "clean", progress=False)
    assert local.rows == finished.rows
    assert_same_rankings(read_rankings(tmp_path / "out"), read_rankings(tmp_path / "clean"))


def test_ray_job_input_error_raised_in_an_actor_reaches_the_caller_as_one_line(prepared, tmp_path):
    import polars as pl

    seq = pl.read_parquet(prepared / "sequences.parquet")
    bad = seq.with_columns(pl.when(pl.col("user_id") == "u012").then(pl.col("timestamp").list.reverse())
                           .otherwise(pl.col("timestamp")).alias("timestamp"))  # fmt: skip  # time backwards: found in the shard
    (tmp_path / "in").mkdir()
    bad.write_parquet(tmp_path / "in" / "sequences.parquet")
    vocabulary().write_parquet(tmp_path / "in" / "items.parquet")
    with pytest.raises(DataError) as err:  # shard 2 (users 10..14) fails in its actor
        score_with_ray(score_config(ray=ONE_ACTOR), tiny_model(time_gap_buckets=6), vocabulary(), tmp_path / "in",
                       tmp_path / "out", progress=False)  # fmt: skip
    assert "\n" not in str(err.value) and str(err.value).endswith(
        "timestamps go backwards inside the history of user 'u012' (row 12); sort each history by time first")
    assert not (tmp_path / "out").exists()  # the refused job withdrew the shards written before it (was: kept)
    seq.write_parquet(tmp_path / "in" / "sequences.parquet")  # the input fixed: the same command runs
    fixed = score_with_ray(score_config(ray=ONE_ACTOR), tiny_model(time_gap_buckets=6), vocabulary(), tmp_path / "in",
                           tmp_path / "out", progress=False)  # fmt: skip
    assert (fixed.users, fixed.shards, fixed.shards_skipped) == (23, 5, 0)
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*.parquet")) == [f"part-{i:05d}.parquet" for i in range(5)]


def test_score_cli_engine_ray_prints_only_the_summary(prepared, tmp_path, mlflow_store, capfd):
    setup_tracking(score_config().tracking)
    with mlflow.start_run():
        logged = log_ranker(tiny_model(), vocabulary(), None, tmp_path / "w")
    capfd.readouterr()
    code = main(["score", "--engine", "ray", "--model-uri", logged.uri, "--input", str(prepared),
                 "--output", str(tmp_path / "out"), "--k", "10", "--quiet", "--set", "score.shard_users=5",
                 "--set", "score.ray.actors=1",
                 "--set", "score.attention_backend=sdpa", "--set", "score.device=cpu"])  # fmt: skip
    out, err = capfd.readouterr()
    assert code == 0, err
    assert out.startswith("ranked 23 of 23 users: 209 rows in 5 shards") and len(out.strip().splitlines()) == 2
    assert err.strip() == "", err
    local = tmp_path / "local"
    assert main(["score", "--model-uri", logged.uri, "--input", str(prepared), "--output", str(local), "--k", "10",
                 "--quiet", "--set", "score.shard_users=5", "--set", "score.attention_backend=sdpa"]) == 0  # fmt: skip
    assert_same_rankings(read_rankings(tmp_path / "out"), read_rankings(local))


def test_ray_job_applies_allow_and_deny_rules_and_the_popularity_prior_like_score(prepared, tmp_path):
    """Per-user allow and global deny files (serving.rules): the actors read the rule rows of their shards; the
    driver's item popularity (score.popularity_prior) reaches every actor."""
    import polars as pl

    rows = [(f"u{u:03d}", 1000 + i) for u in range(0, 23, 2) for i in range(3, 30, 3)]  # odd users: nothing allowed
    pl.DataFrame(rows, schema={"user_id": pl.String, "item_id": pl.Int64}, orient="row").write_parquet(tmp_path / "a.parquet")
    pl.DataFrame({"item_id": [1003, 1006, 99_999]}).write_parquet(tmp_path / "d.parquet")
    config = score_config(allow=str(tmp_path / "a.parquet"), deny=str(tmp_path / "d.parquet"),
                          popularity_prior={"weight": 2.0, "half_life_days": 1e-4}, ray=ONE_ACTOR)  # fmt: skip
    local = score_with_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "local", progress=False)
    remote = score_with_ray(config, tiny_model(), vocabulary(), prepared, tmp_path / "ray", progress=False)
    got = read_rankings(tmp_path / "ray")
    assert_same_rankings(got, read_rankings(tmp_path / "local"))
    assert remote.rules == local.rules and remote.rules["deny_unknown_items"] == 1
    assert set(got["item_id"]) <= {1000 + i for i in range(9, 30, 3)}
    assert set(got["user_id"]) <= {f"u{u:03d}" for u in range(0, 23, 2)}


def test_ray_job_applies_integer_user_7_rules_to_text_user_7_only(tmp_path):
    """Issue 41, defect 3 on Ray: the actors' shards of text ids "007", "+7", "7" meet an integer rule for 7."""
    prepared = spelled_prepared(tmp_path / "prep")
    deny, allow = user_7_rules(tmp_path)
    got = {}
    score_with_model(score_config(), tiny_model(), vocabulary(), prepared, tmp_path / "plain", progress=False)
    got["plain"] = read_rankings(tmp_path / "plain")  # without rules: the engines agree (the tests above)
    for name, rules in (("deny", {"deny": deny}), ("allow", {"allow": allow})):
        score_with_ray(score_config(**rules, ray=ONE_ACTOR), tiny_model(), vocabulary(), prepared, tmp_path / name,
                       progress=False)  # fmt: skip
        got[name] = read_rankings(tmp_path / name)
    check_spelled_rules(got["deny"], got["allow"], got["plain"])


def test_run_score_with_score_engine_ray_scores_on_the_actor_pool(prepared, tmp_path, mlflow_store, monkeypatch):
    """Every caller of run_score (``score``, the pipeline's scoring step) honours score.engine=ray; the local
    job's own run_score refuses a Ray config rather than scoring it in-process."""
    from recsys_alibi.config import ConfigError
    from serving import engines
    from serving import score as score_module

    setup_tracking(score_config().tracking)
    with mlflow.start_run():
        logged = log_ranker(tiny_model(), vocabulary(), None, tmp_path / "w")
    local = engines.run_score(score_config(), logged.uri, prepared, tmp_path / "local", progress=False)

    def in_process(*args, **kwargs):
        raise AssertionError("scored in-process although score.engine=ray")

    monkeypatch.setattr(score_module._ScoreJob, "_score_todo", in_process)  # the Ray job has its own
    remote = engines.run_score(score_config(engine="ray"), logged.uri, prepared, tmp_path / "ray", progress=False)
    with pytest.raises(ConfigError, match="score.engine=ray: score with serving.engines.run_score"):
        score_module.run_score(score_config(engine="ray"), logged.uri, prepared, tmp_path / "other", progress=False)
    assert (remote.users, remote.shards, remote.rows, remote.users_scored) == (23, 5, local.rows, 23)
    assert_same_rankings(read_rankings(tmp_path / "ray"), read_rankings(tmp_path / "local"))


def test_ray_job_changed_since_carries_over_like_score(prepared, tmp_path):
    """score --changed-since on Ray: the actors carry over the unchanged users' rows as the local engine does."""
    import polars as pl

    config = score_config()
    score_with_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "before", progress=False)
    seq = pl.read_parquet(prepared / "sequences.parquet")
    seq = seq.with_columns(pl.when(pl.col("user_id").is_in(["u003", "u017"])).then(pl.col("item_idx").list.reverse())
                           .otherwise(pl.col("item_idx")).alias("item_idx"))  # fmt: skip
    (tmp_path / "new").mkdir()
    seq.write_parquet(tmp_path / "new" / "sequences.parquet")
    vocabulary().write_parquet(tmp_path / "new" / "items.parquet")
    delta = score_config(changed_since=str(tmp_path / "before"), ray=ONE_ACTOR)
    local = score_with_model(delta, tiny_model(), vocabulary(), tmp_path / "new", tmp_path / "local", progress=False)
    remote = score_with_ray(delta, tiny_model(), vocabulary(), tmp_path / "new", tmp_path / "ray", progress=False)
    assert remote.carried_users == local.carried_users == 21
    assert read_rankings(tmp_path / "ray").equals(read_rankings(tmp_path / "local"))


def test_ray_job_identity_names_the_device_its_actors_score_on():
    """Issue 41, defect 4 on Ray: the device in the reuse identity is the actors', not the driver's."""
    from recsys_alibi.config import RayConfig, ScoreConfig
    from serving.ray_job import actor_device
    import torch

    from serving.rank import device_identity

    here = device_identity(torch.device("cpu"))
    assert actor_device(ScoreConfig(), RayConfig()) == here  # local instance, CPU actors: this machine's CPU
    assert actor_device(ScoreConfig(device="cpu"), RayConfig(address="auto", gpus_per_actor=1)).startswith(
        "cpu (the Ray cluster's nodes), torch ")
    assert actor_device(ScoreConfig(), RayConfig(address="auto", gpus_per_actor=1)).startswith("cuda (the Ray cluster")


def test_the_actors_get_absolute_paths_for_a_relative_input_and_output(tmp_path, monkeypatch):
    """verify-s66 N2: on a cluster (`ray start` run in another folder) the workers' working folder is not this
    process's, so `--input prep` was not found there. The actors are given absolute paths."""
    from serving_fixtures import write_prepared

    captured: dict = {}

    class Stop(Exception):
        pass

    class Dataset:
        def map_batches(self, fn, **kwargs):
            captured.update(kwargs["fn_constructor_kwargs"])
            raise Stop

    monkeypatch.chdir(tmp_path)
    write_prepared(tmp_path / "prep")
    monkeypatch.setattr(ray.data, "from_items", lambda *args, **kwargs: Dataset())
    with pytest.raises(Stop):
        score_with_ray(score_config(ray=ONE_ACTOR), tiny_model(), vocabulary(), "prep", "out", progress=False)
    assert captured["source"].sequences == tmp_path / "prep" / "sequences.parquet"
    assert captured["output_dir"] == tmp_path / "out"
