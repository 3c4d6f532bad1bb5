"""``train.init_from``: the model a new training run starts from, and the lineage it leaves.

The job-layer half of warm starting (the weights are built by
:mod:`recsys_alibi.training.warm_start`): resolve the URI (``champion`` is
``models:/<tracking.registered_model>@<tracking.champion_alias>``, pinned to the version holding
the alias now; no champion yet: the run starts from scratch and says so), load the model and its
vocabulary, map the prepared directory's items onto the model's by raw ``item_id``
(:func:`serving.inputs.vocabulary_remap`, as ``score`` and the promotion gate do), refuse another
architecture (one line, before training), and apply the warm schedule (``train.warm``).

A warm run writes ``checkpoints/<run_id>.warm_start.json`` beside its checkpoint directory: a
resumed run (``--resume``) finds it, keeps the warm schedule and never loads the parent's weights over its
checkpoint.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from recsys_alibi.atomic import write_json_atomic
from recsys_alibi.config import WARM_EPOCHS_DIVISOR, WARM_LR_FACTOR, JobConfig, check_warm_schedule, with_overrides
from recsys_alibi.data.partition import read_lengths
from recsys_alibi.data.prepare import read_items
from recsys_alibi.tracking import tracking_uri

log = logging.getLogger(__name__)

MARKER = "warm_start.json"  # checkpoints/<run_id>.warm_start.json of a warm-started run
USERS_TAG, EVENTS_TAG = "recsys_alibi.data.users", "recsys_alibi.data.events"  # every run: size of its prepared data


@dataclass(frozen=True)
class WarmStart:
    """Where a run started from and what its data has that the parent's had not.

    ``uri`` is None for a cold start asked for by ``champion`` with no champion yet (``reason``
    says so). ``new_users`` / ``new_events``: users and events of this data minus the parent's
    (its run tags); exact when the data only grew, as under ``data.append``; None when the parent
    run has no counts or this data has fewer users or fewer events than the parent's (it is not the
    parent's data grown, e.g. a champion trained in another output directory on another log). ``state``: the initial weights (not kept for a resumed run).
    """

    uri: str | None
    parent_run_id: str | None = None
    kept_items: int = 0
    new_items: int = 0
    dropped_items: int = 0
    new_users: int | None = None
    new_events: int | None = None
    reason: str = ""
    state: dict | None = field(default=None, repr=False, compare=False)

    def line(self) -> str:
        """One line for the run's summary."""
        if self.uri is None:
            return f"cold start: {self.reason}"
        users = "n/a" if self.new_users is None else self.new_users
        events = "n/a" if self.new_events is None else self.new_events
        return (
            f"warm start from {self.uri} (run {self.parent_run_id}): {self.kept_items} items kept, {self.new_items} new, "
            f"{self.dropped_items} dropped; {users} new users, {events} new events"
        )

    def tags(self) -> dict[str, str]:
        """The run's lineage tags ``lineage.init_from``, ``lineage.parent_run_id``, ``lineage.new_*``."""
        if self.uri is None:
            return {"lineage.init_from": f"none ({self.reason})"}
        counts = {"kept_items": self.kept_items, "new_items": self.new_items, "dropped_items": self.dropped_items,
                  "new_users": self.new_users, "new_events": self.new_events}  # fmt: skip
        return {
            "lineage.init_from": self.uri, "lineage.parent_run_id": str(self.parent_run_id),
            **{f"lineage.{key}": str(value) for key, value in counts.items() if value is not None},
        }  # fmt: skip

    def callbacks(self) -> list:
        """``[InitialWeights]`` when there are weights to load, else ``[]``."""
        if self.state is None:
            return []
        from recsys_alibi.training.warm_start import InitialWeights

        return [InitialWeights(self.state)]

    def write_marker(self, checkpoint_dir: Path) -> None:
        """``<run_id>.warm_start.json`` beside the run's checkpoint directory (read back on resume)."""
        if self.uri is not None:
            checkpoint_dir.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(marker_path(checkpoint_dir), {k: v for k, v in asdict(self).items() if k != "state"})


def marker_path(checkpoint_dir: Path) -> Path:
    """Where a warm run's start is recorded: beside its checkpoint directory, not in it (Lightning wants it empty)."""
    return checkpoint_dir.with_name(f"{checkpoint_dir.name}.{MARKER}")


def data_counts(prepared_dir: Path) -> dict[str, str]:
    """``{USERS_TAG, EVENTS_TAG}`` of a prepared directory (only its ``length`` column is read)."""
    lengths = read_lengths(prepared_dir)
    return {USERS_TAG: str(lengths.size), EVENTS_TAG: str(int(lengths.sum()))}


