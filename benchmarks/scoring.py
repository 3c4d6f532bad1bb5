"""Batch scoring throughput and peak memory: users/s and peak RSS of the whole ``score`` job.

Model: a randomly initialised ``AlibiRanker`` (d_model 64, 2 layers, 2 heads, max_len 200,
dropout 0): the cost of scoring does not depend on the weights. Input: a sequences Parquet file
of U users whose histories are L events drawn uniformly from a catalog of N items. Each
configuration runs in a fresh process (so that peak RSS is its own) through
:func:`serving.score.score_with_model`: read shards, encode, chunked top-K with seen items
excluded, write part files and manifest. Reported: users/s over the whole job, RSS before
scoring (imports + model + item table) and peak RSS.

Run (defaults: the table in docs/benchmarks.md)::

    python benchmarks/scoring.py                       # catalogs x history lengths, K=100
    python benchmarks/scoring.py --memory-sweep        # peak RSS vs number of users
    python benchmarks/scoring.py --catalogs 10000 --lengths 200 --users 500   # one row
    python benchmarks/scoring.py --engines ../shared/data/ml-1m/ml-1m.txt.gz  # score vs pyfunc vs Ray

``--engines LOG``: the same random model and the same prepared input (``prepare`` of LOG, e.g.
ML-1M in the SASRec format) scored three ways in this process, users/s of each: ``score``
(``score_with_model``, torch on all threads), the MLflow pyfunc on one process
(``RankerPyfunc.predict`` on a frame of raw ids) and the Ray job (``score_with_ray``, 2 actors of
1 CPU each on a local 2-CPU instance, whose start is timed apart), and Ray's wall time over
``score``'s.

Prints a Markdown table; ``--json PATH`` also writes ``{"command", "machine", "rows"}`` (its folder is made
before anything is measured).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from a checkout

D_MODEL, N_LAYERS, N_HEADS, MAX_LEN = 64, 2, 2, 200


def _rss_mib(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_sequences(path: Path, users: int, length: int, n_items: int, seed: int = 0) -> None:
    """U users x L uniform random items (1..N) as a sequences Parquet, 10,000 users per row group."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    writer = None
    for start in range(0, users, 10_000):
        n = min(10_000, users - start)
        values = rng.integers(1, n_items + 1, n * length, dtype=np.int32)
        offsets = np.arange(0, (n + 1) * length, length, dtype=np.int32)
        table = pa.table(
            {
                "user_id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                "item_idx": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
            }
        )
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()
    assert pl.scan_parquet(path).select(pl.len()).collect().item() == users


