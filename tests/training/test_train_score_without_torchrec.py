"""``recsys-alibi train`` and ``score`` on a machine where torchrec cannot be imported.

Both commands run in subprocesses with torchrec and fbgemm-gpu hidden from the import system
(``tests/without_modules.py``): the item table is then the plain ``nn.Embedding``. The logged
model then scores again in this process, where torchrec imports (the model loads with the torchrec
table), to the same rankings.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from training_fixtures import write_walks
from without_modules import run_without

from pipelines.cli import main

TINY = [
    "model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=16", "model.attention_backend=sdpa",
    "train.max_epochs=2", "train.batch_size=32", "train.warmup_steps=1", "train.attention_health=false",
    "train.accelerator=cpu", "score.k=5", "score.shard_users=100",
]  # fmt: skip


def _cli_without_torchrec(*args: str, cwd: Path) -> str:
    done = run_without("torchrec,fbgemm_gpu", "-m", "pipelines.cli", *args, cwd=cwd)
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr
    told = [line for line in done.stderr.splitlines() if "torchrec" in line]
    assert len(told) <= 1 and all(line.endswith("the item table is a plain nn.Embedding") for line in told), told
    return done.stdout


def test_train_and_score_run_where_torchrec_cannot_be_imported(tmp_path, mlflow_store, capsys):
    prepared = write_walks(tmp_path / "prepared")
    sets = [arg for item in TINY for arg in ("--set", item)]
    printed = _cli_without_torchrec("train", "--prepared", str(prepared), "--quiet", *sets, cwd=tmp_path)
    run_id = next(line for line in printed.splitlines() if line.startswith("mlflow_run_id: ")).split(": ", 1)[1]
    uri = f"runs:/{run_id}/model"
    _cli_without_torchrec("score", "--model-uri", uri, "--input", str(prepared), "--output", str(tmp_path / "plain"),
                          "--quiet", *sets, cwd=tmp_path)  # fmt: skip
    plain = pl.read_parquet(tmp_path / "plain" / "*.parquet").sort("user_id", "rank")
    assert plain.height == 240 * 5 and plain["user_id"].n_unique() == 240

    assert main(["score", "--model-uri", uri, "--input", str(prepared), "--output", str(tmp_path / "torchrec"),
                 "--quiet", *sets]) == 0  # fmt: skip
    torchrec = pl.read_parquet(tmp_path / "torchrec" / "*.parquet").sort("user_id", "rank")
    assert torchrec.select("user_id", "rank", "item_id").equals(plain.select("user_id", "rank", "item_id"))
    assert (torchrec["score"] - plain["score"]).abs().max() < 1e-5

    from recsys_alibi.tracking import load_ranker

    assert load_ranker(uri).model.items.backend == "torchrec"  # rebuilt where torchrec imports
