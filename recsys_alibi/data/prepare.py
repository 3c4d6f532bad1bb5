"""``prepare``: an event log -> a prepared directory.

Output (``output_dir``; every file written to a temporary name in the same directory and moved
into place with ``os.replace``):

===================== =====================================================================
``events.parquet``    cleaned canonical events, grouped by user, in time order
``items.parquet``     the vocabulary: ``item_idx`` Int32 1..N, ``item_id``, ``count`` Int64
``sequences.parquet`` one row per user: ``user_id``, ``item_idx``, ``timestamp``, ``length``
``rejects.parquet``   rejected rows with ``reject_reason`` (only when a row was rejected)
``stats.json``        counts, rejects by reason, history-length quantiles, sparsity
``history_length.png`` histogram of events per user
===================== =====================================================================

How it runs within bounded memory (the input may be larger than memory):

A. one streaming pass over the input: rows are tagged (canonical columns + reject reason);
   rejects are sunk to one file, good events to ``P`` user-hash partitions
   (``P = ceil(estimated rows / data.partition_rows)``; 1 for small inputs);
B. per partition (in memory): ``min_value`` filter and exact-duplicate removal (a user's
   events all live in one partition, so both are exact), then integer codes of users and items;
C. the iterative k-core on the codes of all events at once (two int32 arrays);
D. per partition: k-core filter, vocabulary indices, sort by (user, time, source row), then the
   partition's events and sequences are appended to the output files.

Accounting (asserted): ``input_rows = kept + rejected + deduplicated + filtered`` where
``filtered = filtered_min_value + filtered_kcore``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from recsys_alibi.config import DataConfig
from recsys_alibi.data.cleaning import drop_exact_duplicates, filter_min_value, k_core_mask, sort_events
from recsys_alibi.data.ingest import (
    DataError,
    Source,
    _first_line,
    rejected_rows,
    scan_source,
    tag_rows,
    valid_events,
)
from recsys_alibi.data.schema import (
    COUNT,
    EVENTS_FILE,
    ITEM_ID,
    ITEM_IDX,
    ITEMS_FILE,
    LENGTH,
    REJECT_REASON,
    REJECTS_FILE,
    SEQUENCES_FILE,
    SOURCE_ROW,
    STATS_FILE,
    TIMESTAMP,
    USER_ID,
)
from recsys_alibi.data.sequences import build_vocabulary, group_sequences, read_items, read_sequences
from recsys_alibi.data.stats import HISTOGRAM_FILE, history_length_summary, plot_history_lengths, sparsity

__all__ = ["DataError", "PrepareResult", "prepare", "read_items", "read_sequences"]

log = logging.getLogger(__name__)

BUCKET = "_bucket"
CODE = "_code"
HASH_SEED = 20240101  # fixed: the partition of a user never changes between runs
BYTES_PER_TEXT_ROW = 20  # estimate of rows in a text input, for the number of partitions
GZIP_RATIO = 4


@dataclass(frozen=True)
class PrepareResult:
    """What ``prepare`` wrote.

    Attributes:
        output_dir: the prepared directory.
        counts: ``input_rows``, ``rejected``, ``deduplicated``, ``filtered_min_value``,
            ``filtered_kcore``, ``filtered``, ``kept``, ``users``, ``items``, ``events``,
            ``kcore_rounds``.
        stats: everything in ``stats.json``.
    """

    output_dir: Path
    counts: dict[str, int]
    stats: dict = field(default_factory=dict, repr=False)

    def summary(self) -> str:
        c = self.counts
        return (
            f"prepared {c['events']:,} events, {c['users']:,} users, {c['items']:,} items "
            f"from {c['input_rows']:,} rows ({c['rejected']:,} rejected, {c['deduplicated']:,} duplicates, "
            f"{c['filtered']:,} filtered) -> {self.output_dir}"
        )


# ----------------------------------------------------------------------------- atomic files


def _temp_beside(path: Path) -> Path:
    """An empty temporary file in the directory of ``path``, with the usual (umask) permissions."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return Path(tmp)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``; moved onto ``path`` only when the block succeeds."""
    tmp = _temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class _PartWriter:
    """Appends polars frames to one Parquet file (a row group per frame); moved into place on close."""

    def __init__(self, path: Path) -> None:
        self._path, self._tmp = path, _temp_beside(path)
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None

    def write(self, df: pl.DataFrame) -> None:
        table = df.to_arrow(compat_level=pl.CompatLevel.oldest())
        if self._writer is None:
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self._tmp, self._schema, compression="zstd")
        self._writer.write_table(table.cast(self._schema))

    def close(self, empty: pl.DataFrame | None, ok: bool = True) -> None:
        """Finish the file and move it into place (``ok``), or delete it."""
        try:
            if ok and self._writer is None and empty is not None:
                self.write(empty)  # no partition held rows: still write the schema
            if self._writer is not None:
                self._writer.close()
            if ok:
                os.replace(self._tmp, self._path)
        finally:
            if self._tmp.exists():
                self._tmp.unlink()


