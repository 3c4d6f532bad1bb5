"""What a prepared directory keeps so that new events can be appended to it (``stats.json["append_state"]``).

An append must give what a full ``prepare`` of every input together gives (docs/data.md,
"Appending"), without reading the earlier inputs again. ``prepare`` therefore keeps, beside
its outputs:

* ``cleaned.parquet``: the cleaned events of every input BEFORE the k-core (after the
  ``min_value`` filter and the duplicate removal), with the raw ids, ``_subsecond`` (when the
  source has sub-second times) and ``source_row``, so the union can be de-duplicated, sorted at
  full precision and cut to the k-core again;
* in ``stats.json`` under ``append_state``: the settings that shape the cleaned events
  (:func:`settings`; an append with other ones is refused), the sha256 of every input file
  prepared so far (a file already prepared is skipped: re-running an append changes nothing),
  each input's path and size beside its sha256 (a file that grew in place since is refused:
  an append reads whole files), and the id-typing decision (text ids that became Int64).

:class:`Base` is that state read back: the earlier events, rejects and vocabulary that an append
merges its new input into.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from recsys_alibi.config import DataConfig
from recsys_alibi.data.ingest import Source
from recsys_alibi.data.schema import CLEANED_FILE, COUNT, ITEM_ID, ITEM_IDX

STATE_KEY = "append_state"


def settings(cfg: DataConfig, source: Source) -> dict:
    """The settings an append must share with the directory it appends to (JSON-ready).

    The format as read, the raw columns and their types, the column map, and every rule that
    decides which events are kept: ``id_type``, ``timestamp_unit``, ``min_value``,
    ``drop_duplicates`` and the k-core thresholds (other thresholds could drop existing items,
    whose indices must never change).
    """
    schema = source.frame.collect_schema()
    return {
        "format": source.fmt,
        "raw_columns": [[name, str(schema[name])] for name in source.raw_columns],  # in order
        "columns": dict(source.columns),
        "id_type": cfg.id_type,
        "timestamp_unit": cfg.timestamp_unit,
        "min_value": cfg.min_value,
        "drop_duplicates": cfg.drop_duplicates,
        "min_events_per_user": cfg.min_events_per_user,
        "min_events_per_item": cfg.min_events_per_item,
    }


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (as stored: a ``.gz`` file is hashed compressed)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def input_record(paths: list[Path] | tuple[Path, ...], digests: list[str]) -> list[dict]:
    """``append_state["input_files"]``: per input file its absolute path, size (bytes) and sha256, so an append
    can tell a file that grew in place since it was prepared (:func:`grown_file`)."""
    return [{"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": d} for p, d in zip(paths, digests)]


def grown_file(path: Path, state: dict) -> dict | None:
    """The record of an earlier input at ``path`` whose bytes are the start of ``path`` now (the file grew since:
    a log still being written, lines added to a day), or None. ``.gz`` files are not compared (a grown stream
    is compressed anew). An earlier file of that name with other first bytes is another file (a daily export
    written over the day before's): None."""
    if path.name.lower().endswith(".gz"):
        return None
    size, where = path.stat().st_size, str(path.resolve())
    for record in state.get("input_files", []):
        if record["path"] == where and record["bytes"] < size:
            with path.open("rb") as handle:
                digest = hashlib.sha256()
                left = record["bytes"]
                while left and (chunk := handle.read(min(left, 1 << 20))):
                    digest.update(chunk)
                    left -= len(chunk)
            if digest.hexdigest() == record["sha256"]:
                return record
    return None


@dataclass(frozen=True)
class Base:
    """The part of an existing prepared directory an append builds on.

    Attributes:
        directory: the prepared directory.
        stats: its ``stats.json`` (counts of the earlier inputs, ``append_state``).
        items: its vocabulary (``item_idx``, ``item_id``, ``count``), by ``item_idx``.
        row_offset: rows read from the earlier inputs; the new input's ``source_row`` (and the
            time of formats without timestamps) continues from here, as in a full prepare that
            reads the new files after the earlier ones.
    """

    directory: Path
    stats: dict
    items: pl.DataFrame
    row_offset: int

    @property
    def state(self) -> dict:
        return self.stats[STATE_KEY]

    @property
    def cleaned_rows(self) -> int:
        """Events in ``cleaned.parquet``."""
        return int(self.state["cleaned_rows"])

    def cleaned(self) -> pl.LazyFrame:
        """The earlier cleaned events (before the k-core): ids, ``timestamp``, ``_subsecond``, ..., ``source_row``."""
        return pl.scan_parquet(self.directory / CLEANED_FILE)

    def vocabulary(self, item_ids: pl.Series, counts: pl.Series) -> pl.DataFrame:
        """The union's vocabulary: every earlier item keeps its ``item_idx``; new items follow.

        Args:
            item_ids: (N,) raw ids of every item the union's k-core keeps (a superset of the
                earlier vocabulary: counts only grow, so the k-core only grows).
            counts: (N,) Int64 events of each in the union.

        Returns:
            ``item_idx`` Int32, ``item_id``, ``count`` Int64 by ``item_idx``: the earlier items
            at their indices with the union's counts, then the new ones numbered from the
            earlier maximum + 1 by descending count, ties by ascending raw id (the order of a
            full prepare).

        Raises:
            AssertionError: an earlier item is not in ``item_ids`` (the k-core would have shrunk).
        """
        old = self.items.with_columns(pl.col(ITEM_ID).cast(item_ids.dtype))
        union = pl.DataFrame({ITEM_ID: item_ids, COUNT: counts.cast(pl.Int64)})
        kept = old.select(ITEM_IDX, ITEM_ID).join(union, on=ITEM_ID, how="left", maintain_order="left")
        assert kept[COUNT].null_count() == 0, "an earlier item left the k-core of the union"
        new = (
            union.join(old, on=ITEM_ID, how="anti")
            .sort([COUNT, ITEM_ID], descending=[True, False])
            .with_row_index(ITEM_IDX, offset=self.items.height + 1)
            .select(pl.col(ITEM_IDX).cast(pl.Int32), ITEM_ID, COUNT)
        )
        return pl.concat([kept, new])
