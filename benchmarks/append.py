"""Wall time of ``prepare --append`` (one new day) against a full ``prepare`` of every input.

Run (from the repository root):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/append.py --events 10000000 --new 100000 --workdir /tmp/recsys-alibi-append

A synthetic time-ordered log (``--users`` users, ``--items`` items with Zipf popularity, integer
ids, 100 days of timestamps; by default 50 events a user and 100 an item on average: 200,000 users and
100,000 items at 10,000,000 events) is split into the earlier events and the newest ``--new`` ones (the
day, with some new users and items), each written as Parquet and as CSV into ``--workdir``. For
each format: the earlier events are prepared once (setup), then the day is appended, and a full
prepare of both files together is run; the counts of both must be equal. Wall and CPU seconds
(all threads of the process: less sensitive to other jobs on the machine than the wall time).
Prints one Markdown row per format. Results: docs/benchmarks.md, "Append". The logs are kept in
``--workdir`` under a name of every setting that makes them (``log-<events>-<new>-<users>-<items>-<format>``)
and reused by the same settings. A log too sparse for the 5-core (too few events for ``--users`` or
``--items``) is refused with one line.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np
import polars as pl


EVENTS_PER_USER, EVENTS_PER_ITEM = 50, 100  # the default --users and --items: --events over these
MIN_EVENTS = 5  # the benchmark's k-core (data.min_events_per_user and _per_item)


def write_inputs(events: int, new: int, users: int, items: int, workdir: Path) -> dict[str, tuple[Path, Path]]:
    """``{format: (earlier events file, the day's file)}``, written once per setting (cached under a folder
    named by every argument that makes the log)."""
    paths = {}
    for fmt in ("parquet", "csv"):
        folder = workdir / f"log-{events}-{new}-{users}-{items}-{fmt}"
        paths[fmt] = (folder / f"1-earlier.{fmt}", folder / f"2-day.{fmt}")
    if all(p.exists() for pair in paths.values() for p in pair):
        return paths
    rng = np.random.default_rng(0)
    popularity = 1.0 / np.arange(1, items + 1) ** 0.9
    log = pl.DataFrame(
        {
            "user_id": rng.integers(0, users, events),
            "item_id": rng.choice(items, size=events, p=popularity / popularity.sum()),
            "timestamp": np.sort(rng.integers(1_700_000_000, 1_700_000_000 + 100 * 86_400, events)),
        }
    )
    earlier, day = log.head(events - new), log.tail(new)
    day = day.with_columns(  # 2 % of the day's events from new users, 1 % on new items
        pl.when(pl.int_range(pl.len()) % 50 == 0).then(pl.col("user_id") + users).otherwise("user_id").alias("user_id"),
        pl.when(pl.int_range(pl.len()) % 100 == 1).then(pl.col("item_id") % 200 + items).otherwise("item_id").alias("item_id"),
    )
    for fmt, (first, second) in paths.items():
        first.parent.mkdir(parents=True, exist_ok=True)
        for frame, path in ((earlier, first), (day, second)):
            frame.write_parquet(path) if fmt == "parquet" else frame.write_csv(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--new", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=None,
                        help=f"users of the log (default: --events / {EVENTS_PER_USER}, at least 1)")
    parser.add_argument("--items", type=int, default=None,
                        help=f"items of the log (default: --events / {EVENTS_PER_ITEM}, at least 1)")
    parser.add_argument("--formats", nargs="+", default=["parquet", "csv"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/recsys-alibi-append"))
    args = parser.parse_args(argv)
    if not 0 < args.new < args.events:
        parser.error(f"--new {args.new}: give 1 to --events - 1 ({args.events - 1}) events for the day")
    users = args.users if args.users is not None else max(1, args.events // EVENTS_PER_USER)
    items = args.items if args.items is not None else max(1, args.events // EVENTS_PER_ITEM)

    from recsys_alibi.config import DataConfig
    from recsys_alibi.data.append import append
    from recsys_alibi.data.ingest import DataError
    from recsys_alibi.data.prepare import prepare

    cfg = DataConfig(min_events_per_user=MIN_EVENTS, min_events_per_item=MIN_EVENTS)
    inputs = write_inputs(args.events, args.new, users, items, args.workdir)
    print("| input | events | new events | prepare of the earlier events s | append of the day s | full prepare s | append / full |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for fmt in args.formats:
        earlier, day = inputs[fmt]
        grown, whole = args.workdir / f"grown-{fmt}", args.workdir / f"whole-{fmt}"
        for out in (grown, whole):
            shutil.rmtree(out, ignore_errors=True)
        try:
            (setup, _), _ = timed(prepare, cfg, earlier, grown)
        except DataError as err:  # the k-core left (next to) nothing: one line, not a traceback
            raise SystemExit(
                f"error: {args.events - args.new:,} earlier events over {users:,} users and {items:,} items are too "
                f"sparse for the {MIN_EVENTS}-core ({str(err).split(';')[0]}): give fewer --users/--items, or leave "
                f"them out (--events / {EVENTS_PER_USER} and --events / {EVENTS_PER_ITEM})"
            ) from None
        (wall_append, cpu_append), appended = timed(append, cfg, day, grown)
        (wall_full, cpu_full), full = timed(prepare, cfg, earlier.parent, whole)
        assert appended.counts == full.counts, (appended.counts, full.counts)
        print(
            f"| {fmt} | {full.counts['input_rows']:,} | {appended.stats['appended']['input_rows']:,} | {setup:.1f} "
            f"| {wall_append:.1f} (CPU {cpu_append:.1f}) | {wall_full:.1f} (CPU {cpu_full:.1f}) "
            f"| {wall_append / wall_full:.2f} (CPU {cpu_append / cpu_full:.2f}) |",
            flush=True,
        )


def timed(fn, *args):
    """``((wall s, CPU s of the process), fn(*args))``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return (time.perf_counter() - wall, time.process_time() - cpu), result


if __name__ == "__main__":
    main()
