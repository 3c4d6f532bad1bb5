"""benchmarks/replay_cold.py: cold targets by hand, items beside the catalog ranked from their vectors."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from recsys_alibi.config import DataConfig
from recsys_alibi.data.prepare import prepare
from serving.new_items import NewItems
from benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[2]



scoring = load_benchmark("replay_scoring")


@pytest.fixture
def cold(monkeypatch):
    """The script, with its neighbours importable by name as when it runs from benchmarks/."""
    monkeypatch.setitem(sys.modules, "replay_scoring", scoring)
    monkeypatch.setitem(sys.modules, "replay", load_benchmark("replay"))
    return load_benchmark("replay_cold")


def test_the_recorded_protocol_is_the_paragraph_on_cold_targets_not_the_usage_line(cold):
    assert cold.PROTOCOL.startswith("The replay's own targets are items of step ``k``'s catalog")
    assert "**cold targets**" in cold.PROTOCOL and "\n" not in cold.PROTOCOL and "benchmarks/replay_cold.py" not in cold.PROTOCOL


def test_a_cold_target_is_the_first_next_period_event_on_an_item_new_that_period(tmp_path, cold):
    events = pl.DataFrame(
        {"user_id": [1, 1, 1, 1, 1, 2, 2, 2, 3, 4], "item_id": [10, 11, 12, 50, 51, 11, 51, 60, 50, 52],
         "timestamp": [1, 2, 11, 12, 13, 3, 15, 25, 14, 30]}
    )  # fmt: skip
    events.filter(pl.col("timestamp") < 10).write_parquet(tmp_path / "h.parquet")
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), tmp_path / "h.parquet", tmp_path / "p")
    idx = dict(pl.read_parquet(tmp_path / "p" / "items.parquet").select("item_id", "item_idx").iter_rows())
    fresh = {50, 51}  # first events in [10, 20); 52 and 60 come later, 12 is in the catalog
    out = cold.cold_examples(tmp_path / "p", events, 10, 20, fresh, model=None)
    # user 1: 12 (a catalog item) is passed over, 50 is the first new one; user 2: 51; user 3: no history
    # before 10; user 4: 52 is not new in this period
    assert out.sort("user_id").rows() == [(1, [idx[10], idx[11]], 50), (2, [idx[11]], 51)]


def test_a_target_among_the_new_items_gets_its_index_beside_the_catalog(cold):
    extra = NewItems(pl.Series([50, 51]), torch.zeros(2, 4), "t")
    examples = pl.DataFrame({"user_id": [1, 2, 3], "history": [[1], [2], [3]], "target_id": [51, 50, 77]})
    out = cold.with_targets(examples, 6, extra)
    assert out.columns == ["user_id", "history", "targets"]
    assert out["targets"].to_list() == [[8], [7], [0]]  # N + 1 + j; 77 has no table row: padding, a miss


class _Vectors(torch.nn.Module):
    """A stand-in ranker: every user's state is (1, 0), item vectors fixed: item ``i`` scores ``table[i, 0]``."""

    max_context = None
    uses_time_gaps = False

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table  # (N + 1, 2)

    def last_hidden(self, history, lengths, gaps=None):
        return torch.tensor([[1.0, 0.0]]).expand(history.shape[0], -1)  # (B, 2)

    def logits(self, hidden):
        return hidden @ self.table.T  # (B, N + 1)

    def score(self, history, lengths, gaps=None):
        return self.logits(self.last_hidden(history, lengths))


def _three_items_two_new():
    """A catalog of raw 10, 11, 12 scoring 3, 1, 2 and new items 50, 51 (indices 4, 5) scoring 2.5, 0.5."""
    table = torch.tensor([[0.0, 0.0], [3.0, 0.0], [1.0, 0.0], [2.0, 0.0]])  # padding; raw 10, 11, 12
    items = pl.DataFrame({"item_idx": pl.Series([1, 2, 3], dtype=pl.Int32), "item_id": [10, 11, 12]})
    loaded = types.SimpleNamespace(model=_Vectors(table), items=items)
    return loaded, NewItems(pl.Series([50, 51]), torch.tensor([[2.5, 9.0], [0.5, 0.0]]), "t")