def run_one(n_items: int, length: int, users: int, k: int, input_path: Path, shard_users: int) -> dict:
    """One configuration in this process: build the model, score, measure."""
    import polars as pl
    import torch

    from recsys_alibi.config import JobConfig, ModelConfig, with_overrides
    from recsys_alibi.model.transformer import AlibiRanker
    from serving.score import score_with_model

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=D_MODEL, n_layers=N_LAYERS, n_heads=N_HEADS, max_len=MAX_LEN, dropout=0.0)
    model = AlibiRanker(cfg, n_items)
    items = pl.DataFrame({"item_idx": pl.Series(np.arange(1, n_items + 1), dtype=pl.Int32),
                          "item_id": pl.Series(np.arange(1, n_items + 1), dtype=pl.Int64)})  # fmt: skip
    config = with_overrides(JobConfig(), score={"k": k, "shard_users": shard_users})
    rss_before = _rss_mib()
    out = Path(tempfile.mkdtemp(prefix="score-bench-"))
    load_before = os.getloadavg()[0]
    try:
        started = time.perf_counter()
        result = score_with_model(config, model, items, input_path, out / "rankings", progress=False)
        seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(out, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "catalog": n_items, "history": length, "users": users, "k": k, "rows": result.rows,
        "seconds": round(seconds, 2), "users_per_s": round(users / seconds, 1),
        "rss_before_mib": round(rss_before), "peak_rss_mib": round(peak),
        "threads": torch.get_num_threads(), "load_avg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }  # fmt: skip


def measure(n_items: int, length: int, users: int, k: int, shard_users: int, workdir: Path) -> dict:
    """Write the input, then run :func:`run_one` in a fresh process and return its row."""
    data = workdir / f"seq-{users}-{length}-{n_items}.parquet"
    if not data.exists():
        write_sequences(data, users, length, n_items)
    cmd = [sys.executable, __file__, "--one", str(n_items), str(length), str(users), str(k), str(data), str(shard_users)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    head = "| catalog N | history L | users | users/s | RSS before scoring (MiB) | peak RSS (MiB) | seconds | load avg |\n"
    head += "|---:|---:|---:|---:|---:|---:|---:|---|\n"
    return head + "\n".join(
        f"| {r['catalog']:,} | {r['history']:,} | {r['users']:,} | {r['users_per_s']:,} | {r['rss_before_mib']:,} "
        f"| {r['peak_rss_mib']:,} | {r['seconds']} | {r['load_avg'][0]} -> {r['load_avg'][1]} |"
        for r in rows
    )


def compare_engines(log: Path, k: int, shard_users: int, workdir: Path) -> list[dict]:
    """users/s of ``score``, the pyfunc and the Ray job on the prepared ``log`` (one random model)."""
    import polars as pl
    import torch

    from recsys_alibi.config import DataConfig, JobConfig, ModelConfig, with_overrides
    from recsys_alibi.data.prepare import prepare
    from recsys_alibi.model.transformer import AlibiRanker
    from serving.pyfunc import RankerPyfunc
    from serving.ray_job import ray_instance, score_with_ray
    from serving.score import score_with_model

    prepared = workdir / "prepared"
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), log, prepared)
    items = pl.read_parquet(prepared / "items.parquet")
    seq = pl.read_parquet(prepared / "sequences.parquet")
    ids = pl.concat([pl.Series([None], dtype=items["item_id"].dtype), items.sort("item_idx")["item_id"]])
    frame = seq.select("user_id", pl.col("item_idx").list.eval(pl.element().cast(pl.Int64)).alias("item_id"))
    frame = frame.with_columns(pl.col("item_id").list.eval(pl.element().replace_strict(
        pl.Series(range(ids.len())), ids, return_dtype=ids.dtype)))  # fmt: skip
    torch.manual_seed(0)
    model = AlibiRanker(ModelConfig(d_model=D_MODEL, n_layers=N_LAYERS, n_heads=N_HEADS, max_len=MAX_LEN, dropout=0.0),
                        items.height).eval()  # fmt: skip
    config = with_overrides(JobConfig(), score={"k": k, "shard_users": shard_users, "ray": {"actors": 2}})
    users = seq.height
    rows = []

    def row(engine: str, seconds: float, extra: str = "") -> None:
        rows.append({"engine": engine, "users": users, "seconds": round(seconds, 1), "users_per_s": round(users / seconds, 1),
                     "threads": torch.get_num_threads(), "load_avg": round(os.getloadavg()[0], 1), "note": extra})  # fmt: skip
        print(rows[-1], flush=True)

    started = time.perf_counter()
    local = score_with_model(config, model, items, prepared, workdir / "score", progress=False)
    row("score", time.perf_counter() - started, f"{local.rows} rows")
    started = time.perf_counter()
    got = RankerPyfunc(model, items, config.score).predict(frame.to_pandas(), {"k": k})
    row("pyfunc, one process", time.perf_counter() - started, f"{len(got)} rows")
    started = time.perf_counter()
    with ray_instance(config.score.ray):
        init = time.perf_counter() - started
        started = time.perf_counter()
        remote = score_with_ray(config, model, items, prepared, workdir / "ray", progress=False)
        row("Ray job, 2 CPU actors", time.perf_counter() - started, f"{remote.rows} rows; ray.init {init:.1f} s apart")
    rows.append({"engine": "Ray / score (wall)", "ratio": round(rows[2]["seconds"] / rows[0]["seconds"], 2)})
    return rows


def _write_rows(path: Path, rows: list[dict], argv: list[str] | None) -> None:
    import torch

    from recsys_alibi.atomic import write_text_atomic  # a device or FIFO there is refused, never replaced
    from recsys_alibi.diagnostics.machine import command_line, machine_line

    doc = {"command": command_line("benchmarks/scoring.py", argv), "machine": machine_line(torch.get_num_threads()),
           "rows": rows}  # fmt: skip
    write_text_atomic(path, json.dumps(doc, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalogs", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--lengths", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--users", type=int, nargs="+", default=None,
                        help="users per history length (default: 1,000 for L=200, 200 for L=2,000)")  # fmt: skip
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--shard-users", type=int, default=5_000)
    parser.add_argument("--memory-sweep", action="store_true", help="peak RSS for 10^3, 10^4, 10^5 users (N=10^4, L=50)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--engines", type=Path, metavar="LOG", help="score vs pyfunc vs Ray on this event log")
    args = parser.parse_args(argv)
    if args.json is not None and not args.one:
        if args.json.is_dir():
            parser.error(f"--json {args.json}: a folder")
        args.json.parent.mkdir(parents=True, exist_ok=True)  # before the measurement: its rows are never lost
    if args.engines:
        work = Path(tempfile.mkdtemp(prefix="score-engines-"))
        try:
            rows = compare_engines(args.engines, args.k, args.shard_users, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if args.json:
            _write_rows(args.json, rows, argv)
        return 0
    if args.one:
        n_items, length, users, k, data, shard = args.one
        print(json.dumps(run_one(int(n_items), int(length), int(users), int(k), Path(data), int(shard))))
        return 0
    work = Path(tempfile.mkdtemp(prefix="score-bench-data-"))
    rows = []
    try:
        if args.memory_sweep:
            for users in args.users or [1_000, 10_000, 100_000]:
                rows.append(measure(10_000, 50, users, args.k, args.shard_users, work))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
        else:
            default_users = {200: 1_000, 2000: 200}
            for length in args.lengths:
                for n_items in args.catalogs:
                    users = args.users[0] if args.users else default_users.get(length, 500)
                    rows.append(measure(n_items, length, users, args.k, args.shard_users, work))
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(rows))
    if args.json:
        _write_rows(args.json, rows, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