def resolve_warm_start(config: JobConfig, prepared_dir: Path, resume: Path | None,
                       champion=None) -> tuple[JobConfig, WarmStart | None]:  # fmt: skip
    """The config to train with (the warm schedule applied) and the run's warm start, or None (cold).

    Args:
        resume: the ``last.ckpt`` being resumed, or None for a new run. A resumed warm run keeps
            the warm schedule and loads no weights (its checkpoint holds them).
        champion: ``train.init_from=champion``: the version the pipeline pinned when it started
            (:class:`pipelines.promotion.Champion`); None: the alias read now (``train`` alone).

    Raises:
        ModelUriError: ``train.init_from`` names no loadable model.
        WarmStartError: that model has another architecture (one line naming the keys).
    """
    if resume is not None:
        marker = marker_path(resume.parent)
        if not marker.is_file():
            return config, None
        return warm_schedule(config), WarmStart(**json.loads(marker.read_text()))
    source = config.train.init_from
    if source is None:
        return config, None
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(config.tracking))
    if source == "champion":
        from pipelines.promotion import pin_champion

        name, alias = config.tracking.registered_model, config.tracking.champion_alias
        champion = pin_champion(config) if champion is None else champion
        if champion.uri is None:
            reason = f"train.init_from=champion and models:/{name}@{alias} does not exist yet"
            log.info("%s: training from scratch", reason)
            return config, WarmStart(uri=None, reason=reason)
        source = champion.uri
    warm = load_warm_start(config, prepared_dir, source)
    log.info(warm.line())
    return warm_schedule(config), warm


def load_warm_start(config: JobConfig, prepared_dir: Path, uri: str) -> WarmStart:
    """Load ``uri`` and build the initial weights for ``config.model`` on ``prepared_dir``'s vocabulary.

    Raises:
        ModelUriError, WarmStartError: as :func:`resolve_warm_start`.
    """
    from recsys_alibi.tracking import load_ranker
    from recsys_alibi.training.warm_features import warm_features
    from recsys_alibi.training.warm_start import warm_state_dict
    from serving.inputs import unknown_events, vocabulary_remap

    loaded = load_ranker(uri)
    items = read_items(prepared_dir)
    remap, unknown = vocabulary_remap(items, loaded.items)  # new item_idx -> old item_idx by raw item_id, 0: new
    rows = np.arange(items.height + 1, dtype=np.int64) if remap is None else remap
    features = warm_features(loaded.model, config, prepared_dir, items.height, source=uri)  # None: no item features
    warm = config.train.warm
    state = warm_state_dict(loaded.model.state_dict(), rows, loaded.model.cfg, config.model, config.seed, source=uri,
                            features=features)  # fmt: skip
    if warm.new_item_rows == "context" and remap is not None and features is None:
        state = imprint_new_rows(state, loaded.model, config, prepared_dir, rows)
    kept = items.height - unknown
    new_users = new_events = None
    unseen, total = unknown_events(items, rows != 0)  # events on items the parent never saw (rows[i] == 0: new)
    unknown_share = unseen / max(total, 1)
    if unknown_share > config.score.max_unknown_share:  # another catalog: integer ids overlap by chance
        log.warning("warning: %.0f%% of this data's events are on items %s never saw (%d of %d items), more than "
                    "score.max_unknown_share=%g: it is probably not an earlier model of this data (integer ids of two "
                    "catalogs overlap by chance), so its item rows are matched by id alone; warm start from a model of "
                    "this log, or train from scratch", 100 * unknown_share, uri, unknown, items.height,
                    config.score.max_unknown_share)  # fmt: skip
    elif loaded.run_id is not None:
        now = data_counts(prepared_dir)
        parent = _parent_counts(loaded.run_id)
        if parent is not None:
            grown = int(now[USERS_TAG]) - parent[0], int(now[EVENTS_TAG]) - parent[1]
            if min(grown) >= 0:  # fewer users or events: not the parent's data grown (another log): no count
                new_users, new_events = grown
            else:
                log.warning("warning: %s trained on %d users and %d events, more than this data holds (%s, %s): it is "
                            "not an earlier model of this data (another log, or one that saw later days); a daily job "
                            "wants its own tracking.registered_model (or tracking store)", uri, *parent,
                            now[USERS_TAG], now[EVENTS_TAG])  # fmt: skip
    return WarmStart(
        uri=uri, parent_run_id=loaded.run_id, kept_items=kept, new_items=unknown,
        dropped_items=loaded.items.height - kept, new_users=new_users, new_events=new_events, state=state,
    )  # fmt: skip


