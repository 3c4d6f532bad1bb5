"""Business rules on the rankings: allow and deny lists (``score.allow``, ``score.deny``).

Each rule file is Parquet, or CSV / TSV named ``.csv`` / ``.tsv`` with a header (a file, a directory or a glob),
of one of two schemas:

=========================== =================================================================
``item_id``                 a global rule: the items apply to every user
``user_id``, ``item_id``    a per-user rule: each row applies to that user only
=========================== =================================================================

Ids are raw, as in the events (integers or strings), compared by the typing rule of
:mod:`recsys_alibi.data.ids`: an integer id given as text in its one spelling, or the reverse,
still matches (``7`` and ``"7"``), other spellings never do (``7`` is not ``"007"`` or ``"+7"``). The rules hold for ``score`` (both engines) and the pyfunc alike:

- a ranking never holds a denied item;
- with an allow file, a ranking holds only allowed items, and fewer than K rows when fewer are
  allowed (and not seen or denied). A user with no row in a *per-user* allow file is allowed
  nothing and is not ranked (listed in ``_skipped/`` as ``every_item_excluded``): the file is
  a candidate set, and an absent user has no candidate;
- ids the model does not know are dropped from the rules and counted (:meth:`ItemRules.stats`,
  printed in the job's summary), never silently.

The rules are applied as extra ``-inf`` columns before top-K (:class:`ItemMask`, applied per
catalog chunk by :func:`serving.topk.chunked_topk`), so top-K itself is unchanged and ties keep
their rule. Memory stays bounded with many users: a per-user file is read one shard of users at
a time (:meth:`ItemRules.for_users`: a lazy Parquet scan filtered on the shard's user ids, which
Polars pushes into the reader), never as a whole; a global file holds at most the catalog.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from recsys_alibi.data import schema
from recsys_alibi.data.ids import same_id_in
from recsys_alibi.data.ingest import DataError, resolve_paths
from recsys_alibi.data.loader import FlatSequences, pad_right
from recsys_alibi.data.prepare_state import file_sha256

log = logging.getLogger(__name__)

KINDS = ("allow", "deny")
SKIP_EVERY_ITEM_EXCLUDED = "every_item_excluded"  # known items, but every item seen, denied or not allowed
_ROW = "_row"


_TEXT_SEPARATORS = {".csv": ",", ".tsv": "\t"}
RULE_FORMATS = "Parquet, or CSV / TSV named .csv / .tsv with a header (item_id, or user_id and item_id)"


def _scan(path: str, kind: str) -> pl.LazyFrame:
    """The rule file's rows: a file, a folder (every file below it but hidden and ``_``-prefixed ones, as
    Spark writes them beside ``.crc`` files and ``_SUCCESS``) or a glob, by the rule of every user-given
    folder (:func:`recsys_alibi.data.formats.resolve_paths`: a FIFO or device is refused, named).

    Parquet; files named ``.csv`` / ``.tsv`` (all of them) are read as text with a header, every column a string
    (ids are matched by the typing rule of :mod:`recsys_alibi.data.ids`: ``"7"`` is the integer id 7)."""
    files = _rule_files(path, kind)
    separators = {_TEXT_SEPARATORS.get(Path(f).suffix.lower()) for f in files}
    try:
        if len(separators) == 1 and None not in separators:
            return pl.scan_csv(files, separator=separators.pop(), infer_schema=False, glob=False)
        if separators != {None}:
            raise DataError(f"score.{kind} {path}: mixes text and Parquet files; a rule is one format ({RULE_FORMATS})")
        return _scan_parquet_files(files, path, kind)
    except (pl.exceptions.PolarsError, OSError) as err:
        raise DataError(f"score.{kind} {path}: cannot read it ({str(err).splitlines()[0]}); rule files are "
                        f"{RULE_FORMATS}") from None  # fmt: skip


def _rule_files(path: str, kind: str) -> list:
    return resolve_paths(path, what=f"score.{kind} rule file", flag=f"score.{kind}")


def _scan_parquet_files(files: list, path: str, kind: str) -> pl.LazyFrame:
    """The Parquet files of one rule as one frame: they must have the same columns; an id column that is an
    integer in some files and text in others is read as text in all (the typing rule matches ``"7"`` to 7).

    Raises:
        DataError: files with other columns than the first (naming both), or an id column of another type.
    """
    if len(files) == 1:
        return pl.scan_parquet(files, glob=False)
    schemas = [pl.read_parquet_schema(f) for f in files]
    first = schemas[0]
    for f, found in zip(files[1:], schemas[1:]):
        if set(found) != set(first):
            raise DataError(f"score.{kind} {path}: {f} has the columns {sorted(found)} and {files[0]} {sorted(first)}; "
                            "every file of one rule holds item_id, or every one user_id and item_id")  # fmt: skip
    columns = [c for c in (schema.USER_ID, schema.ITEM_ID) if c in first]
    mixed = [c for c in columns if len({found[c] for found in schemas}) > 1]
    for column in mixed:
        types = {found[column] for found in schemas}
        if not all(t.is_integer() or t == pl.String for t in types):
            raise DataError(f"score.{kind} {path}: {column} is {', '.join(sorted(map(str, types)))} across its files; "
                            "raw ids are integers or strings")  # fmt: skip
    if not mixed:
        return pl.scan_parquet(files, glob=False)
    return pl.concat([pl.scan_parquet(f, glob=False).select(columns).with_columns(pl.col(mixed).cast(pl.String))
                      for f in files])  # fmt: skip


@dataclass(frozen=True)
class RuleFile:
    """One rule file: ``kind`` (``allow`` | ``deny``), ``path``, and whether it has a ``user_id`` column."""

    kind: str
    path: str
    per_user: bool
    item_type: pl.DataType
    user_type: pl.DataType | None

    @classmethod
    def open(cls, kind: str, path: str) -> "RuleFile":
        """Check the schema of the rule file at ``path`` (key ``score.<kind>``).

        Raises:
            DataError: unreadable, no ``item_id`` column, or ids that are neither integers nor strings.
        """
        try:
            found = _scan(path, kind).collect_schema()
        except (pl.exceptions.PolarsError, OSError) as err:
            raise DataError(f"score.{kind} {path}: cannot read it ({str(err).splitlines()[0]}); rule files are "
                            f"{RULE_FORMATS}") from None  # fmt: skip
        if schema.ITEM_ID not in found:
            raise DataError(f"score.{kind} {path}: no item_id column (a rule file holds item_id, or user_id and item_id)")
        for column in (schema.ITEM_ID, schema.USER_ID):
            dtype = found.get(column)
            if dtype is not None and not (dtype.is_integer() or dtype == pl.String):
                raise DataError(f"score.{kind} {path}: {column} is {dtype}; raw ids are integers or strings")
        user_type = found.get(schema.USER_ID)
        return cls(kind=kind, path=str(path), per_user=user_type is not None, item_type=found[schema.ITEM_ID],
                   user_type=user_type)  # fmt: skip

    def scan(self) -> pl.LazyFrame:
        """The rows (``item_id``, and ``user_id`` for a per-user file)."""
        columns = [schema.USER_ID, schema.ITEM_ID] if self.per_user else [schema.ITEM_ID]
        return _scan(self.path, self.kind).select(columns)


def _content_digest(files: list) -> str:
    """sha256 over each file's name and sha256, in the given (sorted) order."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{Path(f).name}\0{file_sha256(Path(f))}\0".encode())
    return digest.hexdigest()


