"""What a command prints is the project's own lines (users run them from cron): third-party notices that
``pipelines.cli.configure_logging`` silences, the project's own INFO and WARNING lines kept."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# after configure_logging, as in a command: lightning imported afterwards (it resets its loggers' levels),
# its process group started (what train.strategy=ddp and torchrun do per rank), a SIGTERM noted by its
# signal connector, and torchrec's planner planning an item table (model.shard_embeddings)
SCRIPT = textwrap.dedent("""
    import logging
    from pipelines.cli import configure_logging
    configure_logging()
    import torch
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.fabric.utilities.distributed import _init_dist_connection
    from lightning.pytorch.trainer.connectors import signal_connector
    _init_dist_connection(LightningEnvironment(), "gloo", global_rank=0, world_size=1)
    torch.distributed.destroy_process_group()
    signal_connector.log.info("Received SIGTERM: 15")
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection
    table = EmbeddingConfig(name="item_table", embedding_dim=8, num_embeddings=10, feature_names=["item"])
    collection = EmbeddingCollection(tables=[table], device=torch.device("cpu"))
    EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu")).plan(
        collection, [EmbeddingCollectionSharder()])
    logging.getLogger("recsys_alibi.training").info("own info")
    logging.getLogger("pipelines.train").warning("own warning")
    logging.getLogger("torchrec.distributed.planner.types").warning("another torchrec warning")
""")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_lightning_distributed_and_torchrec_planner_notices_are_silenced_the_project_lines_kept(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for noise in ("Initializing distributed", "Received SIGTERM", "The topology was constructed directly",
                  "HeuristicalStorageReservation", "dense tensor size"):  # fmt: skip
        assert noise not in proc.stderr + proc.stdout
    # the project's lines once each, and torchrec's other warnings still shown
    assert proc.stderr.splitlines() == ["own info", "own warning", "another torchrec warning"]


def test_mlflow_prints_no_run_and_experiment_urls_when_a_run_ends_on_a_tracking_server(monkeypatch, capsys):
    from types import SimpleNamespace

    from mlflow.store.tracking.rest_store import RestStore
    from mlflow.tracking._tracking_service.client import TrackingServiceClient

    from pipelines.cli import configure_logging

    monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", raising=False)  # restored after the test
    client = TrackingServiceClient("http://127.0.0.1:5000")  # what end_run calls as a run ends (no request made)
    assert isinstance(client.store, RestStore)
    run = SimpleNamespace(data=SimpleNamespace(tags={}), info=SimpleNamespace(experiment_id="1", run_name="r"))
    monkeypatch.setattr(RestStore, "get_run", lambda self, run_id: run)
    client._log_url("abc")
    assert "View run" in capsys.readouterr().out  # MLflow's own behaviour: the lines this test is about
    configure_logging()
    client._log_url("abc")
    assert capsys.readouterr().out == ""


def test_numerics_probe_logging_keeps_its_lines_without_fbgemm_library_notices(tmp_path):
    """``python -m benchmarks.numerics``: fbgemm_gpu logs "Successfully loaded: 'fbgemm_gpu_*.so'" on the root
    logger at INFO for each of its libraries as torchrec is imported."""
    script = ("import logging; from benchmarks.numerics import configure_logging; configure_logging(); "
              "import torchrec; logging.getLogger('benchmarks.numerics').info('probe line')")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Successfully loaded" not in proc.stderr
    assert [line.split(" ", 2)[-1] for line in proc.stderr.splitlines()] == ["probe line"]  # after the time