# ----------------------------------------------------------------------------- prepare


def prepare(
    cfg: DataConfig, input_path: str | Path, output_dir: str | Path, *, fmt: str | None = None
) -> PrepareResult:
    """Read, validate, clean and index an event log into ``output_dir`` (see the module docstring).

    Args:
        cfg: the ``data`` section (format, column map, cleaning thresholds).
        input_path: file, directory or glob of any supported format (optionally ``.gz``).
        output_dir: the prepared directory (created; files of a previous run are replaced).
        fmt: overrides ``cfg.format``.

    Raises:
        DataError: missing/unreadable/empty input, unknown format, missing column, or nothing
            left after validation and cleaning.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = scan_source(cfg, input_path, fmt)
    work = Path(tempfile.mkdtemp(prefix=".prepare-", dir=out))
    try:
        return _prepare(cfg, source, out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _n_partitions(cfg: DataConfig, source: Source) -> int:
    if source.fmt == "parquet":
        try:
            rows = pl.scan_parquet(list(source.paths)).select(pl.len()).collect().item()
        except (pl.exceptions.PolarsError, OSError):
            rows = sum(p.stat().st_size for p in source.paths) // 8
    else:
        size = sum(p.stat().st_size * (GZIP_RATIO if p.name.endswith(".gz") else 1) for p in source.paths)
        rows = size // BYTES_PER_TEXT_ROW
    return max(1, math.ceil(rows / cfg.partition_rows))


def _rows(files: list[Path]) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files) if files else 0


def _prepare(cfg: DataConfig, source: Source, out: Path, work: Path) -> PrepareResult:
    n_parts = _n_partitions(cfg, source)
    parts = _ingest(cfg, source, work, n_parts)  # A
    rejects_path = work / REJECTS_FILE
    rejects_by_reason = (
        pl.scan_parquet(rejects_path).group_by(REJECT_REASON).len().sort(REJECT_REASON).collect()
        if rejects_path.exists()
        else pl.DataFrame({REJECT_REASON: [], "len": []})
    )
    by_reason = {r: int(n) for r, n in rejects_by_reason.iter_rows()}
    n_rejected = sum(by_reason.values())
    n_valid = sum(_rows(files) for files in parts)
    input_rows = n_valid + n_rejected
    if input_rows == 0:
        raise DataError(f"empty input: '{source.paths[0]}' has no rows; point --input at the event log")
    if n_rejected:
        os.replace(rejects_path, out / REJECTS_FILE)
    elif (out / REJECTS_FILE).exists():
        os.unlink(out / REJECTS_FILE)  # a stale file from an earlier run would mislead
    if n_valid == 0:
        reasons = ", ".join(f"{k}: {v}" for k, v in by_reason.items())
        raise DataError(
            f"all {n_rejected:,} rows were rejected ({reasons}); see {out / REJECTS_FILE} and check --format and data.columns"
        )

    # B: per-partition filter + dedup, then codes
    clean, n_after_min, n_after_dedup = _clean_partitions(cfg, parts, work)
    users, items, item_ids = _codes(clean)

    # C: k-core on all events at once
    keep, rounds = k_core_mask(users, items, cfg.min_events_per_user, cfg.min_events_per_item)
    kept = int(keep.sum())
    if kept == 0:
        raise DataError(
            f"no events left after cleaning ({n_after_dedup:,} events before the k-core with "
            f"min_events_per_user={cfg.min_events_per_user}, min_events_per_item={cfg.min_events_per_item}); "
            "lower data.min_events_per_user / data.min_events_per_item"
        )
    item_count = np.bincount(items[keep], minlength=item_ids.len())
    present = np.flatnonzero(item_count)
    vocab = build_vocabulary(
        pl.LazyFrame({ITEM_ID: item_ids.gather(present), COUNT: item_count[present].astype(np.int64)})
    ).collect()
    idx_of_code = np.zeros(item_ids.len(), dtype=np.int32)
    idx_of_code[present] = (
        pl.DataFrame({ITEM_ID: item_ids.gather(present)}).join(vocab, on=ITEM_ID, how="left", maintain_order="left")[ITEM_IDX].to_numpy()
    )

    # D: write events and sequences, partition after partition
    lengths, t_min, t_max = _write_outputs(clean, keep, items, idx_of_code, out)
    with atomic_path(out / ITEMS_FILE) as tmp:
        vocab.write_parquet(tmp)

    n_users, n_items = int(lengths.shape[0]), int(vocab.height)
    counts = {
        "input_rows": input_rows,
        "rejected": n_rejected,
        "deduplicated": n_after_min - n_after_dedup,
        "filtered_min_value": n_valid - n_after_min,
        "filtered_kcore": n_after_dedup - kept,
        "filtered": (n_valid - n_after_min) + (n_after_dedup - kept),
        "kept": kept,
        "users": n_users,
        "items": n_items,
        "events": kept,
        "kcore_rounds": rounds,
    }
    assert counts["input_rows"] == counts["kept"] + counts["rejected"] + counts["deduplicated"] + counts["filtered"]
    stats = {
        "input": [str(p) for p in source.paths[:20]],
        "format": source.fmt,
        **counts,
        "rejects_by_reason": by_reason,
        "min_value": cfg.min_value,
        "min_events_per_user": cfg.min_events_per_user,
        "min_events_per_item": cfg.min_events_per_item,
        "history_length": history_length_summary(lengths),
        "sparsity": sparsity(kept, n_users, n_items),
        "timestamp_min": t_min,
        "timestamp_max": t_max,
        "time_from_line_order": TIMESTAMP not in source.columns,
        "partitions": n_parts,
    }
    with atomic_path(out / STATS_FILE) as tmp:
        tmp.write_text(json.dumps(stats, indent=2) + "\n")
    with atomic_path(out / HISTOGRAM_FILE) as tmp:
        plot_history_lengths(lengths, tmp)
    result = PrepareResult(output_dir=out, counts=counts, stats=stats)
    log.info(result.summary())
    return result


def _ingest(cfg: DataConfig, source: Source, work: Path, n_parts: int) -> list[list[Path]]:
    """A: one streaming pass; good events to user-hash partitions, rejects to one file."""
    tagged = tag_rows(source, cfg)
    valid = valid_events(tagged)
    rejects = rejected_rows(tagged, source.raw_columns)
    if n_parts == 1:
        valid_sink = valid.sink_parquet(work / "valid.parquet", lazy=True)
    else:
        bucket = (pl.col(USER_ID).hash(HASH_SEED) % n_parts).alias(BUCKET)
        valid_sink = valid.with_columns(bucket).sink_parquet(
            pl.PartitionBy(work / "valid", key=BUCKET, include_key=False), lazy=True, mkdir=True
        )
    try:
        pl.collect_all([valid_sink, rejects.sink_parquet(work / REJECTS_FILE, lazy=True)], engine="streaming")
    except (pl.exceptions.PolarsError, OSError) as err:
        raise DataError(
            f"cannot read '{source.paths[0]}' as {source.fmt}: {_first_line(err)}; check the file or --format"
        ) from None
    if n_parts == 1:
        return [[work / "valid.parquet"]]
    return [sorted((work / "valid" / f"{BUCKET}={p}").glob("*.parquet")) for p in range(n_parts)]


def _clean_partitions(cfg: DataConfig, parts: list[list[Path]], work: Path) -> tuple[list[Path], int, int]:
    """B: min_value filter and duplicate removal per partition; returns the clean files and counts."""
    clean: list[Path] = []
    n_after_min = n_after_dedup = 0
    for p, files in enumerate(parts):
        if not files:
            continue
        df = filter_min_value(pl.scan_parquet(files), cfg.min_value).collect()
        n_after_min += df.height
        if cfg.drop_duplicates:
            df = drop_exact_duplicates(df.lazy()).collect()
        n_after_dedup += df.height
        path = work / f"clean-{p:05d}.parquet"
        df.write_parquet(path, compression="lz4")
        clean.append(path)
    return clean, n_after_min, n_after_dedup


def _codes(clean: list[Path]) -> tuple[np.ndarray, np.ndarray, pl.Series]:
    """Integer codes of every event's user and item, in the row order of the clean files.

    Returns ``(users (E,) int32, items (E,) int32, item_ids)`` where ``item_ids[code]`` is the raw id.
    """
    item_ids = (
        pl.concat([pl.scan_parquet(f).select(ITEM_ID).unique() for f in clean]).unique().sort(ITEM_ID).collect().to_series()
    )
    code_table = pl.DataFrame({ITEM_ID: item_ids, CODE: np.arange(item_ids.len(), dtype=np.int32)}).lazy()
    users: list[np.ndarray] = []
    items: list[np.ndarray] = []
    offset = 0
    for f in clean:
        df = (
            pl.scan_parquet(f)
            .select(USER_ID, ITEM_ID)
            .join(code_table, on=ITEM_ID, how="left", maintain_order="left")
            .select((pl.col(USER_ID).rank("dense").cast(pl.Int32) - 1 + offset).alias(USER_ID), CODE)
            .collect()
        )
        users.append(df[USER_ID].to_numpy())
        items.append(df[CODE].to_numpy())
        offset += int(users[-1].max()) + 1 if df.height else 0
    return np.concatenate(users), np.concatenate(items), item_ids


def _write_outputs(
    clean: list[Path], keep: np.ndarray, items: np.ndarray, idx_of_code: np.ndarray, out: Path
) -> tuple[np.ndarray, int | None, int | None]:
    """D: per partition, k-core filter + vocabulary index + sort; append events and sequences."""
    events_writer = _PartWriter(out / EVENTS_FILE)
    seq_writer = _PartWriter(out / SEQUENCES_FILE)
    lengths: list[np.ndarray] = []
    t_min: int | None = None
    t_max: int | None = None
    start = 0
    ok = False
    empty_events = empty_seq = None
    try:
        for f in clean:
            lf = pl.scan_parquet(f)
            n = pq.ParquetFile(f).metadata.num_rows
            part_keep = keep[start : start + n]
            part_idx = idx_of_code[items[start : start + n]]
            start += n
            df = (
                lf.with_columns(pl.Series("_keep", part_keep), pl.Series(ITEM_IDX, part_idx))
                .filter(pl.col("_keep"))
                .drop("_keep")
                .pipe(sort_events)
                .collect()
            )
            event_cols = [c for c in df.columns if c not in (ITEM_IDX, SOURCE_ROW)]
            seq = group_sequences(df.lazy()).collect()
            if empty_events is None:
                empty_events, empty_seq = df.select(event_cols).clear(), seq.clear()
            if df.height == 0:
                continue
            events_writer.write(df.select(event_cols))
            seq_writer.write(seq)
            lengths.append(seq[LENGTH].to_numpy())
            lo, hi = df[TIMESTAMP].min(), df[TIMESTAMP].max()
            t_min = lo if t_min is None else min(t_min, lo)
            t_max = hi if t_max is None else max(t_max, hi)
        ok = True
    finally:
        events_writer.close(empty_events, ok=ok)
        seq_writer.close(empty_seq, ok=ok)
    assert start == keep.shape[0]
    return np.concatenate(lengths).astype(np.int64), t_min, t_max
