"""benchmarks/replay.py: next-period examples by hand, and a whole tiny replay writing every field."""

from __future__ import annotations

import datetime as dt
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from recsys_alibi.config import DataConfig
from recsys_alibi.data.prepare import prepare
from benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[2]



replay = load_benchmark("replay", "replay_benchmark")
scoring = load_benchmark("replay_scoring")

DAY = replay.DAY
TINY = [
    "model.d_model=8", "model.n_heads=2", "model.n_layers=1", "model.max_len=8", "model.attention_backend=sdpa",
    "train.max_epochs=1", "train.batch_size=16", "train.warmup_steps=1", "train.attention_health=false",
    "train.warm.max_epochs=1", "data.min_events_per_user=1", "data.min_events_per_item=1", "evaluate.batch_size=64",
    "data.item_features={}",  # configs/default.yaml declares the synthetic item table's columns; this log has none
]  # fmt: skip


def _log(n_users: int = 40, n_items: int = 30, days: int = 70) -> pl.DataFrame:
    """Users walking a catalog, one event every 5 days each (staggered), over ``days`` days; 5 more users
    arrive on day 40 and walk 10 items of their own (new users and new items on later steps)."""
    rng = np.random.default_rng(0)
    rows = []
    for u in range(n_users + 5):
        late = u >= n_users
        start, first, catalog = int(rng.integers(0, n_items)), (40 * DAY if late else 0) + u * 3600, 10 if late else n_items
        for t, ts in enumerate(range(first, days * DAY, 5 * DAY)):
            rows.append((u, (start + t) % catalog + 1 + (100 if late else 0), ts))
    return pl.DataFrame(rows, schema=["user_id", "item_id", "timestamp"], orient="row")


def _test_users(log: pl.DataFrame, lo: int, hi: int) -> int:
    """Reference: users with a next-period event on an item of the catalog before ``lo`` they have not seen."""
    rows = sorted(log.rows(), key=lambda r: r[2])
    catalog = {item for _, item, ts in rows if ts < lo}
    seen: dict[int, set] = {}
    for user, item, ts in rows:
        if ts < lo:
            seen.setdefault(user, set()).add(item)
    return len({u for u, item, ts in rows if lo <= ts < hi and u in seen and item in catalog and item not in seen[u]})


def test_next_period_target_is_the_first_unseen_catalog_event(tmp_path):
    events = pl.DataFrame(
        {"user_id": [1, 1, 1, 1, 1, 1, 2, 2, 2, 3], "item_id": [10, 11, 10, 99, 12, 13, 11, 12, 14, 10],
         "timestamp": [1, 2, 10, 11, 12, 13, 3, 4, 30, 20]}
    )  # fmt: skip
    history = events.filter(pl.col("timestamp") < 10)
    history.write_parquet(tmp_path / "h.parquet")
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), tmp_path / "h.parquet", tmp_path / "p")
    examples = replay.next_period_examples(tmp_path / "p", events, 10, 20, model=None)
    items = pl.read_parquet(tmp_path / "p" / "items.parquet")
    idx = dict(zip(items["item_id"].to_list(), items["item_idx"].to_list()))
    # user 1: 10 (seen) and 99 (not in the catalog) are passed over, 12 is the target; user 2: nothing
    # in [10, 20) (its event at 30 is later); user 3: no history before 10
    assert examples["user_id"].to_list() == [1]
    assert examples["history"].to_list() == [[idx[10], idx[11]]] and examples["targets"].to_list() == [[idx[12]]]


def test_horizon_targets_are_every_unseen_catalog_item_of_the_period_first_event_first(tmp_path):
    horizon = load_benchmark("replay_horizon")
    events = pl.DataFrame(
        {"user_id": [1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3],
         "item_id": [10, 11, 13, 10, 99, 12, 13, 12, 11, 12, 13, 10, 14, 10],
         "timestamp": [1, 2, 5, 10, 11, 12, 13, 14, 3, 4, 15, 16, 30, 12]}
    )  # fmt: skip
    events.filter(pl.col("timestamp") < 10).write_parquet(tmp_path / "h.parquet")
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), tmp_path / "h.parquet", tmp_path / "p")
    examples = horizon.horizon_examples(tmp_path / "p", events, 10, 20, model=None)
    items = pl.read_parquet(tmp_path / "p" / "items.parquet")
    idx = dict(zip(items["item_id"].to_list(), items["item_idx"].to_list()))
    # user 1: 10 and 13 seen, 99 not in the catalog, 12 twice (once); user 2: 13 then 10 (14 is after the
    # period); user 3: no history before 10. The first target is next_period_examples' one target.
    assert examples["user_id"].to_list() == [1, 2]
    assert examples["targets"].to_list() == [[idx[12]], [idx[13], idx[10]]]
    first = replay.next_period_examples(tmp_path / "p", events, 10, 20, model=None)
    assert first["targets"].to_list() == [[t[0]] for t in examples["targets"].to_list()]
    assert first["history"].to_list() == examples["history"].to_list()


def test_set_metrics_by_hand():
    horizon = load_benchmark("replay_horizon")
    scores = torch.tensor([[-torch.inf, *[float(20 - i) for i in range(1, 15)]]])  # item i at rank i (1..14)
    out = horizon.set_metrics(scores.repeat(3, 1), [[2, 5, 12], [1], []], [3, 2, 1])
    d = 1 / np.log2(np.arange(2, 12))  # discounts of ranks 1..10
    assert out[0].tolist() == pytest.approx([(d[1] + d[4]) / d[:3].sum(), 2 / 3])  # 12 is at rank 12: a miss
    assert out[1].tolist() == pytest.approx([d[0] / d[:2].sum(), 1 / 2])  # |T| 2, one target unknown to the model
    assert out[2].tolist() == [0.0, 0.0]


def test_boundaries_cover_the_log_in_whole_periods():
    ts = np.array([0, 10 * DAY, 20 * DAY, 100 * DAY])
    assert replay.boundaries(ts, 0.5, 30) == [15 * DAY, 45 * DAY, 75 * DAY, 105 * DAY]


def _args(steps: int, arms: list[str], output: str = "replay.json") -> list[str]:
    args = ["--config", str(REPO / "configs" / "default.yaml"), "--input", "log.parquet", "--format", "parquet",
            "--start", "0.5", "--period-days", "14", "--steps", str(steps), "--workdir", "work", "--output", output,
            "--arms", *arms]  # fmt: skip
    features = ["data.items=items.parquet", "data.item_features.categorical=[genre]"]  # a table of every item
    for item in [*TINY, *(features if any(a in replay.FEATURE_ARMS for a in arms) else [])]:
        args += ["--set", item]
    return args


@pytest.fixture
def replay_dir(tmp_path, monkeypatch, one_torch_thread, new_store) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path / "mlflow.db"))
    log = _log()
    log.write_parquet(tmp_path / "log.parquet")
    items = log.select("item_id").unique().sort("item_id")
    items.with_columns(genre=(pl.col("item_id") % 3).cast(pl.String)).write_parquet(tmp_path / "items.parquet")
    return tmp_path


