"""``train.init_from``: a warm-started run's lineage, its refusal of another model, and ``--resume``."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pytest

from pipelines.cli import main
from recsys_alibi.config import DataConfig
from recsys_alibi.data.prepare import prepare
from recsys_alibi.training import warm_start
from recsys_alibi.training.launch import COMPLETE_MARKER
from test_train import TINY, _train



def _walks(path: Path, n_users: int, n_items: int) -> Path:
    """``n_users`` users walking items ``i0..i<n_items - 1>`` (8 events each), prepared into ``path``."""
    rng = np.random.default_rng(0)
    starts = rng.integers(0, n_items, n_users)
    rows = [f"u{u},i{(start + 3 * t) % n_items},{t}" for u, start in enumerate(starts) for t in range(8)]
    events = path.with_suffix(".csv")
    events.write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), events, path)
    return path


def _runs() -> list:
    return mlflow.search_runs(search_all_experiments=True, output_format="list", order_by=["attributes.start_time"])


def test_warm_run_records_its_parent_and_what_is_new(tmp_path, mlflow_store, capsys, monkeypatch):
    loads = []
    monkeypatch.setattr(warm_start.InitialWeights, "setup", lambda self, *a, **k: loads.append(len(self.state)))
    day1, day2 = _walks(tmp_path / "day1", 30, 10), _walks(tmp_path / "day2", 42, 13)  # 12 new users, 3 new items
    assert main(_train(day1, tmp_path / "job")) == 0
    (parent,) = _runs()
    capsys.readouterr()
    warm = ("train.warm.max_epochs=2", "train.warm.lr=0.0005")
    assert main(_train(day2, tmp_path / "job", f"train.init_from=runs:/{parent.info.run_id}/model", *warm)) == 0
    printed = capsys.readouterr().out
    child = _runs()[-1]
    tags = child.data.tags
    assert tags["lineage.parent_run_id"] == parent.info.run_id
    assert tags["lineage.init_from"] == f"runs:/{parent.info.run_id}/model"
    assert (tags["lineage.new_items"], tags["lineage.kept_items"], tags["lineage.dropped_items"]) == ("3", "10", "0")
    assert (tags["lineage.new_users"], tags["lineage.new_events"]) == ("12", str(12 * 8))
    assert child.data.params["train.max_epochs"] == "2" and child.data.params["train.lr"] == "0.0005"  # warm schedule
    assert (
        f"warm start from runs:/{parent.info.run_id}/model (run {parent.info.run_id}): 10 items kept, 3 new, "
        "0 dropped; 12 new users, 96 new events" in printed
    )
    assert loads == [sum(1 for _ in parent_state_keys())]  # the weights were loaded once, for the new run

    # killed after its first epoch: --resume continues it with the warm schedule, without loading the parent again
    (marker,) = (tmp_path / "job" / "checkpoints").glob(f"{child.info.run_id}/{COMPLETE_MARKER}")
    marker.unlink()
    warm_args = _train(day2, tmp_path / "job", f"train.init_from=runs:/{parent.info.run_id}/model", *warm)
    assert main([*_train(day2, tmp_path / "job", f"train.init_from=runs:/{parent.info.run_id}/model"), "--resume"]) == 2
    assert "its run trained with other training settings (train.lr=0.0005 (now 0.002)" in capsys.readouterr().err
    assert main([*warm_args, "--resume"]) == 0  # the same command: resumed (without its warm keys: refused above)
    printed = capsys.readouterr().out
    assert f"mlflow_run_id: {child.info.run_id}" in printed and "resumed from" in printed
    assert "warm start from" in printed and loads == [loads[0]]
    assert len(_runs()) == 2


def _warm_from(parent_data: Path, data: Path, job: Path, capsys) -> str:
    """Train on ``parent_data``, then one warm epoch on ``data`` from that run's model: what the second run printed."""
    assert main(_train(parent_data, job)) == 0
    (parent,) = _runs()
    capsys.readouterr()
    assert main(_train(data, job, f"train.init_from=runs:/{parent.info.run_id}/model", "train.warm.max_epochs=1")) == 0
    return capsys.readouterr().out


