"""``train.context_schedule``: short-to-long windows in one fit, one optimizer, one learning-rate schedule."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import lightning as L
import polars as pl
import pytest
import torch
from training_fixtures import KillAt, Killed, tiny_config, write_walks

from recsys_alibi.config import ConfigError
from recsys_alibi.data.schema import LENGTH, SEQUENCES_FILE
from recsys_alibi.training.data_rules import resolve_max_len
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.fit import fit_ranker
from recsys_alibi.training.module import warmup_cosine

SHORT, LONG, SWITCH, EPOCHS = 4, 16, 2, 4
SCHEDULE = [f"train.context_schedule=[[0, {SHORT}], [{SWITCH}, {LONG}]]", f"train.max_epochs={EPOCHS}",
            "train.windows=all", "train.patience=10"]  # fmt: skip


class Recorder(L.Callback):
    """Per training step: epoch, widest input row, lr, global step; per epoch end: weights and Adam's step."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, float, int]] = []
        self.end_of_epoch: dict[int, tuple[dict[str, torch.Tensor], int, list[int]]] = {}
        self.start_of_epoch: dict[int, tuple[dict[str, torch.Tensor], int, list[int]]] = {}

    @staticmethod
    def _state(trainer: L.Trainer, module: L.LightningModule) -> tuple[dict[str, torch.Tensor], int, list[int]]:
        optimizer = trainer.optimizers[0]
        adam_steps = {int(s["step"]) for s in optimizer.state.values() if "step" in s}
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
        return weights, adam_steps.pop() if len(adam_steps) == 1 else -1, [id(p) for p in module.parameters()]

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        self.steps.append((trainer.current_epoch, int(batch["inputs"].shape[1]), lr, trainer.global_step))

    def on_train_epoch_start(self, trainer, module) -> None:
        self.start_of_epoch[trainer.current_epoch] = self._state(trainer, module)

    def on_train_epoch_end(self, trainer, module) -> None:
        self.end_of_epoch[trainer.current_epoch] = self._state(trainer, module)

    def widest(self) -> dict[int, int]:
        """epoch -> widest input row of its batches (items)."""
        out: dict[int, int] = {}
        for epoch, width, _, _ in self.steps:
            out[epoch] = max(out.get(epoch, 0), width)
        return out


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return write_walks(tmp_path_factory.mktemp("walks") / "prepared", n_users=120)


def _fit(prepared: Path, out: Path, *callbacks: L.Callback, resume: Path | None = None, overrides: tuple = ()):
    config = tiny_config(out, *SCHEDULE, *overrides)
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    fit = fit_ranker(config, datamodule, out / "ckpt", callbacks=list(callbacks), progress=False, resume_from=resume)
    return fit, datamodule


@pytest.fixture(scope="module")
def uninterrupted(prepared, tmp_path_factory):
    # a module-scoped fixture is set up before the function-scoped one-thread fixture: set one thread here too, as
    # the resumed runs have it, or the two runs sum in another order (differences ~1e-6 after 4 epochs)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recorder = Recorder()
        fit, datamodule = _fit(prepared, tmp_path_factory.mktemp("full"), recorder)
    finally:
        torch.set_num_threads(before)
    return fit, datamodule, recorder


def _windows_per_user(lengths, window: int) -> int:
    """``train.windows=all``: a history of n events gives ceil((n - 1) / window) windows."""
    return sum(math.ceil((n - 1) / window) for n in lengths if n >= 2)


def test_the_window_switches_at_the_configured_epoch(uninterrupted):
    _, _, recorder = uninterrupted
    assert recorder.widest() == {0: SHORT, 1: SHORT, 2: LONG, 3: LONG}  # histories of up to 27 training events


def test_weights_and_optimizer_carry_over_the_switch_and_the_lr_schedule_spans_all_epochs(uninterrupted):
    fit, datamodule, recorder = uninterrupted
    before, adam_before, ids_before = recorder.end_of_epoch[SWITCH - 1]
    after, adam_after, ids_after = recorder.start_of_epoch[SWITCH]
    assert ids_after == ids_before  # the same parameter objects: no new model
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    steps_before_switch = sum(1 for epoch, *_ in recorder.steps if epoch < SWITCH)
    assert adam_before == adam_after == steps_before_switch  # AdamW's step count goes on

    # the schedule's length: each epoch's batches at its own window (windows=all: shorter windows, more batches)
    lengths = datamodule.train_histories.lengths()
    batches = {w: math.ceil(_windows_per_user(lengths, w) / 32) for w in (SHORT, LONG)}
    assert batches[SHORT] > batches[LONG]
    total = SWITCH * batches[SHORT] + (EPOCHS - SWITCH) * batches[LONG]
    assert len(recorder.steps) == total
    assert fit.module._schedule == (2, total)
    for epoch, _, lr, step in recorder.steps:
        assert lr == pytest.approx(0.01 * warmup_cosine(step, 2, total), rel=1e-9, abs=1e-12), (epoch, step)
    assert [s for *_, s in recorder.steps] == list(range(total))


