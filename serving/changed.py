"""``score --changed-since PREVIOUS``: rank again only the users whose history changed.

Every scoring job writes, per shard and before its part file, ``_fingerprints/part-NNNNN.parquet``:
``user_id`` and ``history`` (UInt64), a fingerprint of what the ranking of that user is computed
from (:func:`history_fingerprints`: the history in model item indices, in order; the time-gap
buckets for a time-gap model; the count of input events). 16 bytes a user, read a shard at a time:
10^6 users are 16 MB of side files, and no file grows with the job.

A job with ``score.changed_since`` (``--changed-since``) reads the previous output's manifest. When
the previous model is the same (:func:`model_digest` of the weights, whatever the URI or alias
that named it) and so is every setting that can change a row's bits (every entry of the job
identity but :data:`NOT_ROW_KEYS`: K, seen-item rule, context, sinks, catalog size, rule files,
new items' table, attention backend, device and torch version, catalog chunk, the model's config:
:meth:`serving.rank.ShardRanker.settings`), each shard is split (:meth:`CarryOver.split`): users whose fingerprint
equals their previous one keep their previous rows, read from the previous part files (only
those that hold them, filtered on the shard's user ids); new users and users whose history
changed are ranked. When the model or a setting differs, every user is ranked and the job is an
ordinary full score. Either way the output is a complete output of its own (part files,
manifest, ``_skipped/``, fingerprints), written with the rules of :mod:`serving.manifest`, so a
killed changed-only job run again ends with exactly the output of an uninterrupted one.

Carried rows are the previous job's rows byte for byte, and a full score of the same input gives
the same bytes: a user's bits do not depend on its batch (:mod:`serving.rank`), and everything
else they depend on is compared first.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from serving.inputs import Shard
from serving.manifest import FINGERPRINTS_DIR, MANIFEST, Manifest, OutputDirError, read_manifest

log = logging.getLogger(__name__)

HISTORY = "history"
NOT_ROW_KEYS = ("model_uri", "run_id", "model", "input", "input_fingerprint", "shard_users", "data", "changed_since")
"""Job identity keys that do not change a user's row: how the model was named (its weights are
``model_digest``), where the input is and how it is cut into shards or cleaned (the fingerprints
compare each user's history itself), and the carry-over itself. Every other key (the weights and
every setting of :meth:`serving.rank.ShardRanker.settings`, a new one too) must be equal for rows
to be carried over; a key only one of the two jobs records counts as changed."""
_FILE = "_file"
_C = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _differences(name: str, before, now) -> list[str]:
    """The dotted names under ``name`` whose values differ between two job identities, down to the
    innermost setting: ``["popularity_prior.counts_of"]`` when only the scored input's counts moved,
    ``["top_k"]`` for a plain value, ``[name]`` when one side lacks it or is not a mapping."""
    if before == now:
        return []
    if isinstance(before, dict) and isinstance(now, dict):
        return [path for key in sorted(set(before) | set(now)) for path in
                _differences(f"{name}.{key}", before.get(key), now.get(key))]  # fmt: skip
    return [name]


def model_digest(model) -> str:
    """SHA-256 (hex) of a model's weights: every ``state_dict`` entry's name, dtype, shape and bytes."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        value = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{value.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes())  # raw bytes of any dtype (bfloat16 too)
    return digest.hexdigest()


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on (E,) uint64 (wrapping arithmetic): a well-spread 64-bit hash of each value."""
    with np.errstate(over="ignore"):
        x = x + _C[0]
        x = (x ^ (x >> np.uint64(30))) * _C[1]
        x = (x ^ (x >> np.uint64(27))) * _C[2]
        return x ^ (x >> np.uint64(31))


def _per_sequence(events: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(U,) uint64 wrapping sum of ``events`` (E,) uint64 over each sequence ``offsets`` (U + 1,)."""
    total = np.concatenate([[np.uint64(0)], np.cumsum(events, dtype=np.uint64)])
    with np.errstate(over="ignore"):
        return total[offsets[1:]] - total[offsets[:-1]]


def history_fingerprints(shard: Shard, withheld: np.ndarray | None = None) -> pl.DataFrame:
    """``user_id``, ``history`` UInt64: a 64-bit fingerprint of what each user's ranking is computed from.

    Each event contributes a hash of (item index, position in the history) and, for a time-gap
    model, of its gap bucket; the per-user sum is hashed with the history length and the count
    of input events (unknown items included), and with the new items of the history (``Shard.new_seen``) when
    it holds any (a user without one has the same print whether or not other users' inputs hold one), and with the items withheld from every user (``ScoreInput.withheld``:
    a row carried over must not hold an item withheld now). Any change of an item, its order, a gap, or an
    added or removed event changes the fingerprint (up to 64-bit collisions: 2^-64 per user).
    Vectorised over the shard (no Python loop over users); stable across runs and versions.
    """
    seqs = shard.histories
    lengths = seqs.lengths()
    position = np.arange(seqs.values.shape[0], dtype=np.int64) - np.repeat(seqs.offsets[:-1], lengths)
    with np.errstate(over="ignore"):
        events = _mix(seqs.values.astype(np.uint64) * _C[1] + position.astype(np.uint64))
        if shard.gaps is not None:
            events = events ^ _mix(shard.gaps.values.astype(np.uint64) + _C[2])
        given = lengths if shard.input_lengths is None else shard.input_lengths
        summary = _mix(lengths.astype(np.uint64) * _C[0] + given.astype(np.uint64))
        history = _mix(_per_sequence(events, seqs.offsets) ^ summary)
        if shard.new_seen is not None:  # the new items of each input history (Shard.new_seen): excluded as seen;
            new = _mix(shard.new_seen.values.astype(np.uint64) * _C[2])  # a user with none keeps the print it had
            mixed = _mix(history ^ _per_sequence(new, shard.new_seen.offsets))  # before any input held a new item
            history = np.where(shard.new_seen.lengths() > 0, mixed, history)
        if withheld is not None and withheld.size:
            history = _mix(history ^ _mix(np.unique(withheld).astype(np.uint64)).sum(dtype=np.uint64))
    return pl.DataFrame({schema.USER_ID: shard.user_ids, HISTORY: pl.Series(history, dtype=pl.UInt64)})


