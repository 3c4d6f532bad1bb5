"""The output directory of a scoring job: part files, the manifest, and how a job resumes.

Layout of ``output_dir``::

    part-00000.parquet ...        one per shard of ``score.shard_users`` users (contract rankings)
    _manifest.json                the job's identity and the shards recorded as done
    _manifest.rank-R.json         while a multi-process job runs: shards done by rank R > 0
    _input/                       raw-event input only: the events prepared for scoring (removed
                                  when the job completes, except ``stats.json`` and rejects)
    _fingerprints/part-NNNNN.parquet  ``user_id``, ``history`` UInt64 of shard NNNNN's users (what
                                  ``score --changed-since`` compares; serving.changed), written
                                  before the part file
    _skipped/part-NNNNN.parquet   the users of shard NNNNN that were not ranked (``user_id``,
                                  ``reason``: no_known_item | no_events, ``input_events``); only
                                  for shards that have such users, written before the part file

The rules that make a job killed at any moment and started again end with exactly the output of
an uninterrupted run:

1. A part file is written to a unique hidden temporary name and renamed into place
   (``os.replace``, atomic on POSIX), so a part file is either absent or complete.
2. After the rename the shard is recorded in the rank's manifest file (also written to a
   temporary file and renamed). A shard is *done* when it is recorded **and** its part file
   exists; anything else is scored again. A shard scored again (a kill between rename and
   record) rewrites the same file with the same content: scoring is deterministic.
3. Part files are named by shard index, so a shard can never be written twice under two names:
   no duplicate (user, rank) rows, whatever the number of processes in either run.
4. On start, rank 0 folds leftover rank files into ``_manifest.json``, deletes stale temporary
   files and checks the identity (model, input, K and every setting that changes the rows);
   an output directory of another job is an error, never mixed.
5. When every shard is done, rank 0 writes ``_manifest.json`` with ``"complete": true`` and only
   then removes the rank files and the staged input; a job started on a complete directory
   returns its result at once.
"""

from __future__ import annotations

import json
from fnmatch import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recsys_alibi.atomic import atomic_path, write_json_atomic
from recsys_alibi.staging import remove, stale_temps_in

MANIFEST = "_manifest.json"
RANK_MANIFEST = "_manifest.rank-{rank}.json"
PART = "part-{shard:05d}.parquet"
STAGED_INPUT = "_input"
SKIPPED_DIR = "_skipped"
FINGERPRINTS_DIR = "_fingerprints"


class OutputDirError(ValueError):
    """``output_dir`` holds another job's rankings; the message names the fix."""


def part_name(shard: int) -> str:
    """``part-00012.parquet`` for shard 12."""
    return PART.format(shard=shard)


def write_atomic(path: Path, write) -> None:
    """Call ``write(tmp_path)`` on a hidden temporary file beside ``path``, then rename it onto ``path``.

    Only a hard kill can leave the temporary behind (:func:`remove_stale_temporaries` clears those).
    """
    with atomic_path(path) as tmp:
        write(tmp)


def _written_here(name: str) -> bool:
    """Whether a scoring job writes files of this name (part files, its manifests)."""
    return fnmatch(name, "part-*.parquet") or fnmatch(name, "_manifest*.json")


def remove_stale_temporaries(output_dir: Path) -> int:
    """Delete the temporaries killed writers of this job's files left (also in ``_skipped/``,
    ``_fingerprints/``); returns how many. Only temporaries of the names a scoring job writes, and
    only those no running writer holds (:mod:`recsys_alibi.staging`)."""
    folders = (output_dir, output_dir / SKIPPED_DIR, output_dir / FINGERPRINTS_DIR)
    return len(remove([p for folder in folders for p in stale_temps_in(folder, _written_here)]))


SHARD_STATS = ("users", "rows", "skipped_users", "unknown_events", "carried_users", "new_item_places")
"""What each shard records in the manifest: users in it, ranking rows, users not ranked, input events on unknown
items, users whose rows were carried over (``score.changed_since``), ranking rows that hold a new item."""