def test_tiny_replay_writes_every_field(replay_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "replay_scoring", scoring)  # the script's folder is on sys.path when run
    replay.main(_args(1, list(replay.ARMS)))
    result = json.loads((replay_dir / "replay.json").read_text())
    assert result["command"] == shlex.join(["python", "benchmarks/replay.py", *_args(1, list(replay.ARMS))])
    assert result["machine"].endswith(f"Python {'.'.join(map(str, sys.version_info[:3]))}, 1 torch thread")
    per_user = json.loads((replay_dir / "replay.per_user.json").read_text())
    assert (replay_dir / "replay.png").stat().st_size > 0
    assert result["seeds"] == [42] and result["arms"] == list(replay.ARMS)
    steps = result["runs"]["42"]["steps"]
    assert [s["step"] for s in steps] == [1]
    log = _log()
    bounds = replay.boundaries(log["timestamp"].to_numpy(), 0.5, 14)
    step = steps[0]
    before, now = log.filter(pl.col("timestamp") < bounds[0]), log.filter(pl.col("timestamp") < bounds[1])
    assert step["new_events"] == now.height - before.height
    assert step["new_users"] == now["user_id"].n_unique() - before["user_id"].n_unique() == 5  # the late users
    assert step["new_items"] == now["item_id"].n_unique() - before["item_id"].n_unique() > 0
    assert step["test_users"] == _test_users(log, bounds[1], bounds[2]) >= 40
    assert step["period_end"] == dt.datetime.fromtimestamp(bounds[1], dt.timezone.utc).date().isoformat()
    users = per_user["42"]["steps"][0]["per_user"]
    kinds = per_user["42"]["steps"][0]["target_kinds"]
    for name in replay.ARMS:
        arm = step["arms"][name]
        assert 0 <= arm["NDCG@10"] <= arm["HR@10"] <= 1
        values = np.array(list(users[name].values()))  # the means are over every test user
        assert arm["NDCG@10"] == pytest.approx(values[:, 0].mean()) and arm["HR@10"] == pytest.approx(values[:, 1].mean())
        assert sum(v["n"] for v in arm["by_target_kind"].values()) == step["test_users"]
        assert arm["by_target_kind"]["new_this_period"]["n"] == sum(k == "new_this_period" for k in kinds.values())
        assert 0 <= arm["top10_share_new"] <= 1
    assert step["arms"]["stale"]["train_seconds"] == 0 and "val_NDCG@10" not in step["arms"]["stale"]
    # the stale model (step 0) does not know the items that entered at step 1: those targets are its misses
    assert step["arms"]["stale"]["by_target_kind"]["new_this_period"]["HR@10"] == 0.0
    assert step["arms"]["stale"]["unservable"] >= step["arms"]["stale"]["by_target_kind"]["new_this_period"]["n"] > 0
    for name in ("warm", "warm_full", "warm_features"):
        moved = step["arms"][name]["moved"]
        assert moved["old_rows"] > 0 and moved["new_rows"] > 0 and moved["old_row_norm"] > 0
    for other in ("scratch", "stale", "warm_full", "scratch_budget"):
        d = step["differences"][f"warm_minus_{other}"]["NDCG@10"]
        assert d["difference"] == pytest.approx(step["arms"]["warm"]["NDCG@10"] - step["arms"][other]["NDCG@10"])
        assert d["ci95"][0] <= d["difference"] <= d["ci95"][1] and d["pairs"] == step["test_users"]
        pooled = result[f"pooled_warm_minus_{other}"]["NDCG@10"]  # one step: the pooled pairs are that step's
        assert pooled["difference"] == pytest.approx(d["difference"]) and pooled["pairs"] == d["pairs"]
        assert pooled["users"] == d["pairs"]  # one seed, one step: each user is one pair
        assert pooled["ci95_by_user"][0] <= pooled["difference"] <= pooled["ci95_by_user"][1]
    for a, b in (("warm_features", "warm"), ("scratch_features", "scratch")):  # features against their twin
        d = step["differences"][f"{a}_minus_{b}"]["HR@10"]
        assert d["difference"] == pytest.approx(step["arms"][a]["HR@10"] - step["arms"][b]["HR@10"])
        new = [u for u, kind in kinds.items() if kind == "new_this_period"]  # the cold-item figure, by hand
        cold = result["by_target_kind_differences"][f"{a}_minus_{b}"]["new_this_period"]["HR@10"]
        assert cold["pairs"] == len(new) and cold["difference"] == pytest.approx(
            np.mean([users[a][u][1] - users[b][u][1] for u in new]))
    run = per_user["42"]
    assert run["step0_features"]["uri"] != run["step0"]["uri"]  # the feature chain starts from its own model
    seconds = result["train_seconds"]  # a one-epoch tiny scratch run can round to 0.0 s on a quiet machine: no ratio
    assert result["warm_over_scratch_train_time"] == (
        pytest.approx(seconds["warm"] / seconds["scratch"]) if seconds["scratch"] else None)
    assert result["warm_over_scratch_epochs"] == pytest.approx(step["arms"]["warm"]["epochs"] / step["arms"]["scratch"]["epochs"])
    _check_cold_figures(replay_dir, monkeypatch, log, bounds, step)
    _check_validation_figures(replay_dir, monkeypatch, log, bounds, step)
    _check_paired_figures(replay_dir, monkeypatch, result)
    _check_popularity_figures(replay_dir, monkeypatch, log, bounds, per_user)
    _check_prior_figures(replay_dir, monkeypatch, log, bounds, per_user)
    _check_horizon_figures(replay_dir, monkeypatch, per_user)


def _check_record(out: dict, command: str) -> None:
    """A script's JSON names the command as it was run and the machine (CPU, cores, Python)."""
    assert out["command"] == f"python benchmarks/{command}"
    assert out["machine"].endswith(f" cores, Python {'.'.join(map(str, sys.version_info[:3]))}")