@pytest.mark.parametrize("kill_at", [SWITCH - 1, SWITCH + 1], ids=["ckpt_before_switch", "ckpt_after_switch"])
def test_resume_continues_with_the_window_of_its_epoch(prepared, uninterrupted, tmp_path, kill_at):
    full, _, full_steps = uninterrupted
    first = Recorder()
    with pytest.raises(Killed):
        _fit(prepared, tmp_path, first, KillAt(kill_at))
    last = tmp_path / "ckpt" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["epoch"] == kill_at - 1
    (before,) = [state["seconds"] for key, state in saved["callbacks"].items() if "TrainClock" in key]
    resumed_steps = Recorder()
    resumed, _ = _fit(prepared, tmp_path, resumed_steps, resume=last)
    assert resumed.train_seconds > before > 0  # the seconds before the kill count (were dropped on resume)
    expected = {e: w for e, w in full_steps.widest().items() if e >= kill_at}
    assert resumed_steps.widest() == expected
    # the same steps with the same learning rates as the uninterrupted run, and the same result
    full_after = [s for s in full_steps.steps if s[0] >= kill_at]
    assert [(e, w, step) for e, w, _, step in resumed_steps.steps] == [(e, w, step) for e, w, _, step in full_after]
    assert [lr for _, _, lr, _ in resumed_steps.steps] == pytest.approx([lr for _, _, lr, _ in full_after], rel=1e-12)
    for name, value in full.module.state_dict().items():
        assert torch.allclose(resumed.module.state_dict()[name], value, atol=1e-6), name


def test_whole_is_the_longest_fit_history_and_max_len_the_last_window(prepared, tmp_path):
    config = tiny_config(tmp_path, "train.context_schedule=[[0, 4], [2, whole]]", "model.max_len=auto")
    resolved = resolve_max_len(config, prepared)
    # leave-one-out: training and validation may use every event but the last (the test target)
    longest = int(pl.read_parquet(prepared / SEQUENCES_FILE).get_column(LENGTH).max()) - 1
    assert resolved.train.context_schedule == [[0, 4], [2, longest]]
    assert resolved.model.max_len == longest


@pytest.mark.parametrize(
    "schedule, expected",
    [
        ("[[1, 200]]", "the first window must start at epoch 0 (got 1)"),
        ("[[0, 200], [5, 1000], [5, 2000]]", "the epochs must be strictly ascending (got [0, 5, 5])"),
        ("[[0, 200], [9, 1000], [4, 2000]]", "the epochs must be strictly ascending"),
        ("[[0, 0]]", "entry 0: the window 0 must be an integer >= 2 (items) or 'whole'"),
        ("[[0, 200], [3, long]]", "entry 1: the window 'long' must be an integer >= 2 (items) or 'whole'"),
        ("[[0, 200], [3.5, 1000]]", "entry 1: the epoch 3.5 must be an integer >= 0"),
        ("[[0, true]]", "entry 0: the window True must be"),
        ("[200, 1000]", "entry 0 (200) is not [epoch, window]"),
        ("[[0, 200, 3]]", "is not [epoch, window]"),
        ("{0: 200}", "must be a list of [epoch, window] pairs"),
        ("[]", "must be a list of [epoch, window] pairs"),
        ("[[0, 200], [20, 1000]]", "switches at epoch 20 but train.max_epochs=20 trains epochs 0..19"),
    ],
)
def test_an_invalid_schedule_is_one_config_error_line(schedule, expected):
    from recsys_alibi.config import load_config

    with pytest.raises(ConfigError) as caught:
        load_config(None, [f"train.context_schedule={schedule}", "train.max_epochs=20"])
    message = str(caught.value)
    assert "\n" not in message and expected in message, message
    assert "train" in message


def test_learned_positions_refuse_a_window_beyond_the_table_of_the_last_window():
    from recsys_alibi.config import load_config

    with pytest.raises(ConfigError) as caught:
        load_config(None, ["model.position=learned", "train.context_schedule=[[0, 1000], [5, 200]]"])
    assert "\n" not in str(caught.value) and "the window 1000 is beyond it" in str(caught.value)
    # short-to-long ends on the longest window: the table covers every epoch's window
    ok = load_config(None, ["model.position=learned", "train.context_schedule=[[0, 200], [5, 1000]]"])
    assert ok.train.context_schedule == [[0, 200], [5, 1000]]


