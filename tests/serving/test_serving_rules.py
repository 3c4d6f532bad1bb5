"""Business rules (score.allow / score.deny): never a denied item, only allowed ones, unknown ids counted.

The reference: the same model's full ranking (K = N, no rules), filtered by the rules in Polars and
cut to K. The rule run must give exactly those rows (same batches, so the same scores, bit for bit).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from engine_fixtures import SPELLED, assert_same_rankings, check_spelled_rules, raw_histories, spelled_prepared, user_7_rules
from serving_fixtures import N_ITEMS, read_rankings, score_config, tiny_model, vocabulary

from recsys_alibi.config import ScoreConfig
from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from serving.pyfunc import RankerPyfunc, rules_config
from serving.rules import ItemMask
from serving.score import score_with_model

K = 10
USERS = [f"u{u:03d}" for u in range(23)]


def _write(path: Path, frame: pl.DataFrame) -> str:
    frame.write_parquet(path)
    return str(path)


def _per_user(path: Path, seed: int, size: int, skip: set[str] = frozenset(), as_text: bool = False) -> str:
    """``size`` random raw item ids (1001..1030) per user (users in ``skip`` have no row), plus an unknown id."""
    rng = np.random.default_rng(seed)
    rows = [(u, int(1000 + i)) for u in USERS if u not in skip for i in rng.choice(np.arange(1, N_ITEMS + 1), size, replace=False)]
    rows.append(("u002", 99_999))  # the model does not know it
    frame = pl.DataFrame(rows, schema={schema.USER_ID: pl.String, schema.ITEM_ID: pl.Int64}, orient="row")
    if as_text:
        frame = frame.with_columns(pl.col(schema.ITEM_ID).cast(pl.String))
    return _write(path, frame)


def _global(path: Path, ids: list[int]) -> str:
    return _write(path, pl.DataFrame({schema.ITEM_ID: pl.Series(ids, dtype=pl.Int64)}))


def _reference(full: pl.DataFrame, allow: str | None, deny: str | None, k: int = K) -> pl.DataFrame:
    """The rows ``full`` (every item ranked) keeps under the rules, first ``k`` per user, ranks renumbered."""
    rows = full.with_columns(pl.col(schema.ITEM_ID).cast(pl.String).alias("_id"))
    for path, how in ((allow, "semi"), (deny, "anti")):
        if path is None:
            continue
        rules = pl.read_parquet(path).with_columns(pl.col(schema.ITEM_ID).cast(pl.String).alias("_id")).drop(schema.ITEM_ID)
        on = ["_id"] + ([schema.USER_ID] if schema.USER_ID in rules.columns else [])
        rows = rows.join(rules.select(on), on=on, how=how)
    rows = rows.sort(schema.USER_ID, schema.RANK).with_columns(
        pl.int_range(1, pl.len() + 1, dtype=pl.Int32).over(schema.USER_ID).alias(schema.RANK))
    return rows.filter(pl.col(schema.RANK) <= k).drop("_id")


def _score(prepared: Path, out: Path, **score):
    return score_with_model(score_config(**score), tiny_model(), vocabulary(), prepared, out, progress=False)


@pytest.mark.parametrize("case", ["global_deny_per_user_allow", "per_user_deny_global_allow"])
def test_rankings_never_hold_a_denied_item_and_only_allowed_ones(prepared, tmp_path, case):
    if case == "global_deny_per_user_allow":  # u001 has no allow row: allowed nothing
        deny = _global(tmp_path / "deny.parquet", list(range(1001, 1011)) + [99_998])
        allow = _per_user(tmp_path / "allow.parquet", seed=3, size=8, skip={"u001"}, as_text=True)
    else:
        deny = _per_user(tmp_path / "deny.parquet", seed=4, size=6)
        allow = _global(tmp_path / "allow.parquet", list(range(1005, 1025)))
    _score(prepared, tmp_path / "full", k=N_ITEMS)
    result = _score(prepared, tmp_path / "ruled", allow=allow, deny=deny)
    got, expected = read_rankings(tmp_path / "ruled"), _reference(read_rankings(tmp_path / "full"), allow, deny)
    assert got.equals(expected)  # same rows and bit-identical scores
    assert got.group_by(schema.USER_ID).len()["len"].min() < K  # some users have fewer than K allowed items
    if case == "global_deny_per_user_allow":
        assert "u001" not in got[schema.USER_ID].to_list()
        skipped = pl.read_parquet(tmp_path / "ruled" / "_skipped" / "*.parquet")
        assert skipped.filter(pl.col(schema.USER_ID) == "u001")["reason"].to_list() == ["every_item_excluded"]
        assert result.rules == {"allow_rows": 22 * 8 + 1, "allow_unknown_items": 1, "allow_unknown_rows": 1,
                                "allow_absent_user_rows": 0, "deny_rows": 11, "deny_unknown_items": 1,
                                "deny_unknown_rows": 1}  # fmt: skip
        assert "rules: allow 177 rows (1 unknown item ids, 1 rows dropped); deny 11 rows" in result.summary()


def test_pyfunc_applies_the_rules_of_its_model_config_like_score(prepared, tmp_path):
    deny = _per_user(tmp_path / "deny.parquet", seed=5, size=5)
    allow = _global(tmp_path / "allow.parquet", list(range(1003, 1027)))
    config = score_config(allow=allow, deny=deny, shard_users=25)
    score_with_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "out", progress=False)
    pyfunc = RankerPyfunc(tiny_model(), vocabulary(), config.score.model_copy(update={"allow": None, "deny": None}))
    plain = pyfunc.predict_polars(raw_histories(prepared), {"k": K})
    with_rules = RankerPyfunc(tiny_model(), vocabulary(), config.score)
    ruled = with_rules.predict_polars(raw_histories(prepared), {"k": K})
    assert_same_rankings(ruled, read_rankings(tmp_path / "out"))
    assert with_rules.rule_stats["deny_unknown_items"] == 1 and with_rules.rule_stats["deny_rows"] == 23 * 5 + 1
    assert not plain.equals(ruled)
    assert rules_config({"allow": allow}).allow == allow
    with pytest.raises(DataError, match=r"pyfunc model_config: unknown \[.alow.\]"):
        rules_config({"alow": allow})


def test_registered_pyfunc_takes_rule_files_from_model_config(prepared, tmp_path, mlflow_store):
    import mlflow

    from recsys_alibi.config import TrackingConfig
    from recsys_alibi.tracking import log_ranker, setup_tracking
    from serving.pyfunc import pyfunc_flavour

    deny = _global(tmp_path / "deny.parquet", [1001, 1002, 1003, 1004])
    setup_tracking(TrackingConfig())
    with mlflow.start_run():
        logged = log_ranker(tiny_model(), vocabulary(), None, tmp_path / "w",
                            pyfunc=pyfunc_flavour(tiny_model(), vocabulary(), k=K))  # fmt: skip
    model = mlflow.pyfunc.load_model(logged.uri, model_config={"deny": deny})
    got = pl.from_pandas(model.predict(raw_histories(prepared).to_pandas(), params={"k": K}))
    assert not set(got[schema.ITEM_ID].to_list()) & {1001, 1002, 1003, 1004}
    _score(prepared, tmp_path / "out", deny=deny, shard_users=25, batch_size=256, catalog_chunk=65_536)
    assert_same_rankings(got, read_rankings(tmp_path / "out"))


def test_item_mask_blocks_denied_and_unallowed_columns_in_every_chunk():
    torch.manual_seed(0)
    scores = torch.randn(3, 12)
    deny_global = torch.zeros(12, dtype=torch.bool)
    deny_global[[2, 7]] = True
    allow_user = torch.tensor([[1, 2, 3, 9, 0], [4, 5, 0, 0, 0], [0, 0, 0, 0, 0]])  # user 2: nothing allowed
    mask = ItemMask(global_columns={"deny": deny_global}, per_user={"allow": allow_user})
    expected = torch.full_like(scores, float("-inf"))
    for b, items in enumerate(([1, 3, 9], [4, 5], [])):  # allowed and not denied
        expected[b, items] = scores[b, items]
    assert torch.equal(mask.apply(scores), expected)
    chunks = torch.cat([mask.apply(scores[:, s : s + 5], offset=s) for s in range(0, 12, 5)], dim=1)
    assert torch.equal(chunks, expected)


def test_bad_rule_files_are_one_line_errors(prepared, tmp_path):
    no_items = _write(tmp_path / "a.parquet", pl.DataFrame({schema.USER_ID: ["u001"], "item": [1001]}))
    floats = _write(tmp_path / "b.parquet", pl.DataFrame({schema.ITEM_ID: [1001.0]}))
    nulls = _write(tmp_path / "c.parquet", pl.DataFrame({schema.USER_ID: ["u001", None], schema.ITEM_ID: [1001, 1002]}))
    for path, message in ((no_items, "no item_id column"), (floats, "item_id is Float64"),
                          (nulls, "1 rows with a null user_id"),
                          (str(tmp_path / "none.parquet"), "score.deny rule file not found")):  # fmt: skip
        with pytest.raises(DataError, match=message):
            _score(prepared, tmp_path / "out", deny=path)
    assert ScoreConfig(allow="x.parquet").allow == "x.parquet"


def test_csv_and_tsv_rule_files_rank_as_their_parquet_copies(prepared, tmp_path):
    deny = _global(tmp_path / "deny.parquet", list(range(1001, 1011)) + [99_998])
    allow = _per_user(tmp_path / "allow.parquet", seed=3, size=8, skip={"u001"})
    pl.read_parquet(deny).write_csv(tmp_path / "deny.csv")
    pl.read_parquet(allow).write_csv(tmp_path / "allow.tsv", separator="\t")
    parquet = _score(prepared, tmp_path / "parquet", allow=allow, deny=deny)
    text = _score(prepared, tmp_path / "text", allow=str(tmp_path / "allow.tsv"), deny=str(tmp_path / "deny.csv"))
    assert read_rankings(tmp_path / "text").equals(read_rankings(tmp_path / "parquet"))
    assert text.rules == parquet.rules and parquet.rules["allow_rows"] == 22 * 8 + 1
    (tmp_path / "deny.txt").write_text("item_id\n1001\n")  # text, but not named .csv / .tsv
    with pytest.raises(DataError) as err:
        _score(prepared, tmp_path / "out", deny=str(tmp_path / "deny.txt"))
    assert str(err.value).startswith(f"score.deny {tmp_path / 'deny.txt'}: cannot read it (") and str(err.value).endswith(
        "; rule files are Parquet, or CSV / TSV named .csv / .tsv with a header (item_id, or user_id and item_id)")


def test_rules_that_leave_nobody_an_item_are_one_line_naming_the_rules(prepared, tmp_path):
    allow = _per_user(tmp_path / "allow.parquet", seed=1, size=2, skip=set(USERS))  # only u002's unknown id
    with pytest.raises(DataError, match=r"no user was ranked: the allow / deny rules .*\(rules: allow 1 rows \(1 unknown"):
        _score(prepared, tmp_path / "out", allow=allow)


@pytest.mark.parametrize("file_type", [pl.Int32, pl.Int64, pl.String])
def test_per_user_rows_match_user_ids_of_another_integer_or_text_type(tmp_path, file_type):
    from serving.rules import ItemRules

    rows = pl.DataFrame({schema.USER_ID: [7, 7, 9, 11], schema.ITEM_ID: [1001, 1030, 1002, 1003]})
    path = _write(tmp_path / "deny.parquet", rows.with_columns(pl.col(schema.USER_ID).cast(file_type)))
    got = ItemRules(None, path, vocabulary()).for_users(pl.Series(schema.USER_ID, [9, 7, 8], dtype=pl.Int64)).per_user["deny"]
    assert [sorted(got.get(u).tolist()) for u in range(3)] == [[2], [1, 30], []]  # item indices, users in the shard's order


def test_integer_rule_user_7_never_applies_to_text_users_007_or_plus_7(tmp_path):
    """Issue 41, defect 3: the shard's text ids were cast to the file's integers non-strictly ("007" -> 7)."""
    from serving.rules import ItemRules

    deny, allow = user_7_rules(tmp_path)
    got = ItemRules(None, deny, vocabulary()).for_users(pl.Series(schema.USER_ID, SPELLED)).per_user["deny"]
    assert [got.get(u).shape[0] for u in range(4)] == [0, 0, N_ITEMS, 0]
    got = ItemRules(allow, None, vocabulary()).for_users(pl.Series(schema.USER_ID, [7, 8, 70])).per_user["allow"]
    assert [len(got.get(u)) for u in range(3)] == [5, 0, 0]  # text "7" is the integer 7, "u1" no integer

    prepared = spelled_prepared(tmp_path / "prep")
    _score(prepared, tmp_path / "plain")
    _score(prepared, tmp_path / "deny", deny=deny)
    _score(prepared, tmp_path / "allow", allow=allow)
    plain, deny_only, allow_only = (read_rankings(tmp_path / name) for name in ("plain", "deny", "allow"))
    check_spelled_rules(deny_only, allow_only, plain)
    skipped = pl.read_parquet(tmp_path / "allow" / "_skipped" / "*.parquet").sort(schema.USER_ID)
    assert skipped.select(schema.USER_ID, "reason").rows() == [("+7", "every_item_excluded"), ("007", "every_item_excluded")]

    frame = raw_histories(prepared)
    pyfunc = {name: RankerPyfunc(tiny_model(), vocabulary(), score_config(**rules).score).predict_polars(frame, {"k": K})
              for name, rules in (("plain", {}), ("deny", {"deny": deny}), ("allow", {"allow": allow}))}  # fmt: skip
    check_spelled_rules(pyfunc["deny"], pyfunc["allow"], pyfunc["plain"])
    assert_same_rankings(pyfunc["deny"], deny_only)


def test_a_rule_folder_of_mixed_files_is_one_line_or_read_as_text_ids(prepared, tmp_path):
    (tmp_path / "mixed").mkdir()
    _global(tmp_path / "mixed" / "a.parquet", [1001])
    _write(tmp_path / "mixed" / "b.parquet", pl.DataFrame({schema.USER_ID: ["u001"], schema.ITEM_ID: [1002]}))
    with pytest.raises(DataError) as err:
        _score(prepared, tmp_path / "out", deny=str(tmp_path / "mixed"))
    assert str(err.value) == (f"score.deny {tmp_path / 'mixed'}: {tmp_path / 'mixed' / 'b.parquet'} has the columns "
                              f"['item_id', 'user_id'] and {tmp_path / 'mixed' / 'a.parquet'} ['item_id']; every file of "
                              "one rule holds item_id, or every one user_id and item_id")
    assert not (tmp_path / "out").exists()  # a refused rule leaves no manifest behind
    (tmp_path / "typed").mkdir()  # integer ids in one file, text in the other: read as text, matched by the typing rule
    _global(tmp_path / "typed" / "a.parquet", [1001, 1002])
    _write(tmp_path / "typed" / "b.parquet", pl.DataFrame({schema.ITEM_ID: ["1003", "1004"]}))
    _global(tmp_path / "one.parquet", [1001, 1002, 1003, 1004])
    typed = _score(prepared, tmp_path / "typed_out", deny=str(tmp_path / "typed"))
    one = _score(prepared, tmp_path / "one_out", deny=str(tmp_path / "one.parquet"))
    assert read_rankings(tmp_path / "typed_out").equals(read_rankings(tmp_path / "one_out"))
    assert typed.rules == one.rules == {"deny_rows": 4, "deny_unknown_items": 0, "deny_unknown_rows": 0}


def test_a_rule_file_refused_for_its_rows_leaves_no_manifest_so_the_fixed_rule_runs(prepared, tmp_path):
    nulls = _write(tmp_path / "n.parquet", pl.DataFrame({schema.ITEM_ID: [1001, None]}))
    with pytest.raises(DataError, match="1 rows with a null item_id"):
        _score(prepared, tmp_path / "out", deny=nulls)
    assert not (tmp_path / "out").exists()
    assert _score(prepared, tmp_path / "out", deny=_global(tmp_path / "ok.parquet", [1001])).users == 23


def test_a_rule_file_replaced_by_one_of_the_same_size_and_time_is_another_rule(prepared, tmp_path):
    import os

    from serving.rules import ItemRules

    (tmp_path / "rules").mkdir()
    path = Path(_global(tmp_path / "rules" / "a.parquet", [1001]))
    before = ItemRules(None, str(tmp_path / "rules"), vocabulary()).fingerprint()
    stat = path.stat()
    _global(tmp_path / "b.parquet", [1002])
    assert (tmp_path / "b.parquet").stat().st_size == stat.st_size  # one id of the same width: the same size
    os.replace(tmp_path / "b.parquet", path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as cp -p, rsync -a or tar x leave it
    after = ItemRules(None, str(tmp_path / "rules"), vocabulary()).fingerprint()
    assert after != before and after["deny"][0] == before["deny"][0]  # same path, other content


def test_per_user_rule_rows_of_users_not_in_the_input_are_counted(prepared, tmp_path):
    rows = pl.DataFrame({schema.USER_ID: ["u001", "u001", "u999", "U002"], schema.ITEM_ID: [1001, 1002, 1003, 1004]})
    result = _score(prepared, tmp_path / "out", deny=_write(tmp_path / "deny.parquet", rows))
    assert result.rules["deny_absent_user_rows"] == 2  # u999 is nobody; "U002" is not "u002"
    assert "rules: deny 4 rows (0 unknown item ids, 0 rows dropped; 2 rows of users not in the input)" in result.summary()
