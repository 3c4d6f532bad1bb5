"""Throughput and peak memory of ``prepare`` on synthetic Parquet logs, beside plain pandas.

Run (from the repository root):

    .venv/bin/python benchmarks/pipeline.py --sizes 10000000 50000000 --workdir /tmp/recsys-alibi-bench

For each size it writes (once, cached in ``--workdir``) a synthetic log of the embedded default
data (``generate_events``) sorted by timestamp, as a real event stream is, then runs each
engine in a fresh subprocess and reads back its wall time, CPU time (user + system) and peak
RSS (``ru_maxrss``):

* ``polars``: ``recsys_alibi.data.prepare.prepare`` (streaming ingest, user-hash partitions).
* ``pandas``: the same transform written plainly with pandas (validate, drop exact duplicates,
  iterative 5-core, vocabulary, sort, per-user lists, write events/items/sequences Parquet).

Before timing, ``--check-size`` events are run through both engines and their sequences and
vocabularies are compared, so that the two do the same work. Prints a Markdown table.
pandas is used here only, never in the library.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

MIN_EVENTS = 5  # k-core thresholds of both engines


def _rusage() -> dict[str, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "peak_rss_gib": ru.ru_maxrss / 1024**2}


def generate(size: int, path: Path) -> None:
    """A time-ordered synthetic log of about ``size`` events (default task, ~212 events per user)."""

    from recsys_alibi.atomic import atomic_path
    from recsys_alibi.config import GenerateConfig
    from recsys_alibi.data.synthetic import generate_events

    cfg = GenerateConfig(users=max(10, round(size / 212)), items=max(1000, size // 100))
    df = generate_events(cfg, seed=0).sort("timestamp", maintain_order=True)
    with atomic_path(path) as tmp:
        df.write_parquet(tmp, row_group_size=1_000_000)


def run_polars(input_path: Path, output: Path) -> dict:
    from recsys_alibi.config import ColumnMap, DataConfig
    from recsys_alibi.data.prepare import prepare

    cfg = DataConfig(
        columns=ColumnMap(event_type="event_type"), min_events_per_user=MIN_EVENTS, min_events_per_item=MIN_EVENTS
    )
    start = time.perf_counter()
    result = prepare(cfg, input_path, output)
    return {"wall_s": time.perf_counter() - start, "events_in": result.counts["input_rows"], "events_out": result.counts["events"]}


def run_pandas(input_path: Path, output: Path) -> dict:
    """The reference transform in plain pandas (numpy dtypes, object strings)."""
    import numpy as np
    import pandas as pd

    start = time.perf_counter()
    output.mkdir(parents=True, exist_ok=True)
    df = pd.read_parquet(input_path)
    n_in = len(df)
    df["source_row"] = np.arange(n_in)
    bad = df["user_id"].isna() | df["item_id"].isna() | df["timestamp"].isna() | (df["timestamp"] < 0)
    df[bad].assign(reject_reason="invalid").to_parquet(output / "rejects.parquet")
    df = df[~bad]
    df = df.drop_duplicates(subset=["user_id", "item_id", "timestamp", "event_type"], keep="first")
    while True:  # iterative k-core
        user_n = df.groupby("user_id")["item_id"].transform("size")
        item_n = df.groupby("item_id")["user_id"].transform("size")
        ok = (user_n >= MIN_EVENTS) & (item_n >= MIN_EVENTS)
        if ok.all():
            break
        df = df[ok]
    counts = df["item_id"].value_counts().rename("count").rename_axis("item_id").reset_index()
    vocab = counts.sort_values(["count", "item_id"], ascending=[False, True], kind="stable").reset_index(drop=True)
    vocab.insert(0, "item_idx", np.arange(1, len(vocab) + 1, dtype=np.int32))
    df = df.assign(item_idx=df["item_id"].map(pd.Series(vocab["item_idx"].values, index=vocab["item_id"].values)))
    df = df.sort_values(["user_id", "timestamp", "source_row"], kind="stable")
    df[["user_id", "item_id", "timestamp", "event_type"]].to_parquet(output / "events.parquet", index=False)
    vocab.to_parquet(output / "items.parquet", index=False)
    seq = df.groupby("user_id", sort=True).agg(item_idx=("item_idx", list), timestamp=("timestamp", list))
    seq["length"] = seq["item_idx"].str.len().astype(np.int32)
    seq.reset_index().to_parquet(output / "sequences.parquet", index=False)
    return {"wall_s": time.perf_counter() - start, "events_in": n_in, "events_out": len(df)}


def _worker(args: argparse.Namespace) -> None:
    if args.worker == "generate":
        generate(args.size, Path(args.input))
        print(json.dumps(_rusage()))
        return
    run = run_polars if args.worker == "polars" else run_pandas
    result = run(Path(args.input), Path(args.output))
    print(json.dumps({**result, **_rusage()}))


def _spawn(*argv: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _same_outputs(a: Path, b: Path) -> bool:
    import polars as pl

    seq_a = pl.read_parquet(a / "sequences.parquet").sort("user_id")
    seq_b = pl.read_parquet(b / "sequences.parquet").sort("user_id").cast(seq_a.schema)
    items_a = pl.read_parquet(a / "items.parquet")
    items_b = pl.read_parquet(b / "items.parquet").select(items_a.columns).cast(items_a.schema)
    return seq_a.equals(seq_b) and items_a.equals(items_b)


def _machine() -> str:
    from recsys_alibi.diagnostics.machine import cpu_name

    cpu = cpu_name()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    import pandas
    import polars

    return (
        f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}, "
        f"polars {polars.__version__}, pandas {pandas.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000_000, 50_000_000])
    parser.add_argument("--workdir", default="/tmp/recsys-alibi-bench")
    parser.add_argument("--engines", nargs="+", default=["polars", "pandas"], choices=["polars", "pandas"])
    parser.add_argument("--pandas-max", type=int, default=50_000_000, help="skip pandas above this many events")
    parser.add_argument("--check-size", type=int, default=200_000, help="events of the equivalence check (0: skip)")
    parser.add_argument("--worker", choices=["generate", "polars", "pandas"], help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {_machine()}", flush=True)
    if args.check_size:
        log = work / f"events-{args.check_size}.parquet"
        if not log.exists():
            _spawn("--worker", "generate", "--size", str(args.check_size), "--input", str(log))
        for engine in ("polars", "pandas"):
            _spawn("--worker", engine, "--input", str(log), "--output", str(work / f"check-{engine}"))
        same = _same_outputs(work / "check-polars", work / "check-pandas")
        print(f"equivalence check on {args.check_size:,} events: {'same sequences and items' if same else 'DIFFERENT'}")
        if not same:
            return 1

    rows = []
    for size in args.sizes:
        log = work / f"events-{size}.parquet"
        if not log.exists():
            print(f"generating {log} ...", flush=True)
            _spawn("--worker", "generate", "--size", str(size), "--input", str(log))
        for engine in args.engines:
            if engine == "pandas" and size > args.pandas_max:
                continue
            load = os.getloadavg()[0]
            res = _spawn("--worker", engine, "--input", str(log), "--output", str(work / f"out-{engine}-{size}"))
            res.update(engine=engine, size=size, load=load)
            print(json.dumps(res), flush=True)
            rows.append(res)

    print("\n| events | engine | wall s | events/s | CPU s (user+sys) | peak RSS GiB | load avg before |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['size']:,} | {r['engine']} | failed: {r['error']} | | | | |")
            continue
        print(
            f"| {r['events_in']:,} | {r['engine']} | {r['wall_s']:.1f} | {r['events_in'] / r['wall_s'] / 1e6:.2f} M "
            f"| {r['cpu_s']:.1f} | {r['peak_rss_gib']:.2f} | {r['load']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