def test_warns_when_training_stops_before_the_last_switch(caplog):
    from recsys_alibi.training.context_schedule import warn_unreached

    with caplog.at_level("WARNING", logger="recsys_alibi.training.context_schedule"):
        warn_unreached([[0, 4], [2, 16]], 3)  # epochs 0..2 ran: the switch at 2 happened
        assert not caplog.records
        warn_unreached([[0, 4], [2, 16]], 2)  # early stopping after epochs 0 and 1
    (record,) = caplog.records
    assert "before train.context_schedule switches to 16 items at epoch 2" in record.getMessage()


def test_cli_train_logs_the_last_window_as_max_len_and_resumes_across_the_switch(
    prepared, tmp_path, mlflow_store, monkeypatch, capsys
):
    import mlflow

    import pipelines.train
    from pipelines.cli import main
    from training_fixtures import TINY

    args = ["train", "--prepared", str(prepared), "--quiet"]
    for item in [*TINY, *SCHEDULE, "train.context_schedule=[[0, 4], [2, whole]]", f"output={tmp_path / 'job'}"]:
        args += ["--set", item]
    monkeypatch.setattr(pipelines.train, "training_callbacks", lambda config: [KillAt(SWITCH + 1)])
    assert main(args) == 1  # a failure: its traceback, then one error line
    resumed = Recorder()
    monkeypatch.setattr(pipelines.train, "training_callbacks", lambda config: [resumed])
    assert main([*args, "--resume"]) == 0
    longest = int(pl.read_parquet(prepared / SEQUENCES_FILE).get_column(LENGTH).max()) - 1
    assert set(resumed.widest()) == {SWITCH + 1} and resumed.widest()[SWITCH + 1] > SHORT  # the long window
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "FINISHED"
    assert run.data.params["model.max_len"] == str(longest)  # the model's context: the last window
    assert run.data.params["train.context_schedule"] == str([[0, 4], [2, longest]])


@pytest.mark.parametrize("batching", [[], ["train.packing=true"], ["train.batch_tokens=200"]],
                         ids=["padded", "packed", "length_buckets"])  # fmt: skip
def test_every_batching_builds_the_epoch_s_window(prepared, tmp_path, batching):
    """Packed rows are exactly the window long; padded and bucketed rows at most (the longest history fills it)."""
    from types import SimpleNamespace

    config = tiny_config(tmp_path, *SCHEDULE, *batching)
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    for epoch, window in [(0, SHORT), (SWITCH - 1, SHORT), (SWITCH, LONG), (EPOCHS - 1, LONG)]:
        datamodule.trainer = SimpleNamespace(current_epoch=epoch)
        widths = {int(batch["inputs"].shape[1]) for batch in datamodule.train_dataloader()}
        assert max(widths) == window, (epoch, widths)
        if batching == ["train.packing=true"]:
            assert widths == {window}


def test_a_whole_window_shorter_than_an_earlier_one_with_learned_positions_is_one_config_error(prepared, tmp_path):
    """'whole' is known only from the data: resolved, it may fall below an earlier window of the table."""
    config = tiny_config(tmp_path, "model.position=learned", "train.context_schedule=[[0, 5000], [2, whole]]")
    with pytest.raises(ConfigError) as caught:
        resolve_max_len(config, prepared)
    assert "\n" not in str(caught.value) and "the window 5000 is beyond it" in str(caught.value)


def test_the_train_clock_adds_the_seconds_of_the_fits_before_a_resume():
    """A resumed run's train_seconds counted only the fit after the resume (replay time ratios were understated)."""
    from recsys_alibi.training.fit import TrainClock

    clock = TrainClock()
    clock.load_state_dict({"seconds": 100.0})  # what the resumed checkpoint holds
    assert clock.total() == 100.0
    clock.on_fit_start(None, None)
    assert 100.0 <= clock.total() < 110.0 and clock.state_dict()["seconds"] >= 100.0
    assert TrainClock().total() == 0.0


class _TermAfterFirstEpoch(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler's kill: Lightning's handler sets received_sigterm


def test_a_fit_stopped_by_sigterm_exits_143_with_one_line(prepared, tmp_path, caplog):
    """A killed train or daily pipeline exited 0 without a word (Lightning's SIGTERMException is a SystemExit(0)):
    a scheduler saw success where nothing was registered or scored."""
    with pytest.raises(SystemExit) as stopped:
        _fit(prepared, tmp_path, _TermAfterFirstEpoch())
    assert stopped.value.code == 143
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("error: training stopped")]
    assert "stopped by SIGTERM" in line and "--resume" in line and str(tmp_path / "ckpt" / "last.ckpt") in line
    # a run that resumes on its own (train.resume=true: quality.py, long_histories.py) is told the same command
    caplog.clear()
    with pytest.raises(SystemExit):
        _fit(prepared, tmp_path / "again", _TermAfterFirstEpoch(), overrides=("train.resume=true",))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("error: training stopped")]
    assert "the same command continues from" in line and "--resume" not in line
