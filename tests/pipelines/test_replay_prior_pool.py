"""benchmarks/replay_prior_pool.py: outputs of replay_prior.py over disjoint seeds pooled, by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[2]



replay = load_benchmark("replay", "replay_for_pool")
pool = load_benchmark("replay_prior_pool")


def _replay(path: Path, log: str = "log.parquet", gate: bool = False) -> str:
    """A finished replay's JSON as far as the pool reads it: its recorded command (the log, periods and chain)."""
    command = f"python benchmarks/replay.py --config configs/default.yaml --input {log} --period-days 14 --output {path.name}"
    command += " --gate" if gate else ""
    path.write_text(json.dumps({"command": command}))
    path.with_suffix(".per_user.json").write_text("{}")
    return path.name


def _output(path: Path, arm: str, replay_name: str, values: dict, against: str | None = None) -> Path:
    doc = {"arm": arm, "replay": replay_name, "chosen": {k.split("/")[0]: {"1": "x"} for k in values}}
    if against is not None:
        doc["against"] = {"file": against}
    path.write_text(json.dumps(doc))
    path.with_suffix(".per_user.json").write_text(json.dumps(values))
    return path


def _v(arm: float, prior: float, recent: float, stale: float) -> list:
    return [[arm, 1.0 if arm else 0.0], [prior, 1.0 if prior else 0.0], [recent, 0.0], [stale, 0.0]]


@pytest.fixture()
def outputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "replay", replay)
    r12, r3 = _replay(tmp_path / "r12.json"), _replay(tmp_path / "r3.json")
    warm12 = _output(tmp_path / "w12.prior.json", "warm", r12, {"1/1/a": _v(0.1, 0.5, 0.4, 0.3), "2/1/a": _v(0.0, 0.2, 0.2, 0.2)})
    warm3 = _output(tmp_path / "w3.prior.json", "warm", r3, {"3/1/a": _v(0.3, 0.6, 0.6, 0.1), "3/2/b": _v(0.0, 0.0, 0.1, 0.0)})
    scratch12 = _output(tmp_path / "s12.prior.json", "scratch", r12, {"1/1/a": _v(0.2, 0.4, 0.4, 0.4)}, against="w12.prior.json")
    scratch3 = _output(tmp_path / "s3.prior.json", "scratch", r3, {"3/1/a": _v(0.1, 0.7, 0.6, 0.6), "3/2/b": _v(0.2, 0.2, 0.1, 0.0)},
                       against="w3.prior.json")  # fmt: skip
    return tmp_path, warm12, warm3, scratch12, scratch3


def test_disjoint_seeds_pool_as_one_run(outputs):
    tmp_path, warm12, warm3, scratch12, scratch3 = outputs
    pool.main([str(warm12), str(warm3), "--output", "pooled.json"])
    out = json.loads((tmp_path / "pooled.json").read_text())
    assert out["command"] == f"python benchmarks/replay_prior_pool.py {warm12} {warm3} --output pooled.json"
    assert " cores, Python " in out["machine"]
    assert out["arm"] == "warm" and out["seeds"] == ["1", "2", "3"] and set(out["chosen"]) == {"1", "2", "3"}
    prior, stale = [0.5, 0.2, 0.6, 0.0], [0.3, 0.2, 0.1, 0.0]  # the four (seed, step, user) in key order
    d = out["prior_minus_stale_with_prior"]["NDCG@10"]
    assert d["pairs"] == 4 and d["difference"] == pytest.approx(np.mean(np.subtract(prior, stale))) == pytest.approx(0.175)
    assert out["prior_minus_arm"]["NDCG@10"]["difference"] == pytest.approx((0.4 + 0.2 + 0.3 + 0.0) / 4)
    assert out["mean_NDCG@10"]["recent"] == pytest.approx((0.4 + 0.2 + 0.6 + 0.1) / 4)
    assert "prior_minus_their_prior" not in out
    by_step = {k: v["prior_minus_stale_with_prior"]["NDCG@10"] for k, v in out["by_step"].items()}
    assert sorted(by_step) == ["1", "2"] and by_step["2"]["pairs"] == 1 and by_step["2"]["difference"] == 0.0
    assert by_step["1"]["difference"] == pytest.approx(((0.5 - 0.3) + (0.2 - 0.2) + (0.6 - 0.1)) / 3)
    pool.main([str(scratch12), str(scratch3), "--output", "against.json"])  # each input against its own chain
    out = json.loads((tmp_path / "against.json").read_text())
    d = out["prior_minus_their_prior"]["NDCG@10"]  # scratch's prior - warm's prior on 1/1/a, 3/1/a, 3/2/b
    assert out["against_arm"] == "warm" and d["pairs"] == 3
    assert d["difference"] == pytest.approx(((0.4 - 0.5) + (0.7 - 0.6) + (0.2 - 0.0)) / 3)
    assert out["arm_minus_their_arm"]["HR@10"]["difference"] == pytest.approx((0 + 0 + 1) / 3)


def test_what_cannot_be_pooled_is_refused_with_one_line(outputs, capsys):
    tmp_path, warm12, warm3, scratch12, scratch3 = outputs
    other_log = _output(tmp_path / "o.prior.json", "warm", _replay(tmp_path / "ro.json", "other.parquet"), {"4/1/a": _v(0, 0, 0, 0)})
    gated = _output(tmp_path / "g.prior.json", "warm", _replay(tmp_path / "rg.json", gate=True), {"5/1/a": _v(0, 0, 0, 0)})
    twice = _output(tmp_path / "t.prior.json", "warm", "r3.json", {"3/1/a": _v(0, 0, 0, 0)})
    paired = _output(tmp_path / "p.prior.json", "warm", "r12.json", {"9/1/a": _v(0, 0, 0, 0)}, against="s12.prior.json")
    (tmp_path / "broken.prior.json").write_text("{")
    cases = {
        "different arms": [warm12, scratch3], "different logs, periods or chains": [warm12, other_log],
        "--gate": [warm12, gated],
        "is in another input too": [warm3, twice], "some inputs were made --against": [warm3, paired],
        "not an output of replay_prior.py": [warm12, tmp_path / "broken.prior.json"],
    }  # fmt: skip
    for said, inputs in cases.items():
        with pytest.raises(SystemExit) as stopped:
            pool.main([*map(str, inputs), "--output", "x.json"])
        assert stopped.value.code == 2 and said in capsys.readouterr().err, said
    with pytest.raises(SystemExit):
        pool.main([str(warm12), "--output", str(warm12)])  # would overwrite an input
    assert not (tmp_path / "x.json").exists()
