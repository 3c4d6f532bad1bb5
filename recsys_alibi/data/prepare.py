"""``prepare``: an event log -> a prepared directory.

Output (``output_dir``; every file is written into a staging directory inside it, then all are
published at once with ``manifest.json`` last, see :mod:`recsys_alibi.data.prepared`):

===================== =====================================================================
``events.parquet``    cleaned canonical events, grouped by user, in time order
``items.parquet``     the vocabulary: ``item_idx`` Int32 1..N, ``item_id``, ``count`` Int64
``sequences.parquet`` one row per user: ``user_id``, ``item_idx``, ``timestamp``, ``length``
``rejects.parquet``   rejected rows with ``reject_reason`` (only when a row was rejected)
``cleaned.parquet``   the cleaned events before the k-core, with ``_subsecond`` and ``source_row``:
                      what an append merges into (:mod:`recsys_alibi.data.append`)
``stats.json``        counts, rejects by reason, history-length quantiles, sparsity
``history_length.png`` histogram of events per user
``manifest.json``     the run's ``prepare_id`` (also in every Parquet footer and stats.json),
                      file sizes, data fingerprint; ``"state": "complete"`` once published
===================== =====================================================================

How it runs within bounded memory (the input may be larger than memory):

A. (:mod:`~recsys_alibi.data.prepare_ingest`) streaming passes over the input (Polars streaming engine): rows are tagged (canonical
   columns + reject reason); good events are sunk to ``P`` user-hash partitions in Arrow IPC
   (``P = ceil(estimated rows / data.partition_rows)``, 1 for small inputs) in a temporary
   directory inside ``output_dir``, then rejects to one Parquet file (a second pass: sharing
   one scan between the two sinks would cache the whole input in memory; skipped when the
   input is Parquet and its row count, read from the footers, equals the good events);
A'. text ids: one pass over the partitions' id columns decides their type (Int64 only when
   every value round-trips, ``ingest.integer_id_columns``);
B. (:mod:`~recsys_alibi.data.prepare_clean`) per partition (in memory, ``WORKERS`` at a time in threads): ids typed, ``min_value``
   filter, user and item ids replaced by their ranks in the partition, sort by (user, time at
   full precision, source row) as a radix sort on the user codes, exact-duplicate removal (a
   user's events all live in one partition, so this is exact; the sub-second part is then
   dropped: timestamps are written as seconds); then, in partition order, the codes are made global; the
   partition is kept slim (Int32 user and item codes, timestamp, event type as an Enum, value:
   ~17-21 bytes per event) and its file deleted;
C. the iterative k-core on the codes of all events at once (two Int32 arrays), then each
   partition filtered in place;
D. (:mod:`~recsys_alibi.data.prepare_write`) per partition: vocabulary indices, raw ids restored; events and sequences are streamed
   into their output files by the polars Parquet writer, one partition at a time, while a
   second thread draws the history-length histogram.

Peak memory is about 20-30 bytes per event plus ``WORKERS`` partitions' worth of working space.

Accounting (asserted): ``input_rows = kept + rejected + deduplicated + filtered`` where
``filtered = filtered_min_value + filtered_kcore``.
"""

from __future__ import annotations

import json
import importlib
import logging
import shutil
import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from recsys_alibi.atomic import json_text
from recsys_alibi.config import DataConfig
from recsys_alibi.data.cleaning import k_core_mask
from recsys_alibi.data.ingest import DataError, QuotedLinesError, Source, integer_id_columns, scan_source
from recsys_alibi.data.rejected_hints import all_rejected_hint
from recsys_alibi.data.item_features import STATS_KEY as ITEM_TABLE_KEY
from recsys_alibi.data.item_features import item_table_line, write_item_features
from recsys_alibi.data.item_table import check_declaration, read_item_table
from recsys_alibi.data.prepare_clean import ITEM_CODE, USER_CODE, ItemCoder, Part, clean_partition
from recsys_alibi.data.prepare_ingest import (
    WORKERS,
    ipc_rows,
    n_partitions,
    parquet_rows,
    round_trip_ids,
    sink_partitions,
    sink_rejects,
)
from recsys_alibi.data.prepare_state import STATE_KEY, Base, file_sha256, input_record, settings
from recsys_alibi.data.prepare_write import write_outputs
from recsys_alibi.data.prepared import LINE_ORDER_KEY, PREPARE_ID_KEY, STAGING_PREFIX, clean_stale, keep_failed_rejects, prepare_lock, publish
from recsys_alibi.data.schema import CLEANED_FILE, COUNT, EVENT_TYPE, ITEM_ID, ITEM_IDX, ITEMS_FILE, REJECT_REASON, REJECTS_FILE, STATS_FILE, TIMESTAMP, USER_ID
from recsys_alibi.data.sequences import build_vocabulary, read_items, read_sequences
from recsys_alibi.data.stats import HISTOGRAM_FILE, history_length_summary, plot_history_lengths, sparsity

