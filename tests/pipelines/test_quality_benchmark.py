"""benchmarks/quality.py: the seed summary, and a whole run with two parallel jobs on a new store."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline_end_to_end import TINY
from benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[2]
quality = load_benchmark("quality", "quality_benchmark")
summarise = quality.summarise


def _run(seed: int, hr: float, ndcg: float) -> dict:
    return {"seed": seed, "train_seconds": 10.0 * seed, "epochs": seed, "metrics": {"HR@10": hr, "NDCG@10": ndcg}}


def test_summarise_gives_means_and_sample_std_over_seeds():
    out = summarise([_run(1, 0.30, 0.18), _run(2, 0.32, 0.19), _run(3, 0.34, 0.17)])
    assert out["HR@10"] == pytest.approx(0.32) and out["NDCG@10"] == pytest.approx(0.18)
    # sample std (ddof = 1): sqrt((0.02^2 + 0 + 0.02^2) / 2) = 0.02; NDCG: sqrt((0 + 0.01^2 + 0.01^2) / 2) = 0.01
    assert out["HR@10_std"] == pytest.approx(0.02) and out["NDCG@10_std"] == pytest.approx(0.01)
    assert out["seeds"] == [1, 2, 3] and out["train_seconds"] == [10.0, 20.0, 30.0] and out["epochs"] == [1, 2, 3]
    assert "MRR" not in out  # absent metrics are left out, not zero
    assert summarise([_run(7, 0.3, 0.2)])["NDCG@10_std"] == 0.0


def test_two_parallel_jobs_on_a_new_tracking_store_write_the_results(tmp_path):
    """Both workers start on a store that does not exist yet (they used to race migrating it)."""
    args = [sys.executable, str(REPO / "benchmarks" / "quality.py"), "--config", str(REPO / "configs" / "default.yaml")]
    args += ["--seeds", "1", "--jobs", "2", "--workdir", "work", "--json", "result.json", "--curve", "curve.png"]
    for item in TINY:
        args += ["--set", item]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]

    result = json.loads((tmp_path / "result.json").read_text())
    alibi, sasrec = result["per_seed"]["ALiBi"], result["per_seed"]["SASRec"]
    assert [r["position"] for r in alibi] == ["alibi"] and [r["position"] for r in sasrec] == ["learned"]
    assert result["NDCG@10"] == alibi[0]["metrics"]["NDCG@10"] and result["NDCG@10_std"] == 0.0
    assert result["baseline"]["HR@10"] == sasrec[0]["metrics"]["HR@10"]
    assert result["seeds"] == result["baseline"]["seeds"] == [1]
    assert len(alibi[0]["val_curve"]) == alibi[0]["epochs"] == 2  # one validation per epoch (TINY: 2 epochs)
    assert 0.0 < result["popularity"]["HR@10"] <= 1.0
    assert result["command"].startswith("python benchmarks/quality.py --config ")
    assert (tmp_path / "curve.png").stat().st_size > 0
    assert "| ALiBi ranker |" in done.stdout and "| SASRec (learned positions) |" in done.stdout

    # the same command again (a re-run after a kill): both finished runs are reused, not retrained
    finished = json.loads((tmp_path / "work" / "finished.json").read_text())
    assert sorted(r["position"] for r in finished.values()) == ["alibi", "learned"]
    again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("reused the finished run") == 2 and "epochs in" not in again.stdout
    assert json.loads((tmp_path / "result.json").read_text())["per_seed"] == result["per_seed"]
    assert result["command"] == shlex.join(["python", "benchmarks/quality.py", *args[2:]])  # argv as given
    assert f"cores, Python {'.'.join(map(str, sys.version_info[:3]))}, {result['torch_threads_per_run']} torch thread" in result["machine"]
    # --models SASRec: the baseline re-measured (here its finished run, reused); the ALiBi runs finished in the
    # workdir are kept in the JSON beside it (never trained by this command)
    alone = [*args[:args.index("--json")], "--json", "sasrec.json", "--curve", "sasrec.png", *args[args.index("--curve") + 2:],
             "--models", "SASRec"]  # fmt: skip
    done = subprocess.run(alone, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    sasrec_only = json.loads((tmp_path / "sasrec.json").read_text())
    assert sasrec_only["per_seed"] == result["per_seed"] and sasrec_only["NDCG@10"] == result["NDCG@10"]
    assert sasrec_only["baseline"]["HR@10"] == result["baseline"]["HR@10"]
    assert done.stdout.count("reused the finished run") == 2 and "ALiBi: not in --models; its finished runs" in done.stdout
    # the ALiBi runs gone from the workdir: its figures of the earlier --json are kept, not dropped
    finished_path = tmp_path / "work" / "finished.json"
    finished_path.write_text(json.dumps({k: r for k, r in finished.items() if r["position"] == "learned"}))
    alone[alone.index("sasrec.json")] = "result.json"
    done = subprocess.run(alone, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    kept = json.loads((tmp_path / "result.json").read_text())
    assert kept["NDCG@10"] == result["NDCG@10"] and kept["per_seed"] == result["per_seed"]
    assert "ALiBi: not in --models and not every seed finished" in done.stdout and "figures kept from result.json" in done.stdout


def test_the_table_shows_the_spread_of_several_seeds_even_when_it_is_zero():
    block = {"HR@10": 0.0067, "HR@10_std": 0.0, "seeds": [1, 2]}
    table = quality.markdown_table({**block, "baseline": {**block, "seeds": [1]}, "popularity": {"HR@10": 0.01}})
    alibi, sasrec, popularity = table.splitlines()[2:5]
    assert "| 0.0067 ± 0.0000 |" in alibi  # two seeds that agree: a spread of 0, not a single-seed figure
    assert "| 0.0067 |" in sasrec and "±" not in sasrec and "±" not in popularity  # one seed: no spread to give


def test_run_key_follows_the_resolved_config():
    from recsys_alibi.config import load_config

    config = str(REPO / "configs" / "default.yaml")
    one, same = load_config(config, ["seed=1"]), load_config(config, ["seed=1"])
    assert quality.run_key(one) == quality.run_key(same)
    assert quality.run_key(one) != quality.run_key(load_config(config, ["seed=2"]))
    from recsys_alibi.config import sasrec_overrides

    assert quality.run_key(one) != quality.run_key(load_config(config, ["seed=1", *sasrec_overrides()]))
    assert quality.read_finished(REPO / "no-such-file.json") == {}


def test_a_finished_run_is_found_after_the_config_gained_a_key_at_its_default():
    """A finished run recorded before a config key existed (its ``config`` lacks it) is reused while the key is at
    its default; a changed value of a key it recorded, or the new key set away from its default, trains again."""
    from recsys_alibi.config import load_config

    config = load_config(str(REPO / "configs" / "default.yaml"), ["seed=1"])
    recorded = quality.config_record(config)
    del recorded["data"]["quote_char"]  # as a run recorded before data.quote_char existed
    finished = {"older-key": {"seed": 1, "epochs": 3, "config": recorded}}
    assert quality.find_finished(finished, config) == finished["older-key"]
    assert quality.find_finished(finished, load_config(str(REPO / "configs" / "default.yaml"), ["seed=2"])) is None
    unquoted = load_config(str(REPO / "configs" / "default.yaml"), ["seed=1", "data.quote_char=null"])
    assert quality.find_finished(finished, unquoted) is None
    assert quality.find_finished({quality.run_key(config): {"seed": 1}}, config) == {"seed": 1}



def test_a_run_killed_mid_way_resumes_from_its_checkpoint_and_equals_an_uninterrupted_one(
    tmp_path, monkeypatch, mlflow_store, one_torch_thread
):
    """Real tiny training (one thread): a run killed at the start of epoch 2 is continued by the next
    ``train_and_test`` of the same config from its epoch-1 ``last.ckpt`` and gives what an uninterrupted run gives;
    the switch that resumes it leaves the run's key (``run_key``) unchanged."""
    import pipelines.train
    from benchmark_scripts import load_module
    from recsys_alibi.config import load_config

    fixtures = load_module(REPO / "tests" / "training" / "training_fixtures.py", "training_fixtures_for_quality")
    prepared = fixtures.write_walks(tmp_path / "prepared", n_users=60)
    tiny = [*fixtures.TINY, *fixtures.NO_ITEM_TABLE, "train.max_epochs=4", "evaluate.batch_size=32", "seed=3"]

    def config(name: str):
        return load_config(str(REPO / "configs" / "default.yaml"), [*tiny, f"output={tmp_path / name}"])

    full = quality.train_and_test(config("uninterrupted"), prepared)
    real_callbacks = pipelines.train.training_callbacks
    monkeypatch.setattr(pipelines.train, "training_callbacks", lambda c: [*real_callbacks(c), fixtures.KillAt(2)])
    with pytest.raises(fixtures.Killed):
        quality.train_and_test(config("killed"), prepared)
    monkeypatch.setattr(pipelines.train, "training_callbacks", real_callbacks)
    # another config first (a re-run with --set model.d_model=32): a new run, not a refused resume (was exit 1)
    monkeypatch.setattr(pipelines.train, "training_callbacks", lambda c: [*real_callbacks(c), fixtures.KillAt(2)])
    with pytest.raises(fixtures.Killed):
        quality.train_and_test(config("other"), prepared)
    monkeypatch.setattr(pipelines.train, "training_callbacks", real_callbacks)
    wider = load_config(str(REPO / "configs" / "default.yaml"), [*tiny, f"output={tmp_path / 'other'}", "model.d_model=32"])
    assert quality.train_and_test(wider, prepared)["resumed_from"] is None
    given = config("killed")
    key = quality.run_key(given)
    resumed = quality.train_and_test(given, prepared)

    assert full["resumed_from"] is None
    assert resumed["resumed_from"] is not None and resumed["resumed_from"].endswith("last.ckpt")
    assert resumed["epochs"] == full["epochs"] == 4
    assert resumed["val_curve"] == full["val_curve"] and len(full["val_curve"]) == 4  # the epochs before the kill kept
    assert resumed["metrics"] == full["metrics"]
    assert given.train.resume is False and quality.run_key(given) == key  # the config given (and keyed) is unchanged
