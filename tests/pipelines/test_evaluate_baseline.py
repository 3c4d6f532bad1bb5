"""``evaluate --baseline popularity``: fitted on training information only, ties included."""

from __future__ import annotations

import json

import pytest

from pipelines.evaluate import run_evaluate
from recsys_alibi.config import DataConfig, EvaluateConfig, JobConfig
from recsys_alibi.data.prepare import prepare, read_items


def test_popularity_ties_are_not_broken_by_counts_that_include_test_targets(tmp_path):
    # u1, u2: history [C], test target A; u3: history [A, B], test target D.
    # Training counts (all but each user's last event): C 2, A 1, B 1, D 0. Counted over every
    # event A has 3, so prepare numbers it first: a tie broken by index would put A ahead of B.
    # B's training event (t=20) is more recent than A's (t=3): B goes first.
    rows = ["u1,C,1", "u1,A,10", "u2,C,2", "u2,A,11", "u3,A,3", "u3,B,20", "u3,D,30"]
    (tmp_path / "e.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    prepared = tmp_path / "prepared"
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), tmp_path / "e.csv", prepared)
    assert read_items(prepared).get_column("item_id").to_list()[0] == "A"
    config = JobConfig(output=str(tmp_path / "job"), evaluate=EvaluateConfig(ks=[1, 2]))
    job = run_evaluate(config, prepared, baseline="popularity", output_dir=tmp_path / "report")
    # ranks (seen items masked): u1 C masked -> B, A: A at 2; u2 the same; u3 A, B masked -> C, D: D at 2
    assert job.result.metrics["HR@1"] == 0.0
    assert job.result.metrics["MRR"] == pytest.approx(0.5)
    assert json.loads((tmp_path / "report" / "report.json").read_text())["metrics"]["HR@2"] == pytest.approx(1.0)