def _check_prior_figures(replay_dir, monkeypatch, log, bounds, per_user) -> None:
    """benchmarks/replay_prior.py on the finished tiny replay: at beta 0 it is the replay's own warm figure; the
    recent-popularity ranking agrees with counts weighted by hand (its target's rank lies between the items
    strictly above it and those tied with it); the stale model misses every target it does not know."""
    monkeypatch.setitem(sys.modules, "replay", replay)
    prior = load_benchmark("replay_prior")
    prior.main(["replay.json", "--output", "prior.json"])
    out = json.loads((replay_dir / "prior.json").read_text())
    _check_record(out, "replay_prior.py replay.json --output prior.json")
    values = json.loads((replay_dir / "prior.per_user.json").read_text())
    warm = per_user["42"]["steps"][0]["per_user"]["warm"]
    assert set(values) == {f"42/1/{u}" for u in warm}
    assert all(values[f"42/1/{u}"][0] == pytest.approx(v) for u, v in warm.items())  # beta 0: the replay's figure
    assert out["mean_NDCG@10"]["arm"] == pytest.approx(np.mean([v[0] for v in warm.values()]))
    half_life = out["chosen"]["42"]["1"]["recent"]["half_life_days"]
    rows = log.filter(pl.col("timestamp") < bounds[1]).rows()
    weight, seen = {}, {}
    for user, item, ts in rows:
        age = (bounds[1] - ts) / DAY
        weight[item] = weight.get(item, 0.0) + (1.0 if half_life is None else 0.5 ** (age / half_life))
        seen.setdefault(user, set()).add(item)
    done = set()
    for user, item, ts in sorted(log.filter((pl.col("timestamp") >= bounds[1]) & (pl.col("timestamp") < bounds[2])).rows(), key=lambda r: (r[2], r[1])):
        if user in done or user not in seen or item not in weight or item in seen[user]:
            continue
        done.add(user)
        others = [weight[i] for i in weight if i not in seen[user] and i != item]
        above = sum(w > weight[item] * (1 + 1e-9) for w in others)
        tied = sum(abs(w - weight[item]) <= weight[item] * 1e-9 for w in others)
        ndcg = values[f"42/1/{user}"][2][0]
        rank = 2 ** (1 / ndcg) - 1 if ndcg > 0 else None
        assert (rank is None and above + tied + 1 > 10) or (rank is not None and above + 1 <= round(rank) <= above + tied + 1)
    kinds = per_user["42"]["steps"][0]["target_kinds"]
    new = [u for u, kind in kinds.items() if kind == "new_this_period"]
    assert new and all(values[f"42/1/{u}"][3] == [0.0, 0.0] for u in new)  # the stale model does not know them
    (replay_dir / "bad-uris.json").write_text('{"42": "abc"}')
    (replay_dir / "few-uris.json").write_text('{"42": {"2": "runs:/x/model"}}')
    for bad in (["--output", "replay.txt"], ["--uris", "bad-uris.json"], ["--uris", "few-uris.json"],
                ["--against", "replay.json"], ["--seeds", "7"]):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:  # one line, before any model is scored
            prior.main(["replay.json", "--output", "p2.json", *bad] if bad[0] != "--output" else ["replay.json", *bad])
        assert stopped.value.code == 2, bad
    assert json.loads((replay_dir / "replay.per_user.json").read_text()) == per_user  # replay.txt's .per_user.json
    prior.main(["replay.json", "--output", "only42.json", "--seeds", "42"])  # the one seed there is: the same figures
    assert json.loads((replay_dir / "only42.per_user.json").read_text()) == values
    d = out["prior_minus_stale_with_prior"]["NDCG@10"]
    assert d["difference"] == pytest.approx(np.mean([v[1][0] - v[3][0] for v in values.values()]))
    assert d["pairs"] == len(warm)


def _check_horizon_figures(replay_dir, monkeypatch, per_user) -> None:
    """benchmarks/replay_horizon.py on the finished tiny replay: a user with one next-period target has the
    replay's own NDCG@10 and HR@10 (= Recall@10) for warm and stale, alone and with the prior's chosen point (the
    prior file's per-user figures); the pooled difference is the mean of the per-user ones; bad --prior refused."""
    monkeypatch.setitem(sys.modules, "replay", replay)
    monkeypatch.setitem(sys.modules, "replay_scoring", scoring)
    monkeypatch.setitem(sys.modules, "replay_prior", load_benchmark("replay_prior"))  # the script's folder when run
    horizon = load_benchmark("replay_horizon")
    horizon.main(["replay.json", "--prior", "warm=prior.json", "--output", "h.json"])
    out = json.loads((replay_dir / "h.json").read_text())
    _check_record(out, "replay_horizon.py replay.json --prior warm=prior.json --output h.json")
    values = json.loads((replay_dir / "h.per_user.json").read_text())
    prior = json.loads((replay_dir / "prior.per_user.json").read_text())  # [arm, prior, recent, stale_prior]
    replayed = per_user["42"]["steps"][0]["per_user"]
    assert set(values) == set(prior) and out["test_users"] == len(prior)
    assert out["targets_per_user"] == pytest.approx(np.mean([v["targets"] for v in values.values()]))
    assert out["targets_per_user"] > 1
    one = [key for key, v in values.items() if v["targets"] == 1]
    assert one, "the tiny log has users with a single next-period target"
    for key in one:
        user = key.split("/")[2]
        assert values[key]["warm/model"] == pytest.approx(replayed["warm"][user])
        assert values[key]["stale/model"] == pytest.approx(replayed["stale"][user])
        assert values[key]["warm/prior"] == pytest.approx(prior[key][1])
        assert values[key]["stale/prior"] == pytest.approx(prior[key][3])
    d = out["warm_minus_stale_model"]["Recall@10"]
    assert d["difference"] == pytest.approx(np.mean([v["warm/model"][1] - v["stale/model"][1] for v in values.values()]))
    assert d["pairs"] == len(values) and out["warm_minus_stale_prior"]["by_step"]["1"]["NDCG@10"]["pairs"] == len(values)
    horizon.main(["--pool", "h.json", "--output", "pooled.json"])  # one file: its own comparisons again
    pooled = json.loads((replay_dir / "pooled.json").read_text())
    _check_record(pooled, "replay_horizon.py --pool h.json --output pooled.json")
    assert pooled["warm_minus_stale_prior"] == out["warm_minus_stale_prior"] and pooled["means"] == out["means"]
    for bad in (["--prior", "stale=prior.json"], ["--prior", "warm=replay.json"], ["--prior", "scratch=prior.json"],
                ["--pool", "h.json", "h.json"], ["--pool", "replay.json"]):
        with pytest.raises(SystemExit) as stopped:
            horizon.main([*([] if bad[0] == "--pool" else ["replay.json"]), *bad, "--output", "h2.json"])
        assert stopped.value.code == 2, bad


def _check_popularity_figures(replay_dir, monkeypatch, log, bounds, per_user) -> None:
    """benchmarks/replay_popularity.py on the finished tiny replay against a hand ranking: every catalog item by
    its events before b_1 (ties: the later last event first, then the lower raw id), seen items skipped."""
    monkeypatch.setitem(sys.modules, "replay", replay)
    popularity = load_benchmark("replay_popularity")
    popularity.main(["replay.json", "--output", "pop.json"])
    out = json.loads((replay_dir / "pop.json").read_text())
    _check_record(out, "replay_popularity.py replay.json --output pop.json")
    rows = sorted(log.filter(pl.col("timestamp") < bounds[1]).rows(), key=lambda r: r[2])
    count, last, seen = {}, {}, {}
    for user, item, ts in rows:
        count[item], last[item] = count.get(item, 0) + 1, ts
        seen.setdefault(user, set()).add(item)
    order = sorted(count, key=lambda i: (-count[i], -last[i], i))
    ndcg = []
    for user, item, ts in sorted(log.filter((pl.col("timestamp") >= bounds[1]) & (pl.col("timestamp") < bounds[2])).rows(), key=lambda r: (r[2], r[1])):
        if user in seen and item in count and item not in seen[user] and user not in {u for u, _ in ndcg}:
            rank = [i for i in order if i not in seen[user]].index(item) + 1
            ndcg.append((user, 1 / np.log2(rank + 1) if rank <= 10 else 0.0))
    assert out["steps"]["1"]["test_users"] == len(ndcg) == len(per_user["42"]["steps"][0]["per_user"]["warm"])
    assert out["steps"]["1"]["NDCG@10"] == pytest.approx(np.mean([v for _, v in ndcg]))
    warm = np.mean([v[0] for v in per_user["42"]["steps"][0]["per_user"]["warm"].values()])
    assert out["popularity_minus_warm"]["NDCG@10"]["difference"] == pytest.approx(out["steps"]["1"]["NDCG@10"] - warm)