@dataclass
class Manifest:
    """The state of a scoring output directory.

    Attributes:
        identity: what defines the rows (model, run, input fingerprint, K, settings).
        users: users in the input; n_shards: shards of the job (set once the input is read).
        shards: part file name -> ``{"users", "rows", "skipped_users", "unknown_events"}``.
        complete: every shard done and recorded.
        input_stats: facts about the input (``unknown_items``, ``rejected_rows``, ...).
    """

    identity: dict[str, Any]
    users: int | None = None
    n_shards: int | None = None
    shards: dict[str, dict[str, int]] = field(default_factory=dict)
    complete: bool = False
    input_stats: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "identity": self.identity, "users": self.users, "n_shards": self.n_shards,
            "shards": dict(sorted(self.shards.items())), "complete": self.complete,
            "input_stats": self.input_stats,
        }  # fmt: skip

    @classmethod
    def from_json(cls, payload: dict) -> "Manifest":
        return cls(
            identity=payload.get("identity", {}), users=payload.get("users"), n_shards=payload.get("n_shards"),
            shards=payload.get("shards", {}), complete=bool(payload.get("complete", False)),
            input_stats=payload.get("input_stats", {}),
        )  # fmt: skip

    def totals(self) -> dict[str, int]:
        """Sums over the recorded shards of each of :data:`SHARD_STATS` (0 where an older manifest lacks one)."""
        return {key: sum(int(s.get(key, 0)) for s in self.shards.values()) for key in SHARD_STATS}


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:  # only possible if edited by hand: writes are atomic
        raise OutputDirError(f"{path} is not valid JSON; delete the output directory and score again") from None


