"""``score --changed-since``: unchanged users keep their rows, the output equals a full re-score, a kill resumes."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from serving_fixtures import Killed, kill_at, read_rankings, score_config, snapshot, tiny_model, vocabulary, write_prepared

from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.loader import FlatSequences
from serving.changed import history_fingerprints
from serving.inputs import Shard
from serving.score import score_with_model

N_USERS = 100


def _changed_input(prepared: Path, out: Path, share: float, new_users: int = 0) -> tuple[Path, set[str]]:
    """A copy of ``prepared`` where ``share`` of the users got one more event (and ``new_users`` appear)."""
    seq = pl.read_parquet(prepared / schema.SEQUENCES_FILE)
    rng = np.random.default_rng(7)
    picked = set(rng.choice(seq[schema.USER_ID].to_numpy(), round(share * seq.height), replace=False).tolist())
    hit = pl.col(schema.USER_ID).is_in(list(picked))
    seq = seq.with_columns(
        pl.when(hit).then(pl.col(schema.ITEM_IDX).list.concat(pl.lit([5], dtype=pl.List(pl.Int32)))).otherwise(pl.col(schema.ITEM_IDX)),
        pl.when(hit).then(pl.col(schema.TIMESTAMP).list.concat(pl.lit([10_000], dtype=pl.List(pl.Int64))))
        .otherwise(pl.col(schema.TIMESTAMP)),
    ).with_columns(pl.col(schema.ITEM_IDX).list.len().cast(pl.Int32).alias(schema.LENGTH))  # fmt: skip
    if new_users:
        extra = seq.head(new_users).with_columns((pl.lit("new-") + pl.col(schema.USER_ID)).alias(schema.USER_ID))
        seq = pl.concat([seq, extra])
    out.mkdir(parents=True)
    seq.write_parquet(out / schema.SEQUENCES_FILE)
    vocabulary().write_parquet(out / schema.ITEMS_FILE)
    return out, picked


def _score(input_path: Path, out: Path, seed: int = 0, **score):
    config = score_config(shard_users=30, **score)
    return score_with_model(config, tiny_model(seed=seed), vocabulary(), input_path, out, progress=False)


@pytest.fixture
def previous(tmp_path) -> tuple[Path, Path]:
    """A prepared dir of 100 users and its complete rankings."""
    prepared = write_prepared(tmp_path / "prepared", n_users=N_USERS)
    _score(prepared, tmp_path / "previous")
    return prepared, tmp_path / "previous"


@pytest.mark.parametrize(("share", "new_users"), [(0.0, 0), (0.05, 3), (1.0, 3)])
def test_changed_only_output_equals_a_full_rescore(previous, tmp_path, share, new_users):
    prepared, before = previous
    new_input, picked = _changed_input(prepared, tmp_path / "new", share, new_users=new_users)
    full = _score(new_input, tmp_path / "full")
    delta = _score(new_input, tmp_path / "delta", changed_since=str(before))
    users = N_USERS + new_users
    assert (delta.users, delta.rows, delta.skipped_users) == (full.users, full.rows, full.skipped_users) == (users, full.rows, 0)
    assert delta.carried_users == N_USERS - len(picked) and full.carried_users == 0
    got, expected = read_rankings(tmp_path / "delta"), read_rankings(tmp_path / "full")
    assert got.equals(expected)  # scores too: a user's bits do not depend on who shares its batch (serving.rank)
    unchanged = pl.col(schema.USER_ID).is_in(list(picked)).not_() & pl.col(schema.USER_ID).str.starts_with("new-").not_()
    assert got.filter(unchanged).equals(read_rankings(before).filter(unchanged))  # carried rows, byte for byte
    parts = sorted(p.name for p in (tmp_path / "full").glob("part-*.parquet"))
    assert parts and parts == sorted(p.name for p in (tmp_path / "delta").glob("part-*.parquet"))
    for name in parts:  # byte for byte, file by file
        assert (tmp_path / "delta" / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name
    assert (f"carried over (history unchanged since the previous output): {delta.carried_users} users; ranked again: "
            f"{users - delta.carried_users}" in delta.summary())
    # nobody carried over: the summary says why (it said nothing)
    assert ("every user's history, its new items or the items the input's k-core withholds differ from the previous "
            "output's" in delta.summary()) == (share == 1)
    assert "carried over" not in full.summary()


def test_another_model_ranks_everybody_again(previous, tmp_path):
    prepared, before = previous
    new_input, _ = _changed_input(prepared, tmp_path / "new", 0.05)
    full = _score(new_input, tmp_path / "full", seed=1)
    delta = _score(new_input, tmp_path / "delta", seed=1, changed_since=str(before))
    assert delta.carried_users == 0 and delta.users_scored == N_USERS
    assert read_rankings(tmp_path / "delta").equals(read_rankings(tmp_path / "full"))
    other_k = _score(new_input, tmp_path / "k5", k=5, changed_since=str(before))  # a setting that changes rows
    assert other_k.carried_users == 0


def test_killed_changed_only_run_rerun_equals_an_uninterrupted_one(previous, tmp_path):
    prepared, before = previous
    new_input, _ = _changed_input(prepared, tmp_path / "new", 0.05, new_users=2)
    _score(new_input, tmp_path / "clean", changed_since=str(before))
    for point, shard in (("written", 1), ("recorded", 2)):
        out = tmp_path / f"killed-{point}"
        with pytest.raises(Killed):
            score_with_model(score_config(shard_users=30, changed_since=str(before)), tiny_model(), vocabulary(),
                             new_input, out, progress=False, hook=kill_at(point, shard))  # fmt: skip
        _score(new_input, out, changed_since=str(before))
        assert snapshot(out) == snapshot(tmp_path / "clean")  # parts, fingerprints, manifest: byte for byte


def test_changed_since_refuses_what_is_not_a_finished_output(previous, tmp_path):
    prepared, before = previous
    with pytest.raises(DataError, match="nowhere: no such folder"):
        _score(prepared, tmp_path / "a", changed_since=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not a complete scoring output"):
        _score(prepared, tmp_path / "b", changed_since=str(tmp_path / "empty"))
    with pytest.raises(DataError, match="is the output itself"):
        _score(prepared, before, changed_since=str(before))


def _shard(histories: list[list[int]], gaps: list[list[int]] | None = None, ids: list[str] | None = None) -> Shard:
    def flat(rows):
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        return FlatSequences(values=np.array([v for r in rows for v in r], dtype=np.int64), offsets=offsets)

    users = pl.Series(schema.USER_ID, ids or [f"u{i}" for i in range(len(histories))])
    return Shard(user_ids=users, histories=flat(histories), unknown_events=0, gaps=None if gaps is None else flat(gaps))


def test_history_fingerprint_changes_with_any_item_order_or_gap_and_only_then():
    base = [[1, 2, 3], [1, 2, 3], [3, 2, 1], [1, 2, 3, 4], [1, 2], [], [7]]
    h = history_fingerprints(_shard(base))["history"].to_list()
    assert h[0] == h[1] and len(set(h[1:])) == 6  # same history, same print; order, an added or removed event: another
    again = history_fingerprints(_shard([[7], [1, 2, 3]], ids=["x", "y"]))["history"].to_list()
    assert again == [h[6], h[0]]  # independent of the user, its position and the shard
    timed = history_fingerprints(_shard([[1, 2], [1, 2]], gaps=[[0, 3], [0, 4]]))["history"].to_list()
    assert timed[0] != timed[1] and h[4] not in timed
    # a new item (ranked from its features) in the input history, and the items withheld from everybody: both change it
    from dataclasses import replace

    plain = _shard([[1, 2], [1, 2]])
    new_seen = replace(plain, new_seen=_shard([[9], []]).histories)
    with_new = history_fingerprints(new_seen)["history"].to_list()
    assert with_new[0] != with_new[1] and with_new[0] != h[4]
    assert with_new[1] == h[4]  # no new item in its history: the print it has when no input holds one
    held = history_fingerprints(plain, np.array([11, 12]))["history"].to_list()
    assert held[0] == held[1] != h[4] and history_fingerprints(plain, np.array([12, 11]))["history"].to_list() == held


def test_previous_output_of_another_user_id_type_ranks_everybody(previous, tmp_path):
    """Integer user ids before, text ids now (same model and settings): no user is carried, no Polars error."""
    prepared, _ = previous
    seq = pl.read_parquet(prepared / schema.SEQUENCES_FILE)
    (tmp_path / "ints").mkdir()
    seq.with_columns(pl.int_range(pl.len()).alias(schema.USER_ID)).write_parquet(tmp_path / "ints" / schema.SEQUENCES_FILE)
    vocabulary().write_parquet(tmp_path / "ints" / schema.ITEMS_FILE)
    _score(tmp_path / "ints", tmp_path / "before-ints")
    delta = _score(prepared, tmp_path / "delta", changed_since=str(tmp_path / "before-ints"))
    assert (delta.carried_users, delta.users_scored) == (0, N_USERS)
    assert read_rankings(tmp_path / "delta").equals(read_rankings(tmp_path / "previous"))


@pytest.mark.parametrize(("key", "value"), [("attention_backend", "eager"),
                                            ("catalog_chunk", 11), ("device", "cpu")])  # fmt: skip
def test_rows_of_another_bit_changing_setting_are_never_reused(previous, tmp_path, key, value):
    """Issue 41, defect 4: rows scored with sdpa were carried into an eager (or flex) run, which then
    differed from a full re-score in 146 of 250 rows (flex too). Now a changed setting ranks everybody, and the
    output equals a full re-score byte for byte (device=cpu vs the fixture's cpu: the same, so carried)."""
    prepared, before = previous
    new_input, picked = _changed_input(prepared, tmp_path / "new", 0.05)
    full = _score(new_input, tmp_path / "full", **{key: value})
    delta = _score(new_input, tmp_path / "delta", changed_since=str(before), **{key: value})
    carried = N_USERS - len(picked) if key == "device" else 0
    assert (delta.carried_users, full.carried_users) == (carried, 0)
    for name in sorted(p.name for p in (tmp_path / "full").glob("part-*.parquet")):
        assert (tmp_path / "delta" / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name


def test_same_weights_with_another_model_config_ranks_everybody(previous, tmp_path):
    """The model's config is not in its weights (a sliding window changes every row, same digest)."""
    prepared, before = previous
    new_input, _ = _changed_input(prepared, tmp_path / "new", 0.05)
    config = score_config(shard_users=30, changed_since=str(before))
    windowed = tiny_model(window=3)
    delta = score_with_model(config, windowed, vocabulary(), new_input, tmp_path / "delta", progress=False)
    full = score_with_model(score_config(shard_users=30), tiny_model(window=3), vocabulary(), new_input,
                            tmp_path / "full", progress=False)  # fmt: skip
    assert delta.carried_users == 0 and read_rankings(tmp_path / "delta").equals(read_rankings(tmp_path / "full"))
    assert not read_rankings(tmp_path / "full").equals(read_rankings(before))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGES = {
    "empty _fingerprints/": lambda before: [p.unlink() for p in (before / "_fingerprints").iterdir()],
    "truncated part file": lambda before: _truncate(before / "part-00001.parquet"),
    "deleted part file": lambda before: (before / "part-00002.parquet").unlink(),
    "truncated fingerprints": lambda before: _truncate(before / "_fingerprints" / "part-00000.parquet"),
    "part file of another shard": lambda before: (before / "part-00000.parquet").write_bytes(
        (before / "part-00003.parquet").read_bytes()),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_previous_output_ranks_everybody_saying_why(previous, tmp_path, damage, caplog):
    """Issue 41, defect 6: a damaged previous output was a Polars traceback or a raw OS message, and left a
    stray _manifest.json. Now the damage is found before any work and every user is ranked (logged)."""
    prepared, before = previous
    new_input, _ = _changed_input(prepared, tmp_path / "new", 0.05)
    DAMAGES[damage](before)
    full = _score(new_input, tmp_path / "full")
    with caplog.at_level("WARNING", logger="serving.changed"):
        delta = _score(new_input, tmp_path / "delta", changed_since=str(before))
    assert (delta.carried_users, delta.users_scored, delta.rows) == (0, N_USERS, full.rows)
    assert read_rankings(tmp_path / "delta").equals(read_rankings(tmp_path / "full"))
    assert [r.getMessage() for r in caplog.records if "every user is ranked" in r.getMessage()]
    assert {p.name for p in (tmp_path / "delta").iterdir()} == {p.name for p in (tmp_path / "full").iterdir()}


def test_previous_output_damaged_while_the_job_runs_is_one_line(previous, tmp_path):
    """A file that breaks after the check (between the carry-over's check and its read): one line, exit 2."""
    prepared, before = previous
    new_input, _ = _changed_input(prepared, tmp_path / "new", 0.05)

    def damage(point: str, shard: int) -> None:
        if point == "staged":
            _truncate(before / "_fingerprints" / "part-00003.parquet")

    config = score_config(shard_users=30, changed_since=str(before))
    with pytest.raises(DataError, match=r"^--changed-since .*previous: cannot read it \(.*\); score without --changed-since"):
        score_with_model(config, tiny_model(), vocabulary(), new_input, tmp_path / "delta", progress=False, hook=damage)
    (before / "_manifest.json").write_text("{")
    with pytest.raises(DataError, match="_manifest.json is not valid JSON; give the output directory of a finished"):
        _score(new_input, tmp_path / "other", changed_since=str(before))
    assert not (tmp_path / "other").exists()


def test_every_identity_setting_is_compared_a_new_one_too(previous, tmp_path, monkeypatch):
    """The reuse identity is every entry of the job identity but where the input lies and how the model
    was named: a setting added to ShardRanker.settings later (e.g. the new items' table) ranks everybody
    when it changes, with no list to keep in step."""
    from serving.rank import ShardRanker

    prepared, before = previous
    new_input, picked = _changed_input(prepared, tmp_path / "new", 0.05)
    settings = ShardRanker.settings
    monkeypatch.setattr(ShardRanker, "settings", lambda self: {**settings(self), "a_future_setting": 1})
    assert _score(new_input, tmp_path / "delta", changed_since=str(before)).carried_users == 0
    moved = tmp_path / "moved-input"
    new_input.rename(moved)  # another path and file times, the same histories: still carried
    again = _score(moved, tmp_path / "again", changed_since=str(tmp_path / "delta"))
    assert again.carried_users == N_USERS and again.users_scored == N_USERS


def test_with_a_popularity_prior_nothing_is_carried_to_another_input(previous, tmp_path, caplog):
    """The prior moves every user's scores with the input's counts, so an unchanged history is no reason to keep
    a row; on the same input (a resumed or repeated job) the rows are carried. The log names the one setting
    that moved (the counts' input), not the whole prior."""
    prepared, _ = previous
    prior = {"popularity_prior": {"weight": 2.0, "half_life_days": 1e-4}}
    before = _score(prepared, tmp_path / "before", **prior)
    new_input, _ = _changed_input(prepared, tmp_path / "new", 0.05)
    full = _score(new_input, tmp_path / "full", **prior)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="serving.changed"):
        delta = _score(new_input, tmp_path / "delta", changed_since=str(tmp_path / "before"), **prior)
    said = [r.getMessage() for r in caplog.records if "every user is ranked" in r.getMessage()]
    assert said == [f"--changed-since {tmp_path / 'before'}: popularity_prior.counts_of changed, so every user is ranked"]
    assert before.carried_users == 0 and delta.carried_users == 0 and delta.users_scored == N_USERS
    assert read_rankings(tmp_path / "delta").equals(read_rankings(tmp_path / "full"))
    assert not read_rankings(tmp_path / "full").equals(read_rankings(tmp_path / "before"))
    again = _score(prepared, tmp_path / "again", changed_since=str(tmp_path / "before"), **prior)
    assert again.carried_users == N_USERS  # the same input and prior: every row kept
