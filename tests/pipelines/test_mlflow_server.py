"""The scheduled pipeline against a real ``mlflow server`` (SQLite backend, served artifacts, 127.0.0.1).

Two runs on the same tiny synthetic data: the first becomes the champion; the second, with a
deliberately worse config, is registered, tagged ``rejected`` with its metric, and the rankings
come from the champion.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import polars as pl
import pytest

from pipelines.cli import main
from recsys_alibi.data import schema

TINY = [  # like test_pipeline_end_to_end, trained long enough that the champion clearly beats the worse config:
    # the long-range probe at distance 3 (a cue -> answer lookup a tiny model learns in seconds; the
    # default task's latent taste needs far more users than 100 to be learnt)
    "generate.enabled=true", "generate.users=100", "generate.items=100", "generate.min_events=8",
    "generate.max_events=60", "generate.task=long-range", "generate.distance=3",
    "data.min_events_per_user=3", "data.min_events_per_item=1",
    "model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=16", "model.dropout=0.0",
    "train.max_epochs=8", "train.batch_size=16", "train.lr=0.005", "train.warmup_steps=1",
    "train.attention_health=false", "evaluate.ks=[1,5,10]", "score.k=10", "score.shard_users=50",
]
MLFLOW = Path(sys.executable).parent / "mlflow"
NAME = "server-test-ranker"
STARTUP_S = 90


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (the CLI, uvicorn and its worker), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def mlflow_server(tmp_path, monkeypatch, new_store):
    """A real tracking server on a free local port (on a store made from the session's template); stopped at
    teardown whatever the test did."""
    if not MLFLOW.exists():
        pytest.skip(f"no mlflow executable beside {sys.executable}")
    port = _free_port()
    root = tmp_path / "server"
    root.mkdir()
    log_file = (root / "server.log").open("w")
    proc = subprocess.Popen(
        [
            str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", new_store(root / "db.sqlite"),
            "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts",
        ],
        stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited with {proc.returncode}: {(root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server not healthy after {STARTUP_S} s: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        yield url
    finally:
        _stop(proc)
        log_file.close()


def _pipeline(out: Path, *extra: str) -> list[str]:
    args = ["pipeline", "--output", str(out), "--quiet", "--set", f"tracking.registered_model={NAME}"]
    for item in [*TINY, *extra]:
        args += ["--set", item]
    return args


def test_scheduled_pipeline_promotes_then_rejects_a_worse_model_on_a_real_server(tmp_path, mlflow_server, capsys):
    out = tmp_path / "job"
    assert main(_pipeline(out)) == 0
    first = capsys.readouterr().out.strip().splitlines()
    assert first[-1].startswith("pipeline: data ") and "decision: promoted: no champion yet" in first[-1]

    worse = ("train.max_epochs=1", "model.d_model=4", "train.lr=1e-6")
    assert main(_pipeline(out, *worse)) == 0
    second = capsys.readouterr().out.strip().splitlines()
    assert "decision: rejected (champion kept)" in second[-1]
    assert any(line.startswith("lineage: ") and "no earlier run with this data and config" in line for line in second)

    client = mlflow.MlflowClient()
    assert mlflow.get_tracking_uri() == mlflow_server
    versions = sorted(client.search_model_versions(f"name='{NAME}'"), key=lambda v: int(v.version))
    assert [str(v.version) for v in versions] == ["1", "2"]
    champion = client.get_model_version_by_alias(NAME, "champion")
    assert str(champion.version) == "1"
    rejected = client.get_model_version(NAME, "2").tags
    champion_ndcg = float(client.get_model_version(NAME, "1").tags["valid.NDCG_at_10"])
    new_ndcg = float(rejected["valid.NDCG_at_10"])
    assert new_ndcg <= champion_ndcg
    assert rejected["rejected"].startswith(f"NDCG@10 {new_ndcg:.4f} does not beat champion {champion_ndcg:.4f}")
    assert float(rejected["promotion.champion.NDCG_at_10"]) == pytest.approx(champion_ndcg)

    # lineage on both training runs: same data, different config
    runs = [client.get_run(v.run_id).data.tags for v in versions]
    assert runs[0]["lineage.data.sha256"] == runs[1]["lineage.data.sha256"]
    assert runs[0]["lineage.config_sha256"] != runs[1]["lineage.config_sha256"]
    assert runs[1]["promotion.decision"] == "rejected" and runs[1]["lineage.seed"] == "42"

    # rankings of the second run come from the champion (version 1, pinned by the gate), not from the rejected model
    manifest = (out / "rankings" / "_manifest.json").read_text()
    assert f"models:/{NAME}/{champion.version}" in manifest and champion.run_id in manifest and versions[1].run_id not in manifest
    rankings = pl.read_parquet(out / "rankings" / "*.parquet")
    sequences = pl.read_parquet(out / "prepared" / schema.SEQUENCES_FILE)
    assert rankings.get_column(schema.USER_ID).n_unique() == sequences.height
    # the artifacts went through the server, to its artifact root
    assert any((tmp_path / "server" / "artifacts").rglob("items.parquet"))
