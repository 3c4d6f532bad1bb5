"""Training progress: Lightning's bar on a terminal; one log line per epoch in a log file or a pipe
(issue 31, defect 22b: the bar's last frame wrapped its metrics over six lines in a log file)."""

from __future__ import annotations

import io
import logging
import re

import pytest

from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.fit import EpochLines, fit_ranker, show_progress
from tests.training.training_fixtures import tiny_config, write_walks

EPOCH_LINE = re.compile(
    r"epoch (\d+)/2: train/loss \d+\.\d{4}, val/hr_at_10 (\d\.\d{4}), val/mrr (\d\.\d{4}), "
    r"val/ndcg_at_10 (\d\.\d{4}) \(\d+\.\d s\)"
)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_only_on_a_terminal_else_epoch_lines_and_nothing_when_quiet(tmp_path):
    assert show_progress(True, _Terminal()) == (True, [])
    with open(tmp_path / "train.log", "w") as log_file:
        bar, callbacks = show_progress(True, log_file)
    assert bar is False and [type(c) for c in callbacks] == [EpochLines]
    assert show_progress(False, log_file) == (False, [])


def test_each_epoch_is_one_log_line_with_its_metrics_when_output_is_not_a_terminal(tmp_path, caplog, capsys):
    prepared = write_walks(tmp_path / "prepared")
    config = tiny_config(tmp_path / "out", "train.max_epochs=2")
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    caplog.set_level(logging.INFO, logger="recsys_alibi.training.fit")
    result = fit_ranker(config, datamodule, tmp_path / "ckpt", progress=True)  # stdout: pytest's capture, no tty
    lines = [r.getMessage() for r in caplog.records if r.name == "recsys_alibi.training.fit"]
    found = [EPOCH_LINE.fullmatch(line) for line in lines]
    assert len(lines) == 2 and all(found), lines
    assert [int(m.group(1)) for m in found] == [1, 2]
    last = found[-1]
    for group, name in ((2, "val/hr_at_10"), (3, "val/mrr"), (4, "val/ndcg_at_10")):
        assert float(last.group(group)) == pytest.approx(result.val_metrics[name], abs=5e-5)
    assert "Epoch" not in capsys.readouterr().out  # no bar frame in the captured output