def rank_manifest_path(output_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` records its shards (``_manifest.json`` for rank 0)."""
    return output_dir / (MANIFEST if rank == 0 else RANK_MANIFEST.format(rank=rank))


def clear_output(output_dir: Path) -> None:
    """Delete what a scoring job writes in ``output_dir`` (parts, manifests, staged input, skipped users, temporaries)."""
    import shutil

    for pattern in ("part-*.parquet", "_manifest*.json"):
        for path in output_dir.glob(pattern):
            path.unlink(missing_ok=True)
    remove_stale_temporaries(output_dir)
    shutil.rmtree(output_dir / STAGED_INPUT, ignore_errors=True)
    shutil.rmtree(output_dir / SKIPPED_DIR, ignore_errors=True)
    shutil.rmtree(output_dir / FINGERPRINTS_DIR, ignore_errors=True)


def open_manifest(output_dir: Path, identity: dict[str, Any], *, overwrite: bool = False) -> Manifest:
    """Rank 0 at start: the directory's manifest with leftover rank files folded in (rule 4).

    Creates ``output_dir`` and an empty manifest when there is none; deletes stale temporaries.
    With ``overwrite``, the output of another job is deleted (:func:`clear_output`) instead of
    refused; the output of the same job is still resumed.

    Raises:
        OutputDirError: the directory holds rankings of another job (a different identity) and
            ``overwrite`` is off.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    payload = _read_json(output_dir / MANIFEST)
    if overwrite and (payload is None or payload.get("identity") != identity):
        clear_output(output_dir)
        payload = None
    if payload is None:
        if any(output_dir.glob("part-*.parquet")):
            raise OutputDirError(
                f"{output_dir} holds part files but no {MANIFEST}; choose a new --output, delete that directory "
                "or set score.overwrite=true"
            )
        manifest = Manifest(identity=identity)
    else:
        manifest = Manifest.from_json(payload)
        if manifest.identity != identity:
            keys = set(identity) | set(manifest.identity)
            changed = sorted(k for k in keys if identity.get(k) != manifest.identity.get(k))
            raise OutputDirError(
                f"{output_dir} holds rankings of another job (different {', '.join(changed)}); "
                "choose a new --output, delete that directory or set score.overwrite=true"
            )
    for path in sorted(output_dir.glob(RANK_MANIFEST.format(rank="*"))):
        other = _read_json(path)
        if other is not None and other.get("identity") == identity:
            manifest.shards.update(other.get("shards", {}))
    remove_stale_temporaries(output_dir)
    write_json_atomic(output_dir / MANIFEST, manifest.to_json())
    for path in output_dir.glob(RANK_MANIFEST.format(rank="*")):
        path.unlink(missing_ok=True)  # folded in above (or another job's leftovers)
    return manifest


def withdraw_manifest(output_dir: Path, *, remove_dir: bool = False, keep: tuple[str, ...] = ()) -> None:
    """Undo :func:`open_manifest` of a run refused before any shard (its input was bad): a refused
    run leaves nothing but what its message names.

    Deletes ``_manifest.json`` (it records no shard: no rankings are lost), the staged input
    (``_input/``) but its files named in ``keep`` (the rejects an "every row was rejected" message
    points at), ``_input/`` itself when nothing is kept, and, with ``remove_dir`` (the run created
    ``output_dir``), the directory when nothing else is left in it.
    """
    import shutil

    (output_dir / MANIFEST).unlink(missing_ok=True)
    staged = output_dir / STAGED_INPUT
    if staged.is_dir():
        for path in staged.iterdir():
            if path.name not in keep:
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        if not any(staged.iterdir()):
            staged.rmdir()
    if remove_dir and output_dir.is_dir() and not any(output_dir.iterdir()):
        output_dir.rmdir()


def withdraw_rankings(output_dir: Path) -> None:
    """Undo the rankings of a job that ranked no user (``score`` then fails with exit 2): its part files hold no
    row, and with a complete manifest they would read as a result and a run started again would return them as
    done. Deletes the manifest (first: nothing is left that says complete), the rank manifests, the part files
    and the fingerprints; ``_skipped/`` and the staged input report stay (the error message points at them)."""
    import shutil

    (output_dir / MANIFEST).unlink(missing_ok=True)
    for path in output_dir.glob("_manifest.rank-*.json"):
        path.unlink(missing_ok=True)
    for path in output_dir.glob("part-*.parquet"):
        path.unlink(missing_ok=True)
    shutil.rmtree(output_dir / FINGERPRINTS_DIR, ignore_errors=True)


def withdraw_job(output_dir: Path, *, remove_dir: bool = False) -> None:
    """Undo every file of a job refused while it scored (an input error found in a later shard): a refused run
    leaves nothing behind, so the same command with the input fixed is a new job there, not "another job's
    rankings". :func:`withdraw_rankings`, then the skipped users' lists, the temporaries and :func:`withdraw_manifest`
    (the staged input; the directory too with ``remove_dir``, when the run created it and nothing else is in it)."""
    import shutil

    withdraw_rankings(output_dir)
    shutil.rmtree(output_dir / SKIPPED_DIR, ignore_errors=True)
    remove_stale_temporaries(output_dir)
    withdraw_manifest(output_dir, remove_dir=remove_dir)


def done_shards(output_dir: Path, manifest: Manifest) -> set[int]:
    """Indices of shards recorded in ``manifest`` whose part file exists (rule 2)."""
    done = set()
    for name in manifest.shards:
        if (output_dir / name).is_file():
            done.add(int(name.removeprefix("part-").removesuffix(".parquet")))
    return done


def record_shard(output_dir: Path, rank: int, manifest: Manifest, name: str, stats: dict[str, int]) -> None:
    """Record a shard whose part file is in place, in this rank's manifest file (rule 2)."""
    manifest.shards[name] = stats
    write_json_atomic(rank_manifest_path(output_dir, rank), manifest.to_json())


def finish_manifest(output_dir: Path, manifest: Manifest, world_size: int) -> Manifest:
    """Rank 0 after every rank finished: fold rank files in, mark complete when all shards are done (rule 5);
    a complete job sweeps the stale temporaries again (:func:`remove_stale_temporaries`)."""
    for rank in range(1, world_size):
        other = _read_json(rank_manifest_path(output_dir, rank))
        if other is not None:
            manifest.shards.update(other.get("shards", {}))
    assert manifest.n_shards is not None
    manifest.shards = {name: s for name, s in manifest.shards.items() if (output_dir / name).is_file()}
    manifest.complete = len(done_shards(output_dir, manifest)) == manifest.n_shards
    if manifest.complete:  # a writer of the killed run still alive at the start (a Ray actor is killed
        remove_stale_temporaries(output_dir)  # asynchronously) and gone since: its temporary goes too
    write_json_atomic(output_dir / MANIFEST, manifest.to_json())
    for rank in range(1, world_size):
        rank_manifest_path(output_dir, rank).unlink(missing_ok=True)
    return manifest


def read_manifest(output_dir: Path) -> Manifest | None:
    """The manifest of ``output_dir``, or None when there is none."""
    payload = _read_json(output_dir / MANIFEST)
    return None if payload is None else Manifest.from_json(payload)
