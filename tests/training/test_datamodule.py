"""Training and validation data follow the evaluation protocol: nothing at or after the temporal cutoff."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from recsys_alibi.config import DataConfig, EvaluateConfig, JobConfig, ModelConfig, TrainConfig
from recsys_alibi.data.prepare import prepare, read_items, read_sequences
from recsys_alibi.data.splits import leave_one_out
from recsys_alibi.evaluation.evaluator import evaluate
from recsys_alibi.training.datamodule import SequenceDataModule
from pipelines import evaluate as evaluate_job

CUTOFF = 1_000
# u0: 5 events before the cutoff, 2 after; u1: 3 before, 1 after; u2: 2 before, 2 after; u3: all 4 after;
# u4: 4 before, none after. Items "late*" occur only at or after the cutoff.
EVENTS = {
    "u0": [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5), ("late1", 1000), ("late2", 1001)],
    "u1": [("b", 10), ("c", 11), ("a", 12), ("late1", 1500)],
    "u2": [("c", 20), ("d", 21), ("late2", 1002), ("late3", 2000)],
    "u3": [("late1", 1100), ("late2", 1200), ("late3", 1300), ("a", 1400)],
    "u4": [("e", 30), ("d", 31), ("c", 32), ("b", 33)],
}


@pytest.fixture
def prepared(tmp_path) -> Path:
    rows = [f"{u},{item},{t}" for u, events in EVENTS.items() for item, t in events]
    (tmp_path / "e.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), tmp_path / "e.csv", tmp_path / "prepared")
    return tmp_path / "prepared"


def _names(prepared: Path) -> dict[int, str]:
    return dict(read_items(prepared).select("item_idx", "item_id").iter_rows())


def _temporal(prepared: Path, cutoff: int = CUTOFF, **train) -> SequenceDataModule:
    dm = SequenceDataModule(
        prepared, ModelConfig(max_len=8), TrainConfig(batch_size=8, **train), seed=0, protocol="temporal", cutoff=cutoff
    )
    dm.load()
    return dm


def _histories(flat, names) -> list[list[str]]:
    return [[names[int(i)] for i in flat.get(u)] for u in range(len(flat))]


def test_temporal_training_and_validation_use_only_events_before_the_cutoff(prepared):
    names = _names(prepared)
    dm = _temporal(prepared)
    # fit prefixes (events before 1000): u0 a b c d e, u1 b c a, u2 c d, u4 e d c b; u3 has none
    assert _histories(dm.train_histories, names) == [["a", "b", "c", "d"], ["b", "c"], ["e", "d", "c"]]
    assert _histories(dm.valid_histories, names) == [["a", "b", "c", "d"], ["b", "c"], ["c"], ["e", "d", "c"]]
    assert [names[int(t)] for t in dm.valid_targets] == ["e", "a", "d", "b"]
    assert dm.n_train_users == 3 and dm.n_train_events == 4 + 2 + 3 and dm.cutoff == CUTOFF
    late = {i for i, name in names.items() if name.startswith("late")}
    for batch in dm.train_dataloader():  # every training input and target
        assert not late & (set(batch["inputs"].flatten().tolist()) | set(batch["targets"].flatten().tolist()))
    # leave-one-out (the default) still trains on items[: n - 2]
    loo = SequenceDataModule(prepared, ModelConfig(max_len=8), TrainConfig(batch_size=8), seed=0)
    loo.load()
    assert loo.n_train_events == 5 + 2 + 2 + 2 + 2 and loo.cutoff is None


def test_temporal_test_examples_and_baseline_metrics_equal_a_hand_built_split(prepared):
    names = _names(prepared)
    idx = {name: i for i, name in names.items()}
    config = JobConfig(evaluate=EvaluateConfig(protocol="temporal", temporal_cutoff=CUTOFF, ks=[1, 3]))
    sequences = read_sequences(prepared)
    examples = evaluate_job.test_examples(config, sequences)
    hand = pl.DataFrame(
        {
            "user_id": ["u0", "u1", "u2"],
            "history": [[idx[i] for i in h] for h in (["a", "b", "c", "d", "e"], ["b", "c", "a"], ["c", "d"])],
            "targets": [[idx[i] for i in t] for t in (["late1", "late2"], ["late1"], ["late2", "late3"])],
        },
        schema={"user_id": pl.String, "history": pl.List(pl.Int32), "targets": pl.List(pl.Int32)},
    )
    assert examples.sort("user_id").equals(hand)
    # popularity counts every event before the cutoff (u4's too) and none after: late items count 0
    pop = evaluate_job.baseline_scorer("popularity", config, sequences, read_items(prepared))
    counts = {names[i]: int(c) for i, c in enumerate(pop.counts.tolist()) if i}
    assert counts == {"a": 2, "b": 3, "c": 4, "d": 3, "e": 2, "late1": 0, "late2": 0, "late3": 0}
    n_items = len(names)
    got = evaluate(pop, examples, n_items, config.evaluate, protocol_name="temporal").metrics
    want = evaluate(pop, hand, n_items, config.evaluate, protocol_name="temporal").metrics
    assert got == want


def test_a_temporal_cutoff_of_zero_is_a_cutoff_not_unset(prepared):
    sequences = read_sequences(prepared)
    config = JobConfig(evaluate=EvaluateConfig(protocol="temporal", temporal_cutoff=0))
    assert evaluate_job.test_examples(config, sequences).height == 0  # every event is at or after 0: no history
    with pytest.raises(ValueError, match="before the temporal cutoff 0"):
        _temporal(prepared, cutoff=0)
    assert leave_one_out(sequences, "test").height == 5


def test_temporal_windows_never_reach_past_the_cutoff_with_all_windows(prepared):
    names = _names(prepared)
    dm = _temporal(prepared, windows="all")
    seen = np.concatenate([b["inputs"].flatten().numpy() for b in dm.train_dataloader()])
    assert {names[int(i)] for i in seen if i} <= {"a", "b", "c", "d", "e"}
