"""``recsys-alibi score``: top-K rankings for every user, written as Parquet part files.

Input (``--input``): a prepared directory, a sequences Parquet file, or a raw event log in any
format ``prepare`` reads (:mod:`serving.inputs`). Users are split into shards of
``score.shard_users``; each shard becomes ``part-NNNNN.parquet`` in the output directory, written
atomically and recorded in ``_manifest.json`` (:mod:`serving.manifest`: the rules that make a job
killed at any moment and started again end with exactly the output of an uninterrupted run).

Per user the model encodes the history (whole up to ``score.max_context`` events, beyond that a
rolling window with sinks: :mod:`serving.rank`), and the top K items come from the item table
scored ``score.catalog_chunk`` items at a time (:mod:`serving.topk`), seen items excluded.

Output rows (long format, the contract): ``user_id`` (raw), ``rank`` int32 (1 = best),
``item_id`` (raw), ``score`` float32; per user ``min(K, N - seen)`` rows when seen items are
excluded. Read them with ``pl.read_parquet(output_dir / "part-*.parquet")``.

Several processes split the shards (:mod:`serving.distributed`)::

    torchrun --nproc-per-node 2 -m pipelines.cli score --model-uri URI --input DIR --output OUT

Rank r takes shards r, r + W, ...; rank 0 checks the directory first and completes the
manifest after a barrier. Any number of processes gives the same files as one.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from recsys_alibi.atomic import atomic_path
from recsys_alibi.config import ConfigError, JobConfig
from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.item_features import ITEM_REJECTS_FILE
from serving.changed import FINGERPRINTS_DIR, CarryOver, history_fingerprints, model_digest
from serving.distributed import World, scoring_world
from serving.inputs import REJECTED_USERS_FILE, ScoreInput, fingerprint, input_kind, open_input, rejected_users, release_staged
from serving.manifest import (
    MANIFEST,
    SKIPPED_DIR,
    STAGED_INPUT,
    Manifest,
    OutputDirError,
    done_shards,
    finish_manifest,
    open_manifest,
    part_name,
    record_shard,
    write_atomic,
    withdraw_job,
    withdraw_manifest,
    withdraw_rankings,
    write_json_atomic,
)
from serving.new_items import with_default_items
from serving.rank import ShardRanker
from serving.rules import KINDS as RULE_KINDS
from serving.rules import rules_summary

__all__ = ["MANIFEST", "OutputDirError", "ScoreJobResult", "run_score", "score_with_model"]

log = logging.getLogger(__name__)

REJECTED_USERS = "rejected_users"  # manifest input_stats: users whose every raw event row was rejected

Hook = Callable[[str, int], None]
"""Test hook ``hook(point, shard)`` at ``"staged"`` (shard -1), ``"written"`` (part file in place,
not yet recorded), ``"recorded"`` and ``"finished"`` (manifest complete, staged input not yet
released; shard -1). Raising there leaves the directory as a kill at that moment would."""


@dataclass(frozen=True)
class ScoreJobResult:
    """Where the rankings went and how fast they were made.

    Attributes:
        output_dir: the rankings directory.
        users: users in the input; shards: shards of the job; shards_skipped: shards already
            done by an earlier run; rows: ranking rows in all part files; seconds: wall time of
            this run; users_scored: users of the shards scored by this run (all processes);
            skipped_users: users not ranked, listed with the reason in ``output_dir/_skipped/``:
            no event the model knows, no events, or every catalog item already seen (seen-item
            exclusion leaves nothing to recommend); unknown_items /
            unknown_events: input items the model does not know and their dropped events;
            rejected_rows: malformed raw-event rows (in ``_input/rejects.parquet``);
            world_size: processes that shared the job; rules: business-rule counts
            (:meth:`serving.rules.ItemRules.stats`: rows and ids unknown to the model per file);
            carried_users: users whose rows were carried over from ``score.changed_since``
            (history unchanged, same model and settings: :mod:`serving.changed`).
    """

    output_dir: Path
    users: int
    shards: int
    shards_skipped: int
    rows: int
    seconds: float
    users_scored: int = 0
    skipped_users: int = 0
    unknown_items: int = 0
    unknown_events: int = 0
    rejected_rows: int = 0
    world_size: int = 1
    rules: dict[str, int] = field(default_factory=dict)
    carried_users: int = 0
    carry_over: str = ""  # score.changed_since: "" not asked, "open" compared per user, "closed" nothing could carry
    new_items: int = 0  # items the model never saw, ranked from their features alone (score.items)
    new_items_source: str = ""
    new_items_rejected: int = 0  # rows of that item table rejected by prepare's rules (bad id, number, duplicate id)
    new_item_slots: int = 0  # places of each top-K held for the best new items (score.new_item_slots, as applied)
    slots_asked: int = 0  # score.new_item_slots as set
    new_item_places: int = 0  # ranking rows that hold a new item

    @property
    def users_per_second(self) -> float:
        """Throughput of this run: users scored / seconds (nan when nothing was scored)."""
        return self.users_scored / self.seconds if self.seconds > 0 and self.users_scored else float("nan")

    @property
    def users_ranked(self) -> int:
        """Users with rankings in the output (every user but the skipped ones)."""
        return self.users - self.skipped_users

    def new_item_lines(self) -> list[str]:
        """What ``score.items`` and ``score.new_item_slots`` did (empty when neither was in play, or when the table
        held no new item and no row was rejected)."""
        lines: list[str] = []
        held = f" (score.new_item_slots={self.new_item_slots})" if self.new_item_slots else ""
        lines += [f"new items ranked from their features alone (not in the model's vocabulary): {self.new_items} "
                  f"from {self.new_items_source}; its rows rejected: {self.new_items_rejected}"
                  + (f" (listed in {self.output_dir / STAGED_INPUT / ITEM_REJECTS_FILE})" if self.new_items_rejected else "")
                  + f"; ranking rows that hold one: {self.new_item_places}{held}"
                  ] if self.new_items_source and (self.new_items or self.new_items_rejected) else []  # fmt: skip
        why = None
        if self.slots_asked and not self.new_item_slots:
            given = f"in {self.new_items_source}" if self.new_items_source else "was given: score.items / --items"
            why = f"no item the model never saw {given}"
        elif self.new_item_slots and not self.new_item_places and self.users_ranked:
            why = ("the allow / deny rules and seen-item exclusion left no user a new item" if self.rules
                   else "every user has seen every new item")  # fmt: skip
        lines += [f"score.new_item_slots={self.slots_asked}: no place held ({why})"] if why else []
        return lines

    def summary(self) -> str:
        procs = f" by {self.world_size} processes" if self.world_size > 1 else ""
        speed = f" ({self.users_per_second:.0f} users/s)" if self.users_scored else ""
        skipped = f" (listed in {self.output_dir / SKIPPED_DIR})" if self.skipped_users else ""
        lines = [
            f"ranked {self.users_ranked} of {self.users} users: {self.rows} rows in {self.shards} shards "
            f"({self.shards_skipped} already done) -> {self.output_dir}; this run "
            f"went over {self.users_scored} users"
            f"{procs} in {self.seconds:.1f} s{speed}",
            f"unknown items: {self.unknown_items} ({self.unknown_events} events skipped); "
            f"users not ranked (no known item, no events, every event rejected or every item seen): "
            f"{self.skipped_users}{skipped}; "
            f"rejected event rows: {self.rejected_rows}",
        ]
        lines += [rules_summary(self.rules)] if self.rules else []
        lines += self.new_item_lines()
        if self.carry_over == "closed":
            lines += ["carried over: 0 users (the model or a setting differs from the previous output's, or it is "
                      "damaged: logged above); every user ranked"]  # fmt: skip
        elif self.carried_users or self.carry_over:
            why = "" if self.carried_users else (" (every user's history, its new items or the items the input's "
                                                 "k-core withholds differ from the previous output's)")  # fmt: skip
            lines += [f"carried over (history unchanged since the previous output): {self.carried_users} users; "
                      f"ranked again: {self.users - self.carried_users}{why}"]  # fmt: skip
        return "\n".join(lines)


def run_score(
    config: JobConfig,
    model_uri: str,
    input_path: str | Path,
    output_dir: str | Path,
    *,
    k: int | None = None,
    progress: bool = True,
    scorer: Callable[..., ScoreJobResult] | None = None,
    shown_dir: str | Path | None = None,
) -> ScoreJobResult:
    """Score every user of ``input_path`` with ``model_uri`` and write top-``k`` part files.

    Args:
        config: the job config (``score`` section; ``data`` for raw events; ``tracking``).
        model_uri: ``runs:/ID/model``, ``models:/NAME/VERSION`` or ``models:/NAME@ALIAS``.
        input_path: prepared dir, sequences Parquet or raw event log.
        output_dir: rankings directory (created; resumed when it holds this job's shards).
        k: items per user (default ``score.k``).
        progress: show a progress bar (rank 0).
        scorer: what scores the loaded model (default :func:`score_with_model`, the local engine;
            :func:`serving.engines.run_score` passes ``score.engine``'s).
        shown_dir: the directory the warning about users not ranked names (default ``output_dir``):
            where the rankings will be once a caller that scores into a staging directory has moved them.

    A user with no event the model knows is not ranked; such users are counted, warned about
    and listed with the reason in ``output_dir/_skipped/``.

    Raises:
        ModelUriError: the model URI does not resolve.
        DataError: bad input (missing, unreadable, empty, wrong columns, null or repeated user ids,
            negative or null item indices, indices beyond the model); no input item is in the
            model's vocabulary (checked before scoring), or no user at all could be ranked.
        OutputDirError: ``output_dir`` holds another job's rankings.
        ConfigError: ``score.engine=ray`` without a ``scorer`` (this module knows only the local
            engine: score with :func:`serving.engines.run_score`).
    """
    from recsys_alibi.tracking import load_ranker, setup_tracking

    if scorer is None and config.score.engine != "local":  # never a silent local run of a Ray job
        raise ConfigError(f"score.engine={config.score.engine}: score with serving.engines.run_score, which starts that engine")
    scorer = scorer or score_with_model
    setup_tracking(config.tracking, reading=model_uri)
    loaded = load_ranker(model_uri)
    return scorer(
        config, loaded.model, loaded.items, input_path, output_dir, k=k, progress=progress,
        model_ref={"model_uri": model_uri, "run_id": loaded.run_id}, shown_dir=shown_dir,
    )


def score_with_model(
    config: JobConfig,
    model,
    items: pl.DataFrame,
    input_path: str | Path,
    output_dir: str | Path,
    *,
    k: int | None = None,
    progress: bool = True,
    model_ref: dict | None = None,
    hook: Hook | None = None,
    job: Callable[..., "_ScoreJob"] | None = None,
    shown_dir: str | Path | None = None,
) -> ScoreJobResult:
    """:func:`run_score` with a model already in memory.

    Args:
        model: an ``AlibiRanker``; items: its vocabulary (``item_idx`` 1..N, ``item_id``).
        model_ref: identifies the model in the manifest (default: ``{"model": "in-memory"}``);
            a resumed job must give the same.
        hook: test hook (see :data:`Hook`).
        job: builds the job (default the in-process loop; the Ray engine passes its own).
        Others as :func:`run_score`.
    """
    k = k or config.score.k
    config = with_default_items(config, model, input_path)  # score --items: default, the prepared input's table
    ranker = ShardRanker(model, items, config.score, k)
    model_ref = {**(model_ref or {"model": "in-memory"}), "model_digest": model_digest(model)}  # changed_since compares it
    with scoring_world() as world:
        runner = (job or _ScoreJob)(config, ranker, items, Path(input_path), Path(output_dir),
                                    model_ref, world, progress, hook)  # fmt: skip
        return _checked(runner.run(), world.is_main, Path(shown_dir or output_dir) / SKIPPED_DIR)


def _checked(result: ScoreJobResult, main: bool, skipped_list: Path) -> ScoreJobResult:
    """Warn about users that were not ranked; raise when no user at all was (nothing to serve), the empty rankings
    withdrawn first (:func:`serving.manifest.withdraw_rankings`: only the skipped users' list stays).
    ``skipped_list``: the list's directory as the warning names it (where a caller that scores into a staging
    directory puts it)."""
    if result.users and not result.users_ranked and main:
        withdraw_rankings(result.output_dir)
    if result.users and not result.users_ranked and result.rules:
        raise DataError(
            f"no user was ranked: the allow / deny rules (score.allow, score.deny) and seen-item exclusion left none of "
            f"the {result.users} users an item to recommend ({rules_summary(result.rules)}; users listed with the "
            f"reason in {result.output_dir / SKIPPED_DIR}); check the rule files' ids and users"
        )
    if result.users and not result.users_ranked:
        raise DataError(
            f"no user was ranked: none of the {result.users} users has an event whose item the model knows "
            f"and an item left to recommend ({result.unknown_items} unknown items, {result.unknown_events} events "
            f"skipped; users listed with the reason in {result.output_dir / SKIPPED_DIR}); "
            + ("a history is read from the events on items the model was trained on, not on the items of score.items "
               "it never saw" if result.new_items else "score with a model trained on this data")
        )
    if result.skipped_users and main:
        log.warning("%d of %d users were not ranked (no item the model knows, or every item already seen or excluded); "
                    "listed with the reason in %s", result.skipped_users, result.users, skipped_list)  # fmt: skip
    return result


class _ScoreJob:
    """One run of the scoring job in one process (rank) of the group."""

    def __init__(self, config, ranker, items, input_path, output_dir, model_ref, world: World, progress, hook) -> None:
        self.created_dir = False  # this run created output_dir (_open)
        self.config = config
        self.ranker = ranker
        self.items = items
        self.input_path = input_path
        self.output_dir = output_dir
        self.world = world
        self.progress = progress and world.is_main
        self.hook = hook or (lambda point, shard: None)
        kind = input_kind(input_path)
        self.identity = {
            **model_ref,
            "input": str(input_path.resolve()),
            "input_fingerprint": fingerprint(input_path),
            "shard_users": config.score.shard_users,
            **ranker.settings(),
            **self.engine_settings(),
        }
        if kind == "events":  # how raw events are read and cleaned changes the histories
            self.identity["data"] = config.data.model_dump(mode="json")
        if "popularity_prior" in self.identity:  # every row moves with the input's counts: no carry-over across inputs
            self.identity["popularity_prior"] = {**self.identity["popularity_prior"],
                                                 "counts_of": self.identity["input_fingerprint"]}  # fmt: skip
        self.carry = None
        if config.score.changed_since:
            self.carry = CarryOver.open(config.score.changed_since, output_dir, self.identity)
            self.identity["changed_since"] = {"output": str(Path(config.score.changed_since).resolve()),
                                              "carried": self.carry is not None}  # fmt: skip

    def engine_settings(self) -> dict:
        """Identity entries the engine decides instead of this process's ranker (the Ray job: the
        device its actors score on); none here."""
        return {}

    # ------------------------------------------------------------------ rank 0 steps

    def _open(self) -> tuple[Manifest, ScoreInput | None]:
        """Rank 0: check/create the manifest, stage and open the input, fix the shard plan.

        An input refused here (bad data, no users) withdraws the manifest when it holds no shard
        plan yet (this run created it, or one of the same job was killed before it read its input:
        :func:`serving.manifest.withdraw_manifest`): the directory holds no rankings, so the same
        command with the input fixed is a new job there, not "another job's rankings"; the staged
        input goes too, but for the rejects file that an "every row was rejected" message names.
        """
        new_dir = self.created_dir = not self.output_dir.exists()
        manifest = open_manifest(self.output_dir, self.identity, overwrite=self.config.score.overwrite)
        if manifest.complete:  # a kill may have come between completing and releasing
            release_staged(self.output_dir / STAGED_INPUT)
            return manifest, None
        try:
            source = self.ranker.for_input(open_input(
                self.input_path, self.items, self.config.data, self.output_dir / STAGED_INPUT,
                time_gap_buckets=self.ranker.time_gap_buckets, max_unknown_share=self.config.score.max_unknown_share,
                new_item_ids=self.ranker.new_item_ids,
            ))  # fmt: skip
            self._use_popularity(source)  # refused (no event times) like any bad input: nothing left behind
            self._keep_item_rejects()
            rules = self.ranker.rules.stats() if self.ranker.rules is not None else {}  # a bad rule file: the same
            if self.ranker.rules is not None:
                rules.update(self.ranker.rules.absent_user_rows(source.user_ids()))
        except Exception as err:
            if manifest.users is None and not manifest.shards:  # nothing left behind but the rejects it names
                named = tuple(n for n in (schema.REJECTS_FILE,) if str(self.output_dir / STAGED_INPUT / n) in str(err))
                withdraw_manifest(self.output_dir, remove_dir=new_dir, keep=named)
            raise
        n_shards = max(1, -(-source.n_users // self.config.score.shard_users))
        if manifest.users is not None and (manifest.users, manifest.n_shards) != (source.n_users, n_shards):
            raise OutputDirError(
                f"{self.output_dir} was started on {manifest.users} users, the input now has {source.n_users}; "
                "choose a new --output or delete that directory"
            )
        manifest.users, manifest.n_shards, manifest.input_stats = source.n_users, n_shards, {**source.stats, **rules}
        manifest.input_stats[REJECTED_USERS] = self._list_rejected_users(source)
        write_json_atomic(self.output_dir / MANIFEST, manifest.to_json())
        return manifest, source

    def _list_rejected_users(self, source: ScoreInput) -> int:
        """Raw events: the users whose every row was rejected (none of them in the staged sequences) listed in
        ``_skipped/rejected-users.parquet`` (reason ``every_event_rejected``: every user of the input is ranked or
        listed); returns how many."""
        rejects = self.output_dir / STAGED_INPUT / schema.REJECTS_FILE
        rejected = rejected_users(source, rejects, self.config.data.columns.user_id) if source.kind == "events" else None
        if rejected is None:
            return 0
        (self.output_dir / SKIPPED_DIR).mkdir(exist_ok=True)
        write_atomic(self.output_dir / SKIPPED_DIR / REJECTED_USERS_FILE, lambda tmp: rejected.write_parquet(tmp))
        return rejected.height

    def _keep_item_rejects(self) -> None:
        """The rows of a ``score.items`` table file that were rejected, with their reasons, in
        ``OUTPUT/_input/item_rejects.parquet`` (kept with the job; the summary names it)."""
        new = self.ranker.new_items
        if new is not None and new.rejects is not None and new.rejects.height:
            staged = self.output_dir / STAGED_INPUT
            staged.mkdir(parents=True, exist_ok=True)
            with atomic_path(staged / ITEM_REJECTS_FILE) as tmp:
                new.rejects.write_parquet(tmp)

    def _use_popularity(self, source: ScoreInput) -> None:
        """``score.popularity_prior``: the item counts of the staged or prepared input (the job fingerprints it)."""
        self.ranker.use_input_popularity(source, self.items)

    def _finish(self) -> Manifest:
        """Rank 0, after every rank is done: complete the manifest, release the staged input."""
        manifest = finish_manifest(self.output_dir, self.manifest, self.world.size)
        if manifest.complete:
            self.hook("finished", -1)
            release_staged(self.output_dir / STAGED_INPUT)
        return manifest

    # ------------------------------------------------------------------ every rank

    def run(self) -> ScoreJobResult:
        started = time.perf_counter()
        self.manifest, source = self.world.run_on_main(self._open)
        if self.manifest.complete:
            if self.world.is_main:
                log.info("%s is complete already; nothing to score", self.output_dir)
            return self._result(started, scored=(0, 0))
        assert source is not None and self.manifest.n_shards is not None
        held_new = 0 if source.withheld is None else int((source.withheld >= self.ranker.first_new_item).sum())
        if self.ranker.bias is None:  # the other ranks (rank 0 read it in _open)
            self._use_popularity(source)
        self.hook("staged", -1)
        done = done_shards(self.output_dir, self.manifest)
        todo = [s for s in self.world.shards(self.manifest.n_shards) if s not in done]
        shard_users = self.config.score.shard_users
        my_users = sum(min(shard_users, source.n_users - s * shard_users) for s in todo)
        try:
            with _progress_bar(self.progress, my_users, self.world) as advance:
                users_scored = self._score_todo(source, todo, advance)
        except DataError:  # an input error found in a shard: the refused job leaves nothing behind (one process:
            if self.world.size == 1:  # torchrun's other ranks may still be writing)
                withdraw_job(self.output_dir, remove_dir=self.created_dir)
            raise
        self.world.barrier()
        self.manifest = self.world.run_on_main(self._finish)
        counts = self.world.all_gather((users_scored, len(todo)))
        return self._result(started, scored=(sum(c[0] for c in counts), sum(c[1] for c in counts)), held_new=held_new)

    def _score_todo(self, source: ScoreInput, todo: list[int], advance: Callable[[int], None]) -> int:
        """Score the shards ``todo`` of this rank one after another; returns the users scored.

        The Ray engine (:mod:`serving.ray_job`) replaces this loop by an actor pool."""
        users_scored = 0
        for shard in todo:
            users = self._score_shard(source, shard)
            users_scored += users
            advance(users)
        return users_scored

    def _score_shard(self, source: ScoreInput, shard: int) -> int:
        name, stats = write_shard(self.ranker, source, shard, self.config.score.shard_users, self.output_dir, self.carry)
        self.hook("written", shard)
        self._record(shard, name, stats)
        return stats["users"]

    def _record(self, shard: int, name: str, stats: dict[str, int]) -> None:
        """Record a shard whose part file is in place (manifest rule 2), then the ``recorded`` hook."""
        record_shard(self.output_dir, self.world.rank, self.manifest, name, stats)
        self.hook("recorded", shard)

    def _result(self, started: float, scored: tuple[int, int], held_new: int = 0) -> ScoreJobResult:
        """The job's summary; ``held_new``: new items withheld from every user (``ScoreInput.withheld``), not counted
        among the new items ranked."""
        m = self.manifest
        totals = m.totals()
        n_shards = m.n_shards or 0
        rejected = int(m.input_stats.get(REJECTED_USERS, 0))  # users of no staged row: in no shard
        return ScoreJobResult(
            output_dir=self.output_dir, users=(m.users or 0) + rejected, shards=n_shards,
            shards_skipped=n_shards - scored[1], rows=totals["rows"], seconds=time.perf_counter() - started,
            users_scored=scored[0], skipped_users=totals["skipped_users"] + rejected, unknown_items=int(m.input_stats.get("unknown_items", 0)),
            unknown_events=totals["unknown_events"], rejected_rows=int(m.input_stats.get("rejected_rows", 0)),
            world_size=self.world.size, carried_users=totals["carried_users"],
            carry_over="" if not self.config.score.changed_since else "open" if self.carry is not None else "closed",
            rules={key: int(v) for key, v in m.input_stats.items() if key.startswith(RULE_KINDS)},
            new_items=(self.ranker.new_items.count - held_new) if self.ranker.new_items else 0,
            new_items_source=self.ranker.new_items.source if self.ranker.new_items else "",
            new_items_rejected=self.ranker.new_items.rejected if self.ranker.new_items else 0,
            new_item_slots=self.ranker.slots, slots_asked=self.ranker.cfg.new_item_slots,
            new_item_places=totals["new_item_places"],
        )  # fmt: skip


def write_shard(ranker: ShardRanker, source: ScoreInput, shard: int, shard_users: int, output_dir: Path,
                carry: CarryOver | None = None) -> tuple[str, dict[str, int]]:  # fmt: skip
    """Read, rank and write one shard: its part file is in place (atomically) when this returns.

    Args:
        ranker: the model and settings; source: the job's input; shard: index (users
            ``shard * shard_users ..``); output_dir: the rankings directory; carry: the previous
            output whose rows unchanged users keep (``score.changed_since``).

    Returns:
        ``(part file name, stats)`` with :data:`serving.manifest.SHARD_STATS`, as the manifest records them.
        The caller records the shard.
    """
    batch = source.read_shard(shard * shard_users, shard_users)
    fingerprints = history_fingerprints(batch, source.withheld)
    carried, changed = carry.split(fingerprints) if carry is not None else (None, None)
    rankings, _ = ranker.rank(batch.user_ids, batch.histories, batch.gaps, only=changed, new_seen=batch.new_seen,
                              withheld=source.withheld)  # fmt: skip
    if carried is not None and carried.height:  # previous rows of the unchanged users, in the same order
        rankings = pl.concat([rankings, carried.select(rankings.columns).cast(rankings.schema)]).sort(
            schema.USER_ID, schema.RANK).rechunk()  # fmt: skip
    unranked = batch.skipped(ranked=rankings.get_column(schema.USER_ID).unique())
    if ranker.rules is not None:  # with rules, "every item seen" is "every item seen, denied or not allowed"
        unranked = ranker.rules.explain(unranked)
    skipped = unranked.height
    name = part_name(shard)
    (output_dir / FINGERPRINTS_DIR).mkdir(exist_ok=True)  # before the part file, as the skipped users
    write_atomic(output_dir / FINGERPRINTS_DIR / name, lambda tmp: fingerprints.write_parquet(tmp))
    if skipped:  # before the part file: a shard whose part file is in place has its list too
        (output_dir / SKIPPED_DIR).mkdir(exist_ok=True)
        write_atomic(output_dir / SKIPPED_DIR / name, lambda tmp: unranked.write_parquet(tmp))
    write_atomic(output_dir / name, lambda tmp: rankings.write_parquet(tmp))
    stats = {"users": batch.user_ids.len(), "rows": rankings.height, "skipped_users": skipped,
             "unknown_events": batch.unknown_events,
             "carried_users": 0 if changed is None else int((~changed).sum()),
             "new_item_places": ranker.new_item_rows(rankings)}  # fmt: skip
    return name, stats


def _speed_label(task) -> str:
    """``"N users/s"`` for a rich task: the mean over the whole run once finished, else rich's recent rate.

    Rich's windowed ``speed`` is ``None`` (shown as 0) when all users came in one or two advances,
    so a finished task, or one with no rate yet, shows ``completed / elapsed`` (users per second).
    """
    speed = task.speed
    if (task.finished or speed is None) and task.elapsed:
        speed = task.completed / task.elapsed
    return f"{speed or 0:,.0f} users/s"


class _progress_bar:
    """Rich progress bar over users with users/s; a no-op when disabled or when standard output (where it draws)
    is not a terminal: a log file gets the summary line only, as training logs lines instead of a bar. Yields
    ``advance(n)``."""

    def __init__(self, enabled: bool, total: int, world: World) -> None:
        self.enabled = enabled and getattr(sys.stdout, "isatty", lambda: False)()
        self.total, self.world = total, world

    def __enter__(self) -> Callable[[int], None]:
        if not self.enabled:
            return lambda n: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        class _Speed(ProgressColumn):
            def render(self, task) -> Text:
                return Text(_speed_label(task))

        label = "scoring users" + (f" (rank 0 of {self.world.size})" if self.world.size > 1 else "")
        self._bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _Speed(),
            TimeElapsedColumn(), TimeRemainingColumn(),
        )  # fmt: skip
        self._bar.__enter__()
        task = self._bar.add_task(label, total=self.total)
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._bar.__exit__(*exc)
