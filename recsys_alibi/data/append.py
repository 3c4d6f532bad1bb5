"""``prepare --append``: merge new events into an existing prepared directory.

The rule that defines it: the appended directory holds the same users, events, sequences,
timestamps and rejects as a full ``prepare`` of every input together (the earlier ones first, in
the order they were given, then the new files in natural name order); the only difference is the
numbering of the items new to this append, which come after every existing ``item_idx`` (by
descending count, ties by ascending raw id, as a full prepare orders them). An existing item's
``item_idx`` never changes; ``items.parquet`` holds the union's counts.

How (the same code as a full prepare, :mod:`recsys_alibi.data.prepare`, with the earlier cleaned
events in place of the earlier inputs):

* the new files are read with the same readers and rules; their ``source_row`` (and, for
  formats without timestamps, their time) continues after the earlier inputs' rows;
* ``cleaned.parquet`` (the earlier inputs' cleaned events before the k-core, with sub-second time
  and source order) and the new good events go through the same partitioning, id typing, sort
  and duplicate removal (an event delivered again is a duplicate of the earlier copy, counted
  once), then the k-core is cut on the union, so events filtered out earlier come back when
  their user or item reaches the thresholds;
* with the same thresholds, the union's k-core contains the earlier one: the iterative k-core
  is the largest set of events in which every user and item has enough events, and the earlier
  k-core still is such a set among more events. So no earlier user or item leaves, and every
  existing ``item_idx`` stays valid (asserted);
* rejects are the earlier ones followed by the new ones.

The directory is published as a whole (:func:`recsys_alibi.data.prepared.publish`): a killed
append leaves the old directory, or, killed while renaming, a publish the next append finishes
(:func:`recsys_alibi.data.prepared.roll_forward`). Files already prepared into the directory
(same sha256) are skipped, so re-running an append changes nothing; a file that grew in place since it was
prepared (its earlier bytes are its start) is refused, as its earlier events would count twice.

Refused with one line (``DataError``): no prepared directory there, one prepared before appends
were kept, or other settings than the directory's (format, raw columns and their types, column
map, ``id_type``, ``timestamp_unit``, ``min_value``, ``drop_duplicates``, k-core thresholds).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import polars as pl

from recsys_alibi.config import DataConfig, ItemFeaturesConfig
from recsys_alibi.data.ingest import DataError, QuotedLinesError, Source, scan_source
from recsys_alibi.data.item_features import STATS_KEY as ITEM_TABLE_KEY
from recsys_alibi.data.prepare import PrepareResult, prepare_in_work_dir
from recsys_alibi.data.prepare_state import STATE_KEY, Base, file_sha256, grown_file, settings
from recsys_alibi.data.prepared import check_file, clean_stale, prepare_lock, read_consistent, read_manifest, roll_forward
from recsys_alibi.data.schema import CLEANED_FILE, MANIFEST_FILE, REJECTS_FILE, SOURCE_ROW, STATS_FILE
from recsys_alibi.data.sequences import read_items

__all__ = ["append"]

log = logging.getLogger(__name__)

REDO = "or prepare all inputs together without --append"


def append(cfg: DataConfig, input_path: str | Path, output_dir: str | Path, *, fmt: str | None = None) -> PrepareResult:
    """Merge the events of ``input_path`` into the prepared directory ``output_dir`` (see the module docstring).

    Args:
        cfg: the ``data`` section; must match the settings the directory was prepared with.
        input_path: new events: file, directory or glob of the directory's format. Files whose
            bytes were already prepared into the directory are skipped.
        output_dir: an existing prepared directory (from ``prepare``, or an earlier append).
        fmt: overrides ``cfg.format``; when neither gives one, the directory's format is used.

    Returns:
        The counts and stats of the whole (appended) directory; ``appended`` is False when
        every file was already in it (nothing was written).

    Raises:
        DataError: ``output_dir`` is not a prepared directory that keeps its cleaned events,
            the settings differ from its own, or the input cannot be read (as ``prepare``).
    """
    out = Path(output_dir)
    check_appendable(out)
    if (fmt or cfg.format) == "auto":  # not given: the new files are read as the directory's were
        fmt = _recorded_format(out)
    source = scan_source(cfg, input_path, fmt)
    with prepare_lock(out):
        roll_forward(out)  # a publish a killed append began: finish it before reading
        clean_stale(out)
        base = _load_base(out)
        _check_settings(base, settings(cfg, source), out)
        cfg = _with_recorded_declaration(cfg, base, out)
        digests = [file_sha256(p) for p in source.paths]
        known = set(base.state["input_sha256"])
        fresh = [(p, d) for p, d in zip(source.paths, digests) if d not in known]
        for path, _ in fresh:
            grown = grown_file(path, base.state)
            if grown is not None:
                raise DataError(
                    f"cannot append '{path}': it grew since it was prepared into {out} (its first {grown['bytes']:,} "
                    "bytes are the file prepared then), and an append reads whole files, so those events would count "
                    f"twice; put the new lines in a file of their own, {REDO}"
                )
        if not fresh:
            # no INFO line: the command's summary says "nothing to append" (prepare's, and pipeline's at its end)
            log.debug("every file of %s is already prepared into %s: nothing to append", input_path, out)
            if cfg.items is not None and str(cfg.items) not in base.stats.get(ITEM_TABLE_KEY, {}).get("sources", []):
                log.warning("item table %s was not read: an append merges a table with new events, and every file of "
                            "%s is already prepared (its rows are not in %s)", cfg.items, input_path, out)  # fmt: skip
            return PrepareResult(output_dir=out, counts=_counts(base.stats), stats=base.stats, appended=False)
        if len(fresh) < len(source.paths):
            log.info("%d of %d files are already prepared into %s: appending the others", len(source.paths) - len(fresh), len(source.paths), out)
        paths, digests = [p for p, _ in fresh], [d for _, d in fresh]
        try:
            return prepare_in_work_dir(cfg, _after(base, scan_source(cfg, paths, source.fmt)), out, base, digests)
        except QuotedLinesError:
            log.warning("%s: quoted fields span lines, so CSV rows are not checked for a wrong number of fields", paths[0])
            source = scan_source(cfg, paths, source.fmt, count_fields=False)
            return prepare_in_work_dir(cfg, _after(base, source), out, base, digests)


def _with_recorded_declaration(cfg: DataConfig, base: Base, out: Path) -> DataConfig:
    """``cfg`` with the item-feature declaration the directory recorded, when an item table is given without one
    (nothing is guessed: it is the declaration every earlier table of the directory was read with).

    Raises:
        DataError: a table without a declaration, for a directory that has no item table.
    """
    if cfg.items is None or cfg.item_features.columns:
        return cfg
    recorded = base.stats.get(ITEM_TABLE_KEY, {}).get("declaration")
    if not recorded:
        raise DataError(f"data.items needs its columns declared: {out} has no item table whose declaration an append "
                        "could take; set data.item_features.categorical and/or .numeric")  # fmt: skip
    return cfg.model_copy(update={"item_features": ItemFeaturesConfig.model_validate(recorded)})


def check_appendable(out: Path, first: str = "run `recsys-alibi prepare` without --append first") -> None:
    """Refuse an append to ``out`` when it holds no prepared directory; ``first``: how to make one.

    Raises:
        DataError: one line naming ``out`` and ``first``.
    """
    if not (out / MANIFEST_FILE).is_file():
        raise DataError(f"cannot append to {out}: it is not a prepared directory (no {MANIFEST_FILE}); {first}")


def _recorded_format(out: Path) -> str | None:
    """The format ``stats.json`` records (None when unreadable: the format is then inferred)."""
    try:
        recorded = json.loads((out / STATS_FILE).read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        return None
    return recorded if isinstance(recorded, str) else None


def _after(base: Base, source: Source) -> Source:
    """``source`` read as if after the earlier inputs: its ``source_row`` continues from theirs."""
    return replace(source, frame=source.frame.with_columns(pl.col(SOURCE_ROW) + base.row_offset))


def _load_base(out: Path) -> Base:
    """The directory's stats, vocabulary and cleaned events, checked to be one prepare's (hold the lock)."""
    manifest = read_manifest(out)
    assert manifest is not None  # checked before taking the lock; nobody else writes it now
    prepare_id = manifest["prepare_id"]
    stats = read_consistent(out, STATS_FILE, lambda p: json.loads(p.read_text()), prepare_id)
    if STATE_KEY not in stats or not (out / CLEANED_FILE).is_file():
        raise DataError(
            f"cannot append to {out}: it was prepared by a version that did not keep its cleaned events "
            f"({CLEANED_FILE}); prepare all inputs again without --append, then append"
        )
    check_file(out / CLEANED_FILE, prepare_id)
    if (out / REJECTS_FILE).is_file():
        check_file(out / REJECTS_FILE, prepare_id)
    return Base(directory=out, stats=stats, items=read_items(out, prepare_id), row_offset=int(stats["input_rows"]))


def _check_settings(base: Base, now: dict, out: Path) -> None:
    """DataError naming the first setting that differs from the directory's."""
    now = json.loads(json.dumps(now))  # as stored: lists, plain numbers
    was = base.state["settings"]
    for key, value in now.items():
        if key == "raw_columns" and _same_raw_columns(was.get(key), value, now.get("format")):
            continue
        if was.get(key) != value:
            raise DataError(
                f"cannot append to {out}: it was prepared with {key} {was.get(key)!r}, this input has {value!r}; "
                f"append events read with the directory's settings, {REDO}"
            )


def _same_raw_columns(was: list | None, now: list, fmt: str | None) -> bool:
    """Whether the input's raw ``[name, dtype]`` columns read as the directory's: the same names and types, in the
    same order for text formats (a CSV header's order is its reading), in any order for Parquet (its columns are
    found by name); a ``Null`` column (a file with no rows, as pandas and Polars write an empty frame) takes any
    type, as a full prepare of that file beside the others reads it."""
    if was is None:
        return False
    if fmt == "parquet":
        was, now = sorted(was), sorted(now)
    return len(was) == len(now) and all(
        w_name == n_name and (w_type == n_type or n_type == "Null") for (w_name, w_type), (n_name, n_type) in zip(was, now)
    )


def _counts(stats: dict) -> dict[str, int]:
    keys = ("input_rows", "rejected", "deduplicated", "filtered_min_value", "filtered_kcore", "filtered", "kept",
            "users", "items", "events", "kcore_rounds")  # fmt: skip
    return {key: int(stats[key]) for key in keys}