def test_a_parent_trained_on_more_data_gets_no_negative_counts(tmp_path, mlflow_store, capsys, caplog):
    """A champion from another log (42 users) warm-starts a run on 30 users: "-12 new users" would be nonsense,
    so the line says n/a and no lineage.new_* count is tagged; the item counts are still exact. A warning says the
    parent is no earlier model of this data (the README's daily loop once warm-started from make pipeline's model)."""
    day1, day2 = _walks(tmp_path / "day1", 30, 10), _walks(tmp_path / "day2", 42, 13)
    printed = _warm_from(day2, day1, tmp_path / "job", capsys)
    assert "10 items kept, 0 new, 3 dropped; n/a new users, n/a new events" in printed
    warned = [r.getMessage() for r in caplog.records if "more than this data holds" in r.getMessage()]
    assert len(warned) == 1 and "trained on 42 users and " in warned[0] and "own tracking.registered_model" in warned[0]
    tags = _runs()[-1].data.tags
    assert "lineage.new_users" not in tags and "lineage.new_events" not in tags and tags["lineage.dropped_items"] == "3"


def test_a_parent_of_another_catalog_is_warned_about_and_gets_no_growth_counts(tmp_path, mlflow_store, capsys, caplog):
    """A parent that knows 10 of this data's 30 items (ids of two logs overlapping by chance) while this data has
    more users and events: about two thirds of the events are on items it never saw, more than
    score.max_unknown_share=0.5, so a warning says it is probably no earlier model of this data and the line says
    n/a instead of reporting the difference of counts as growth (it said "30 new users, 240 new events")."""
    small, other = _walks(tmp_path / "small", 10, 10), _walks(tmp_path / "other", 40, 30)
    printed = _warm_from(small, other, tmp_path / "job", capsys)
    assert "10 items kept, 20 new, 0 dropped; n/a new users, n/a new events" in printed
    warned = [r.getMessage() for r in caplog.records if "probably not an earlier model" in r.getMessage()]
    assert len(warned) == 1 and "(20 of 30 items), more than score.max_unknown_share=0.5" in warned[0]
    tags = _runs()[-1].data.tags
    assert "lineage.new_users" not in tags and tags["lineage.new_items"] == "20"


def parent_state_keys():
    """The state-dict keys of the TINY model (what InitialWeights loads)."""
    from recsys_alibi.config import load_config
    from recsys_alibi.model.transformer import AlibiRanker

    return AlibiRanker(load_config(None, TINY).model, 5).state_dict().keys()


