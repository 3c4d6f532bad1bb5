"""benchmarks/extrapolation.py: where it writes by default (runs/, never docs/results/), the command as run, the
machine, and the PNG beside the JSON; the training and evaluation are replaced by stand-ins."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

from benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[2]
extrapolation = load_benchmark("extrapolation", "extrapolation_benchmark")


def test_the_record_names_the_command_as_run_and_the_machine(tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr(extrapolation, "configure_logging", lambda: None)
    monkeypatch.setattr(extrapolation, "setup_tracking", lambda tracking: None)
    monkeypatch.setattr(extrapolation, "read_sequences", lambda prepared: None)
    monkeypatch.setattr(extrapolation, "test_examples", lambda config, sequences: None)
    monkeypatch.setattr(extrapolation, "read_items", lambda prepared: SimpleNamespace(height=10))
    monkeypatch.setattr(extrapolation, "_train", lambda config, prepared, **model: trained.append(model) or "runs:/x/model")
    figures = {"50": 0.1, "100": 0.11, "200": 0.12, "400": 0.12, "full": 0.13}
    monkeypatch.setattr(extrapolation, "_sweep", lambda config, uri, examples, n, out, name: dict(figures))
    out = tmp_path / "new" / "x.json"
    argv = ["--config", str(REPO / "configs" / "movielens-1m-6ep.yaml"), "--prepared", str(tmp_path / "my prepared"), "--epochs", "1", "--output", str(out)]
    extrapolation.main(argv)
    doc = json.loads(out.read_text())
    assert doc["command"] == shlex.join(["python", "benchmarks/extrapolation.py", *argv])  # not a fixed --prepared
    assert " cores, Python " in doc["machine"] and len(trained) == 3
    assert out.with_suffix(".png").stat().st_size > 0 and not list(out.parent.glob(".*.tmp"))
    monkeypatch.chdir(tmp_path)  # no --output: under runs/, never over the committed docs/results/ figure
    extrapolation.main(["--config", str(REPO / "configs" / "movielens-1m-6ep.yaml"), "--epochs", "1"])
    assert json.loads((tmp_path / "runs" / "extrapolation" / "extrapolation-ml1m.json").read_text())["epochs"] == 1
    assert not (tmp_path / "docs").exists()