def _check_paired_figures(replay_dir, monkeypatch, result) -> None:
    """benchmarks/replay_pair.py on the finished tiny replay: the replay's own pooled differences, to the last
    digit (the same pairs, the same resampling); steps outside --steps leave nothing, refused with exit 2."""
    monkeypatch.setitem(sys.modules, "replay", replay)
    pairing = load_benchmark("replay_pair")
    pairing.main(["--model", "scratch=replay.json:scratch", "--model", "warm=replay.json:warm",
                  "--model", "stale=replay.json:stale", "--output", "pair.json"])  # fmt: skip
    out = json.loads((replay_dir / "pair.json").read_text())
    assert out["warm_minus_scratch"] == result["pooled_warm_minus_scratch"] and out["steps"] == [1]
    assert out["stale_minus_scratch"]["NDCG@10"]["difference"] == pytest.approx(
        out["mean_NDCG@10"]["stale"] - out["mean_NDCG@10"]["scratch"])
    before = (replay_dir / "replay.json").read_bytes()
    fewer = json.loads((replay_dir / "replay.per_user.json").read_text())  # one test user fewer in one arm
    fewer["42"]["steps"][0]["per_user"]["warm"].popitem()
    (replay_dir / "fewer.json").write_bytes(before)
    (replay_dir / "fewer.per_user.json").write_text(json.dumps(fewer))
    for bad in (["--steps", "2-3"], ["--steps", "\u00b2-3"], ["--output", "replay.json"], ["--output", "."],
                ["--model", "c=fewer.json:warm"]):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            pairing.main(["--model", "a=replay.json:warm", "--model", "b=replay.json:scratch", *bad])
        assert stopped.value.code == 2, bad
    assert (replay_dir / "replay.json").read_bytes() == before  # an --output naming an input is refused, not written


def _cold_users(log: pl.DataFrame, lo: int, hi: int) -> tuple[set, set]:
    """Reference: (items whose first event is in [lo, hi), users with history before lo and an event on one)."""
    rows = sorted(log.rows(), key=lambda r: r[2])
    first: dict = {}
    for _, item, ts in rows:
        first.setdefault(item, ts)
    fresh = {i for i, ts in first.items() if lo <= ts < hi}
    history = {u for u, _, ts in rows if ts < lo}
    return fresh, {u for u, i, ts in rows if lo <= ts < hi and i in fresh and u in history}


def _check_cold_figures(replay_dir, monkeypatch, log, bounds, step) -> None:
    """benchmarks/replay_cold.py on the finished tiny replay: its cold targets and figures."""
    monkeypatch.setitem(sys.modules, "replay", replay)
    cold = load_benchmark("replay_cold")
    cold.main(["replay.json"])
    out = json.loads((replay_dir / "replay.cold.json").read_text())
    fresh, users = _cold_users(log, bounds[1], bounds[2])
    assert out["twins"] == {"warm_features": "warm", "scratch_features": "scratch"} and len(users) > 0
    (got,) = out["steps"]
    assert got["new_items"] == len(fresh) and got["cold_test_users"] == len(users)
    for arm, twin in out["twins"].items():
        figures = got["arms"][arm]
        assert figures["cold"]["n"] == len(users) and figures["ranked_new_items"] == len(fresh)
        assert 0 <= figures["cold"]["NDCG@10"] <= figures["cold"]["HR@10"] <= 1
        assert 0 < figures["cold_median_rank_fraction"] <= 1
        among = out["cold_among_new_items"][arm]  # every fresh item has a table row: every cold target ranked
        assert among["n"] == len(users) and 0 <= among["HR@1"] <= among["HR@5"] <= 1
        assert among["random_HR@1"] == pytest.approx(1 / len(fresh)) and among["best_new_item_median_rank"] >= 1
        pooled = out[f"cold_{arm}"]["minus_id_only"]["HR@10"]  # the id-only twin cannot rank them: 0
        assert pooled["difference"] == pytest.approx(figures["cold"]["HR@10"]) and pooled["pairs"] == len(users)
        # more candidates can only push a target down: each user's NDCG@10 is at most the replay's
        assert figures["with_new_items"]["n"] == step["test_users"]
        assert figures["with_new_items"]["NDCG@10"] <= step["arms"][arm]["NDCG@10"] + 1e-12
        d = out[f"{arm}_with_new_items_minus_{twin}"]["NDCG@10"]
        assert d["difference"] == pytest.approx(figures["with_new_items"]["NDCG@10"] - step["arms"][twin]["NDCG@10"])
        # a place held for the best new item: a cold target in the top 10 stays there, and the best new one joins
        slot = out[f"cold_{arm}_slot"]
        assert slot["n"] == len(users) and slot["HR@10"] >= max(figures["cold"]["HR@10"], among["HR@1"]) - 1e-12
        both = out[f"{arm}_slot_all_targets_minus_{twin}"]["NDCG@10"]
        assert both["pairs"] == step["test_users"] + len(users)


def _check_validation_figures(replay_dir, monkeypatch, log, bounds, step) -> None:
    """benchmarks/replay_validation.py on the finished tiny replay: over all users it is each arm's own
    validation figure (what training recorded), and the returning users are counted by hand."""
    monkeypatch.setitem(sys.modules, "replay", replay)
    validation = load_benchmark("replay_validation")
    validation.main(["--model", "warm=replay.json:warm", "--model", "scratch=replay.json:scratch", "--output", "v.json"])
    out = json.loads((replay_dir / "v.json").read_text())
    (row,) = out["steps"]
    # validation users: at least 3 events before b_1 (a training prefix, the validation and the test event)
    before = log.filter(pl.col("timestamp") < bounds[1]).group_by("user_id").len().filter(pl.col("len") >= 3)
    back = set(log.filter((pl.col("timestamp") >= bounds[0]) & (pl.col("timestamp") < bounds[1]))["user_id"])
    assert row["validation_users"] == before.height and row["returning_users"] == len(back & set(before["user_id"])) > 0
    for arm in ("warm", "scratch"):
        assert out["sets"]["all"][arm]["NDCG@10"] == pytest.approx(step["arms"][arm]["val_NDCG@10"], abs=1e-4)
        assert out["sets"]["returning"][arm]["pairs"] == row["returning_users"]
        assert row[f"{arm}_returning_NDCG@10"] == pytest.approx(step["arms"][arm]["val_returning_NDCG@10"])
    d = out["sets"]["returning"]["scratch_minus_warm"]["NDCG@10"]
    assert d["difference"] == pytest.approx(out["sets"]["returning"]["scratch"]["NDCG@10"]
                                            - out["sets"]["returning"]["warm"]["NDCG@10"])  # fmt: skip


