"""benchmarks/numerics.py probe: each new record names the command, the machine and the torch threads (the probe's
figures follow the thread count and the CPU); the training is replaced by a stand-in."""

from __future__ import annotations

import importlib.util
import json
import sys

import torch
from benchmark_scripts import BENCHMARKS

# registered before it runs: its dataclasses look their module up in sys.modules
_spec = importlib.util.spec_from_file_location("numerics_benchmark", BENCHMARKS / "numerics.py")
numerics = sys.modules["numerics_benchmark"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(numerics)


def test_each_new_probe_record_names_command_machine_and_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(numerics, "run_probe_one", lambda setting, precision, work, seed: [
        {"run": precision, "setting": setting, "seed": seed, "distance": 16, "hr_at_10": 0.5}])  # fmt: skip
    monkeypatch.setattr(numerics, "probe_markdown", lambda records: "")
    monkeypatch.setattr(numerics, "probe_summary_markdown", lambda records: "")
    numerics.run_probe(tmp_path / "out", [("fp32", "default", 7)], tmp_path / "p.json", "python -m benchmarks.numerics probe")
    (record,) = json.loads((tmp_path / "p.json").read_text())
    assert record["command"] == "python -m benchmarks.numerics probe" and " cores, Python " in record["machine"]
    assert record["torch_threads"] == torch.get_num_threads() and record["hr_at_10"] == 0.5
