"""Step A of ``prepare``: streaming passes over the input into a work directory.

Good events go to ``P`` user-hash partitions in Arrow IPC (:func:`sink_partitions`; ``P`` from
:func:`n_partitions`, 1 for small inputs), rejected rows to one Parquet file
(:func:`sink_rejects`, a second pass: sharing one scan between the two sinks would cache the
whole input in memory). A user's events all land in one partition, so each partition can be
sorted and de-duplicated on its own (:mod:`recsys_alibi.data.prepare_clean`).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import polars as pl

from recsys_alibi.config import DataConfig
from recsys_alibi.data.errors import is_gzip
from recsys_alibi.data.quotes import swallowed_lines_error
from recsys_alibi.data.read_errors import read_error
from recsys_alibi.data.ids import cast_integer_ids, round_trips
from recsys_alibi.data.ingest import QuotedLinesError, Source, rejected_rows, tag_rows, valid_events
from recsys_alibi.data.schema import SUBSECOND, USER_ID

log = logging.getLogger(__name__)

BUCKET = "_bucket"
HASH_SEED = 20240101  # fixed: the partition of a user never changes between runs
BYTES_PER_TEXT_ROW = 20  # estimate of rows in a text input, for the number of partitions
GZIP_RATIO = 4
WORKERS = 2  # partitions cleaned at once (each one more partition's working space in memory)


def parquet_rows(source: Source) -> int | None:
    """The exact row count of a Parquet input from its footers; None for other inputs."""
    if source.fmt != "parquet":
        return None
    try:
        return pl.scan_parquet(list(source.paths), glob=False).select(pl.len()).collect().item()
    except (pl.exceptions.PolarsError, OSError):  # e.g. gzipped Parquet
        return None


def n_partitions(cfg: DataConfig, source: Source, rows: int | None, extra: int = 0) -> int:
    """Partitions for ``rows`` events (estimated from the file sizes when None) plus ``extra``
    (an append's earlier events): whole rounds of ``WORKERS``."""
    if rows is None:  # estimated from the file sizes
        ratio = 8 if source.fmt == "parquet" else BYTES_PER_TEXT_ROW
        size = sum(p.stat().st_size * (GZIP_RATIO if is_gzip(p) else 1) for p in source.paths)
        rows = size // ratio
    n = math.ceil((rows + extra) / cfg.partition_rows)
    return 1 if n <= 1 else WORKERS * math.ceil(n / WORKERS)  # whole rounds of WORKERS threads


def ipc_rows(files: list[Path]) -> int:
    """Rows in Arrow IPC ``files`` (from their metadata)."""
    return pl.scan_ipc(files).select(pl.len()).collect().item() if files else 0


def sink_partitions(
    cfg: DataConfig, source: Source, work: Path, n_parts: int, before: pl.LazyFrame | None = None, int_ids: list[str] = ()
) -> list[list[Path]]:
    """A: a streaming pass; good events to user-hash partitions (Arrow IPC).

    Args:
        before: an append's earlier cleaned events (``Base.cleaned``), written first.
        int_ids: with ``before``, the text id columns of the union that are Int64 (the new
            events' are cast); the earlier events' other Int64 id columns are cast to String.
    """
    valid = valid_events(tag_rows(source, cfg))
    if before is not None:  # the id columns the earlier and the new events share as Int64 are cast first
        valid = cast_integer_ids(valid, int_ids)
        valid = pl.concat([_aligned(before, valid.collect_schema()), valid], how="vertical")
    if n_parts == 1:
        stream(source, valid.sink_ipc(work / "valid.ipc", compression=None, lazy=True))
        return [[work / "valid.ipc"]]
    bucket = (pl.col(USER_ID).hash(HASH_SEED) % n_parts).alias(BUCKET)
    partitions = pl.PartitionBy(work / "valid", key=BUCKET, include_key=False)
    stream(source, valid.with_columns(bucket).sink_ipc(partitions, compression=None, lazy=True, mkdir=True))
    return [sorted((work / "valid" / f"{BUCKET}={p}").glob("*.ipc")) for p in range(n_parts)]


def _aligned(before: pl.LazyFrame, schema: pl.Schema) -> pl.LazyFrame:
    """``before`` with the columns and types of ``schema`` (a missing ``_subsecond`` is 0)."""
    have = before.collect_schema()
    return before.select(
        pl.col(name).cast(dtype) if name in have else pl.lit(0 if name == SUBSECOND else None).cast(dtype).alias(name)
        for name, dtype in schema.items()
    )


def sink_rejects(
    cfg: DataConfig, source: Source, path: Path, tag: dict[str, str], before: Path | None = None, new: bool = True
) -> None:
    """A, second pass: rejected rows to Parquet (one pass for both sinks would cache the whole input).

    Args:
        before: an append's earlier ``rejects.parquet``, written first (same raw columns).
        new: read the input's rejects (False: the input is known to have none).
    """
    frames = [pl.scan_parquet(before)] if before is not None else []
    if new:
        frames.append(rejected_rows(tag_rows(source, cfg), source.raw_columns))
    if frames:
        stream(source, pl.concat(frames, how="vertical").sink_parquet(path, metadata=tag, lazy=True))


def stream(source: Source, sink: pl.LazyFrame) -> pl.DataFrame:
    """Run a lazy query (a sink) on the streaming engine; a read failure becomes one line naming the file.

    Raises:
        QuotedLinesError: CSV rows span lines (their fields cannot be counted per line).
        DataError: the input cannot be read.
    """
    try:
        return sink.collect(engine="streaming")
    except pl.exceptions.ShapeError as err:  # the CSV rows and the lines counted beside them differ
        if source.fmt == "csv":
            read = source.csv_read
            for path in source.paths if read.get("quote") is not None else ():  # a quote that swallows rows
                swallowed = swallowed_lines_error(path, read["separator"], read["quote"], read["has_header"])
                if swallowed is not None and read["separator"] == "\t":  # TSV: refused
                    raise swallowed from None
                if swallowed is not None:  # a valid CSV may quote a row-shaped line: read, and said
                    log.warning("%s", swallowed)
            raise QuotedLinesError(f"rows of '{source.paths[0]}' span lines") from None
        raise read_error(source.paths, source.fmt, err, "check the file or --format", **source.csv_read) from None
    except (pl.exceptions.PolarsError, OSError) as err:
        raise read_error(source.paths, source.fmt, err, "check the file or --format", **source.csv_read) from None


def round_trip_ids(cfg: DataConfig, source: Source, columns: list[str]) -> list[str]:
    """The text id ``columns`` whose every value in the input's good rows round-trips as Int64.

    One streaming pass over the input (``ids.round_trips``); an append asks it of the new
    events only, for the columns the earlier inputs typed Int64 (their values all round-trip).
    """
    if not columns:
        return []
    valid = valid_events(tag_rows(source, cfg))
    row = stream(source, valid.select(*[round_trips(pl.col(c)).all().alias(c) for c in columns]))
    return [c for c in columns if row[c][0] is not False]