def imprint_new_rows(state: dict, parent, config: JobConfig, prepared_dir: Path, rows: np.ndarray) -> dict:
    """``state`` with each new item that occurs in the training part of ``prepared_dir`` (under
    ``evaluate.protocol``, validation and test events excluded) imprinted from the parent's hidden states
    before its occurrences (``train.warm.new_item_rows: context``, :mod:`recsys_alibi.training.context_rows`);
    the others keep their rows. ``rows``: (N + 1,) new item_idx -> the parent's, 0 for a new item."""
    import polars as pl
    import torch

    from recsys_alibi.data.loader import FlatSequences
    from recsys_alibi.data.partition import read_fit_cutoff
    from recsys_alibi.data.sequences import read_sequences
    from recsys_alibi.data.schema import ITEM_IDX, TIMESTAMP
    from recsys_alibi.data.splits import fit_length
    from recsys_alibi.training.context_rows import context_means, imprinted_rows, occurrence_contexts
    from recsys_alibi.training.warm_start import ITEM_TABLE_KEY

    protocol = config.evaluate.protocol
    cutoff = read_fit_cutoff(prepared_dir, protocol, config.evaluate.temporal_cutoff)
    seqs = read_sequences(prepared_dir).with_columns(fit_length(protocol, cutoff).alias("_m"))
    train = seqs.select(  # each history's training part: the fit prefix without its validation target
        pl.col(ITEM_IDX).list.head(pl.col("_m") - 1), pl.col(TIMESTAMP).list.head(pl.col("_m") - 1)
    )  # fmt: skip
    new = np.asarray(rows) == 0
    new[0] = False
    contexts, times, targets = occurrence_contexts(
        FlatSequences.from_series(train.get_column(ITEM_IDX)), FlatSequences.from_series(train.get_column(TIMESTAMP)),
        np.asarray(rows, dtype=np.int64), new, int(parent.cfg.max_len),  # a logged model's max_len is resolved
    )  # fmt: skip
    if targets.size == 0:
        return state
    means, counts, overall = context_means(parent, contexts, times, targets, len(rows))
    table = state[ITEM_TABLE_KEY].clone()
    seen = torch.from_numpy(counts > 0)
    table[seen] = imprinted_rows(table[torch.from_numpy(~new)][1:], means[seen], overall)
    log.info("train.warm.new_item_rows=context: %d of %d new items imprinted from %d contexts", int(seen.sum()),
             int(new.sum()), targets.size)  # fmt: skip
    return {**state, ITEM_TABLE_KEY: table}


def _parent_counts(run_id: str) -> tuple[int, int] | None:
    """(users, events) of the parent run's prepared data from its tags (``lineage.data.*`` of older pipeline runs)."""
    import mlflow

    tags = mlflow.MlflowClient().get_run(run_id).data.tags
    users = tags.get(USERS_TAG, tags.get("lineage.data.users"))
    events = tags.get(EVENTS_TAG, tags.get("lineage.data.events"))
    return None if users is None or events is None else (int(users), int(events))


def warm_schedule(config: JobConfig) -> JobConfig:
    """``config`` with the warm schedule in place of the cold one (``train.warm``; docs/scheduling.md).

    A key of ``train.warm`` left unset takes the rule measured by the ML-100K replay (docs/scheduling.md):
    ``max_epochs`` a quarter of ``train.max_epochs`` (rounded up); ``lr`` twice the cold run's and its
    ``warmup_steps``, so the learning rate is re-warmed past the scratch peak and decayed again (Ibrahim et
    al. 2024, arXiv 2403.08763; a fifth of the rate moved new item rows a twentieth as far as a scratch run and
    lost; twice the peak was ahead of the peak on the returning users' validation, ML-100K seeds 4-6, 2026-12-05);
    ``patience`` stays ``train.patience``.

    Raises:
        ConfigError: ``train.context_schedule`` switches after the warm run's last epoch
            (:func:`recsys_alibi.config.check_warm_schedule`, also checked when the config is loaded).
    """
    check_warm_schedule(config)
    train, warm = config.train, config.train.warm
    rule = {
        "max_epochs": -(-train.max_epochs // WARM_EPOCHS_DIVISOR),
        "lr": train.lr * WARM_LR_FACTOR,
        "warmup_steps": train.warmup_steps,
        "patience": train.patience,
    }
    return with_overrides(config, train={key: value if (value := getattr(warm, key)) is not None else default
                                         for key, default in rule.items()})  # fmt: skip