class ItemRules:
    """The allow and deny files of a job, mapped onto a model's item indices.

    Args:
        allow, deny: rule file paths (None: no such rule).
        items: the model's vocabulary (``item_idx`` 1..N Int32, ``item_id`` raw).

    Raises:
        DataError: a rule file that cannot be read or has the wrong columns.
    """

    def __init__(self, allow: str | None, deny: str | None, items: pl.DataFrame) -> None:
        self.files = {kind: RuleFile.open(kind, path) for kind, path in (("allow", allow), ("deny", deny)) if path}
        self.vocab = items.select(schema.ITEM_ID, schema.ITEM_IDX)
        self.n_items = items.height
        self._global = {kind: self._global_columns(f) for kind, f in self.files.items() if not f.per_user}

    # ------------------------------------------------------------------ id matching

    def _mapped(self, rules: pl.LazyFrame, item_type: pl.DataType, how: str = "inner") -> pl.LazyFrame:
        """``rules`` with ``item_idx``, the model index of each ``item_id``: unknown ids dropped (``how="inner"``)
        or with a null index (``"left"``)."""
        vocab = self.vocab.lazy().with_columns(  # the model's ids in the file's type: one id by one spelling
            same_id_in(pl.col(schema.ITEM_ID), self.vocab.schema[schema.ITEM_ID], item_type))
        return rules.join(vocab.drop_nulls(schema.ITEM_ID), on=schema.ITEM_ID, how=how)

    def _global_columns(self, rule: RuleFile) -> torch.Tensor:
        """(N + 1,) bool: the items a global file names (index 0, padding, False)."""
        idx = self._mapped(rule.scan(), rule.item_type).select(schema.ITEM_IDX).collect().get_column(schema.ITEM_IDX)
        columns = torch.zeros(self.n_items + 1, dtype=torch.bool)
        columns[torch.from_numpy(idx.to_numpy().astype(np.int64))] = True
        return columns

    # ------------------------------------------------------------------ the job's view

    def fingerprint(self) -> dict:
        """What identifies the rules in a job's identity: per kind, the path and the sha256 of its files' names and
        bytes (a file replaced by another of the same size and time is another rule; rule files are small)."""
        return {kind: [str(Path(f.path).resolve()), _content_digest(_rule_files(f.path, kind))]
                for kind, f in self.files.items()}  # fmt: skip

    def stats(self) -> dict[str, int]:
        """Per kind: ``<kind>_rows`` and ``<kind>_unknown_items`` (distinct ids the model does not
        know; their ``<kind>_unknown_rows`` are dropped). One streaming scan per file.

        Raises:
            DataError: a rule row with a null id.
        """
        out: dict[str, int] = {}
        for kind, rule in self.files.items():
            ids = rule.scan()
            nulls = ids.select(pl.all().null_count()).collect(engine="streaming").row(0, named=True)
            if any(nulls.values()):
                column = next(c for c, n in nulls.items() if n)
                raise DataError(f"score.{kind} {rule.path}: {nulls[column]} rows with a null {column}; drop them")
            counts = ids.group_by(schema.ITEM_ID).agg(pl.len().alias("rows"))
            unknown = self._mapped(counts, rule.item_type, how="left").filter(pl.col(schema.ITEM_IDX).is_null())
            total = counts.select(pl.col("rows").sum()).collect(engine="streaming").item() or 0
            missed = unknown.select(pl.len(), pl.col("rows").sum()).collect(engine="streaming").row(0)
            out[f"{kind}_rows"], out[f"{kind}_unknown_items"], out[f"{kind}_unknown_rows"] = (
                int(total), int(missed[0]), int(missed[1] or 0))  # fmt: skip
            if missed[0]:
                log.warning("score.%s: %d item ids (%d rows) of %s are not in the model's vocabulary; those rules "
                            "are dropped", kind, missed[0], missed[1] or 0, rule.path)  # fmt: skip
        return out

    def absent_user_rows(self, user_ids: pl.Series) -> dict[str, int]:
        """Per per-user file: ``<kind>_absent_user_rows``, its rows whose user is none of ``user_ids`` (U,) (the
        input's users, matched by the typing rule): they apply to nobody (a wrong id column or id type, or users
        not in this input). One streaming scan per file."""
        out: dict[str, int] = {}
        for kind, rule in self.files.items():
            if not rule.per_user:
                continue
            users = same_id_in(pl.lit(user_ids), user_ids.dtype, rule.user_type)
            wanted = pl.select(users.alias(schema.USER_ID)).get_column(schema.USER_ID).drop_nulls()
            absent = rule.scan().filter(~pl.col(schema.USER_ID).is_in(wanted.implode()))
            out[f"{kind}_absent_user_rows"] = int(absent.select(pl.len()).collect(engine="streaming").item())
        return out

    def for_users(self, user_ids: pl.Series) -> "UserRules":
        """The rules of the users ``user_ids`` (U,), aligned with them: per-user files read for these users only."""
        per_user = {kind: self._user_rows(f, user_ids) for kind, f in self.files.items() if f.per_user}
        return UserRules(global_columns=self._global, per_user=per_user)

    def _user_rows(self, rule: RuleFile, user_ids: pl.Series) -> FlatSequences:
        """U sequences of model item indices: the rows of ``rule`` of each user of ``user_ids``."""
        users = pl.DataFrame({schema.USER_ID: user_ids, _ROW: np.arange(user_ids.len(), dtype=np.int64)})
        # the shard's ids take the file's type (an id with no such spelling, e.g. "007" for an integer file,
        # matches nothing: data.ids.same_id_in), never the reverse: a filter on the file's own column is pushed
        # into the Parquet reader, which then skips the row groups of other users and never holds the whole
        # file (a cast of the file's column would read it all)
        users = users.with_columns(same_id_in(pl.col(schema.USER_ID), user_ids.dtype, rule.user_type)).drop_nulls(schema.USER_ID)
        wanted = users.get_column(schema.USER_ID)
        rows = rule.scan().filter(pl.col(schema.USER_ID).is_in(wanted.implode()))
        found = (self._mapped(rows, rule.item_type).join(users.lazy(), on=schema.USER_ID, how="inner")
                 .select(_ROW, schema.ITEM_IDX).collect(engine="streaming"))  # fmt: skip
        owner = found.get_column(_ROW).to_numpy()
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=user_ids.len())
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        values = found.get_column(schema.ITEM_IDX).to_numpy().astype(np.int64)[order]
        return FlatSequences(values=values, offsets=offsets)

    def explain(self, unranked: pl.DataFrame) -> pl.DataFrame:
        """``_skipped`` rows with ``every_item_seen`` renamed ``every_item_excluded``: with rules, a user
        with known items but no ranking row may have had every item seen, denied or not allowed."""
        reason = pl.col("reason")
        return unranked.with_columns(
            pl.when(reason == "every_item_seen").then(pl.lit(SKIP_EVERY_ITEM_EXCLUDED)).otherwise(reason).alias("reason")
        )