__all__ = ["DataError", "PrepareResult", "prepare", "read_items", "read_sequences"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepareResult:
    """What ``prepare`` (or an append) wrote.

    Attributes:
        output_dir: the prepared directory.
        counts: ``input_rows``, ``rejected``, ``deduplicated``, ``filtered_min_value``,
            ``filtered_kcore``, ``filtered``, ``kept``, ``users``, ``items``, ``events``,
            ``kcore_rounds`` (of the whole directory, every input together).
        stats: everything in ``stats.json`` (an append: ``appended`` says what it brought).
        appended: None for a full prepare; True when an append merged new files; False when
            every file was already in the directory (nothing changed).
    """

    output_dir: Path
    counts: dict[str, int]
    stats: dict = field(default_factory=dict, repr=False)
    appended: bool | None = None

    def summary(self) -> str:
        c = self.counts
        whole = (
            f"{c['events']:,} events, {c['users']:,} users, {c['items']:,} items "
            f"from {c['input_rows']:,} {self.stats.get('format', 'input')} rows ({c['rejected']:,} rejected, "
            f"{c['deduplicated']:,} duplicates, {c['filtered']:,} filtered) -> {self.output_dir}"
        )
        whole += item_table_line(self.stats.get(ITEM_TABLE_KEY))
        if self.appended is None:
            return f"prepared {whole}"
        if not self.appended:
            return f"nothing to append: every input file is already prepared; {whole}"
        a = self.stats["appended"]
        return (  # what the prepared data gained: the union's k-core may keep what it cut from earlier inputs
            f"appended {a['input_rows']:,} rows: the prepared data gained {a['new_events']:,} events, "
            f"{a['new_users']:,} users and {a['new_items']:,} items (with any of earlier inputs that the k-core now "
            f"keeps); now {whole}"
        )


# ----------------------------------------------------------------------------- prepare



EARLIEST_FINE_UNIT_TIME = 100_000_000  # seconds: 1973-03-03, where 1e11 milliseconds lies


def _warn_if_the_unit_looks_too_fine(unit: str, t_max: int | None, line_order: bool) -> None:
    """Warn when ``data.timestamp_unit`` names a unit finer than seconds and every event then falls before
    1973-03-03 (the newest at ``t_max`` seconds): the usual sign of seconds read as milliseconds (or finer),
    which would put every time-dependent step (temporal cutoff, time gaps, the popularity prior's ages, the
    daily period boundaries) on a clock a thousand times too slow. Relative times in that unit stay possible,
    so this warns rather than refuses."""
    if unit in ("ms", "us", "ns") and not line_order and t_max is not None and 0 <= t_max < EARLIEST_FINE_UNIT_TIME:
        import datetime as dt

        newest = dt.datetime.fromtimestamp(t_max, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        log.warning("data.timestamp_unit=%s: every event falls before 1973-03-03 (the newest at %s); if the "
                    "timestamps are seconds, prepare again with data.timestamp_unit=s (or auto)", unit, newest)  # fmt: skip

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
            return prepare_in_work_dir(cfg, source, out)
        except QuotedLinesError:  # rows span lines: fields cannot be counted per line; read without the check
            log.warning("%s: quoted fields span lines, so CSV rows are not checked for a wrong number of fields", source.paths[0])
            return prepare_in_work_dir(cfg, scan_source(cfg, input_path, fmt, count_fields=False), out)


def prepare_in_work_dir(
    cfg: DataConfig, source: Source, out: Path, base: Base | None = None, digests: list[str] | None = None
) -> PrepareResult:
    """``_prepare`` in a fresh staging directory inside ``out`` (removed afterwards; hold the lock)."""
    work = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
    try:
        return _prepare(cfg, source, out, work, base, digests)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _prepare(
    cfg: DataConfig, source: Source, out: Path, work: Path, base: Base | None = None, digests: list[str] | None = None
) -> PrepareResult:
    """Every output into ``work`` (tagged with a new prepare id), then published into ``out``.

    Args:
        base: an append's existing directory (its cleaned events, rejects and vocabulary are
            merged with the new input's); None for a full prepare.
        digests: sha256 of each file of ``source`` (None: computed here, beside the reading).
    """
    if cfg.items is not None:  # a table that cannot match its declaration is refused before the events are read
        check_declaration(read_item_table(cfg.items), cfg.item_features)
    prepare_id = uuid.uuid4().hex
    # every Parquet footer says where time came from, so a sequences file copied out alone still says it
    tag = {PREPARE_ID_KEY: prepare_id, **({LINE_ORDER_KEY: "true"} if TIMESTAMP not in source.columns else {})}
    with ThreadPoolExecutor(1) as hasher:  # hashlib releases the GIL: the input is hashed while polars reads it
        hashing = hasher.submit(lambda: digests if digests is not None else [file_sha256(p) for p in source.paths])
        ingested = _ingest(cfg, source, out, work, tag, base)
        result = _clean_and_write(cfg, source, ingested, work, tag, base)
        item_table = write_item_features(cfg, work, pl.read_parquet(work / ITEMS_FILE), tag, base and base.directory)
        before = _before(base, STATE_KEY, {})
        state = {**result.stats[STATE_KEY], "input_sha256": [*before.get("input_sha256", []), *hashing.result()],
                 "input_files": [*before.get("input_files", []), *input_record(source.paths, hashing.result())]}
    stats = {**result.stats, STATE_KEY: state, **({ITEM_TABLE_KEY: item_table} if item_table else {})}
    if base is None and not cfg.overwrite:
        _check_nothing_lost(out, source.paths, hashing.result())
    (work / STATS_FILE).write_text(json_text(stats, sort_keys=False))
    publish(work, out, prepare_id)
    return PrepareResult(output_dir=out, counts=result.counts, stats=stats, appended=None if base is None else True)


def _check_nothing_lost(out: Path, paths: tuple[Path, ...], digests: list[str]) -> None:
    """Refuse a full prepare over a prepared directory that holds events of input files it does not read (days added
    by ``--append``, another log): it replaces the directory as a whole, so they would be gone. An earlier input is
    read again when this prepare reads its path (a corrected file) or its bytes (a moved one); a directory's own
    files as input (its ``events.parquet``) are its events. Directories prepared before paths were recorded
    (``append_state["input_files"]``) are not checked.

    Raises:
        DataError: naming how many such files there are and the three ways on.
    """
    try:
        earlier = json.loads((out / STATS_FILE).read_text())[STATE_KEY]["input_files"]
    except (OSError, ValueError, KeyError, TypeError):  # no prepared directory there (or one from before the record)
        return
    inside = out.resolve()
    if any(inside in p.resolve().parents for p in paths):
        return
    read_paths, read_bytes = {str(p.resolve()) for p in paths}, set(digests)
    lost = [f for f in earlier if f["path"] not in read_paths and f["sha256"] not in read_bytes]
    if lost:
        raise DataError(
            f"{out} holds the events of {len(lost)} input file(s) that this prepare does not read (e.g. "
            f"'{lost[-1]['path']}', prepared earlier or added with --append): a prepare replaces the directory as a "
            "whole, so they would be lost; add this input with --append (data.append=true), prepare every input "
            "together, or --set data.overwrite=true to replace it"
        )


def _before(base: Base | None, key: str, default):
    """``base.stats[key]`` (what the earlier inputs contributed), ``default`` for a full prepare."""
    return default if base is None else base.stats.get(key, default)


@dataclass(frozen=True)
class _Ingested:
    """Step A's result: the partitions (earlier cleaned events first) and the rejects' counts."""

    parts: list[list[Path]]
    n_parts: int
    n_all: int  # good rows in the partitions (an append's earlier cleaned events included)
    new_rows: int  # rows of this input (good and rejected)
    text_ids: tuple[str, ...]
    int_ids: list[str]
    by_reason: dict[str, int]


def _ingest(cfg: DataConfig, source: Source, out: Path, work: Path, tag: dict[str, str], base: Base | None) -> _Ingested:
    """A: good events (after an append's earlier ones) to partitions, rejects (after the earlier ones) to Parquet."""
    earlier = base.cleaned_rows if base is not None else 0
    rows = parquet_rows(source)
    n_parts = n_partitions(cfg, source, rows, earlier)
    if base is None:
        text_ids = source.text_ids
        parts = sink_partitions(cfg, source, work, n_parts)
        n_all = sum(ipc_rows(files) for files in parts)
        int_ids = integer_id_columns(pl.scan_ipc([f for files in parts for f in files]), text_ids) if n_all else []
    else:  # Int64 only where the earlier inputs' ids were (so all round-trip) and every new one round-trips too
        text_ids = tuple(dict.fromkeys((*base.state["text_ids"], *source.text_ids)))
        int_ids = round_trip_ids(cfg, source, [c for c in text_ids if c in base.state["int_ids"]])
        parts = sink_partitions(cfg, source, work, n_parts, base.cleaned(), int_ids)
        n_all = sum(ipc_rows(files) for files in parts)
    n_valid = n_all - earlier
    rejects_path = work / REJECTS_FILE
    earlier_rejects = base.directory / REJECTS_FILE if base is not None else None
    earlier_rejects = earlier_rejects if earlier_rejects is not None and earlier_rejects.is_file() else None
    # some rows are rejects, or the row count is unknown: a second pass
    sink_rejects(cfg, source, rejects_path, tag, before=earlier_rejects, new=n_valid != rows)
    rejects_by_reason = (
        pl.scan_parquet(rejects_path).group_by(REJECT_REASON).len().sort(REJECT_REASON).collect()
        if rejects_path.exists()
        else pl.DataFrame({REJECT_REASON: [], "len": []})
    )
    by_reason = {r: int(n) for r, n in rejects_by_reason.iter_rows()}
    n_rejected = sum(by_reason.values())
    new_rows = n_valid + n_rejected - _before(base, "rejected", 0)
    if new_rows == 0 and base is None:  # an append of no rows (a quiet day) adds nothing, as in a full prepare
        raise DataError(f"empty input: '{source.paths[0]}' has no rows; point --input at the event log")
    if not n_rejected:
        rejects_path.unlink(missing_ok=True)  # an empty file: published as "no rejects" (an older one is removed)
    if n_all == 0:
        reasons = ", ".join(f"{k}: {v}" for k, v in by_reason.items())
        hint = all_rejected_hint(source, by_reason, rejects_path)
        kept_at = keep_failed_rejects(rejects_path, out)
        if hint is not None:
            raise DataError(f"all {n_rejected:,} rows were rejected ({reasons}): {hint}; see {kept_at}")
        raise DataError(f"all {n_rejected:,} rows were rejected ({reasons}); see {kept_at} and check --format and data.columns")
    return _Ingested(parts, n_parts, n_all, new_rows, text_ids, int_ids, by_reason)


def _clean_partitions(
    cfg: DataConfig, parts: list[list[Path]], int_ids: list[str], cleaned_path: Path, tag: dict[str, str]
) -> tuple[list[Part], pl.Series, int]:
    """B: per partition, min_value filter, local codes, sort, duplicate removal (held slim in memory).

    ``WORKERS`` partitions at a time (numpy and polars release the GIL), codes made global in
    partition order; each partition's cleaned events with raw ids are appended to
    ``cleaned_path`` (what a later append merges into).

    Returns:
        ``(parts, item_ids, n_after_min)``: the partitions, the raw item id of every global item
        code, and the events left after the min_value filter.
    """
    coder = ItemCoder()
    cleaned: list[Part] = []
    n_after_min = n_users_seen = 0
    parts = [files for files in parts if files]
    writer = _CleanedWriter(cleaned_path, tag)
    with writer, ThreadPoolExecutor(WORKERS) as pool:
        for files, (users, items, frame, n_min, events) in zip(parts, pool.map(partial(clean_partition, cfg, int_ids), parts)):
            for f in files:  # free the disk as we go
                f.unlink()
            if frame.height:
                writer.write(events)
                item_codes = coder.encode(items)[frame[ITEM_ID].to_numpy()]  # local codes -> global ones
                frame = frame.with_columns(pl.col(USER_ID) + n_users_seen, pl.Series(ITEM_ID, item_codes))
                frame = frame.rename({USER_ID: USER_CODE, ITEM_ID: ITEM_CODE})
                cleaned.append(Part(users=users, frame=frame, user_offset=n_users_seen))
                n_users_seen += users.len()
                n_after_min += n_min
    return cleaned, coder.ids(), n_after_min


class _CleanedWriter:
    """``cleaned.parquet`` written partition after partition in a background thread (pyarrow releases
    the GIL), in the order given; plain encoding but for the event type (ids, times and rows are
    near-unique: dictionaries cost CPU and save nothing), no statistics, zstd level 1."""

    def __init__(self, path: Path, tag: dict[str, str]) -> None:
        self._path, self._tag = path, tag
        self._writer: pq.ParquetWriter | None = None
        self._thread = ThreadPoolExecutor(1)
        self._pending: list = []

    def write(self, events: pl.DataFrame) -> None:
        self._pending.append(self._thread.submit(self._write, events.to_arrow()))

    def _write(self, table) -> None:
        if self._writer is None:
            dictionary = [name for name in table.column_names if name == EVENT_TYPE] or False
            self._writer = pq.ParquetWriter(
                self._path, table.schema.with_metadata(self._tag), compression="zstd", compression_level=1,
                use_dictionary=dictionary, write_statistics=False,
            )  # fmt: skip
        self._writer.write_table(table)

    def __enter__(self) -> _CleanedWriter:
        return self

    def __exit__(self, *exc) -> None:
        self._thread.shutdown(wait=True)
        try:
            for done in self._pending:
                done.result()  # a write error is raised here
        finally:
            if self._writer is not None:
                self._writer.close()


def _clean_and_write(
    cfg: DataConfig, source: Source, ingested: _Ingested, work: Path, tag: dict[str, str], base: Base | None
) -> PrepareResult:
    """B, C, D: clean the partitions, cut the k-core, index the items, write every output but the manifest."""
    cleaned, item_ids, n_after_min = _clean_partitions(cfg, ingested.parts, ingested.int_ids, work / CLEANED_FILE, tag)
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
    present_ids, present_counts = item_ids.gather(present), pl.Series(COUNT, item_count[present], dtype=pl.Int64)
    if base is None:
        vocab = build_vocabulary(pl.LazyFrame({ITEM_ID: present_ids, COUNT: present_counts})).collect()
    else:  # earlier items keep their indices, new ones follow
        vocab = base.vocabulary(present_ids, present_counts)
    idx_of_code = np.zeros(item_ids.len(), dtype=np.int32)  # 0 (padding) for items the k-core removed
    idx_of_code[present] = (
        pl.DataFrame({ITEM_ID: present_ids}).join(vocab, on=ITEM_ID, how="left", maintain_order="left")[ITEM_IDX].to_numpy()
    )

    # D: write events and sequences, partition after partition; the histogram is drawn meanwhile
    # (matplotlib holds the GIL, the polars writer mostly does not)
    with ThreadPoolExecutor(1) as plotter:
        histogram = plotter.submit(plot_history_lengths, lengths, work / HISTOGRAM_FILE)
        t_min, t_max = write_outputs(cleaned, item_ids, idx_of_code, work, tag)
        vocab.write_parquet(work / ITEMS_FILE, metadata=tag)
        histogram.result()

    _warn_if_the_unit_looks_too_fine(cfg.timestamp_unit, t_max, LINE_ORDER_KEY in tag)
    n_users, n_items, n_all = int(lengths.shape[0]), int(vocab.height), ingested.n_all
    n_rejected = sum(ingested.by_reason.values())
    counts = {
        "input_rows": _before(base, "input_rows", 0) + ingested.new_rows,
        "rejected": n_rejected,
        "deduplicated": _before(base, "deduplicated", 0) + n_after_min - n_after_dedup,
        "filtered_min_value": _before(base, "filtered_min_value", 0) + n_all - n_after_min,
        "filtered_kcore": n_after_dedup - kept,
        "kept": kept,
        "users": n_users,
        "items": n_items,
        "events": kept,
        "kcore_rounds": rounds,
    }
    counts["filtered"] = counts["filtered_min_value"] + counts["filtered_kcore"]
    assert counts["input_rows"] == counts["kept"] + counts["rejected"] + counts["deduplicated"] + counts["filtered"]
    stats = {
        "input": [*_before(base, "input", []), *(str(p) for p in source.paths)][:20],
        "format": source.fmt,
        **counts,
        "rejects_by_reason": ingested.by_reason,
        "min_value": cfg.min_value,
        "min_events_per_user": cfg.min_events_per_user,
        "min_events_per_item": cfg.min_events_per_item,
        "history_length": history_length_summary(lengths),
        "sparsity": sparsity(kept, n_users, n_items),
        "timestamp_min": t_min,
        "timestamp_max": t_max,
        "time_from_line_order": LINE_ORDER_KEY in tag,
        "partitions": ingested.n_parts,
        PREPARE_ID_KEY: tag[PREPARE_ID_KEY],
        STATE_KEY: {
            # an append keeps the directory's (its input matched them; an empty day's Null columns must not replace them)
            "settings": settings(cfg, source) if base is None else base.state["settings"],
            "text_ids": list(ingested.text_ids),
            "int_ids": ingested.int_ids,
            "cleaned_rows": n_after_dedup,
            "appends": _before(base, STATE_KEY, {}).get("appends", -1) + 1,
        },
    }
    if base is not None:  # what this append brought (counts only grow: see recsys_alibi.data.append)
        stats["appended"] = {
            "input_rows": ingested.new_rows,
            "new_users": n_users - int(base.stats["users"]),
            "new_items": n_items - base.items.height,
            "new_events": kept - int(base.stats["kept"]),
        }
    return PrepareResult(output_dir=work, counts=counts, stats=stats)
