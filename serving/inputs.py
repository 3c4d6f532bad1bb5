"""What the scoring job reads: users and their histories in the model's item indices, by shard.

Three kinds of input (``--input``):

=============== ===========================================================================
``prepared``    a directory with ``sequences.parquet`` (and ``items.parquet``) from ``prepare``
``sequences``   a sequences Parquet file (``user_id``, ``item_idx`` list<int32>)
``events``      anything else: a raw event log in any format ``prepare`` reads (file,
                directory or glob; Parquet, CSV/TSV, NDJSON, MovieLens, SASRec, S3-Rec, .gz)
=============== ===========================================================================

Raw events are staged once by :func:`recsys_alibi.data.prepare.prepare` itself (same readers,
validation and rejects, same duplicate rule, users grouped and time-ordered the same way) into
``output_dir/_input`` with the k-core switched off (``min_events_per_user/item = 1``: scoring
keeps every user and every event). Its vocabulary is then mapped onto the model's training
vocabulary by raw ``item_id``; so is a prepared directory whose ``items.parquet`` differs from
the model's. Events of items the model does not know are dropped and counted
(``unknown_events``; distinct items: ``unknown_items``); a user left with no known event is not
scored and is counted (``skipped_users``). A bare sequences file without an ``items.parquet``
beside it must already use the model's indices (checked: an index above N is an error).

Shards are contiguous runs of ``score.shard_users`` users in the order of the sequences file;
each is read alone (Parquet slice), so memory does not grow with the number of users.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.atomic import json_text
from recsys_alibi.config import DataConfig
from recsys_alibi.data import schema
from recsys_alibi.data.ids import same_id_in
from recsys_alibi.data.ingest import DataError, resolve_paths
from recsys_alibi.data.item_features import ITEM_REJECTS_FILE
from recsys_alibi.data.loader import FlatSequences
from recsys_alibi.data.prepared import check_file, check_prepared, cleaned_item_ids, read_consistent
from recsys_alibi.data.sequences import read_parquet_file, vocabulary_difference
from recsys_alibi.data.time_gaps import (
    backwards_sequences,
    checked_timestamps,
    gap_buckets,
    sequences_have_real_timestamps,
)
from recsys_alibi.data.timestamps import seconds_of_lists

log = logging.getLogger(__name__)

STAGED_MARKER = "_staged.json"
STAGED_KEEP = (schema.STATS_FILE, schema.REJECTS_FILE, ITEM_REJECTS_FILE, STAGED_MARKER)  # kept when the job completes
SKIP_NO_KNOWN_ITEM = "no_known_item"  # reasons a user is not ranked (Shard.skipped)
SKIP_NO_EVENTS = "no_events"
SKIP_EVERY_ITEM_SEEN = "every_item_seen"  # ranked, but seen-item exclusion left no item to recommend
SKIP_EVERY_EVENT_REJECTED = "every_event_rejected"  # raw events: every row of the user rejected (rejected_users)
REJECTED_USERS_FILE = "rejected-users.parquet"  # in _skipped/, beside the shards' lists


@dataclass(frozen=True)
class Shard:
    """One shard of users ready to rank.

    Attributes:
        user_ids: (U,) raw user ids (Int64 or String), in input order.
        histories: U sequences of model item indices (1..N, int64), time order, unknown items
            removed; a sequence may be empty (no known item: the user is skipped).
        unknown_events: events dropped because the model does not know their item.
        gaps: time-gap buckets of the kept events, aligned with ``histories`` (time-gap models
            only; computed on the whole input history, so dropping an unknown event keeps each
            other event's true gap), else None.
        input_lengths: (U,) int64 events of each user in the input, before unknown items were
            dropped (None: equal to the history lengths).
        new_seen: U sequences of ranker indices (N + 1 .. N + M) of the items ranked from their features
            alone (``score.items``) that are in the user's input history (``histories`` drops their events, the
            model does not know them; :attr:`ScoreInput.new_item_remap`); None: no such item in the input.
    """

    user_ids: pl.Series
    histories: FlatSequences
    unknown_events: int
    gaps: FlatSequences | None = None
    input_lengths: np.ndarray | None = None
    new_seen: FlatSequences | None = None

    def skipped(self, ranked: pl.Series) -> pl.DataFrame:
        """The users that are not ranked, with why: ``user_id``, ``reason``, ``input_events`` Int64.

        ``reason`` is ``no_known_item`` (every event's item is unknown to the model),
        ``no_events`` (an empty or null history in the input) or ``every_item_seen``: a user
        with known items who is not in ``ranked`` (the user ids that got ranking rows), because
        the history holds every item of the catalog and seen items are excluded.
        """
        lengths = self.histories.lengths()
        given = lengths if self.input_lengths is None else self.input_lengths
        rows = np.flatnonzero((lengths == 0) | ~self.user_ids.is_in(ranked.implode()).to_numpy())
        reasons = np.where(lengths[rows] > 0, SKIP_EVERY_ITEM_SEEN, np.where(given[rows] > 0, SKIP_NO_KNOWN_ITEM, SKIP_NO_EVENTS))
        return pl.DataFrame({
            schema.USER_ID: self.user_ids.gather(rows),
            "reason": pl.Series(reasons.tolist(), dtype=pl.String),
            "input_events": pl.Series(given[rows], dtype=pl.Int64),
        })  # fmt: skip


@dataclass(frozen=True)
class ScoreInput:
    """A resolved input: where the sequences are and how their indices map to the model's.

    Attributes:
        kind: ``"prepared"``, ``"sequences"`` or ``"events"``.
        sequences: Parquet file with ``user_id`` and ``item_idx`` list columns.
        n_users: rows (users) in ``sequences``.
        remap: (M + 1,) int64, input item index -> model item index (0: unknown), or None when
            the input already uses the model's indices.
        stats: ``unknown_items`` and, for raw events, ``input_rows``, ``rejected_rows``,
            ``duplicate_rows``, ``filtered_rows``.
        time_gap_buckets: G > 0 when the model reads time gaps: shards then carry ``gaps``
            from the input's ``timestamp`` lists (``recsys_alibi.data.time_gaps``), read by
            ``prepare``'s rule as the pyfunc reads them (integers above 1e11 are ms, ...:
            ``seconds_of_lists`` with ``auto``; seconds, as ``prepare`` writes, stay as they are).
        prepare_id: the prepare of the directory holding ``sequences`` (None: no manifest);
            every shard read checks the file still carries it (``recsys_alibi.data.prepared``).
        name: how messages name the input (None: ``sequences``).
        new_item_remap: (M_in + 1,) int64, input item index -> the ranker's index of the same item when it
            ranks it from its features alone (N + 1 .. N + M; 0 otherwise), and ``withheld`` (W,) int64 such
            indices never served to any user of this input (items its k-core removed: they have events, which
            the histories lack); set by ``ShardRanker.for_input``, None before.
    """

    kind: str
    sequences: Path
    n_users: int
    remap: np.ndarray | None = None
    stats: dict[str, int] = field(default_factory=dict)
    time_gap_buckets: int = 0
    prepare_id: str | None = None
    name: str | None = None  # how messages name the input (the user's path, never a staged or temporary file)
    new_item_remap: np.ndarray | None = None
    withheld: np.ndarray | None = None

    def removed_item_ids(self) -> pl.Series | None:
        """Raw ids of the items the input's k-core removed (``data.min_events_per_item``, ...): in the cleaned
        events beside ``sequences`` (``cleaned.parquet``) and not in its ``items.parquet``; None without them."""
        items_path = self.sequences.with_name(schema.ITEMS_FILE)
        events = cleaned_item_ids(self.sequences.parent) if self.sequences.name == schema.SEQUENCES_FILE else None
        if events is None or not items_path.is_file():
            return None
        kept = read_consistent(items_path.parent, items_path.name, read_parquet_file, self.prepare_id)
        return events.join(kept.select(schema.ITEM_ID), on=schema.ITEM_ID, how="anti").get_column(schema.ITEM_ID)

    def vocabulary(self, model_items: pl.DataFrame) -> pl.DataFrame:
        """The items the input's ``item_idx`` refer to: the ``items.parquet`` beside ``sequences`` (a prepared or
        staged directory), else ``model_items`` (a bare sequences file is in the model's numbering)."""
        items_path = self.sequences.with_name(schema.ITEMS_FILE)
        if self.sequences.name != schema.SEQUENCES_FILE or not items_path.is_file():
            return model_items
        return read_consistent(items_path.parent, items_path.name, read_parquet_file, self.prepare_id)

    def user_ids(self) -> pl.Series:
        """(U,) every user id of the input, in its order."""
        return pl.scan_parquet(self.sequences).select(schema.USER_ID).collect().get_column(schema.USER_ID)

    def read_shard(self, start: int, n: int) -> Shard:
        """Users ``start .. start + n - 1`` with their histories in model indices (bounded memory)."""
        columns = [schema.USER_ID, schema.ITEM_IDX] + ([schema.TIMESTAMP] if self.time_gap_buckets else [])
        frame = pl.scan_parquet(self.sequences).select(columns).slice(start, n).collect()
        check_file(self.sequences, self.prepare_id)  # not replaced by another prepare since open_input
        histories = FlatSequences.from_series(frame.get_column(schema.ITEM_IDX))
        mapped, unknown = map_histories(histories, self.remap)
        gaps = None
        if self.time_gap_buckets:
            frame = frame.with_columns(seconds_of_lists(pl.col(schema.TIMESTAMP), frame.schema[schema.TIMESTAMP].inner, "auto"))
            try:  # null timestamps: one line naming the shard's users
                timestamps = checked_timestamps(frame)
            except ValueError as err:
                raise DataError(f"{self.name or self.sequences}, users {start}..{start + frame.height - 1}: {err}") from None
            backwards = backwards_sequences(timestamps)
            if backwards.size:
                row = int(backwards[0])
                raise DataError(
                    f"{self.name or self.sequences}: timestamps go backwards inside the history of user "
                    f"{frame.get_column(schema.USER_ID)[row]!r} (row {start + row}); sort each history by time first"
                )
            buckets = gap_buckets(timestamps, self.time_gap_buckets)
            gaps = select_events(buckets, known_events(histories, self.remap))
        return Shard(user_ids=frame.get_column(schema.USER_ID), histories=mapped, unknown_events=unknown, gaps=gaps,
                     input_lengths=histories.lengths(), new_seen=self._new_seen(histories))  # fmt: skip

    def _new_seen(self, histories: FlatSequences) -> FlatSequences | None:
        """:attr:`Shard.new_seen` of ``histories`` (input indices): each user's events on the ranker's new items."""
        if self.new_item_remap is None:
            return None
        mapped = _mapped(histories.values, self.new_item_remap)
        return select_events(FlatSequences(values=mapped, offsets=histories.offsets), mapped > 0)


def map_histories(histories: FlatSequences, remap: np.ndarray | None) -> tuple[FlatSequences, int]:
    """Translate item indices with ``remap`` and drop unknown (0) and padding entries.

    Args:
        histories: U sequences of input item indices (int64; 0 = padding, ignored).
        remap: (M + 1,) int64 input index -> model index (0 = unknown), or None (identity).

    Returns:
        The sequences in model indices, order kept, and the number of dropped unknown events
        (every entry but padding zeros that maps to no model item, negative indices included).
    """
    mapped = FlatSequences(values=_mapped(histories.values, remap), offsets=histories.offsets)
    keep = mapped.values > 0
    unknown = int(((histories.values != 0) & ~keep).sum())
    return select_events(mapped, keep), unknown


def _mapped(values: np.ndarray, remap: np.ndarray | None) -> np.ndarray:
    """(E,) input indices -> (E,) int64 model indices (0: unknown or padding)."""
    if remap is None:
        return np.where(values > 0, values, 0).astype(np.int64)
    # indices outside the input vocabulary (above it, or negative: never a wrapped-around lookup) are unknown
    inside = (values > 0) & (values < remap.shape[0])
    return np.where(inside, remap[np.where(inside, values, 0)], 0).astype(np.int64)


def known_events(histories: FlatSequences, remap: np.ndarray | None) -> np.ndarray:
    """(E,) bool: the events ``map_histories`` keeps (an item the model knows, not padding)."""
    return _mapped(histories.values, remap) > 0


def select_events(sequences: FlatSequences, keep: np.ndarray) -> FlatSequences:
    """The events where ``keep`` (E,) bool is True, each sequence's order kept (int64 values)."""
    if keep.all():
        return FlatSequences(values=sequences.values.astype(np.int64), offsets=sequences.offsets)
    owner = np.repeat(np.arange(len(sequences)), sequences.lengths())  # (E,) sequence of each event
    counts = np.bincount(owner[keep], minlength=len(sequences))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return FlatSequences(values=sequences.values[keep].astype(np.int64), offsets=offsets)


def unknown_events(items: pl.DataFrame, known_idx: np.ndarray) -> tuple[int, int]:
    """``(events on unknown items, all events)`` of a vocabulary with ``item_idx`` and ``count`` (events per item);
    ``known_idx`` (M + 1,) bool by ``item_idx``: the items a model knows."""
    counts = items.select(schema.ITEM_IDX, pl.col(schema.COUNT).fill_null(0).cast(pl.Int64))
    known = pl.Series(known_idx[counts.get_column(schema.ITEM_IDX).to_numpy()])
    return int(counts.get_column(schema.COUNT).filter(~known).sum()), int(counts.get_column(schema.COUNT).sum())


def _check_unknown_share(input_items: pl.DataFrame, known_idx: np.ndarray, model_n_items: int, max_share: float,
                         shown: str) -> None:  # fmt: skip
    """Refuse an input whose events are mostly on items the model does not know: integer ids of two catalogs
    overlap by chance, so "none known" alone lets a model of another catalog rank it. Counted from the input
    vocabulary's ``count`` column (events per item; a table without it is not checked). ``known_idx`` (M + 1,)
    bool: the input indices of items the job knows (the model's, and the new items of ``score.items``).

    Raises:
        DataError: more than ``max_share`` of the events are on unknown items (``score.max_unknown_share``).
    """
    if schema.COUNT not in input_items.columns:
        return
    unknown, total = unknown_events(input_items, known_idx)
    known = known_idx[input_items.get_column(schema.ITEM_IDX).to_numpy()]
    if total and unknown / total > max_share:
        raise DataError(
            f"{unknown / total:.0%} of the events of {shown} ({unknown:,} of {total:,}) are on items the model does not "
            f"know ({int((~known).sum()):,} of the input's {input_items.height:,} items; the model knows "
            f"{model_n_items:,}): it looks trained on another catalog; score with a model trained on this data, or "
            f"set score.max_unknown_share=1 to rank on the known events anyway (now {max_share:g})"
        )


def vocabulary_remap(input_items: pl.DataFrame, model_items: pl.DataFrame) -> tuple[np.ndarray | None, int]:
    """Map an input vocabulary onto the model's by raw ``item_id``.

    Args:
        input_items: ``item_idx`` Int32, ``item_id`` of the input.
        model_items: ``item_idx`` Int32, ``item_id`` of the model (its training vocabulary).

    Returns:
        ``(remap, unknown_items)``: remap (M + 1,) int64 from input to model index (0 for items
        the model does not know), or None when both vocabularies are identical; and the number
        of input items the model does not know.
    """
    a = input_items.select(schema.ITEM_IDX, schema.ITEM_ID).sort(schema.ITEM_IDX)
    b = model_items.select(schema.ITEM_IDX, schema.ITEM_ID).sort(schema.ITEM_IDX)
    if a.schema == b.schema and a.equals(b):
        return None, 0
    if a.schema[schema.ITEM_ID] != b.schema[schema.ITEM_ID]:  # e.g. ids read as text vs integers
        a = a.with_columns(pl.col(schema.ITEM_ID).cast(pl.String))
        b = b.with_columns(pl.col(schema.ITEM_ID).cast(pl.String))
    joined = a.join(b.rename({schema.ITEM_IDX: "_model_idx"}), on=schema.ITEM_ID, how="left")
    size = int(a[schema.ITEM_IDX].max() or 0) + 1
    remap = np.zeros(size, dtype=np.int64)
    remap[joined[schema.ITEM_IDX].to_numpy()] = joined["_model_idx"].fill_null(0).to_numpy()
    return remap, int(joined["_model_idx"].null_count())


def _new_in(input_items: pl.DataFrame, new_item_ids: pl.Series | None, size: int) -> np.ndarray:
    """(size,) bool: the input indices (``item_idx`` of ``input_items``) of the items in ``new_item_ids``."""
    found = np.zeros(size, dtype=bool)
    if new_item_ids is not None and new_item_ids.len():
        matched = join_on_id(input_items.select(schema.ITEM_IDX, schema.ITEM_ID), new_item_ids.to_frame(schema.ITEM_ID),
                             how="semi")  # fmt: skip
        found[matched.get_column(schema.ITEM_IDX).to_numpy()] = True
    return found


def join_on_id(left: pl.DataFrame, right: pl.DataFrame, how: str = "inner") -> pl.DataFrame:
    """``left.join(right, on="item_id", how=how)`` with the ids matched by the typing rule whatever the two
    columns' types (:func:`recsys_alibi.data.ids.same_id_in`: ``104`` and ``"104"`` are one id, ``"0104"`` is
    another); the result keeps ``left``'s id type."""
    source, target = right.schema[schema.ITEM_ID], left.schema[schema.ITEM_ID]
    if source != target:
        right = right.with_columns(same_id_in(pl.col(schema.ITEM_ID), source, target)).drop_nulls(schema.ITEM_ID)
    return left.join(right, on=schema.ITEM_ID, how=how)


def fingerprint(input_path: str | Path) -> list[int]:
    """``[files, bytes, newest mtime_ns]`` of the input: a resumed job must read the same input."""
    path = Path(input_path)
    if path.is_dir() and (path / schema.SEQUENCES_FILE).is_file():
        files = [p for p in (path / schema.SEQUENCES_FILE, path / schema.ITEMS_FILE) if p.is_file()]
    elif path.is_file():
        files = [path]
    else:
        files = resolve_paths(input_path)
    stats = [p.stat() for p in files]
    return [len(stats), sum(s.st_size for s in stats), max(s.st_mtime_ns for s in stats)]


def input_kind(input_path: str | Path) -> str:
    """``"prepared"``, ``"sequences"`` or ``"events"`` (see the module docstring)."""
    path = Path(input_path)
    if path.is_dir() and (path / schema.SEQUENCES_FILE).is_file():
        return "prepared"
    if path.is_file() and path.suffix == ".parquet":
        try:
            file_schema = pl.read_parquet_schema(path)
        except (pl.exceptions.PolarsError, OSError) as err:
            raise DataError(f"cannot read {path}: {str(err).splitlines()[0]}; check the file given as --input") from None
        if isinstance(file_schema.get(schema.ITEM_IDX), pl.List):
            return "sequences"
    return "events"


def _n_rows(path: Path) -> int:
    return int(pl.scan_parquet(path).select(pl.len()).collect().item())


def _check_timestamps(sequences: Path, name: str | None = None) -> None:
    """DataError unless a time-gap model can read real per-event timestamps from ``sequences``
    (messages name ``name``, default ``sequences``)."""
    shown = name or sequences
    found = pl.read_parquet_schema(sequences).get(schema.TIMESTAMP)
    if not isinstance(found, pl.List) or not found.inner.is_integer():
        raise DataError(
            f"the model reads time gaps but {shown} has no '{schema.TIMESTAMP}' list of integer seconds "
            f"(found: {found or 'no such column'})"
        )
    negative = pl.scan_parquet(sequences).select(
        pl.col(schema.TIMESTAMP).list.eval((pl.element() < 0).sum()).explode().sum()).collect().item()  # fmt: skip
    if negative:
        first = _first_row(sequences, pl.col(schema.TIMESTAMP).list.eval((pl.element() < 0).any()).list.first())
        raise DataError(
            f"{shown}: {negative} timestamps before the epoch (first: row {first}); give seconds since 1970 "
            "(prepare rejects earlier events as bad_timestamp)"
        )
    if not sequences_have_real_timestamps(sequences):  # the file's footer or its folder records it
        raise DataError(
            f"the model reads time gaps but the data in {shown} has no timestamps (time came from "
            f"line order); score it with a model trained with model.time_gap_buckets=0"
        )


def _check_sequences(path: Path, name: str | None = None) -> None:
    """DataError unless ``path`` holds one row per user with integer item indices >= 0 (messages name
    ``name``, default ``path``).

    Checked (one scan of the file): ``user_id`` is an integer or string column (a float id is not
    one raw id: ``1.0`` and ``1`` would merge) with no null and no id in two rows (the rankings are
    keyed by user); ``item_idx`` is a list of integers with no null entry and none below 0 (0 is
    padding). An empty or null history is allowed: that user is skipped and listed. Where the file has a
    ``length`` column or a ``timestamp`` list, each row's must agree with its ``item_idx`` (a file edited
    by hand or joined wrongly; which of the two is right cannot be told).
    """
    found, shown = pl.read_parquet_schema(path), name or path
    if schema.USER_ID not in found or not isinstance(found.get(schema.ITEM_IDX), pl.List):
        raise DataError(
            f"{shown} lacks user_id / item_idx list columns; "
            "give a prepared dir, a sequences Parquet or raw events as --input"
        )
    user_type, item_type = found[schema.USER_ID], found[schema.ITEM_IDX].inner
    if not (user_type.is_integer() or user_type == pl.String):
        raise DataError(
            f"{shown}: user_id is {user_type}, but user ids must be integers or strings (a float id such as 1.5 is "
            "not one raw id); cast the column"
        )
    if not item_type.is_integer():
        raise DataError(f"{shown}: item_idx holds {item_type}, but item indices are integers (1..N, 0 = padding)")
    user, item = pl.col(schema.USER_ID), pl.col(schema.ITEM_IDX)
    disagree = {}  # column -> (rows,) its count of events, to equal item_idx's
    if found.get(schema.LENGTH, pl.Null).is_integer():
        disagree[schema.LENGTH] = pl.col(schema.LENGTH)
    if isinstance(found.get(schema.TIMESTAMP), pl.List):
        disagree[schema.TIMESTAMP] = pl.col(schema.TIMESTAMP).list.len()
    facts = pl.scan_parquet(path).select(
        null_users=user.null_count(), distinct=user.n_unique(), rows=pl.len(),
        null_items=item.list.eval(pl.element().is_null().sum()).explode().sum(),
        negative=item.list.eval((pl.element() < 0).sum()).explode().sum(),
        **{column: (size != item.list.len()).sum() for column, size in disagree.items()},
    ).collect().row(0, named=True)  # fmt: skip
    for column, size in disagree.items():
        if facts[column]:
            first = _first_row(path, size != item.list.len())
            what = "list length" if column == schema.TIMESTAMP else "value"
            raise DataError(
                f"{shown}: {column}'s {what} differs from the number of item_idx entries in {facts[column]} rows "
                f"(first: row {first}); fix the file or drop the {column} column"
            )
    if facts["null_users"]:
        first = _first_row(path, user.is_null())
        raise DataError(f"{shown}: {facts['null_users']} rows have a null user_id (first: row {first}); give every row its user's id")
    if facts["distinct"] != facts["rows"]:
        top = (pl.scan_parquet(path).group_by(schema.USER_ID).len().filter(pl.col("len") > 1)
               .sort("len", schema.USER_ID, descending=[True, False]).first().collect().row(0))  # fmt: skip
        raise DataError(
            f"{shown}: {facts['rows'] - facts['distinct']} rows repeat a user_id (e.g. {top[0]!r} in {top[1]} rows); "
            "give one row per user with its whole history"
        )
    if facts["null_items"]:
        first = _first_row(path, item.list.eval(pl.element().is_null().any()).list.first())
        raise DataError(f"{shown}: {facts['null_items']} null entries in item_idx (first: row {first}); indices are 1..N")
    if facts["negative"]:
        first = _first_row(path, item.list.eval((pl.element() < 0).any()).list.first())
        raise DataError(
            f"{shown}: {facts['negative']} negative entries in item_idx (first: row {first}); indices are 1..N, 0 = padding"
        )


def _ids(items: pl.DataFrame) -> pl.Series:
    """(N,) raw item ids of a vocabulary by ``item_idx``."""
    return items.sort(schema.ITEM_IDX).get_column(schema.ITEM_ID)


def _first_row(path: Path, condition: pl.Expr) -> int:
    """The 0-based row of the first row of ``path`` where ``condition`` holds."""
    return int(pl.scan_parquet(path).with_row_index("_row").filter(condition).select("_row").first().collect().item())


def stage_events(data: DataConfig, input_path: str | Path, staged_dir: Path, report_dir: Path | None = None) -> dict[str, int]:
    """Prepare a raw event log for scoring into ``staged_dir`` once (reused when already staged).

    Runs ``prepare`` with the k-core off; writes ``_staged.json`` last, so a staging that was
    killed is redone from scratch. An input refused because every row was rejected keeps its
    rejects where the message says: ``report_dir`` (default ``staged_dir``; the export stages in a
    hidden folder it removes, so it names its output's ``_input/`` instead).

    Returns:
        ``input_rows``, ``rejected_rows``, ``duplicate_rows``, ``filtered_rows``.

    Raises:
        DataError: unreadable, empty or fully rejected input (from ``prepare``).
    """
    from recsys_alibi.data.prepare import prepare

    marker = staged_dir / STAGED_MARKER
    key = {"input": str(Path(input_path).resolve()) if "*" not in str(input_path) else str(input_path),
           "fingerprint": fingerprint(input_path), "data": data.model_dump(mode="json")}
    if marker.is_file():
        staged = json.loads(marker.read_text())
        if staged.get("key") == key:
            return staged["stats"]
    shutil.rmtree(staged_dir, ignore_errors=True)
    cfg = data.model_copy(update={"min_events_per_user": 1, "min_events_per_item": 1})
    try:
        result = prepare(cfg, input_path, staged_dir)
    except DataError as err:
        rejects = staged_dir / schema.REJECTS_FILE
        if report_dir is None or report_dir == staged_dir or str(rejects) not in str(err):
            raise
        report_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(rejects, report_dir / schema.REJECTS_FILE)
        raise DataError(str(err).replace(str(rejects), str(report_dir / schema.REJECTS_FILE))) from None
    c = result.counts
    stats = {"input_rows": c["input_rows"], "rejected_rows": c["rejected"],
             "duplicate_rows": c["deduplicated"], "filtered_rows": c["filtered"]}  # fmt: skip
    marker.write_text(json_text({"key": key, "stats": stats}, sort_keys=False))
    return stats


def rejected_users(source: ScoreInput, rejects: Path, user_column: str = schema.USER_ID) -> pl.DataFrame | None:
    """The users of raw events whose every row was rejected (``rejects``: the staged ``rejects.parquet``), so not in
    the staged sequences: ``user_id`` (the sequences' type; an id that is none of that type's ids is no user of
    them either and is typed by :func:`recsys_alibi.data.ids.same_id_in`, so it is left out), ``reason``
    (``every_event_rejected``), ``input_events`` (their rejected rows), by ``user_id``; None when there is none.

    ``user_column``: the input's own user column (``data.columns.user_id``): a rejects file keeps the source's
    column names (``visitorid``, ``column_1``); the fixed formats' is ``user_id``, the fallback when it is absent."""
    if not rejects.is_file():
        return None
    names = pl.read_parquet_schema(rejects)
    column = user_column if user_column in names else schema.USER_ID
    rows = pl.read_parquet(rejects, columns=[column]).rename({column: schema.USER_ID}).drop_nulls()
    source_type, user_type = rows.schema[schema.USER_ID], pl.read_parquet_schema(source.sequences)[schema.USER_ID]
    if not rows.height or not (source_type.is_integer() or source_type == pl.String):
        return None
    counts = (rows.group_by(schema.USER_ID).len("input_events")
              .with_columns(same_id_in(pl.col(schema.USER_ID), source_type, user_type)).drop_nulls(schema.USER_ID))  # fmt: skip
    users = counts.join(source.user_ids().to_frame(), on=schema.USER_ID, how="anti").sort(schema.USER_ID)
    if not users.height:
        return None
    return users.select(schema.USER_ID, pl.lit(SKIP_EVERY_EVENT_REJECTED).alias("reason"),
                        pl.col("input_events").cast(pl.Int64))  # fmt: skip


def release_staged(staged_dir: Path) -> None:
    """After a complete job: delete the staged events, keep the input report (stats, rejects)."""
    if not staged_dir.is_dir():
        return
    for path in staged_dir.iterdir():
        if path.name not in STAGED_KEEP:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def open_input(
    input_path: str | Path, model_items: pl.DataFrame, data: DataConfig, staged_dir: Path, time_gap_buckets: int = 0,
    name: str | None = None, report_dir: Path | None = None, max_unknown_share: float = 1.0,
    new_item_ids: pl.Series | None = None,
) -> ScoreInput:
    """Resolve ``input_path`` into a :class:`ScoreInput` in the model's item indices.

    Args:
        input_path: prepared dir, sequences Parquet or raw events (see the module docstring).
        model_items: the model's vocabulary (``item_idx`` 1..N, ``item_id``).
        data: the ``data`` config section (format, column map, cleaning) for raw events.
        staged_dir: where raw events are staged (``output_dir/_input``).
        time_gap_buckets: the model's ``time_gap_buckets`` (0: it reads no time gaps).
        name: how messages name the input (the pyfunc's is a temporary folder: "the predict input");
            default: the file in question for a prepared dir or sequences file, ``input_path`` for raw
            events (never the staged copy, which the user did not give).
        report_dir: where the rejects of raw events refused for them are kept (:func:`stage_events`).
        max_unknown_share: refuse when more than this share of the input's events are on items the model does
            not know (``score.max_unknown_share``; 1: never, as for the pyfunc's requests).
        new_item_ids: raw ids of the items the job ranks from their features alone (``score.items``:
            ``ShardRanker.new_item_ids``): known to the job, so their events count as known in both checks above
            (a user with only such events is not ranked, and listed, as any user without a known item).

    Raises:
        DataError: missing/unreadable/empty input, wrong columns, or a bare sequences file with
            indices beyond the model's catalog; no input item known, or more than ``max_unknown_share`` of
            the events on unknown items; a time-gap model and an input without
            ``timestamp`` lists.
    """
    kind = input_kind(input_path)
    path = Path(input_path)
    stats: dict[str, int] = {}
    if kind == "prepared":
        sequences, items_path = path / schema.SEQUENCES_FILE, path / schema.ITEMS_FILE
    elif kind == "sequences":
        sequences = path
        items_path = path.with_name(schema.ITEMS_FILE) if path.name == schema.SEQUENCES_FILE else None
    else:
        stats = stage_events(data, input_path, staged_dir, report_dir)
        sequences, items_path = staged_dir / schema.SEQUENCES_FILE, staged_dir / schema.ITEMS_FILE
        name = name or str(input_path)
    # a prepared (or staged) directory must be whole: its files from the prepare its manifest names
    prepare_id = check_prepared(sequences.parent) if sequences.name == schema.SEQUENCES_FILE else None
    check_file(sequences, prepare_id)
    _check_sequences(sequences, name)
    if time_gap_buckets:
        _check_timestamps(sequences, name)
    n_users = _n_rows(sequences)
    if n_users == 0:
        raise DataError(f"no users to score in {name or sequences}; check --input")
    remap, unknown_items = None, 0
    if items_path is not None and items_path.is_file():
        input_items = read_consistent(items_path.parent, items_path.name, read_parquet_file, prepare_id)
        remap, unknown_items = vocabulary_remap(input_items, model_items)
        known = None if remap is None else (remap > 0) | _new_in(input_items, new_item_ids, remap.shape[0])
        if known is not None and not known.any():
            raise DataError(
                f"none of the {input_items.height} items of {name or input_path} is in the model's vocabulary "
                f"({vocabulary_difference(_ids(model_items), _ids(input_items))}): the model was trained on another "
                "catalog; score with a model trained on this data"
            )
        if remap is not None and max_unknown_share < 1.0:
            _check_unknown_share(input_items, known, model_items.height, max_unknown_share, name or str(input_path))
    else:
        n_items = model_items.height
        top = pl.scan_parquet(sequences).select(pl.col(schema.ITEM_IDX).list.max().max()).collect().item()
        if top is not None and int(top) > n_items:
            raise DataError(
                f"{sequences} has item index {int(top)} but the model knows {n_items} items; "
                "score the prepared dir (with its items.parquet) or the raw events instead"
            )
    stats["unknown_items"] = unknown_items
    if unknown_items:
        log.warning("%d of the input's %d items are not in the model's vocabulary of %d; their events are skipped",
                    unknown_items, input_items.height, model_items.height)  # fmt: skip
    return ScoreInput(kind=kind, sequences=sequences, n_users=n_users, remap=remap, stats=stats,
                      time_gap_buckets=time_gap_buckets, prepare_id=prepare_id, name=name)  # fmt: skip