def test_items_beside_the_catalog_are_ranked_from_their_vectors():
    loaded, extra = _three_items_two_new()
    examples = pl.DataFrame({"history": [[1], [1], [2]], "targets": [[5], [4], [1]]},
                            schema={"history": pl.List(pl.Int32), "targets": pl.List(pl.Int32)})  # fmt: skip
    ranks, tops = scoring.rank_examples(loaded, examples, extra)
    # scores 10: 3, 11: 1, 12: 2, 50: 2.5, 51: 0.5; a seen item is excluded (ranked last, at -inf, in a
    # catalog of fewer than 10 items)
    assert ranks.tolist() == [4, 1, 1] and tops[0] == [50, 12, 11, 51, 10] and tops[2] == [10, 50, 12, 51, 11]
    ranks, tops = scoring.rank_examples(loaded, examples.slice(2))  # without new items: the catalog alone
    assert ranks.tolist() == [1] and tops == [[10, 12, 11]]


def test_a_place_held_for_the_best_new_item_moves_it_into_the_top_10_by_hand():
    table = torch.tensor([[0.0, 0.0], *[[13.0 - i, 0.0] for i in range(1, 13)]])  # item i scores 13 - i (raw 100 + i)
    items = pl.DataFrame({"item_idx": pl.Series(range(1, 13), dtype=pl.Int32), "item_id": [100 + i for i in range(1, 13)]})
    loaded = types.SimpleNamespace(model=_Vectors(table), items=items)
    extra = NewItems(pl.Series([500, 501]), torch.tensor([[0.5, 0.0], [0.2, 0.0]]), "t")  # indices 13, 14
    examples = pl.DataFrame({"history": [[12]] * 4, "targets": [[14], [13], [10], [9]]},
                            schema={"history": pl.List(pl.Int32), "targets": pl.List(pl.Int32)})  # fmt: skip
    plain, _ = scoring.rank_examples(loaded, examples, extra)
    assert plain.tolist() == [13, 12, 10, 9]  # 11 unseen catalog items (12 to 2) above both new ones
    ranks, tops = scoring.rank_examples(loaded, examples, extra, slots=1)
    # the best new item (500) takes the 10th place, item 10 gives way (its rank: 11 at least); 501 stays out
    assert ranks.tolist() == [13, 10, 11, 9] and tops[0] == [*range(101, 110), 500]


def test_new_items_are_ranked_among_themselves_and_against_the_unseen_catalog(cold):
    loaded, extra = _three_items_two_new()
    examples = pl.DataFrame({"history": [[1], [2], [1]], "targets": [[5], [4], [0]]},
                            schema={"history": pl.List(pl.Int32), "targets": pl.List(pl.Int32)})  # fmt: skip
    within, best = scoring.new_item_ranks(loaded, examples, extra)
    # new items score 50: 2.5, 51: 0.5. Row 0: target 51 is 2nd of the new items; the best new item (2.5) is above
    # every unseen catalog item (11: 1, 12: 2; 10 seen). Row 1: target 50 is 1st; 10 (3) is above 2.5 (11 seen).
    # Row 2: a target without a table row: 0 in both
    assert within.tolist() == [2, 1, 0] and best.tolist() == [1, 2, 0]
    summary = cold.among_new_summary([2, 1], [1, 2], [2, 2])
    assert summary["HR@1"] == 0.5 and summary["HR@5"] == 1.0 and summary["random_HR@1"] == 0.5
    assert summary["best_new_item_median_rank"] == 1.5 and summary["best_new_item_in_top10"] == 1.0


@pytest.mark.parametrize("case", ["missing", "not json", "no command", "not a replay command", "workdir gone"])
def test_what_is_not_a_finished_replay_is_refused_with_one_line(tmp_path, monkeypatch, capsys, cold, case):
    monkeypatch.chdir(tmp_path)
    command = "python benchmarks/replay.py --config c.yaml --output r.json --workdir gone --arms warm warm_features"
    text = {"missing": None, "not json": "xx", "no command": "{}", "not a replay command": '{"command": "python x.py"}',
            "workdir gone": json.dumps({"command": command})}[case]  # fmt: skip
    if text is not None:
        (tmp_path / "r.json").write_text(text)
        (tmp_path / "r.per_user.json").write_text('{"1": {"steps": [{"step": 1}]}}')
    with pytest.raises(SystemExit) as stop:
        cold.main(["r.json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err[-1].startswith("replay_cold.py: error: ") and "Traceback" not in err
    expected = {"missing": "not a finished replay", "not json": "not a finished replay", "no command": "is not a",
                "not a replay command": "is not a", "workdir gone": "its workdir is gone"}[case]  # fmt: skip
    assert expected in err[-1]
    assert not (tmp_path / "gone").exists()  # nothing written where the replay's store was