class Stopped(Exception):
    """A replay stopped mid-step."""


def _stop_at(monkeypatch, arm_folder: str) -> tuple[list[str], list[bool]]:
    """``replay.train_arm`` recording each arm's folder and raising :class:`Stopped` (stands for the
    session's end) at ``arm_folder`` while ``stop[0]``; returns ``(calls, stop)``."""
    monkeypatch.setitem(sys.modules, "replay_scoring", scoring)
    calls, stop = [], [True]
    real = replay.train_arm

    def train_arm(config, prepared):
        calls.append(Path(config.output).name)
        if Path(config.output).name == arm_folder and stop[0]:
            raise Stopped
        return real(config, prepared)

    monkeypatch.setattr(replay, "train_arm", train_arm)
    return calls, stop


def test_a_stopped_replay_resumes_without_training_a_finished_arm_again(replay_dir, monkeypatch):
    calls, stop = _stop_at(monkeypatch, "step-002-warm")
    with pytest.raises(Stopped):
        replay.main(_args(2, ["scratch", "warm", "stale"]))
    first = json.loads((replay_dir / "replay.json").read_text())["runs"]["42"]
    assert [s["step"] for s in first["steps"]] == [1] and set(first["partial"]["arms"]) == {"scratch"}
    calls.clear()
    stop[0] = False
    replay.main(_args(2, ["scratch", "warm", "stale"]))  # the same command
    assert calls == ["step-002-warm"]  # step 0, step 1 and step 2's scratch are not trained again
    done = json.loads((replay_dir / "replay.json").read_text())["runs"]["42"]
    assert [s["step"] for s in done["steps"]] == [1, 2] and done["partial"] is None
    assert done["steps"][0] == first["steps"][0] and done["step0"] == first["step0"]
    assert done["steps"][1]["arms"]["scratch"]["uri"] == first["partial"]["arms"]["scratch"]["uri"]
    # the trend over the 2 steps: the least-squares slope of the per-user warm - scratch NDCG@10 on the step
    x, d = [], []
    for st in json.loads((replay_dir / "replay.per_user.json").read_text())["42"]["steps"]:
        for user, (ndcg, _hr) in st["per_user"]["warm"].items():
            x.append(st["step"])
            d.append(ndcg - st["per_user"]["scratch"][user][0])
    trend = json.loads((replay_dir / "replay.json").read_text())["trend_warm_minus_scratch"]["NDCG@10"]
    assert trend["slope_per_step"] == pytest.approx(np.polyfit(x, d, 1)[0]) and trend["pairs"] == len(x)
    _check_validation_over_steps(replay_dir, monkeypatch, done)


def _check_validation_over_steps(replay_dir, monkeypatch, done) -> None:
    """replay_validation.py on a 2-step replay whose step-2 histories outgrow model.max_len (8): each step's
    figure over all users is the run's own val_NDCG@10 (the last max_len items read, as training validates);
    what it cannot score is refused with one line, exit 2."""
    monkeypatch.setitem(sys.modules, "replay", replay)
    validation = load_benchmark("replay_validation")
    lengths = pl.read_parquet(replay_dir / "work" / "seed-42" / "prepared" / "sequences.parquet")["length"]
    assert lengths.max() > 8 + 2  # a validation history longer than the window
    validation.main(["--model", "warm=replay.json:warm", "--model", "scratch=replay.json:scratch", "--output", "v.json"])
    rows = json.loads((replay_dir / "v.json").read_text())["steps"]
    assert [r["step"] for r in rows] == [1, 2]
    for row, step in zip(rows, done["steps"]):
        for arm in ("warm", "scratch"):
            assert row[f"{arm}_all_NDCG@10"] == pytest.approx(step["arms"][arm]["val_NDCG@10"], abs=1e-4)
    base = ["--model", "warm=replay.json:warm", "--output", "v.json"]
    for bad in (["--model", "stale=replay.json:stale"], ["--model", "s=replay.json:scratch", "--seeds", "7"],
                ["--model", "s=replay.json:scratch", "--output", "nowhere/v.json"]):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            validation.main(base + bad)
        assert exit_.value.code == 2


def test_a_replay_whose_tracking_store_is_gone_starts_the_seed_over(replay_dir, monkeypatch, capsys, new_store):
    """A new checkout keeps the committed JSON but not ``<workdir>`` nor the MLflow store: the unfinished
    seed cannot continue its warm chain, so it starts over (with a line) instead of failing on a lost run."""
    calls, stop = _stop_at(monkeypatch, "step-001-warm")
    with pytest.raises(Stopped):
        replay.main(_args(1, ["scratch", "warm", "stale"]))
    assert calls == ["step-000", "step-001-scratch", "step-001-warm"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(replay_dir / "another.db"))  # the old store is gone
    calls.clear()
    stop[0] = False
    replay.main(_args(1, ["scratch", "warm", "stale"]))
    assert calls == ["step-000", "step-001-scratch", "step-001-warm"]  # every model of the seed again
    assert "this seed starts over" in capsys.readouterr().out
    done = json.loads((replay_dir / "replay.json").read_text())["runs"]["42"]
    assert [s["step"] for s in done["steps"]] == [1] and done["partial"] is None


class _ByIndex(torch.nn.Module):
    """A stand-in ranker: item ``i`` scores ``i`` for every history (higher index = better)."""

    max_context = None
    uses_time_gaps = False

    def __init__(self, n_items: int) -> None:
        super().__init__()
        self.n_items = n_items

    def score(self, history, lengths, gaps=None):
        return torch.arange(self.n_items + 1, dtype=torch.float32).expand(history.shape[0], -1).clone()


def test_a_model_scores_the_next_period_in_its_own_vocabulary_and_misses_what_it_does_not_know(tmp_path):
    import types

    # the step's catalog: items 10..15 (idx 1..6); the stale model knows 10..13 only, numbered otherwise
    items = pl.DataFrame({"item_idx": pl.Series(range(1, 7), dtype=pl.Int32), "item_id": [10, 11, 12, 13, 14, 15],
                          "count": pl.Series([1] * 6, dtype=pl.Int64)})  # fmt: skip
    (tmp_path / "p").mkdir()
    items.write_parquet(tmp_path / "p" / "items.parquet")
    model_items = pl.DataFrame({"item_idx": pl.Series(range(1, 5), dtype=pl.Int32), "item_id": [13, 12, 11, 10],
                                "count": pl.Series([1] * 4, dtype=pl.Int64)})  # fmt: skip
    loaded = types.SimpleNamespace(model=_ByIndex(4), items=model_items)
    examples = pl.DataFrame({
        "user_id": [1, 2, 3, 4],
        "history": [[1], [4, 5], [6], [2, 3]],  # raw 10 | 13, 14 | 15 (unknown only) | 11, 12
        "targets": [[3], [2], [1], [5]],  # raw 12 | 11 | 10 | 14 (unknown)
    }, schema={"user_id": pl.Int64, "history": pl.List(pl.Int32), "targets": pl.List(pl.Int32)})  # fmt: skip
    entry = {10: 0, 11: 0, 12: 0, 13: 0, 14: 1, 15: 1}
    out = scoring.score_model(loaded, tmp_path / "p", examples, entry, step=1)
    # model numbering: 13->1, 12->2, 11->3, 10->4; score = model index. user 1 (seen 10=4): 11 (3) first,
    # 12 (2) second -> rank 2; user 2 (seen 13=1; 14 unknown, dropped): 10 (4), 12 (2), 11 (3): 11 is
    # rank 2 (after 10); user 3: its whole history is unknown: a miss; user 4: target unknown: a miss
    ndcg2 = 1 / np.log2(3)
    assert out["per_user"] == {"1": [pytest.approx(ndcg2), 1.0], "2": [pytest.approx(ndcg2), 1.0],
                               "3": [0.0, 0.0], "4": [0.0, 0.0]}  # fmt: skip
    assert out["unservable"] == 2 and out["NDCG@10"] == pytest.approx(ndcg2 / 2) and out["HR@10"] == 0.5
    assert out["target_kinds"] == {"1": "older", "2": "older", "3": "older", "4": "new_this_period"}
    assert out["by_target_kind"]["new_this_period"] == {"n": 1, "NDCG@10": 0.0, "HR@10": 0.0}
    assert out["top10_share_new"] == 0.0  # the model cannot rank items it does not know