@dataclass(frozen=True)
class CarryOver:
    """A previous, complete scoring output whose rows may be carried over (same model and settings).

    Attributes:
        previous: the previous output directory.
    """

    previous: Path

    @classmethod
    def open(cls, previous: str | Path, output_dir: Path, identity: dict) -> "CarryOver | None":
        """The carry-over from ``previous`` for a job of ``identity``, or None when its model or a
        row-changing setting differs, or when a file it would be read from is damaged (a part or
        fingerprint file of a recorded shard missing, unreadable, or not of the rows its manifest
        records: :func:`_damage`); then every user is ranked, and the reason logged.

        Raises:
            DataError: ``previous`` is no complete scoring output (its manifest missing, not
                complete or not JSON), has no fingerprints (written before they existed), or is
                ``output_dir`` itself.
        """
        previous = Path(previous)
        if previous.resolve() == output_dir.resolve():
            raise DataError(f"--changed-since {previous} is the output itself; write the new rankings to another --output")
        if not previous.exists():
            raise DataError(f"--changed-since {previous}: no such folder; give the output directory of a finished `score`")
        try:
            manifest = read_manifest(previous) if previous.is_dir() else None
        except OutputDirError:  # hand-edited: its writes are atomic
            raise DataError(f"--changed-since {previous}: its {MANIFEST} is not valid JSON; give the output "
                            "directory of a finished `score`") from None  # fmt: skip
        if manifest is None or not manifest.complete:
            raise DataError(f"--changed-since {previous}: not a complete scoring output (no complete _manifest.json); "
                            "give the output directory of a finished `score`")  # fmt: skip
        if not (previous / FINGERPRINTS_DIR).is_dir():
            raise DataError(f"--changed-since {previous} has no {FINGERPRINTS_DIR}/ (scored by an older version); "
                            "score it once in full, then use --changed-since on that output")  # fmt: skip
        keys = sorted((set(manifest.identity) | set(identity)) - set(NOT_ROW_KEYS))
        differs = [path for key in keys for path in _differences(key, manifest.identity.get(key), identity.get(key))]
        if differs:
            log.info("--changed-since %s: %s changed, so every user is ranked", previous, ", ".join(differs))
            return None
        damage = _damage(previous, manifest)
        if damage is not None:
            log.warning("--changed-since %s: %s; every user is ranked (nothing is carried over from it)", previous, damage)
            return None
        return cls(previous=previous)

    def split(self, fingerprints: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray]:
        """Which users of a shard keep their previous rows.

        Args:
            fingerprints: the shard's ``user_id``, ``history`` (:func:`history_fingerprints`), U rows.

        Returns:
            ``(carried, changed)``: the previous ranking rows of the unchanged users (contract
            schema, any order) and (U,) bool, True for the users to rank (new or changed).
        """
        users = fingerprints.get_column(schema.USER_ID)
        try:
            scan = pl.scan_parquet(self.previous / FINGERPRINTS_DIR / "part-*.parquet", include_file_paths=_FILE)
            if scan.collect_schema()[schema.USER_ID] != users.dtype:  # ids of another type: every user is ranked
                return pl.DataFrame(), np.ones(users.len(), dtype=bool)  # (their rows would carry the old type)
            before = scan.filter(pl.col(schema.USER_ID).is_in(users.implode())).collect()
            same = fingerprints.join(before, on=[schema.USER_ID, HISTORY], how="inner")
            keep = same.get_column(schema.USER_ID)
            parts = sorted({Path(f).name for f in same.get_column(_FILE).to_list()})
            carried = pl.DataFrame()
            if parts:
                carried = (pl.scan_parquet([self.previous / name for name in parts])
                           .filter(pl.col(schema.USER_ID).is_in(keep.implode())).collect())  # fmt: skip
        except (pl.exceptions.PolarsError, OSError) as err:  # damaged since the job started (checked then)
            raise DataError(f"--changed-since {self.previous}: cannot read it ({str(err).strip().splitlines()[0]}); "
                            "score without --changed-since (ranks every user)") from None  # fmt: skip
        return carried, ~users.is_in(keep.implode()).to_numpy()


def _damage(previous: Path, manifest: Manifest) -> str | None:
    """What is wrong with the files a carry-over reads from the complete output ``previous``, or None.

    Each recorded shard's part file must hold the rows and its ``_fingerprints/`` file the users
    that ``manifest`` records for it (Parquet footers only: a truncated, missing or replaced file
    is found without reading the rows).
    """
    import pyarrow.parquet as pq

    for name, stats in sorted(manifest.shards.items()):
        for path, key in ((previous / name, "rows"), (previous / FINGERPRINTS_DIR / name, "users")):
            try:
                rows = pq.read_metadata(path).num_rows
            except FileNotFoundError:
                return f"{path} is missing"
            except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
                return f"{path} is not a readable Parquet file ({str(err).strip().splitlines()[0]})"
            if key in stats and rows != int(stats[key]):
                return f"{path} holds {rows} rows where the manifest records {stats[key]}"
    return None
