"""``prepare``: an event log -> a prepared directory.

Output (``output_dir``; every file is written into a staging directory inside it, then all are
published at once with ``manifest.json`` last, see :mod:`recsys_alibi.data.prepared`):

===================== =====================================================================
``events.parquet``    cleaned canonical events, grouped by user, in time order
``items.parquet``     the vocabulary: ``item_idx`` Int32 1..N, ``item_id``, ``count`` Int64
``sequences.parquet`` one row per user: ``user_id``, ``item_idx``, ``timestamp``, ``length``
``rejects.parquet``   rejected rows with ``reject_reason`` (only when a row was rejected)
``stats.json``        counts, rejects by reason, history-length quantiles, sparsity
``history_length.png`` histogram of events per user
``manifest.json``     the run's ``prepare_id`` (also in every Parquet footer and stats.json),
                      file sizes, data fingerprint; ``"state": "complete"`` once published
===================== =====================================================================

How it runs within bounded memory (the input may be larger than memory):

A. streaming passes over the input (Polars streaming engine): rows are tagged (canonical
   columns + reject reason); good events are sunk to ``P`` user-hash partitions in Arrow IPC
   (``P = ceil(estimated rows / data.partition_rows)``, 1 for small inputs) in a temporary
   directory inside ``output_dir``, then rejects to one Parquet file (a second pass: sharing
   one scan between the two sinks would cache the whole input in memory; skipped when the
   input is Parquet and its row count, read from the footers, equals the good events);
A'. text ids: one pass over the partitions' id columns decides their type (Int64 only when
   every value round-trips, ``ingest.integer_id_columns``);
B. per partition (in memory, ``WORKERS`` at a time in threads): ids typed, ``min_value``
   filter, user and item ids replaced by their ranks in the partition, sort by (user, time at
   full precision, source row) as a radix sort on the user codes, exact-duplicate removal (a
   user's events all live in one partition, so this is exact; the sub-second part is then
   dropped: timestamps are written as seconds); then, in partition order, the codes are made global; the
   partition is kept slim (Int32 user and item codes, timestamp, event type as an Enum, value:
   ~17-21 bytes per event) and its file deleted;
C. the iterative k-core on the codes of all events at once (two Int32 arrays), then each
   partition filtered in place;
D. per partition: vocabulary indices, raw ids restored; events and sequences are streamed
   into their output files by the polars Parquet writer, one partition at a time, while a
   second thread draws the history-length histogram.

Peak memory is about 20-30 bytes per event plus ``WORKERS`` partitions' worth of working space.

Accounting (asserted): ``input_rows = kept + rejected + deduplicated + filtered`` where
``filtered = filtered_min_value + filtered_kcore``.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl
from polars.io.plugins import register_io_source

from recsys_alibi.config import DataConfig
from recsys_alibi.data.cleaning import (
    dense_codes,
    filter_min_value,
    k_core_mask,
    sort_permutation,
    sorted_duplicates,
)
from recsys_alibi.data.errors import read_error
from recsys_alibi.data.ingest import (
    DataError,
    QuotedLinesError,
    Source,
    cast_integer_ids,
    integer_id_columns,
    rejected_rows,
    scan_source,
    tag_rows,
    valid_events,
)
from recsys_alibi.data.prepared import PREPARE_ID_KEY, STAGING_PREFIX, clean_stale, keep_failed_rejects, prepare_lock, publish
from recsys_alibi.data.schema import (
    COUNT,
    EVENT_TYPE,
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
    SUBSECOND,
    TIMESTAMP,
    USER_ID,
    VALUE,
)
from recsys_alibi.data.sequences import (
    build_vocabulary,
    group_sequences,
    read_items,
    read_sequences,
)
from recsys_alibi.data.stats import (
    HISTOGRAM_FILE,
    history_length_summary,
    plot_history_lengths,
    sparsity,
)

__all__ = ["DataError", "PrepareResult", "prepare", "read_items", "read_sequences"]

log = logging.getLogger(__name__)

BUCKET = "_bucket"
CODE = "_code"
USER_CODE = "_u"
ITEM_CODE = "_i"
HASH_SEED = 20240101  # fixed: the partition of a user never changes between runs
BYTES_PER_TEXT_ROW = 20  # estimate of rows in a text input, for the number of partitions
GZIP_RATIO = 4
WORKERS = 2  # partitions cleaned at once (each one more partition's working space in memory)


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


# ----------------------------------------------------------------------------- prepare


def prepare(
    cfg: DataConfig, input_path: str | Path, output_dir: str | Path, *, fmt: str | None = None
) -> PrepareResult:
    """Read, validate, clean and index an event log into ``output_dir`` (see the module docstring).

    Args:
        cfg: the ``data`` section (format, column map, cleaning thresholds).
        input_path: file, directory or glob of any supported format (optionally ``.gz``).
        output_dir: the prepared directory (created; a previous run's files are replaced as a
            whole when this run succeeds, and left as they were when it fails or is killed).
        fmt: overrides ``cfg.format``.

    Raises:
        DataError: missing/unreadable/empty input, unknown format, missing column, or nothing
            left after validation and cleaning; another prepare is writing ``output_dir``.
    """
    out = Path(output_dir)
    # matplotlib takes ~0.5 s to import: do it in the background while polars works
    threading.Thread(target=importlib.import_module, args=("matplotlib.backends.backend_agg",), daemon=True).start()
    source = scan_source(cfg, input_path, fmt)
    with prepare_lock(out):
        clean_stale(out)
        try:
            return _prepare_in_work_dir(cfg, source, out)
        except QuotedLinesError:  # rows span lines: fields cannot be counted per line; read without the check
            log.warning("%s: quoted fields span lines, so CSV rows are not checked for a wrong number of fields", source.paths[0])
            return _prepare_in_work_dir(cfg, scan_source(cfg, input_path, fmt, count_fields=False), out)


def _prepare_in_work_dir(cfg: DataConfig, source: Source, out: Path) -> PrepareResult:
    """``_prepare`` in a fresh staging directory inside ``out`` (removed afterwards; hold the lock)."""
    work = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
    try:
        return _prepare(cfg, source, out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _parquet_rows(source: Source) -> int | None:
    """The exact row count of a Parquet input from its footers; None for other inputs."""
    if source.fmt != "parquet":
        return None
    try:
        return pl.scan_parquet(list(source.paths)).select(pl.len()).collect().item()
    except (pl.exceptions.PolarsError, OSError):  # e.g. gzipped Parquet
        return None


def _n_partitions(cfg: DataConfig, source: Source, rows: int | None) -> int:
    if rows is None:  # estimated from the file sizes
        ratio = 8 if source.fmt == "parquet" else BYTES_PER_TEXT_ROW
        size = sum(p.stat().st_size * (GZIP_RATIO if p.name.endswith(".gz") else 1) for p in source.paths)
        rows = size // ratio
    n = math.ceil(rows / cfg.partition_rows)
    return 1 if n <= 1 else WORKERS * math.ceil(n / WORKERS)  # whole rounds of WORKERS threads


def _rows(files: list[Path]) -> int:
    return pl.scan_ipc(files).select(pl.len()).collect().item() if files else 0


def _prepare(cfg: DataConfig, source: Source, out: Path, work: Path) -> PrepareResult:
    """Every output into ``work`` (tagged with a new prepare id), then published into ``out``."""
    prepare_id = uuid.uuid4().hex
    tag = {PREPARE_ID_KEY: prepare_id}
    rows = _parquet_rows(source)
    n_parts = _n_partitions(cfg, source, rows)
    parts = _ingest(cfg, source, work, n_parts)  # A
    n_valid = sum(_rows(files) for files in parts)
    int_ids = integer_id_columns(pl.scan_ipc([f for files in parts for f in files]), source.text_ids) if n_valid else []
    rejects_path = work / REJECTS_FILE
    if n_valid != rows:  # some rows are rejects, or the row count is unknown: a second pass
        _sink_rejects(cfg, source, rejects_path, tag)
    rejects_by_reason = (
        pl.scan_parquet(rejects_path).group_by(REJECT_REASON).len().sort(REJECT_REASON).collect()
        if rejects_path.exists()
        else pl.DataFrame({REJECT_REASON: [], "len": []})
    )
    by_reason = {r: int(n) for r, n in rejects_by_reason.iter_rows()}
    n_rejected = sum(by_reason.values())
    input_rows = n_valid + n_rejected
    if input_rows == 0:
        raise DataError(f"empty input: '{source.paths[0]}' has no rows; point --input at the event log")
    if not n_rejected:
        rejects_path.unlink(missing_ok=True)  # an empty file: published as "no rejects" (an older one is removed)
    if n_valid == 0:
        reasons = ", ".join(f"{k}: {v}" for k, v in by_reason.items())
        kept_at = keep_failed_rejects(rejects_path, out)
        raise DataError(f"all {n_rejected:,} rows were rejected ({reasons}); see {kept_at} and check --format and data.columns")

    # B: per partition, min_value filter, local codes, sort, duplicate removal (held slim in memory);
    # WORKERS partitions at a time (numpy and polars release the GIL), codes made global in order
    coder = _ItemCoder()
    cleaned: list[_Part] = []
    n_after_min = n_users_seen = 0
    parts = [files for files in parts if files]
    with ThreadPoolExecutor(WORKERS) as pool:
        for files, (users, items, frame, n_min) in zip(parts, pool.map(partial(_clean_partition, cfg, int_ids), parts)):
            for f in files:  # free the disk as we go
                f.unlink()
            if frame.height:
                item_codes = coder.encode(items)[frame[ITEM_ID].to_numpy()]  # local codes -> global ones
                frame = frame.with_columns(pl.col(USER_ID) + n_users_seen, pl.Series(ITEM_ID, item_codes))
                frame = frame.rename({USER_ID: USER_CODE, ITEM_ID: ITEM_CODE})
                cleaned.append(_Part(users=users, frame=frame, user_offset=n_users_seen))
                n_users_seen += users.len()
                n_after_min += n_min
    n_after_dedup = sum(p.frame.height for p in cleaned)

    # C: k-core on the codes of all events at once (numpy views of the frames, no copies)
    all_users = [p.frame[USER_CODE].to_numpy() for p in cleaned]
    all_items = [p.frame[ITEM_CODE].to_numpy() for p in cleaned]
    keep, rounds = k_core_mask(all_users, all_items, cfg.min_events_per_user, cfg.min_events_per_item)
    del all_users, all_items
    kept = int(keep.sum())
    if kept == 0:
        raise DataError(
            f"no events left after cleaning ({n_after_dedup:,} events before the k-core with "
            f"min_events_per_user={cfg.min_events_per_user}, min_events_per_item={cfg.min_events_per_item}); "
            "lower data.min_events_per_user / data.min_events_per_item"
        )
    item_ids = coder.ids()
    item_count = np.zeros(item_ids.len(), dtype=np.int64)
    per_user: list[np.ndarray] = []
    start = 0
    for part in cleaned:  # the k-core filter, one partition at a time
        mask = keep[start : start + part.frame.height]
        start += mask.shape[0]
        if not mask.all():
            part.frame = part.frame.filter(pl.Series(mask))
        item_count += np.bincount(part.frame[ITEM_CODE].to_numpy(), minlength=item_ids.len())
        per_user.append(np.bincount(part.frame[USER_CODE].to_numpy() - part.user_offset))
    lengths = np.concatenate(per_user)
    lengths = lengths[lengths > 0]  # (U,) events per user kept, the same multiset as the sequences' lengths
    present = np.flatnonzero(item_count)
    vocab = build_vocabulary(
        pl.LazyFrame({ITEM_ID: item_ids.gather(present), COUNT: item_count[present].astype(np.int64)})
    ).collect()
    idx_of_code = np.zeros(item_ids.len(), dtype=np.int32)  # 0 (padding) for items the k-core removed
    idx_of_code[present] = (
        pl.DataFrame({ITEM_ID: item_ids.gather(present)})
        .join(vocab, on=ITEM_ID, how="left", maintain_order="left")[ITEM_IDX]
        .to_numpy()
    )

    # D: write events and sequences, partition after partition; the histogram is drawn meanwhile
    # (matplotlib holds the GIL, the polars writer mostly does not)
    with ThreadPoolExecutor(1) as plotter:
        histogram = plotter.submit(plot_history_lengths, lengths, work / HISTOGRAM_FILE)
        t_min, t_max = _write_outputs(cleaned, item_ids, idx_of_code, work, tag)
        vocab.write_parquet(work / ITEMS_FILE, metadata=tag)
        histogram.result()

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
        PREPARE_ID_KEY: prepare_id,
    }
    (work / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
    publish(work, out, prepare_id)
    return PrepareResult(output_dir=out, counts=counts, stats=stats)


def _ingest(cfg: DataConfig, source: Source, work: Path, n_parts: int) -> list[list[Path]]:
    """A: a streaming pass; good events to user-hash partitions (Arrow IPC)."""
    valid = valid_events(tag_rows(source, cfg))
    if n_parts == 1:
        _stream(source, valid.sink_ipc(work / "valid.ipc", compression=None, lazy=True))
        return [[work / "valid.ipc"]]
    bucket = (pl.col(USER_ID).hash(HASH_SEED) % n_parts).alias(BUCKET)
    partitions = pl.PartitionBy(work / "valid", key=BUCKET, include_key=False)
    _stream(source, valid.with_columns(bucket).sink_ipc(partitions, compression=None, lazy=True, mkdir=True))
    return [sorted((work / "valid" / f"{BUCKET}={p}").glob("*.ipc")) for p in range(n_parts)]


def _sink_rejects(cfg: DataConfig, source: Source, path: Path, tag: dict[str, str]) -> None:
    """A, second pass: rejected rows to Parquet (one pass for both sinks would cache the whole input)."""
    _stream(source, rejected_rows(tag_rows(source, cfg), source.raw_columns).sink_parquet(path, metadata=tag, lazy=True))


def _stream(source: Source, sink: pl.LazyFrame) -> None:
    try:
        sink.collect(engine="streaming")
    except pl.exceptions.ShapeError as err:  # the CSV rows and the lines counted beside them differ
        if source.fmt == "csv":
            raise QuotedLinesError(f"rows of '{source.paths[0]}' span lines") from None
        raise read_error(source.paths, source.fmt, err, "check the file or --format") from None
    except (pl.exceptions.PolarsError, OSError) as err:
        raise read_error(source.paths, source.fmt, err, "check the file or --format") from None


@dataclass
class _Part:
    """One user-hash partition after cleaning, held slim in memory (~20 bytes per event).

    Attributes:
        users: raw ids of the partition's users in sorted order.
        frame: one row per event (after the k-core: the events it kept), sorted by (user,
            time, source row): ``_u`` Int32 global user code (``user_offset`` + position in
            ``users``), ``_i`` Int32 item code, ``timestamp``, and ``event_type`` (Enum) and
            ``value`` when present.
        user_offset: global code of the partition's first user.
    """

    users: pl.Series
    frame: pl.DataFrame
    user_offset: int


class _ItemCoder:
    """Dense Int32 codes of raw item ids, shared by all partitions (new ids get the next codes).

    ``prepare`` encodes the distinct items of each partition, in partition order, so the codes do
    not depend on thread timing. Integer ids spanning at most ``MAX_TABLE_SPAN`` values use a
    numpy lookup table (one gather per id); other ids (strings, sparse integers) a hash map.
    """

    MAX_TABLE_SPAN = 1 << 25

    def __init__(self) -> None:
        self._chunks: list[pl.Series] = []  # raw ids in code order
        self._n = 0
        self._base = 0
        self._table: np.ndarray | None = None
        self._hash: pl.DataFrame | None = None

    def ids(self) -> pl.Series:
        """Raw id of every code (position = code)."""
        return pl.concat(self._chunks) if self._chunks else pl.Series(ITEM_ID, [], dtype=pl.Int64)

    def encode(self, ids: pl.Series) -> np.ndarray:
        """(E,) int32 codes of ``ids`` (no nulls)."""
        if self._hash is None and ids.dtype == pl.Int64 and self._fit_table(ids):
            arr = ids.to_numpy()
            assert self._table is not None
            codes = self._table[arr - self._base]
            new = codes < 0
            if new.any():
                seen = np.zeros(self._table.shape[0], dtype=bool)
                seen[arr[new] - self._base] = True
                fresh = np.flatnonzero(seen) + self._base  # the new ids, sorted
                self._table[fresh - self._base] = np.arange(self._n, self._n + fresh.shape[0], dtype=np.int32)
                self._add(pl.Series(ITEM_ID, fresh, dtype=pl.Int64))
                codes = self._table[arr - self._base]
            return codes
        if self._hash is None:  # from now on: hash map (holding the codes given so far)
            self._hash = pl.DataFrame({ITEM_ID: self.ids().cast(ids.dtype), CODE: np.arange(self._n, dtype=np.int32)})
            self._table = None
        unique = ids.unique(maintain_order=True)
        fresh = unique.filter(~unique.is_in(self._hash[ITEM_ID].implode()))
        if fresh.len():
            self._add(fresh.rename(ITEM_ID))
            added = pl.DataFrame({ITEM_ID: fresh, CODE: np.arange(self._n - fresh.len(), self._n, dtype=np.int32)})
            self._hash = pl.concat([self._hash, added])
        return ids.replace_strict(self._hash[ITEM_ID], self._hash[CODE], return_dtype=pl.Int32).to_numpy()

    def _add(self, fresh: pl.Series) -> None:
        self._chunks.append(fresh)
        self._n += fresh.len()

    def _fit_table(self, ids: pl.Series) -> bool:
        lo, hi = int(ids.min()), int(ids.max())  # type: ignore[arg-type]
        if self._table is not None:
            lo, hi = min(lo, self._base), max(hi, self._base + self._table.shape[0] - 1)
            if lo == self._base and hi == self._base + self._table.shape[0] - 1:
                return True
        if hi - lo + 1 > self.MAX_TABLE_SPAN:
            return False
        table = np.full(hi - lo + 1, -1, dtype=np.int32)
        if self._table is not None:
            table[self._base - lo : self._base - lo + self._table.shape[0]] = self._table
        self._table, self._base = table, lo
        return True


def _clean_partition(
    cfg: DataConfig, int_ids: list[str], files: list[Path]
) -> tuple[pl.Series, pl.Series, pl.DataFrame, int]:
    """B for one partition: id types, min_value filter, local codes, sort, exact duplicates (thread-safe).

    ``int_ids`` are the text id columns that become Int64 (``ingest.integer_id_columns``).
    Events are sorted and de-duplicated with their ``_subsecond`` part, which is then dropped.

    Returns:
        ``(users, items, frame, n_after_min)``: the partition's distinct user and item ids
        (ascending); its events after the min_value filter and the duplicate removal, sorted by
        (user, time, source row), with ``user_id`` and ``item_id`` replaced by their positions
        in ``users`` and ``items`` (Int32; bijections, so duplicates stay duplicates) and
        ``event_type`` as an Enum; the event count after the min_value filter.
    """
    df = cast_integer_ids(filter_min_value(pl.scan_ipc(files), cfg.min_value), int_ids).collect()
    users, user_codes = dense_codes(df[USER_ID])
    timestamps = df[TIMESTAMP].to_numpy()
    subseconds = df[SUBSECOND] if SUBSECOND in df.columns and bool((df[SUBSECOND] != 0).any()) else None
    if df[SOURCE_ROW].is_sorted():
        perm = sort_permutation(user_codes, timestamps, None if subseconds is None else subseconds.to_numpy())
    else:
        keys = [df[SOURCE_ROW].to_numpy()] + ([] if subseconds is None else [subseconds.to_numpy()])
        perm = np.lexsort((*keys, timestamps, user_codes))
    items, item_codes = dense_codes(df[ITEM_ID])
    columns = [pl.Series(USER_ID, user_codes), pl.Series(ITEM_ID, item_codes), df[TIMESTAMP]]
    if EVENT_TYPE in df.columns:  # a partition-local Enum: 1-2 bytes per event, cheap to turn back into strings
        columns.append(df[EVENT_TYPE].cast(pl.Enum(df[EVENT_TYPE].unique().drop_nulls().sort())))
    if VALUE in df.columns:
        columns.append(df[VALUE])
    if subseconds is not None:
        columns.append(subseconds)
    frame = pl.DataFrame(columns).gather(perm)
    if cfg.drop_duplicates:  # sorted: the first of equal rows is the first in source order
        duplicate = sorted_duplicates(frame)
        frame = frame.filter(~duplicate) if duplicate.any() else frame
    return users, items, frame.drop(SUBSECOND, strict=False), df.height


def _write_outputs(
    parts: list[_Part], item_ids: pl.Series, idx_of_code: np.ndarray, out: Path, tag: dict[str, str]
) -> tuple[int | None, int | None]:
    """D: events and sequences of every partition (after the k-core), each streamed into one file.

    Each output is a polars lazy source that yields one partition at a time, sunk with the
    (multi-threaded) polars Parquet writer; nothing larger than a partition is materialised.

    Returns:
        The smallest and largest timestamp kept (None when nothing was kept).
    """
    has = {c: c in parts[0].frame.columns for c in (EVENT_TYPE, VALUE)}

    def events(*_: object) -> Iterator[pl.DataFrame]:
        for part in parts:
            sub = part.frame
            cols = [part.users.gather(sub[USER_CODE] - part.user_offset).alias(USER_ID), item_ids.gather(sub[ITEM_CODE]).alias(ITEM_ID), sub[TIMESTAMP]]
            if has[EVENT_TYPE]:  # ~8x faster than cast(pl.String), which builds every string anew
                kinds = sub[EVENT_TYPE]
                cols.append(kinds.dtype.categories.gather(kinds.to_physical()).alias(EVENT_TYPE))  # type: ignore[attr-defined]
            if has[VALUE]:
                cols.append(sub[VALUE])
            yield pl.DataFrame(cols)

    bounds: list[tuple[int, int]] = []

    def sequences(*_: object) -> Iterator[pl.DataFrame]:
        for part in parts:
            sub = part.frame
            if sub.height == 0:
                continue
            item_idx = pl.Series(ITEM_IDX, idx_of_code[sub[ITEM_CODE].to_numpy()], dtype=pl.Int32)
            users = pl.col(USER_CODE).set_sorted().alias(USER_ID)  # sorted keys: groups are slices
            seq = group_sequences(sub.lazy().select(users, TIMESTAMP, item_idx)).collect()
            bounds.append((sub[TIMESTAMP].min(), sub[TIMESTAMP].max()))  # type: ignore[arg-type]
            yield seq.with_columns(part.users.gather(seq[USER_ID] - part.user_offset).alias(USER_ID))

    user_type, item_type = parts[0].users.dtype, item_ids.dtype
    events_schema = {USER_ID: user_type, ITEM_ID: item_type, TIMESTAMP: pl.Int64}
    if has[EVENT_TYPE]:
        events_schema[EVENT_TYPE] = pl.String
    if has[VALUE]:
        events_schema[VALUE] = pl.Float32
    seq_schema = {USER_ID: user_type, ITEM_IDX: pl.List(pl.Int32), TIMESTAMP: pl.List(pl.Int64), LENGTH: pl.Int32}
    for name, source, schema in ((EVENTS_FILE, events, events_schema), (SEQUENCES_FILE, sequences, seq_schema)):
        lazy = register_io_source(source, schema=schema)
        lazy.sink_parquet(out / name, compression="zstd", compression_level=1, metadata=tag)
    t_min = min(lo for lo, _ in bounds) if bounds else None
    t_max = max(hi for _, hi in bounds) if bounds else None
    return t_min, t_max
