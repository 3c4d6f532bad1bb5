"""The pipeline reads one source of events: generated data and ``data.input`` together are refused
(issue 31, defect 20: a setting accepted and ignored)."""

from __future__ import annotations

import pipelines.pipeline
from pipelines.cli import main


def _never(*args, **kwargs):
    raise AssertionError("the pipeline generated events although data.input was given")


def test_generated_events_and_data_input_together_are_refused_before_any_step(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pipelines.pipeline, "run_generate", _never)  # the old code went on to generate and train
    events = tmp_path / "mine.parquet"
    args = ["pipeline", "--output", str(tmp_path / "run"), "--quiet", "--set", "generate.enabled=true",
            "--set", f"data.input={events}"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == (
        f"error: generate.enabled=true generates the pipeline's events, so data.input={events} would be ignored: "
        "set generate.enabled=false to read data.input, or drop data.input"
    )