def test_replay_tables_quote_the_json():
    tables = load_benchmark("replay_tables")
    arm = {"NDCG@10": 0.05, "epochs": 9, "train_seconds": 12.4}
    ci = {"difference": -0.0125, "ci95": [-0.05, 0.025], "pairs": 3}
    kinds = {"top10_share_new": 0.00125, "new_this_period": {"n": 0}, "new_earlier": {"n": 2, "HR@10": 0.5, "NDCG@10": 0.25},
             "older": {"n": 1, "HR@10": 1.0, "NDCG@10": 1.0}}  # fmt: skip
    doc = {
        "runs": {"1": {"steps": [{"step": 1, "period_end": "1998-01-05", "new_events": 5395, "new_users": 59,
                                  "new_items": 38, "test_users": 3, "differences": {"warm_minus_scratch": {"NDCG@10": ci}},
                                  "arms": {"scratch": arm, "warm": {**arm, "NDCG@10": 0.0375}, "stale": arm}}]},
                 "3": {"steps": []}},
        "pooled_warm_minus_scratch": {"NDCG@10": ci, "HR@10": ci}, "pooled_warm_minus_stale": {"NDCG@10": ci, "HR@10": ci},
        "warm_over_scratch_train_time": 0.284, "by_target_kind": {a: kinds for a in ("scratch", "warm", "stale")},
    }  # fmt: skip
    assert tables.step_rows(doc)[2] == ("| 1 | 1 | 1998-01-05 | 5,395 / 59 / 38 | 3 | 0.0500 | 0.0375 | 0.0500 "
                                        "| -0.0125 [-0.0500, +0.0250] | 9 / 9 | 12 / 12 |")  # fmt: skip
    assert tables.pooled_line(doc).startswith("Pooled over seeds 1 (3 (seed, step, user) pairs): warm - scratch NDCG@10 -0.0125")
    assert tables.pooled_line(doc).endswith("warm / scratch training time 0.28.")
    doc["trend_warm_minus_scratch"] = {"NDCG@10": {"slope_per_step": -0.00125, "ci95": [-0.004, 0.0015], "pairs": 3}}
    doc["warm_over_scratch_epochs"] = 0.2631
    assert tables.pooled_line(doc).endswith("0.28 (in epochs 0.26); trend of warm - scratch NDCG@10 -0.0013 per step "
                                            "[-0.0040, +0.0015].")  # fmt: skip
    rows = tables.kind_rows(doc)
    assert rows[2] == "| new_this_period | 0 / - | 0 / - | 0 / - |"
    assert rows[3] == "| new_earlier | 2 / 0.500 / 0.2500 | 2 / 0.500 / 0.2500 | 2 / 0.500 / 0.2500 |"
    assert rows[-1] == "| top-10 share of items new this period | 0.0013 | 0.0013 | 0.0013 |"


def test_replay_tables_follow_the_arms_and_comparisons_of_the_json():
    tables = load_benchmark("replay_tables")
    arm = {"NDCG@10": 0.05, "epochs": 9, "train_seconds": 12.4}
    ci = {"difference": -0.0125, "ci95": [-0.05, 0.025], "pairs": 3}
    gain = {"difference": 0.0375, "ci95": [0.0, 0.075], "pairs": 3}
    kinds = {"top10_share_new": None, "new_this_period": {"n": 0}, "new_earlier": {"n": 2, "HR@10": 0.5, "NDCG@10": 0.25},
             "older": {"n": 1, "HR@10": 1.0, "NDCG@10": 1.0}}  # fmt: skip
    arms = ["scratch", "warm", "scratch_features"]  # no stale: a feature replay
    doc = {
        "arms": arms,
        "runs": {"1": {"steps": [{"step": 1, "period_end": "1998-01-05", "new_events": 5395, "new_users": 59,
                                  "new_items": 38, "test_users": 3, "differences": {"warm_minus_scratch": {"NDCG@10": ci}},
                                  "arms": {"scratch": arm, "warm": arm, "scratch_features": {**arm, "NDCG@10": 0.0875}}}]}},
        "pooled_warm_minus_scratch": {"NDCG@10": ci, "HR@10": ci},
        "pooled_scratch_features_minus_scratch": {"NDCG@10": gain, "HR@10": gain},
        "warm_over_scratch_train_time": 0.25, "by_target_kind": {a: kinds for a in arms},
    }  # fmt: skip
    rows = tables.step_rows(doc)
    assert rows[0].startswith("| seed | step | trained on events before | new events / users / items | test users | scratch | warm | scratch_features |")
    assert rows[2].startswith("| 1 | 1 | 1998-01-05 | 5,395 / 59 / 38 | 3 | 0.0500 | 0.0500 | 0.0875 | -0.0125")
    assert rows[1].count("|") == rows[2].count("|")
    assert tables.pooled_line(doc) == (
        "Pooled over seeds 1 (3 (seed, step, user) pairs): warm - scratch NDCG@10 -0.0125 [-0.0500, +0.0250], "
        "HR@10 -0.0125 [-0.0500, +0.0250]; scratch_features - scratch NDCG@10 +0.0375 [+0.0000, +0.0750], "
        "HR@10 +0.0375 [+0.0000, +0.0750]; warm / scratch training time 0.25."
    )
    assert tables.kind_rows(doc)[-1] == "| top-10 share of items new this period | - | - | - |"
    # a replay without scratch: the headline is its first comparison, no training-time ratio
    del doc["pooled_warm_minus_scratch"], doc["warm_over_scratch_train_time"]
    doc["arms"] = ["warm", "scratch_features"]
    doc["runs"]["1"]["steps"][0]["differences"] = {"scratch_features_minus_scratch": {"NDCG@10": gain}}
    rows = tables.step_rows(doc)
    assert rows[0].endswith("| warm | scratch_features | scratch_features - scratch [95 % CI] | epochs warm / scratch_features "
                            "| train s warm / scratch_features |")  # fmt: skip
    assert rows[2].endswith("| 0.0500 | 0.0875 | +0.0375 [+0.0000, +0.0750] | 9 / 9 | 12 / 12 |")
    assert tables.pooled_line(doc) == ("Pooled over seeds 1 (3 (seed, step, user) pairs): scratch_features - scratch "
                                       "NDCG@10 +0.0375 [+0.0000, +0.0750], HR@10 +0.0375 [+0.0000, +0.0750].")  # fmt: skip