@dataclass(frozen=True)
class UserRules:
    """The rules of one shard's U users.

    Attributes:
        global_columns: kind -> (N + 1,) bool, items named by a global file.
        per_user: kind -> U sequences of model item indices (rows of a per-user file).
    """

    global_columns: dict[str, torch.Tensor]
    per_user: dict[str, FlatSequences]

    def batch(self, rows: np.ndarray) -> "ItemMask":
        """The mask of the users ``rows`` (B,) (shard positions) of one batch."""
        per_user = {kind: pad_right([seqs.get(int(u)) for u in rows])[0] for kind, seqs in self.per_user.items()}
        return ItemMask(global_columns=self.global_columns, per_user=per_user)


@dataclass(frozen=True)
class ItemMask:
    """Extra ``-inf`` columns for one batch of B users: what :func:`serving.topk.chunked_topk` applies.

    Attributes:
        global_columns: kind -> (N + 1,) bool items of a global file.
        per_user: kind -> (B, S) int64 item indices of each user, right-padded with 0.
    """

    global_columns: dict[str, torch.Tensor]
    per_user: dict[str, torch.Tensor]

    def apply(self, scores: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Set denied and not-allowed items of ``scores`` (B, C) to -inf; column j is item ``offset + j``.

        Returns a new (B, C) tensor (``scores`` is left as it is).
        """
        n_rows, n_cols = scores.shape
        blocked = torch.zeros((n_rows, n_cols), dtype=torch.bool, device=scores.device)
        if "deny" in self.global_columns:
            blocked |= self.global_columns["deny"][offset : offset + n_cols].to(scores.device)
        if "allow" in self.global_columns:
            blocked |= ~self.global_columns["allow"][offset : offset + n_cols].to(scores.device)
        if "deny" in self.per_user:
            blocked |= _named(self.per_user["deny"], n_rows, n_cols, offset, scores.device)
        if "allow" in self.per_user:
            blocked |= ~_named(self.per_user["allow"], n_rows, n_cols, offset, scores.device)
        return scores.masked_fill(blocked, float("-inf"))


def _named(items: torch.Tensor, n_rows: int, n_cols: int, offset: int, device: torch.device) -> torch.Tensor:
    """(B, C) bool: True where column ``offset + j`` is among row b's ``items`` (B, S) (0 = padding)."""
    cols = items.to(device) - offset
    inside = (items.to(device) > 0) & (cols >= 0) & (cols < n_cols)
    out = torch.zeros((n_rows, n_cols), dtype=torch.bool, device=device)
    rows = torch.arange(n_rows, device=device).unsqueeze(1).expand_as(cols)
    out[rows[inside], cols[inside]] = True
    return out


def load_rules(allow: str | None, deny: str | None, items: pl.DataFrame) -> ItemRules | None:
    """The job's :class:`ItemRules`, or None when neither ``score.allow`` nor ``score.deny`` is set."""
    if not allow and not deny:
        return None
    return ItemRules(allow, deny, items)


def rules_summary(stats: dict[str, int]) -> str:
    """One summary line of :meth:`ItemRules.stats`: rows per file and ids the model does not know."""
    parts = [f"{kind} {stats[f'{kind}_rows']} rows ({stats[f'{kind}_unknown_items']} unknown item ids, "
             f"{stats[f'{kind}_unknown_rows']} rows dropped"
             + (f"; {stats[f'{kind}_absent_user_rows']} rows of users not in the input"
                if stats.get(f"{kind}_absent_user_rows") else "") + ")"
             for kind in KINDS if f"{kind}_rows" in stats]  # fmt: skip
    return "rules: " + "; ".join(parts)
