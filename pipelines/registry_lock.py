"""A lock around the promotion gate's alias move, so that overlapping pipelines cannot demote a better model.

The gate compares the new version with the champion and then moves the alias: a read, a
decision, a write. Two pipelines that overlap would both read the same old champion and both
move the alias, leaving it on whichever finished last, better or not. The gate therefore
re-reads the champion *inside* :func:`promotion_lock` and decides again when it changed
(compare-and-set, :func:`pipelines.promotion.run_gate`); the lock makes "re-read, decide, move"
one step that no other gate can interleave with.

Two kinds of lock, by tracking store:

- an embedded SQLite store (``sqlite:///PATH``), or any store whose path is on this machine: an
  exclusive ``fcntl.flock`` on ``PATH.promotion-<model>.lock`` beside the database. The kernel
  releases it when the process ends, so a killed pipeline never leaves it held. Exact for every
  process on this machine (and on a shared filesystem whose locks are coherent).
- any other store (an MLflow server over HTTP, a database server): a *lease* held in the
  registered-model tag ``promotion.lease`` (``TOKEN EXPIRES_EPOCH``). MLflow has no atomic
  compare-and-set on tags, so a gate writes its token, waits :data:`LEASE_SETTLE_S`, and holds the
  lease only when the tag still names it; a lease whose holder died expires after
  ``LEASE_TTL_S``. This closes the overlap of scheduled runs (seconds to hours apart); two gates
  writing the tag within the settle time of each other both back off and retry.

Waiting longer than ``timeout_s`` raises :class:`PromotionLockTimeout` (the pipeline then fails
with exit code 1 and the alias is untouched).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from recsys_alibi.config import ConfigError
from recsys_alibi.tracking_store import local_store_path

log = logging.getLogger(__name__)

LEASE_TAG = "promotion.lease"
LEASE_TTL_S = 3600.0  # a holder that died frees the lease after this long
LEASE_SETTLE_S = 1.0  # wait between writing the lease and checking it is still ours
POLL_S = 0.5


class PromotionLockTimeout(RuntimeError):
    """Another pipeline held the promotion lock of the registered model for longer than the timeout."""


def lock_file(store: Path, model_name: str) -> Path:
    """``<store>.promotion-<model>.lock`` beside the store (the name made file-safe)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model_name)
    return store.with_name(f"{store.name}.promotion-{safe}.lock")


NAME_MAX = 255  # bytes in one file name (ext4, xfs, APFS, NTFS)


def check_lock_name(uri: str, model_name: str) -> None:
    """Refuse a registered model name whose promotion lock file (:func:`lock_file`) could not be created beside the
    local store at ``uri``: the pipeline would find out after registering the version, before its gate.

    Raises:
        ConfigError: one line naming ``tracking.registered_model`` and the longest name that fits.
    """
    store = local_store_path(uri)
    if store is None:  # a tracking server: a lease tag, no file
        return
    name = lock_file(store, model_name).name
    length = len(name.encode())
    if length > NAME_MAX:
        longest = NAME_MAX - (length - len(model_name))  # file-safe names have one byte per character
        raise ConfigError(
            f"invalid config at 'tracking.registered_model': a name of {len(model_name)} characters makes the "
            f"promotion lock file beside {store.name} {length} bytes long, over the {NAME_MAX} bytes a file name "
            f"may have; use a name of at most {max(longest, 0)} characters"
        )


@contextlib.contextmanager
def promotion_lock(uri: str, model_name: str, timeout_s: float = 600.0) -> Iterator[str]:
    """Hold the promotion lock of ``model_name`` in the store at ``uri`` for the block.

    Args:
        uri: the tracking URI (``recsys_alibi.tracking.tracking_uri``).
        model_name: the registered model whose alias is moved.
        timeout_s: how long to wait for another holder, seconds.

    Yields:
        What was locked: the lock file's path, or ``lease <token>``.

    Raises:
        PromotionLockTimeout: the lock stayed held by another pipeline for ``timeout_s``.
    """
    store = local_store_path(uri)
    if store is not None:
        with _file_lock(lock_file(store, model_name), timeout_s) as held:
            yield held
    else:
        with _tag_lease(model_name, timeout_s) as held:
            yield held


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float) -> Iterator[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with path.open("a+") as handle:  # one open file description per holder: flock excludes threads too
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise PromotionLockTimeout(
                        f"another pipeline held the promotion lock {path} for more than {timeout_s:.0f} s; "
                        "the alias was not moved"
                    ) from None
                time.sleep(POLL_S)
        try:
            yield str(path)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _tag_lease(model_name: str, timeout_s: float) -> Iterator[str]:
    import mlflow

    client = mlflow.MlflowClient()
    token = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    while True:
        holder = _lease_holder(client, model_name)
        if holder is None:
            client.set_registered_model_tag(model_name, LEASE_TAG, f"{token} {time.time() + LEASE_TTL_S:.0f}")
            time.sleep(LEASE_SETTLE_S)
            if _lease_holder(client, model_name) == token:
                break
        if time.monotonic() > deadline:
            raise PromotionLockTimeout(
                f"another pipeline held the promotion lease (tag {LEASE_TAG}) of {model_name} for more than "
                f"{timeout_s:.0f} s; the alias was not moved"
            )
        time.sleep(POLL_S)
    try:
        yield f"lease {token}"
    finally:
        if _lease_holder(client, model_name) == token:
            client.delete_registered_model_tag(model_name, LEASE_TAG)


def _lease_holder(client, model_name: str) -> str | None:
    """The token of the unexpired lease on ``model_name``, or None."""
    value = client.get_registered_model(model_name).tags.get(LEASE_TAG, "")
    token, _, expires = value.partition(" ")
    try:
        return token if token and float(expires) > time.time() else None
    except ValueError:  # a hand-edited tag: not a lease
        return None
