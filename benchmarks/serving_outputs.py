"""Serving outputs on ML-1M: export time, FAISS recall and speed, changed-only scoring, rule files at scale.

Model: a short ML-1M training (configs/movielens-1m.yaml with ``--epochs`` epochs at
``model.max_len`` 50, ``d_model`` 64, float32, one thread), so the vectors have a trained geometry; logged to a private
MLflow store under the work folder. Input: ML-1M in the SASRec file, prepared (6,040 users,
3,416 items). Scoring settings: ``score.max_context`` 200 (longer histories: the window with
sinks), shards of 1,000 users. Steps (each timed, one process, one torch thread):

- ``export``: ``serving.export.export_model`` of every user, with ``--index faiss``;
- ``faiss``: recall@100 of HNSW (M, efConstruction, efSearch as ``export.*``) against exact
  inner product (IndexFlatIP), and queries/s of each on the exported user vectors (one search
  call of all users); the same on a synthetic catalog of ``--synthetic-items`` vectors
  (clustered Gaussians of the model's width, users as noisy cluster mixtures), if > 0;
- ``changed``: a full ``score`` of ML-1M, then 5 % of the histories get one more event: full
  re-score vs ``score --changed-since`` (times, carried users, rows with scores equal, part files byte-equal);
- ``rules``: a per-user deny file of ``--rule-users`` x 100 rows (sorted by user, row groups of
  1M rows): the time and peak RSS of reading one shard's rule rows (``score.shard_users`` users)
  with :meth:`serving.rules.ItemRules.for_users` in a fresh process.

Run::

    OMP_NUM_THREADS=1 python benchmarks/serving_outputs.py --work /tmp/serving-bench --json out.json

Prints a Markdown table of the figures; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ML1M = REPO.parent / "shared" / "data" / "ml-1m" / "ml-1m.txt.gz"
TRAIN = ["model.max_len=50", "model.d_model=64", "train.batch_size=256", "train.precision=32-true",
         "train.accelerator=cpu", "train.val_users=500", "train.max_minutes=15", "train.warmup_steps=10", "evaluate.ks=[10]",
         "train.attention_health=false"]  # fmt: skip
SCORE = ["score.device=cpu", "score.max_context=200", "score.shard_users=1000"]  # histories beyond 200: window + sinks


def _timed(fn, *args, **kwargs):
    started = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - started


def prepare_and_train(work: Path, epochs: int, log: Path = ML1M) -> tuple[Path, str, dict]:
    """ML-1M prepared under ``work`` and a short training; returns (prepared, model URI, figures)."""
    import os

    from pipelines.train import run_train
    from recsys_alibi.config import load_config
    from recsys_alibi.data.prepare import prepare

    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    config = load_config(REPO / "configs" / "movielens-1m.yaml", [*TRAIN, f"train.max_epochs={epochs}",
                                                                 f"output={work / 'run'}"])  # fmt: skip
    prepared = work / "prepared"
    if not (prepared / "sequences.parquet").is_file():
        prepare(config.data, log, prepared)
    uri_file = work / "model_uri.txt"
    if uri_file.is_file():
        return prepared, uri_file.read_text().strip(), {}
    result, seconds = _timed(run_train, config, prepared, progress=False)
    uri = f"runs:/{result.run_id}/model"
    uri_file.write_text(uri)
    return prepared, uri, {"train_seconds": round(seconds, 1), "epochs": epochs}


def bench_export(work: Path, prepared: Path, uri: str) -> dict:
    from recsys_alibi.config import load_config
    from serving.export import run_export

    config = load_config(None, [*SCORE, "export.index=faiss", "export.hnsw_above=0"])
    result, seconds = _timed(run_export, config, uri, prepared, work / "export")
    return {"export_seconds": round(seconds, 2), "export_users": result.users, "export_items": result.items,
            "export_hnsw_recall_at_100_on_users": result.index["recall"]}  # fmt: skip


def bench_faiss(items: np.ndarray, queries: np.ndarray, m: int, ef_construction: int, ef_search: int, k: int = 100) -> dict:
    """Recall@k of HNSW vs IndexFlatIP on ``queries``, build time, queries/s of each (one search call)."""
    import faiss

    n, d = items.shape
    exact = faiss.IndexFlatIP(d)
    exact.add(items)
    (_, truth), exact_s = _timed(exact.search, queries, k)
    hnsw = faiss.IndexHNSWFlat(d, m, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = ef_construction
    _, build_s = _timed(hnsw.add, items)
    hnsw.hnsw.efSearch = ef_search
    (_, found), hnsw_s = _timed(hnsw.search, queries, k)
    recall = float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(truth, found)]))
    return {"items": n, "queries": len(queries), "recall_at_100": round(recall, 4), "hnsw_build_s": round(build_s, 1),
            "hnsw_qps": round(len(queries) / hnsw_s), "exact_qps": round(len(queries) / exact_s),
            "M": m, "efConstruction": ef_construction, "efSearch": ef_search}  # fmt: skip


def synthetic(n_items: int, d: int, n_queries: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Clustered item vectors (1,000 Gaussian clusters, lognormal norms: popular items) and user queries."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(1_000, d)).astype(np.float32)
    items = centres[rng.integers(0, 1_000, n_items)] + 0.5 * rng.normal(size=(n_items, d)).astype(np.float32)
    items *= rng.lognormal(0, 0.3, (n_items, 1)).astype(np.float32)
    queries = centres[rng.integers(0, 1_000, (n_queries, 3))].sum(axis=1) + rng.normal(size=(n_queries, d)).astype(np.float32)
    return np.ascontiguousarray(items, dtype=np.float32), np.ascontiguousarray(queries, dtype=np.float32)


def bench_changed(work: Path, prepared: Path, uri: str, share: float = 0.05) -> dict:
    """Full score, then ``share`` of histories get one more event: full re-score vs changed-only."""
    import polars as pl

    from recsys_alibi.config import load_config
    from serving.engines import run_score

    config = load_config(None, [*SCORE, "score.k=100"])
    run_score(config, uri, prepared, work / "before", progress=False)
    seq = pl.read_parquet(prepared / "sequences.parquet")
    rng = np.random.default_rng(0)
    picked = rng.choice(seq.height, round(share * seq.height), replace=False)
    hit = pl.int_range(pl.len()).is_in(picked.tolist())
    changed = work / "changed"
    changed.mkdir(exist_ok=True)
    seq.with_columns(
        pl.when(hit).then(pl.col("item_idx").list.concat(pl.lit([1], dtype=pl.List(pl.Int32)))).otherwise(pl.col("item_idx")),
        pl.when(hit).then(pl.col("timestamp").list.concat(pl.col("timestamp").list.max() + 1)).otherwise(pl.col("timestamp")),
    ).with_columns(pl.col("item_idx").list.len().cast(pl.Int32).alias("length")).write_parquet(changed / "sequences.parquet")  # fmt: skip
    pl.read_parquet(prepared / "items.parquet").write_parquet(changed / "items.parquet")
    full, full_s = _timed(run_score, config, uri, changed, work / "full", progress=False)
    delta_cfg = load_config(None, [*SCORE, "score.k=100", f"score.changed_since={work / 'before'}"])
    delta, delta_s = _timed(run_score, delta_cfg, uri, changed, work / "delta", progress=False)
    a = pl.read_parquet(work / "full" / "part-*.parquet").sort("user_id", "rank")
    b = pl.read_parquet(work / "delta" / "part-*.parquet").sort("user_id", "rank")
    parts = sorted(p.name for p in (work / "full").glob("part-*.parquet"))
    same_files = parts == sorted(p.name for p in (work / "delta").glob("part-*.parquet")) and all(
        (work / "full" / n).read_bytes() == (work / "delta" / n).read_bytes() for n in parts)  # fmt: skip
    return {"changed_share": share, "full_score_s": round(full_s, 2), "changed_only_s": round(delta_s, 2),
            "carried_users": delta.carried_users, "users": full.users, "rows_equal_with_scores": a.equals(b),
            "part_files_byte_equal": same_files}  # fmt: skip


RULES_CHILD = """
import json, resource, sys, time
import polars as pl
from serving.rules import ItemRules
before = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")][0] / 1024
rules = ItemRules(None, sys.argv[1], pl.read_parquet(sys.argv[2]))
users = pl.Series("user_id", list(range(int(sys.argv[3]), int(sys.argv[3]) + int(sys.argv[4]))), dtype=pl.Int64)
start = time.perf_counter()
got = rules.for_users(users)
seconds = time.perf_counter() - start
print(json.dumps({"shard_read_s": round(seconds, 2), "rows": int(got.per_user["deny"].values.shape[0]),
                  "rss_after_imports_mib": round(before),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""


def bench_rules(work: Path, prepared: Path, n_users: int, per_user: int = 100, shard: int = 50_000) -> dict:
    """A ``n_users`` x ``per_user`` deny file, then one shard's rows read in a fresh process (time, peak RSS)."""
    import polars as pl
    import pyarrow.parquet as pq

    path = work / f"deny-{n_users}.parquet"
    items = pl.read_parquet(prepared / "items.parquet")
    if not path.is_file():
        rng = np.random.default_rng(0)
        ids = items.get_column("item_id").to_numpy()
        writer, step = None, 100_000
        for start in range(0, n_users, step):
            users = np.repeat(np.arange(start, min(start + step, n_users)), per_user)
            chunk = pl.DataFrame({"user_id": users, "item_id": ids[rng.integers(0, len(ids), len(users))]}).to_arrow()
            writer = writer or pq.ParquetWriter(path, chunk.schema)
            writer.write_table(chunk, row_group_size=1_000_000)
        writer.close()
    child = subprocess.run([sys.executable, "-c", RULES_CHILD, str(path), str(prepared / "items.parquet"),
                            str(n_users // 2), str(shard)], capture_output=True, text=True, cwd=REPO, check=True)  # fmt: skip
    out = json.loads(child.stdout.strip().splitlines()[-1])
    return {"rule_rows": n_users * per_user, "rule_file_mib": round(path.stat().st_size / 2**20), "shard_users": shard, **out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--log", type=Path, default=ML1M, help="behaviour log (default ML-1M, SASRec file)")
    parser.add_argument("--steps", default="export,faiss,changed,rules")
    parser.add_argument("--synthetic-items", type=int, default=1_000_000)
    parser.add_argument("--rule-users", type=int, default=1_000_000)
    parser.add_argument("--synthetic-hnsw", default="16,100,256", help="M,efConstruction,efSearch of the synthetic catalog")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)
    steps = args.steps.split(",")
    prepared, uri, figures = prepare_and_train(args.work, args.epochs, args.log)
    figures = {"model_uri": uri, **figures}
    if "export" in steps:
        figures.update(bench_export(args.work, prepared, uri))
    if "faiss" in steps:
        import polars as pl

        users = pl.read_parquet(args.work / "export" / "users.parquet").get_column("vector").to_numpy()
        items = pl.read_parquet(args.work / "export" / "items.parquet").get_column("vector").to_numpy()
        figures["faiss_ml1m"] = bench_faiss(items, users, 32, 200, 256)
        if args.synthetic_items:
            m, ef_construction, ef_search = (int(v) for v in args.synthetic_hnsw.split(","))
            figures["faiss_synthetic"] = bench_faiss(*synthetic(args.synthetic_items, items.shape[1], 1_000), m,
                                                     ef_construction, ef_search)  # fmt: skip
    if "changed" in steps:
        figures.update(bench_changed(args.work, prepared, uri))
    if "rules" in steps:
        figures["rules"] = bench_rules(args.work, prepared, args.rule_users)
    figures["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
