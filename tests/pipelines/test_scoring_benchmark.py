"""benchmarks/scoring.py's JSON: its folder made before anything is measured, the command and the machine beside
the rows (the measurement itself is replaced by a stand-in row)."""

from __future__ import annotations

import json
import shlex
import sys

from benchmark_scripts import load_benchmark

scoring = load_benchmark("scoring", "scoring_benchmark")


def test_the_json_folder_is_made_first_and_the_rows_come_with_command_and_machine(tmp_path, monkeypatch):
    out = tmp_path / "new" / "sc.json"

    def measure(n_items, length, users, k, shard_users, workdir):
        assert out.parent.is_dir(), "the JSON's folder is made before the measurement"
        return {"catalog": n_items, "history": length, "users": users, "users_per_s": 1.0, "rss_before_mib": 1,
                "peak_rss_mib": 2, "seconds": 1.0, "load_avg": [0.5, 0.5]}  # fmt: skip

    monkeypatch.setattr(scoring, "measure", measure)
    argv = ["--catalogs", "1000", "--lengths", "50", "--users", "100", "--json", str(out)]
    assert scoring.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["command"] == shlex.join(["python", "benchmarks/scoring.py", *argv])
    assert f" cores, Python {'.'.join(map(str, sys.version_info[:3]))}, " in doc["machine"]
    assert [(r["catalog"], r["history"], r["users"]) for r in doc["rows"]] == [(1000, 50, 100)]