@pytest.mark.parametrize("bad", [["--start", "1.5"], ["--start", "0"], ["--period-days", "-3"], ["--period-days", "0"],
                                 ["--steps", "0"], ["--reuse", "scratch"], ["--reuse", "=old.json"],
                                 ["--set", "train.nosuchkey=1"], ["--input", "no-such.parquet"],
                                 ["--period-days", "1000"], ["--period-days", "0.001"]])  # fmt: skip
def test_bad_arguments_are_one_error_line_and_exit_2_before_any_training(replay_dir, monkeypatch, capsys, bad):
    """A bad option, config or log: one ``error:`` line (argparse's usage line above it for an option), exit 2, no
    traceback, nothing trained or written; ``--period-days 1000``: the log holds no step to compare; ``0.001`` (86
    s): a step whose period holds no event (a traceback of the metrics once their step came, verify-s67 D9)."""
    monkeypatch.setattr(replay, "train_arm", lambda *a: pytest.fail("trained despite a bad argument"))
    args = _args(1, ["scratch", "warm", "stale"])
    if bad[0] in ("--start", "--period-days", "--steps", "--input"):  # replace the option's value
        i = args.index(bad[0])
        args[i + 1] = bad[1]
    else:
        args += bad
    with pytest.raises(SystemExit) as stopped:
        replay.main(args)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len([line for line in err.splitlines() if "error:" in line]) == 1, err
    assert not (replay_dir / "replay.json").exists() and not (replay_dir / "work").exists()


def test_a_half_made_workdir_store_is_one_error_line_and_exit_2_and_kept(replay_dir, monkeypatch, capsys):
    """``<workdir>/mlflow.db`` left half-made by a kill during its creation in place (break-daily-s67 finding 1):
    one line naming it, exit 2, the file kept; the replay's own store is created complete or not at all
    (tests/test_tracking_store_setup.py)."""
    from stopped_store import kill_during_migration

    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # the replay's default store: <workdir>/mlflow.db
    monkeypatch.setattr(replay, "train_arm", lambda *a: pytest.fail("trained on a half-made store"))
    kill_during_migration(replay_dir / "work", "old", "batch")
    store = replay_dir / "work" / "mlflow.db"
    before = store.read_bytes()
    with pytest.raises(SystemExit) as stopped:
        replay.main(_args(1, ["scratch", "warm", "stale"]))
    assert stopped.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"error: the MLflow store {store} is half-made: "), err
    assert "it holds no runs, experiments or models: delete it and run again" in err[0]
    assert store.read_bytes() == before and not (replay_dir / "replay.json").exists()


def test_a_default_output_beside_a_committed_replay_goes_under_runs():
    """replay_popularity / prior / horizon / cold without --output: beside the replay, except for a replay in
    docs/results/ (the committed figures), whose files go to runs/ of the checkout under the same name."""
    committed = replay.RESULTS / "replay-ml100k.json"
    assert replay.default_output(committed, ".popularity.json") == REPO / "runs" / "replay-ml100k.popularity.json"
    assert replay.default_output(Path("runs/r.json"), ".prior.json") == Path("runs/r.prior.json")


def test_a_reused_arm_is_taken_from_the_earlier_replay_without_training(replay_dir, monkeypatch):
    """``--reuse scratch=OLD.json``: after a change of train.warm only, the scratch arm of every step is the
    earlier replay's record (not trained, not scored); the comparisons are computed with it."""
    calls, stop = _stop_at(monkeypatch, "never")
    replay.main(_args(1, ["scratch", "warm", "stale"], output="old.json"))
    assert "step-001-scratch" in calls
    calls.clear()
    replay.main([*_args(1, ["scratch", "warm", "stale"], output="new.json"), "--reuse", "scratch=old.json"])
    assert "step-001-scratch" not in calls and "step-001-warm" in calls
    old = json.loads((replay_dir / "old.per_user.json").read_text())["42"]["steps"][0]
    new = json.loads((replay_dir / "new.per_user.json").read_text())["42"]["steps"][0]
    assert new["arms"]["scratch"] == old["arms"]["scratch"] and new["per_user"]["scratch"] == old["per_user"]["scratch"]
    assert "warm_minus_scratch" in new["differences"]
    with pytest.raises(SystemExit):  # the warm chain cannot be reused
        replay.main([*_args(1, ["scratch", "warm", "stale"], output="x.json"), "--reuse", "warm=old.json"])
    calls.clear()  # a seed the earlier replay lacks trains its scratch arm; seed 42 still takes the old one
    replay.main([*_args(1, ["scratch", "warm", "stale"], output="more.json"), "--seeds", "42", "43",
                 "--reuse", "scratch=old.json"])  # fmt: skip
    assert calls.count("step-001-scratch") == 1 and calls.count("step-001-warm") == 2
    more = json.loads((replay_dir / "more.per_user.json").read_text())
    assert more["42"]["steps"][0]["per_user"]["scratch"] == old["per_user"]["scratch"]
    assert set(more["43"]["steps"][0]["per_user"]["scratch"]) == set(more["43"]["steps"][0]["per_user"]["warm"])


