"""Wall time of ``prepare`` on one synthetic log written as Parquet, CSV and millisecond CSV.

Run (from the repository root; PYTHONPATH chooses the code under test, so two checkouts can be
compared on the same files):

    PYTHONPATH=$PWD .venv/bin/python benchmarks/ingest_formats.py --events 2000000 --workdir /tmp/recsys-alibi-ingest

The log (the embedded default data, ``generate_events``, time-ordered) is written once per size
into ``--workdir``; each format is then prepared ``--repeat`` times in this process (the first
run warms polars' thread pool) and the median wall time is printed as a Markdown row. The
millisecond CSV has the same events with ``timestamp * 1000 + (row % 1000)``: the cost of
sorting and de-duplicating at full precision. Results: docs/benchmarks.md, "Ingest formats".
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import polars as pl


def write_inputs(events: int, workdir: Path) -> dict[str, Path]:
    """Parquet, CSV and millisecond CSV of one log of about ``events`` events (cached)."""
    from recsys_alibi.config import GenerateConfig
    from recsys_alibi.data.synthetic import generate_events

    workdir.mkdir(parents=True, exist_ok=True)
    paths = {name: workdir / f"log-{events}.{suffix}" for name, suffix in
             (("parquet", "parquet"), ("csv", "csv"), ("csv-ms", "ms.csv"))}  # fmt: skip
    if all(p.exists() for p in paths.values()):
        return paths
    cfg = GenerateConfig(users=max(10, round(events / 212)), items=max(1000, events // 100))
    df = generate_events(cfg, seed=0).sort("timestamp", maintain_order=True)
    df.write_parquet(paths["parquet"])
    df.write_csv(paths["csv"])
    ms = pl.col("timestamp") * 1000 + pl.int_range(pl.len()) % 1000
    df.with_columns(ms.alias("timestamp")).write_csv(paths["csv-ms"])
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/recsys-alibi-ingest"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    from recsys_alibi.config import ColumnMap, DataConfig
    from recsys_alibi.data.prepare import prepare

    cfg = DataConfig(columns=ColumnMap(event_type="event_type"), min_events_per_user=5, min_events_per_item=5)
    print("| input | events | wall s (median of runs) | runs |\n|---|---:|---:|---|")
    for name, path in write_inputs(args.events, args.workdir).items():
        walls = []
        for _ in range(args.repeat):
            out = args.workdir / "out"
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            result = prepare(cfg, path, out)
            walls.append(time.perf_counter() - start)
        runs = " / ".join(f"{w:.2f}" for w in walls)
        print(f"| {name} | {result.counts['events']:,} | {statistics.median(walls):.2f} | {runs} |")


if __name__ == "__main__":
    main()