def test_another_architecture_is_refused_before_training_with_one_line(tmp_path, mlflow_store, capsys):
    day1 = _walks(tmp_path / "day1", 30, 10)
    assert main(_train(day1, tmp_path / "job")) == 0
    (parent,) = _runs()
    capsys.readouterr()
    uri = f"runs:/{parent.info.run_id}/model"
    assert main(_train(day1, tmp_path / "job", f"train.init_from={uri}", "model.d_model=16")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: cannot warm-start from {uri}: it is another model (model.d_model=8 (now 16)); set the same "
        "model.* values or leave train.init_from unset to train from scratch"
    ]
    assert len(_runs()) == 1  # refused before any run started
    assert main(_train(day1, tmp_path / "job", "train.init_from=runs:/no-such-run/model")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot load model 'runs:/no-such-run/model'")


def test_init_from_champion_without_one_starts_cold_and_says_so(tmp_path, mlflow_store, capsys):
    day1 = _walks(tmp_path / "day1", 30, 10)
    assert main(_train(day1, tmp_path / "job", "train.init_from=champion", "train.warm.max_epochs=3")) == 0
    printed = capsys.readouterr().out
    assert "cold start: train.init_from=champion and models:/recsys-alibi-ranker@champion does not exist yet" in printed
    (run,) = _runs()
    assert run.data.params["train.max_epochs"] == "1"  # the cold schedule
    assert run.data.tags["lineage.init_from"].startswith("none (train.init_from=champion")


def test_unset_warm_keys_follow_the_measured_rule():
    from pipelines.init_from import warm_schedule
    from recsys_alibi.config import load_config

    cold = ["train.init_from=champion", "train.max_epochs=32", "train.lr=0.005", "train.warmup_steps=20", "train.patience=8"]
    warm = warm_schedule(load_config(None, cold)).train
    assert (warm.max_epochs, warm.lr, warm.warmup_steps, warm.patience) == (8, 0.01, 20, 8)  # a quarter of the epochs, twice the cold peak re-warmed
    given = warm_schedule(load_config(None, [*cold, "train.warm.max_epochs=3", "train.warm.lr=0.002"])).train
    assert (given.max_epochs, given.lr, given.warmup_steps) == (3, 0.002, 20)
    assert warm_schedule(load_config(None, [*cold, "train.max_epochs=5", "train.warmup_steps=2"])).train.max_epochs == 2


def test_the_default_warm_start_copies_every_weight_of_the_parent(tmp_path, mlflow_store):
    """train.warm's default initial weights on the same vocabulary: the parent's, bit for bit (the blocks are not
    shrunk: shrink-and-perturb was deleted, docs/scheduling.md), and a leftover ``train.warm.shrink`` is refused."""
    import torch

    from pipelines.init_from import load_warm_start
    from recsys_alibi.config import ConfigError, load_config
    from recsys_alibi.tracking import load_ranker

    day1 = _walks(tmp_path / "day1", 30, 10)
    assert main(_train(day1, tmp_path / "job")) == 0
    (parent,) = _runs()
    uri = f"runs:/{parent.info.run_id}/model"
    old = load_ranker(uri).model.state_dict()
    state = load_warm_start(load_config(None, [*TINY, f"train.init_from={uri}"]), day1, uri).state
    assert state.keys() == old.keys() and all(torch.equal(state[k], old[k]) for k in old)
    with pytest.raises(ConfigError, match="shrink"):
        load_config(None, [*TINY, f"train.init_from={uri}", "train.warm.shrink=0.5"])


def test_context_rows_imprint_every_new_item_that_occurs_in_training(tmp_path, mlflow_store, caplog):
    """``train.warm.new_item_rows: context``: each new item seen in the training part gets the row
    ``mu + s * unit(m_j - m)`` (recsys_alibi.training.context_rows), every kept row is copied."""
    import torch

    from pipelines.init_from import load_warm_start
    from recsys_alibi.config import load_config
    from recsys_alibi.tracking import load_ranker
    from recsys_alibi.training.warm_start import ITEM_TABLE_KEY

    day1, day2 = _walks(tmp_path / "day1", 30, 10), _walks(tmp_path / "day2", 42, 13)  # 3 new items
    assert main(_train(day1, tmp_path / "job")) == 0
    (parent,) = _runs()
    uri = f"runs:/{parent.info.run_id}/model"
    old = load_ranker(uri).model.state_dict()[ITEM_TABLE_KEY]
    base = [*TINY, f"train.init_from={uri}"]
    caplog.set_level("INFO")
    noise = load_warm_start(load_config(None, [*base, "train.warm.new_item_rows=noise"]), day2, uri).state[ITEM_TABLE_KEY]
    config = load_config(None, base)
    assert config.train.warm.new_item_rows == "context"  # the default
    context = load_warm_start(config, day2, uri).state[ITEM_TABLE_KEY]
    assert "train.warm.new_item_rows=context: 3 of 3 new items imprinted from" in caplog.text
    from recsys_alibi.data.prepare import read_items
    from serving.inputs import vocabulary_remap

    remap, _ = vocabulary_remap(read_items(day2), load_ranker(uri).items)
    new = torch.from_numpy(remap == 0)
    new[0] = False
    assert int(new.sum()) == 3 and torch.equal(context[~new], noise[~new])  # kept rows (and padding) copied
    torch.testing.assert_close(context[torch.from_numpy(remap[1:] > 0).nonzero()[:, 0] + 1], old[remap[remap > 0]])
    mu, spread = old[1:].mean(0), (old[1:] - old[1:].mean(0)).norm(dim=1).mean()
    assert not torch.allclose(context[new], noise[new])
    torch.testing.assert_close((context[new] - mu).norm(dim=1), spread.expand(3))  # a typical distance from the mean