def test_the_gated_chain_serves_and_warm_starts_from_the_model_the_gate_keeps(replay_dir, monkeypatch):
    """``--gate``: the warm chain is the daily pipeline's. With a margin no model beats, every warm model is
    rejected: the served model stays the step-0 champion (warm and stale rank alike), and step 2 warm-starts
    from it, not from step 1's rejected model; with every model promoted, the chain is the ungated one."""
    calls, _ = _stop_at(monkeypatch, "never")
    inits, patched = {}, replay.train_arm

    def train_arm(config, prepared):
        inits[(config.tracking.promotion_margin, Path(config.output).name)] = config.train.init_from
        return patched(config, prepared)

    monkeypatch.setattr(replay, "train_arm", train_arm)
    replay.main([*_args(2, ["warm", "stale"], output="kept.json"), "--gate", "--set", "tracking.promotion_margin=1"])
    result = json.loads((replay_dir / "kept.json").read_text())
    run = json.loads((replay_dir / "kept.per_user.json").read_text())["42"]
    assert result["gate"] is True
    step0 = run["step0"]["uri"]
    for step in run["steps"]:
        warm = step["arms"]["warm"]
        assert warm["gate"]["promoted"] is False and "does not beat champion" in warm["gate"]["reason"]
        assert warm["uri"] == step["arms"]["stale"]["uri"] == step0 != warm["candidate_uri"]
        assert step["per_user"]["warm"] == step["per_user"]["stale"]
        assert step["differences"]["warm_minus_stale"]["NDCG@10"] == {"difference": 0.0, "ci95": [0.0, 0.0],
                                                                      "pairs": step["test_users"]}  # fmt: skip
        assert 0 <= warm["gate"]["champion"] <= 1 and warm["gate"]["new"] - warm["gate"]["champion"] <= 1
    assert inits[(1.0, "step-002-warm")] == step0  # the champion kept at step 1
    # the gate's value of the new model: its validation NDCG@10, the whole history read as the gate and `score` read
    # it (training validates on the last model.max_len items), scored here another way (replay_scoring)
    from pipelines.promotion import validation_examples
    from recsys_alibi.data.prepare import read_sequences
    from recsys_alibi.evaluation.metrics import per_user_metrics
    from recsys_alibi.tracking import load_ranker

    last = run["steps"][-1]["arms"]["warm"]
    loaded = load_ranker(last["candidate_uri"])
    examples = validation_examples(read_sequences(replay_dir / "work" / "seed-42" / "prepared"))
    ranks, _ = scoring.rank_examples(loaded, examples)
    assert last["gate"]["new"] == pytest.approx(float(np.mean(per_user_metrics(ranks, [10])["NDCG@10"])), abs=1e-6)

    # the prior on the gated chain: its served model may be of an earlier step's catalog (the champion kept), and
    # with the same choice it ranks as the stale arm does at every step
    monkeypatch.setitem(sys.modules, "replay", replay)
    load_benchmark("replay_prior").main(["kept.json", "--output", "kept.prior.json"])
    gated = json.loads((replay_dir / "kept.prior.json").read_text())["prior_minus_stale_with_prior"]["NDCG@10"]
    assert (gated["difference"], gated["ci95"]) == (0.0, [0.0, 0.0])

    # every model promoted (the margin no longer goes below 0, where a worse model was promoted): the gate, told so
    gate = replay.gate_record
    monkeypatch.setattr(replay, "gate_record", lambda *args: {**gate(*args), "promoted": True})
    replay.main([*_args(2, ["warm", "stale"], output="moved.json"), "--gate", "--workdir", "work-moved"])
    run = json.loads((replay_dir / "moved.per_user.json").read_text())["42"]
    for step in run["steps"]:
        assert step["arms"]["warm"]["gate"]["promoted"] is True
        assert step["arms"]["warm"]["uri"] == step["arms"]["warm"]["candidate_uri"]
    assert inits[(0.0, "step-002-warm")] == run["steps"][0]["arms"]["warm"]["uri"] == run["steps"][1]["arms"]["stale"]["uri"]


def test_feature_arms_keep_the_configured_feature_settings_and_id_only_arms_drop_them(tmp_path):
    from recsys_alibi.config import load_config

    config = load_config(REPO / "configs" / "default.yaml", [
        "model.item_features.enabled=true", "model.item_features.id_dropout=0.5", "model.item_features.id_min_events=3",
        "train.init_from=champion"])  # fmt: skip
    for arm in replay.ARMS:
        got = replay.arm_config(config, arm, tmp_path / arm, "runs:/parent/model").model.item_features
        if arm in replay.FEATURE_ARMS:
            assert (got.enabled, got.id_dropout, got.id_min_events) == (True, 0.5, 3)
        else:
            assert (got.enabled, got.id_dropout, got.id_min_events) == (False, 0.0, 0)


def test_the_prior_is_chosen_on_earlier_periods_only():
    prior = load_benchmark("replay_prior", "replay_prior_alone")
    g = len(prior.GRID)
    step = lambda best, value: {"u": np.array([[value if i == best else 0.0, 0.0] for i in range(g)])}  # noqa: E731
    chain = [step(5, 1.0), step(7, 1.0), step(7, 1.0), step(2, 9.0)]  # model k's values on its own next period
    # step 1 sees chain[0] only; step 2 chain[0..1] (a tie of 5 and 7: the first); step 3 chain[0..2]: 7.
    # chain[3] (the figure step 3 is read on) never chooses
    assert prior.walk_forward(chain, list(range(g))) == [5, 5, 7]
    assert prior.walk_forward(chain, [1, 2, 3]) == [1, 1, 1]  # among the allowed points only (all 0: the first)


def test_ctrl_c_or_kill_during_training_says_how_to_resume_and_exits_130_or_143(replay_dir, monkeypatch, capsys, caplog):
    """SIGINT and SIGTERM delivered while Lightning trains an arm: one line on stderr naming the step the same
    command resumes from, exit code 128 + the signal; the same command then finishes the replay. A warm arm's
    "new items imprinted" line is said once (not again as its row movement rebuilds the initial rows)."""
    import logging
    import os
    import signal

    import lightning as L

    import pipelines.train

    monkeypatch.setitem(sys.modules, "replay_scoring", scoring)
    kill = {}  # arm folder -> (signal, the epoch (0-based) as which it is sent)

    class Kill(L.Callback):
        def __init__(self, sig, epoch):
            self.sig, self.epoch = sig, epoch

        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == self.epoch:
                os.kill(os.getpid(), self.sig)

    real = pipelines.train.training_callbacks

    def training_callbacks(config):
        sig = kill.pop(Path(config.output).name, None)
        return real(config) + ([Kill(*sig)] if sig else [])

    monkeypatch.setattr(pipelines.train, "training_callbacks", training_callbacks)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    caplog.set_level(logging.INFO, logger="pipelines.init_from")
    # step 1's new items (the late users' own) chosen early in its period by 10 earlier users as well: contexts
    # of known items, from which the warm arm imprints their rows (train.warm.new_item_rows: context)
    log = _log()
    start = replay.boundaries(log["timestamp"].to_numpy(), 0.5, 14)[0]
    chosen = pl.DataFrame({"user_id": range(0, 40, 4), "item_id": [101 + u % 10 for u in range(0, 40, 4)],
                           "timestamp": [start + 3600 + u for u in range(0, 40, 4)]})  # fmt: skip
    pl.concat([log, chosen.cast(log.schema)]).write_parquet(replay_dir / "log.parquet")
    args = [*_args(1, ["warm"]), "--set", "train.warm.max_epochs=2"]  # the warm arm killed after its first epoch
    for folder, sig, epoch, code, step in (("step-000", signal.SIGINT, 0, 130, 0),
                                           ("step-001-warm", signal.SIGTERM, 1, 143, 1)):  # fmt: skip
        kill[folder] = sig, epoch
        with pytest.raises(SystemExit) as exit_:
            replay.main(args)
        assert exit_.value.code == code
        out, err = capsys.readouterr()
        assert err.splitlines()[-1] == f"interrupted; re-run the same command to resume from step {step}"
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # restored
    replay.main(args)  # the same command: step 1's warm arm resumes from its checkpoint
    done = json.loads((replay_dir / "replay.json").read_text())["runs"]["42"]
    assert [s["step"] for s in done["steps"]] == [1] and done["partial"] is None
    assert done["steps"][0]["arms"]["warm"]["resumed"] is True
    imprinted = [r for r in caplog.records if "new items imprinted" in r.getMessage()]
    assert len(imprinted) == 1  # as step 1's warm arm started (before its kill); its resume imprints nothing
