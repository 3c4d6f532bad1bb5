"""Replay a retraining schedule on a timestamped log: warm start vs retraining from scratch vs not retraining.

Run (from the repository root; a heavy job: one at a time, one torch thread; it can take longer than
a session: start it in the background and start it again with the same command after a stop):

    .venv/bin/python benchmarks/replay.py --config configs/movielens-100k.yaml \\
        --input ../shared/data/ml-100k/u.data --format movielens --start 0.5 --period-days 14 \\
        --seeds 1 2 3 --workdir runs/replay-ml100k --output runs/replay-ml100k.json

The log is read with the project's readers (``data.*`` of the config) and cut at boundaries
``b_0 < b_1 < ...``: ``b_0`` is the ``--start`` quantile of the timestamps, then one boundary every
``--period-days``. For each seed, step 0 prepares the events before ``b_0`` and trains a model from
scratch. Step ``k >= 1`` appends the period ``[b_(k-1), b_k)`` to the prepared directory (``prepare
--append``: the directory of a full prepare of every event before ``b_k``), then, by ``--arms``:

* ``scratch``: the config's recipe from random weights;
* ``warm``: ``train.init_from`` the previous step's warm model (step 1: the step-0 model; a chain of
  warm starts, as the daily job runs), with the config's ``train.warm`` schedule;
* ``stale``: no training: the previous step's warm model, scored as it is (targets it does not
  know are its misses);
* with ``--gate``, the warm chain is the daily ``pipeline``'s: each warm model goes through its promotion
  gate (:func:`pipelines.promotion.against_loaded`: the step's leave-one-out validation,
  ``tracking.promotion_metric`` and ``promotion_margin``, the champion's unknown targets its misses) against
  the previous step's ``warm`` model (the champion); ``warm`` is then the model the pipeline serves (the new
  one when promoted, else the champion: ``candidate_uri`` and ``gate`` say which), and the next step
  warm-starts from it. Without ``--gate`` every warm model is served (the chain of warm starts alone);
* ``warm_full`` (diagnosis): the warm initialisation with the scratch schedule;
* ``scratch_budget`` (diagnosis): from scratch in the warm run's time: its number of epochs (an
  epoch costs the same on the same data; a clock budget would follow the machine's load);
* ``scratch_features`` / ``warm_features`` (item side features, issue 44): ``scratch`` and ``warm``
  with ``model.item_features.enabled`` (the data must declare an item table: ``--set data.items=...
  --set data.item_features.categorical=[...]``; ``benchmarks/movielens_items.py`` writes MovieLens'
  tables); the feature chain warm-starts from its own previous model (step 0: a feature model from
  scratch), so a new item's first row comes from its features;

and evaluates each on the NEXT period ``[b_k, b_(k+1))``: every user with history before ``b_k``
and an event in the next period is a test user; the target is that user's first next-period event
whose item is in step ``k``'s catalog and not already in the user's history; it is ranked on the
full catalog with the history's items excluded (``replay_scoring``).

The JSON (written after every trained arm and step) holds, per seed (``runs``), ``step0`` and the
steps: ``new_events``, ``new_items``, ``new_users``, ``test_users``, per arm ``NDCG@10``, ``HR@10``,
``train_seconds``, ``epochs``, ``val_NDCG@10`` (the step's own leave-one-out validation, what a
recipe is chosen on), ``val_returning_NDCG@10`` (the same split on the users with an event in the step's own
new period ``[b_(k-1), b_k)`` only: validation over all users hides a gap on them, which the next period
shows; ``benchmarks/replay_validation.py`` gives paired intervals), ``by_target_kind`` (targets whose
item entered the catalog at this step, at an earlier step, or at step 0), ``top10_share_new`` (share of the top-10 slots held by items that
entered at this step), ``unservable`` and, for warm arms, ``moved`` (mean L2 distance the old and
the new item rows moved from their initial values); and the differences ``warm_minus_<arm>`` with
percentile-bootstrap 95 % intervals of the per-user paired difference
(:func:`recsys_alibi.evaluation.paired.paired_difference`). Top level: ``seeds``,
``pooled_warm_minus_scratch`` and ``pooled_warm_minus_stale`` (``{"NDCG@10": {"difference", "ci95",
"pairs", "ci95_by_user", "users"}, "HR@10": ...}`` over every (seed, step, user); ``ci95_by_user`` resamples
whole users, whose pairs recur over seeds and steps), ``by_step`` (the same per step over the
seeds), ``warm_over_scratch_epochs`` (the time ratio in epochs, free of the load),
``trend_warm_minus_scratch`` and the other ``trend_*`` (the least-squares slope per step of the pooled
difference, ``{"NDCG@10": {"slope_per_step", "ci95", "pairs"}}``: a downward trend has its interval below
0), ``train_seconds`` per arm, ``warm_over_scratch_train_time`` and
``by_target_kind`` pooled. The per-user values are in ``<output>.per_user.json``; ``--plot`` (default
the JSON path with ``.png``) draws each arm per step.

``--reuse scratch=OLD.json`` (repeatable, any arm outside the warm chain) takes that arm of every step
from an earlier replay of the same log and periods (its ``.per_user.json``) instead of training and
scoring it again: after a change of ``train.warm`` only, the scratch arm is the same, and it is most of
the replay's time. The earlier replay must have scored the same test users at every step (else one line,
exit 1); a seed it does not hold trains and scores the arm as usual.

Resuming: stopped by Ctrl-C or ``kill`` (SIGINT, SIGTERM), the replay says ``interrupted; re-run the same
command to resume from step N`` on stderr and exits with 130 or 143. Finished steps are read back from the
JSON (and its per-user file), the prepared
directory is rebuilt up to them, finished arms of the step in progress are kept, and an arm killed
mid-way continues from its last epoch checkpoint (``train.resume`` in its folder
``<workdir>/seed-<S>/step-<k>-<arm>``). Models are not registered; MLflow runs go to
``MLFLOW_TRACKING_URI`` or ``<workdir>/mlflow.db``. A seed whose next step needs a model that is no
longer in the tracking store (a new checkout: the JSON outlived ``<workdir>``) starts over, with a
line that says so; its finished steps are not mixed with a new chain.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.diagnostics.machine import command_line, machine_line

DAY = 86_400
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"  # the committed figures: no default writes there
ARMS = ("scratch", "warm", "stale", "warm_full", "scratch_budget", "scratch_features", "warm_features")
DEFAULT_ARMS = ("scratch", "warm", "stale")  # the final comparison; the other two diagnose
WARM_ARMS = ("warm", "warm_full", "warm_features")  # initialised from the previous step's warm model (of their chain)
TRAINED_ARMS = ("scratch", "warm", "warm_full", "scratch_budget", "scratch_features", "warm_features")  # in this order
FEATURE_ARMS = ("scratch_features", "warm_features")  # model.item_features.enabled (scratch_budget needs warm's epochs)
# pairs compared (a - b), when both arms ran: warm against the others, each feature arm against its id-only twin
COMPARED = (("warm", "scratch"), ("warm", "stale"), ("warm", "warm_full"), ("warm", "scratch_budget"),
            ("warm_features", "warm"), ("scratch_features", "scratch"), ("warm_features", "scratch_features"))
METRICS = ("NDCG@10", "HR@10")


def read_log(config, input_path: str, fmt: str | None) -> pl.DataFrame:
    """The canonical events (``user_id``, ``item_id``, ``timestamp``) of a log, read as ``prepare`` reads it."""
    from recsys_alibi.data.ingest import canonical_events
    from recsys_alibi.data.readers import scan_source

    source = scan_source(config.data, input_path, fmt)
    return canonical_events(source, config.data).select("user_id", "item_id", "timestamp").collect()


def boundaries(timestamps: np.ndarray, start: float, period_days: float) -> list[int]:
    """``[b_0, b_1, ...]``: ``b_0`` the ``start`` quantile (seconds), then every ``period_days``;
    the last boundary is the first one past the last event (so every period but the last is whole).

    >>> boundaries(np.arange(0, 10 * DAY, DAY), 0.5, 2)
    [388800, 561600, 734400, 907200]
    """
    first = int(np.quantile(timestamps, start))
    step = int(period_days * DAY)
    last = int(timestamps.max())
    return [first + i * step for i in range((last - first) // step + 2)]


def next_period_examples(prepared: Path, events: pl.DataFrame, lo: int, hi: int, model) -> pl.DataFrame:
    """Test examples of the period ``[lo, hi)`` for a model trained on ``prepared`` (module doc).

    Returns:
        ``user_id``, ``history`` list<Int32>, ``targets`` list<Int32> (one item), and
        ``history_time_gaps`` when ``model`` reads time gaps.
    """
    from recsys_alibi.data.prepare import read_items, read_sequences
    from recsys_alibi.data.splits import HISTORY, HISTORY_TIME_GAPS, TARGETS
    from recsys_alibi.data.schema import TIME_GAPS
    from recsys_alibi.data.time_gaps import sequences_for

    sequences = sequences_for(model, read_sequences(prepared))
    items = read_items(prepared).select("item_idx", "item_id")
    upcoming = (
        events.filter((pl.col("timestamp") >= lo) & (pl.col("timestamp") < hi))
        .join(items, on="item_id", how="inner")  # items of this step's catalog
        .join(sequences.select("user_id", "item_idx").explode("item_idx").rename({"item_idx": "seen"}),
              left_on=["user_id", "item_idx"], right_on=["user_id", "seen"], how="anti")  # not already seen
        .sort("timestamp", "item_idx")
        .group_by("user_id", maintain_order=True)
        .first()
    )  # fmt: skip
    gaps = [pl.col(TIME_GAPS).cast(pl.List(pl.Int32)).alias(HISTORY_TIME_GAPS)] if TIME_GAPS in sequences.columns else []
    return sequences.join(upcoming.select("user_id", "item_idx"), on="user_id", how="inner").select(
        "user_id",
        pl.col("item_idx").cast(pl.List(pl.Int32)).alias(HISTORY),
        pl.concat_list(pl.col("item_idx_right").cast(pl.Int32)).alias(TARGETS),
        *gaps,
    )


def grow(config, period: Path, prepared: Path, first: bool) -> None:
    """Prepare the first period into ``prepared``, or append a later one to it (``prepare --append``)."""
    from recsys_alibi.data.append import append
    from recsys_alibi.data.prepare import prepare

    data = config.data.model_copy(update={"format": "parquet"})
    (prepare if first else append)(data, period, prepared)


def counts(prepared: Path) -> tuple[int, set, set]:
    """(events, user ids, item ids) of a prepared directory."""
    from recsys_alibi.data.prepare import read_items, read_sequences

    sequences = read_sequences(prepared)
    return int(sequences["length"].sum()), set(sequences["user_id"].to_list()), set(read_items(prepared)["item_id"].to_list())




def arm_config(config, arm: str, output: Path, init_from: str | None, budget_epochs: int | None = None):
    """The config one arm trains with (module doc): ``train.resume`` in its own folder, so an arm killed
    mid-way continues from its last epoch checkpoint when the replay is started again."""
    from recsys_alibi.config import with_overrides

    train: dict = {"resume": True, "init_from": init_from if arm in WARM_ARMS else None}
    # a feature arm: the config's model.item_features (id_min_events, id_dropout) turned on; an id-only arm: none
    features = {"item_features": {**config.model.item_features.model_dump(), "enabled": True} if arm in FEATURE_ARMS
                else {"enabled": False, "id_min_events": 0, "id_dropout": 0.0}}  # fmt: skip
    if arm not in WARM_ARMS:
        train["warm"] = {}  # scratch: no warm schedule
    if arm == "warm_full":  # the warm initialisation with the scratch schedule
        t = config.train
        train["warm"] = {"max_epochs": t.max_epochs, "lr": t.lr, "warmup_steps": t.warmup_steps, "patience": t.patience}
    if arm == "scratch_budget":  # from scratch within the warm run's training time: as many epochs (an epoch costs
        train["max_epochs"] = budget_epochs or 1  # the same on the same data; a clock budget would follow the load)
    return with_overrides(config, output=str(output), train=train, model=features)


def train_arm(config, prepared: Path) -> dict:
    """Train (no registry): ``uri``, ``train_seconds``, ``epochs``, ``val_NDCG@10`` (the step's own validation)."""
    from pipelines.train import run_train

    trained = run_train(config, prepared, progress=False, register=False)
    return {"uri": trained.model.uri, "train_seconds": round(trained.train_seconds, 1), "epochs": trained.epochs,
            "val_NDCG@10": trained.best_val_ndcg_at_10, "resumed": trained.resumed_from is not None}  # fmt: skip


def movement(config, prepared: Path, parent_uri: str, child_uri: str) -> dict:
    """:func:`replay_scoring.row_movement` of a warm-started model (its initial rows rebuilt as the run built them)."""
    from pipelines.init_from import load_warm_start
    from recsys_alibi.tracking import load_ranker
    from replay_scoring import row_movement
    from serving.inputs import vocabulary_remap
    from recsys_alibi.data.sequences import read_items

    parent, child = load_ranker(parent_uri), load_ranker(child_uri)
    quiet = logging.getLogger("pipelines.init_from")  # its INFO lines were printed as the arm was trained
    level = quiet.level
    quiet.setLevel(max(level, logging.WARNING))
    try:
        init = load_warm_start(config, prepared, parent_uri).state
    finally:
        quiet.setLevel(level)
    remap, _ = vocabulary_remap(read_items(prepared), parent.items)
    new_rows = np.zeros(0, dtype=np.int64) if remap is None else np.flatnonzero(remap == 0)[1:]
    return row_movement(parent.model.state_dict(), init, child.model.state_dict(), new_rows)


def write_periods(events: pl.DataFrame, bounds: list[int], folder: Path, upto: int) -> list[Path]:
    """Periods 0..``upto`` of the log as the replay cuts them (period 0: before ``bounds[0]``; period k:
    ``[bounds[k-1], bounds[k])``), one ``period-NNN.parquet`` each in ``folder``; a file already there is kept
    (a resumed replay reuses its periods)."""
    folder.mkdir(parents=True, exist_ok=True)
    edges = [int(events["timestamp"].min()), *bounds]
    files = []
    for k in range(upto + 1):
        path = folder / f"period-{k:03d}.parquet"
        if not path.exists():
            events.filter((pl.col("timestamp") >= edges[k]) & (pl.col("timestamp") < edges[k + 1])).write_parquet(path)
        files.append(path)
    return files


def replayed_log(args: argparse.Namespace, overrides: list[str]) -> tuple:
    """(config, events, bounds) of a finished replay's recorded command ``args`` (:func:`read_replay`): its config
    with ``overrides`` (and ``train.init_from=champion``, as the replay loads it), its log read as it read it,
    and its period boundaries."""
    from recsys_alibi.config import load_config

    config = load_config(args.config, [*overrides, "train.init_from=champion"])
    events = read_log(config, args.input or config.data.input, args.format)
    return config, events, boundaries(events["timestamp"].to_numpy(), args.start, args.period_days)


def rebuild(config, files: list[Path], prepared: Path, upto: int) -> None:
    """``prepared`` = period 0 prepared, then periods 1..``upto`` appended (a resumed replay starts here)."""
    if prepared.exists():
        shutil.rmtree(prepared)
    grow(config, files[0], prepared, first=True)
    for k in range(1, upto + 1):
        grow(config, files[k], prepared, first=False)


def prepared_steps(config, events: pl.DataFrame, bounds: list[int], last: int, folder: Path):
    """Yield ``(k, prepared)`` for k = 0..``last``: the replay's prepared data of step k in ``folder`` (period 0
    prepared, then each later period appended as the replay appended it); for scripts that score a finished
    replay's models (``replay_prior.py``, ``replay_horizon.py``)."""
    files = write_periods(events, bounds, folder / "periods", last)
    prepared = folder / "prepared"
    for k in range(last + 1):
        rebuild(config, files, prepared, 0) if k == 0 else grow(config, files[k], prepared, first=False)
        yield k, prepared


def gate_record(config, prepared: Path, candidate_uri: str, champion_uri: str) -> dict:
    """The daily pipeline's promotion decision (``--gate``, module doc) of the warm model ``candidate_uri``
    against ``champion_uri`` on ``prepared``: ``promoted``, ``reason``, ``new`` and ``champion`` (their
    ``tracking.promotion_metric`` on the validation examples; ``champion`` None when it can serve none)."""
    from pipelines.promotion import against_loaded, model_validation_metrics
    from recsys_alibi.data.prepare import read_items, read_sequences
    from recsys_alibi.tracking import load_ranker

    new, champion = load_ranker(candidate_uri), load_ranker(champion_uri)
    items, sequences = read_items(prepared), read_sequences(prepared)
    value = model_validation_metrics(config, new.model, sequences, items.height)[config.tracking.promotion_metric]
    decision, held = against_loaded(config, champion, "(the previous step's model)", value, items, sequences)
    return {"promoted": decision.promote, "reason": decision.reason, "new": value, "champion": held}


def replay_seed(config, events: pl.DataFrame, bounds: list[int], workdir: Path, arms: list[str], last: int,
                state: dict, save, reused: dict[str, list[dict]] | None = None, gate: bool = False) -> None:  # fmt: skip
    """Every step of one seed (module doc), continuing after the steps already in ``state``.

    ``state`` (this seed's part of the JSON): ``step0`` (the first model), ``steps`` (finished steps) and
    ``partial`` (the arms of the step in progress); ``save()`` is called after every trained arm and step.
    ``reused``: arm -> the steps (with ``per_user``) of an earlier replay of this seed whose records of that
    arm are taken as they are, neither trained nor scored again (``--reuse``). ``gate``: the warm chain goes
    through the pipeline's promotion gate (``--gate``).

    Raises:
        SystemExit: a reused replay lacks a step, or scored other test users at it (one line).
    """
    reused = reused or {}
    from recsys_alibi.tracking import load_ranker
    from replay_scoring import entry_steps, returning_users, score_model, validation_per_user

    if len(state.get("steps", [])) < last and _lost_models(state):
        print(f"seed {config.seed}: the models its finished steps continue from are not in the tracking store "
              "(a new checkout or another MLFLOW_TRACKING_URI): this seed starts over", flush=True)  # fmt: skip
        state.clear()
        shutil.rmtree(workdir, ignore_errors=True)  # no arm resumes from a checkpoint of the lost chain
    files = write_periods(events, bounds, workdir / "periods", len(bounds) - 1)
    entry = entry_steps(events, bounds)
    steps = state.setdefault("steps", [])
    prepared = workdir / "prepared"
    rebuild(config, files, prepared, len(steps))
    if "step0" not in state:
        state["step0"] = train_arm(arm_config(config, "scratch", workdir / "step-000", None), prepared)
        save()
    if "step0_features" not in state and any(a in FEATURE_ARMS for a in arms):  # the feature chain's first model
        state["step0_features"] = train_arm(arm_config(config, "scratch_features", workdir / "step-000-features", None),
                                            prepared)  # fmt: skip
        save()
    before = counts(prepared)
    for k in range(len(steps) + 1, last + 1):
        parent = steps[-1]["arms"]["warm"]["uri"] if steps else state["step0"]["uri"]  # the warm chain
        parents = {arm: parent for arm in WARM_ARMS}
        if "warm_features" in arms:
            parents["warm_features"] = steps[-1]["arms"]["warm_features"]["uri"] if steps else state["step0_features"]["uri"]
        grow(config, files[k], prepared, first=False)
        now = counts(prepared)
        partial = state.get("partial") or {}
        if partial.get("step") != k:
            partial = state["partial"] = {"step": k, "arms": {}}
        for arm in (a for a in TRAINED_ARMS if a in arms and a not in reused):
            if arm not in partial["arms"]:
                budget = partial["arms"].get("warm", {}).get("epochs")
                cfg = arm_config(config, arm, workdir / f"step-{k:03d}-{arm}", parents.get(arm), budget)
                partial["arms"][arm] = train_arm(cfg, prepared)
                save()
        if gate and "gate" not in partial["arms"]["warm"]:
            partial["arms"]["warm"]["gate"] = gate_record(config, prepared, partial["arms"]["warm"]["uri"], parent)
            save()
        lo, hi = bounds[k], bounds[k + 1]
        record = {
            "step": k, "period_end": dt.datetime.fromtimestamp(lo, dt.timezone.utc).date().isoformat(),
            "new_events": now[0] - before[0], "new_items": len(now[2] - before[2]), "new_users": len(now[1] - before[1]),
            "arms": {},
        }  # fmt: skip
        trained = {arm: partial["arms"][arm]["uri"] for arm in partial["arms"]}
        uris = trained | ({"stale": parent} if "stale" in arms else {})
        if gate and not partial["arms"]["warm"]["gate"]["promoted"]:
            uris["warm"] = parent  # the champion is kept: the pipeline serves it, and the next step starts from it
        per_user = {}
        back = {str(u) for u in returning_users(events, bounds[k - 1], lo)}  # users with an event in this step's period
        for arm, uri in uris.items():
            loaded = load_ranker(uri)
            examples = next_period_examples(prepared, events, lo, hi, loaded.model)
            scored = score_model(loaded, prepared, examples, entry, k)
            per_user[arm], kinds = scored.pop("per_user"), scored.pop("target_kinds")
            record["arms"][arm] = {**partial["arms"].get(arm, {"train_seconds": 0.0}), "uri": uri, **scored}
            if arm in trained:  # trained at this step: its validation split, on the users who just came back
                values = [v[0] for u, v in validation_per_user(load_ranker(trained[arm]), prepared).items() if u in back]
                record["arms"][arm]["val_returning_NDCG@10"] = float(np.mean(values)) if values else None
            if arm in WARM_ARMS:
                record["arms"][arm]["moved"] = movement(arm_config(config, arm, workdir, parents[arm]), prepared,
                                                        parents[arm], trained[arm])  # fmt: skip
        if gate:
            record["arms"]["warm"]["candidate_uri"] = trained["warm"]
        for arm, earlier in reused.items():
            found = [st for st in earlier if st["step"] == k]
            if not found or set(found[0]["per_user"][arm]) != set(per_user["warm"]):
                why = "has no step" if not found else "scored other test users at step"
                raise SystemExit(f"--reuse {arm}: the earlier replay of seed {config.seed} {why} {k}")
            record["arms"][arm], per_user[arm] = found[0]["arms"][arm], found[0]["per_user"][arm]
        record["test_users"] = len(per_user["warm"])
        record["differences"] = step_differences(per_user)
        record["per_user"] = per_user
        record["target_kinds"] = kinds
        steps.append(record)
        state["partial"] = None
        before = now
        save()
        d = record["differences"]["warm_minus_scratch"]["NDCG@10"] if "scratch" in per_user else None
        print(f"seed {config.seed} step {k} (to {record['period_end']}): {record['test_users']} test users; NDCG@10 "
              + ", ".join(f"{a} {record['arms'][a]['NDCG@10']:.4f} ({record['arms'][a]['train_seconds']:.0f} s)" for a in uris)
              + (f"; warm - scratch {d['difference']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]" if d else "")
              + (f"; gate: {partial['arms']['warm']['gate']['reason']}" if gate else ""), flush=True)  # fmt: skip


def _lost_models(state: dict) -> bool:
    """True when a model the seed's next step needs (a warm-chain parent, a finished arm of the step in
    progress) no longer loads: the JSON outlived its tracking store, so the seed cannot go on."""
    from recsys_alibi.tracking import ModelUriError, load_ranker

    steps = state.get("steps") or []
    needed = [steps[-1]["arms"][arm]["uri"] for arm in ("warm", "warm_features") if steps and arm in steps[-1]["arms"]]
    needed += [state[key]["uri"] for key in ("step0", "step0_features") if key in state and not steps]
    needed += [arm["uri"] for arm in ((state.get("partial") or {}).get("arms") or {}).values()]
    for uri in needed:
        try:
            load_ranker(uri)
        except ModelUriError:
            return True
    return False


def _difference(a: list, b: list, metrics: tuple[str, ...] = METRICS, users: list | None = None) -> dict:
    """Paired difference a - b per metric (``metrics``, the order of each pair's values; default NDCG@10, HR@10)
    with its bootstrap 95 % interval over the pairs (``ci95``). ``users``: each pair's user, for pairs pooled
    over seeds or steps (a user recurs): adds ``ci95_by_user``, the interval that resamples whole users with
    all their pairs (:func:`recsys_alibi.evaluation.paired.paired_difference`, ``clusters``), and ``users``."""
    from recsys_alibi.evaluation.paired import paired_difference

    out = {}
    for i, metric in enumerate(metrics):
        x, y = np.array([v[i] for v in a]), np.array([v[i] for v in b])
        d = paired_difference(x, y)
        out[metric] = {"difference": d.difference, "ci95": list(d.ci95), "pairs": len(a)}
        if users is not None:
            out[metric]["ci95_by_user"] = list(paired_difference(x, y, clusters=users).ci95)
            out[metric]["users"] = len(set(users))
    return out


def _trend(rows: list) -> dict | None:
    """Least-squares slope per step of a - b, per metric, with its bootstrap 95 % interval
    (:func:`recsys_alibi.evaluation.paired.paired_trend`); ``rows``: (step, a's values, b's values) per
    (seed, step, user); None with a single step."""
    from recsys_alibi.evaluation.paired import paired_trend

    steps = np.array([r[0] for r in rows])
    if np.unique(steps).size < 2:
        return None
    out = {}
    for i, metric in enumerate(METRICS):
        slope, ci = paired_trend(steps, np.array([r[1][i] for r in rows]), np.array([r[2][i] for r in rows]))
        out[metric] = {"slope_per_step": slope, "ci95": list(ci), "pairs": len(rows)}
    return out


def comparisons(arms) -> list[tuple[str, str]]:
    """The pairs compared (:data:`COMPARED`) whose two arms are both present."""
    return [(a, b) for a, b in COMPARED if a in arms and b in arms]


def step_differences(per_user: dict) -> dict:
    """``{"warm_minus_<arm>": {metric: {difference, ci95, pairs}}}`` on one step's test users."""
    users = sorted(per_user["warm"])
    return {f"{a}_minus_{b}": _difference([per_user[a][u] for u in users], [per_user[b][u] for u in users])
            for a, b in comparisons(per_user)}  # fmt: skip


def pooled(runs: dict) -> dict:
    """Every comparison pooled over (seed, step, user), per step pooled over seeds, train seconds per arm,
    and the target-kind split pooled over seeds and steps."""
    from replay_scoring import KINDS

    steps = [s for run in runs.values() for s in run.get("steps", [])]
    if not steps:
        return {}
    arms = list(steps[0]["arms"])
    out: dict = {}
    for a, b in comparisons(arms):
        users = [u for s in steps for u in sorted(s["per_user"][a])]
        rows = [(s["step"], s["per_user"][a][u], s["per_user"][b][u]) for s in steps for u in sorted(s["per_user"][a])]
        out[f"pooled_{a}_minus_{b}"] = _difference([r[1] for r in rows], [r[2] for r in rows], users=users)
        out[f"trend_{a}_minus_{b}"] = _trend(rows)
    by_step = {}
    for k in sorted({s["step"] for s in steps}):
        at_k = [s for s in steps if s["step"] == k]
        by_step[str(k)] = {f"{a}_minus_{b}": _difference(
            [s["per_user"][a][u] for s in at_k for u in sorted(s["per_user"][a])],
            [s["per_user"][b][u] for s in at_k for u in sorted(s["per_user"][a])]) for a, b in comparisons(arms)}  # fmt: skip
    out["by_step"] = by_step
    out["train_seconds"] = {a: round(sum(s["arms"][a]["train_seconds"] for s in steps), 1) for a in arms}
    scratch = out["train_seconds"].get("scratch")
    out["warm_over_scratch_train_time"] = out["train_seconds"]["warm"] / scratch if scratch else None
    # the same ratio in epochs (a warm and a scratch epoch cover the same data): free of the machine's load,
    # which differs when an arm is reused from an earlier replay
    epochs = {a: sum(s["arms"][a].get("epochs") or 0 for s in steps) for a in ("warm", "scratch") if a in arms}
    out["warm_over_scratch_epochs"] = epochs["warm"] / epochs["scratch"] if epochs.get("scratch") else None
    kinds: dict = {}
    for a in arms:
        kinds[a] = {}
        for kind in KINDS:
            rows = [v for s in steps for u, v in s["per_user"][a].items() if s["target_kinds"][u] == kind]
            kinds[a][kind] = {"n": len(rows), **{m: float(np.mean([r[i] for r in rows])) if rows else None
                                                 for i, m in enumerate(METRICS)}}  # fmt: skip
        shares = [s["arms"][a]["top10_share_new"] for s in steps if s["arms"][a]["top10_share_new"] is not None]
        kinds[a]["top10_share_new"] = float(np.mean(shares)) if shares else None
    out["by_target_kind"] = kinds
    out["by_target_kind_differences"] = kind_differences(steps, arms)
    return out


def kind_differences(steps: list, arms) -> dict:
    """``{"<a>_minus_<b>": {kind: {metric: {difference, ci95, pairs}} or None}}``: every comparison on the
    (seed, step, user) pairs whose target is of one kind (new this period: the cold-item figure)."""
    from replay_scoring import KINDS

    out: dict = {}
    for a, b in comparisons(arms):
        out[f"{a}_minus_{b}"] = {}
        for kind in KINDS:
            pairs = [(s["per_user"][a][u], s["per_user"][b][u], u) for s in steps for u in sorted(s["per_user"][a])
                     if s["target_kinds"][u] == kind]  # fmt: skip
            out[f"{a}_minus_{b}"][kind] = (_difference([p[0] for p in pairs], [p[1] for p in pairs],
                                                       users=[p[2] for p in pairs]) if pairs else None)  # fmt: skip
    return out


def plot(doc: dict, path: Path, title: str) -> None:
    """NDCG@10 on the next period per step and arm (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from recsys_alibi.atomic import atomic_path

    steps = [s for run in doc["runs"].values() for s in run.get("steps", [])]
    if not steps:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ks = sorted({s["step"] for s in steps})
    for arm, style in zip(steps[0]["arms"], ("o-", "s--", "^:", "d-.", "x-")):
        ax.plot(ks, [np.mean([s["arms"][arm]["NDCG@10"] for s in steps if s["step"] == k]) for k in ks], style, label=arm)
    ax.set_xlabel("step (model trained on events before the step's boundary)")
    ax.set_ylabel("NDCG@10 on the next period")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def reused_runs(items: list[str], arms: list[str], parser) -> dict[str, dict]:
    """``--reuse ARM=JSON`` -> {arm: the runs of that replay's ``.per_user.json``}; refused (one line, exit 2)
    for an arm not in ``--arms``, the warm chain, or a file that is not there."""
    out = {}
    for item in items:
        arm, equals, path = item.partition("=")
        if not arm or not equals or not path:
            parser.error(f"--reuse {item}: expected ARM=JSON (e.g. scratch=runs/replay-ml100k.json)")
        per_user = Path(path).with_suffix(".per_user.json")
        if arm not in arms or arm in WARM_ARMS or arm == "stale":
            parser.error(f"--reuse {item}: only an arm of --arms that does not follow the warm chain (e.g. scratch)")
        if not per_user.is_file():
            parser.error(f"--reuse {item}: {per_user} does not exist")
        out[arm] = json.loads(per_user.read_text())
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line (module doc); ``benchmarks/replay_cold.py`` reads a finished replay's ``command`` with it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--input", help="the log (default: data.input of the config)")
    parser.add_argument("--format", help="default: data.format of the config")
    parser.add_argument("--start", type=float, default=0.5, help="quantile of the timestamps where step 0 ends")
    parser.add_argument("--period-days", type=float, default=28.0)
    parser.add_argument("--steps", type=int, help="evaluate at most this many steps")
    parser.add_argument("--seeds", nargs="+", type=int, help="default: the config's seed")
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS)
    parser.add_argument("--workdir", type=Path, default=Path("runs/replay"))
    parser.add_argument("--output", type=Path, required=True, help="JSON path")
    parser.add_argument("--plot", type=Path, help="PNG path (default: the JSON path with .png)")
    parser.add_argument("--gate", action="store_true",
                        help="the warm chain goes through the daily pipeline's promotion gate (module doc)")
    parser.add_argument("--reuse", action="append", default=[], metavar="ARM=JSON",
                        help="take ARM of every step from an earlier replay's JSON (its .per_user.json), e.g. "
                             "scratch=docs/results/replay-ml100k.json after a change of train.warm only")
    return parser


def log_key(args: argparse.Namespace) -> tuple:
    """What two replays must share to be compared target by target (``args``: a recorded command, parsed): the
    config and the log as resolved paths (``./configs/x.yaml`` is ``configs/x.yaml``), the format, the start
    quantile and the period length."""
    return (Path(args.config).resolve(), Path(args.input).resolve() if args.input else None, args.format, args.start,
            args.period_days)  # fmt: skip


def read_arm_option(item: str, parser, arms: tuple[str, ...] = ARMS) -> tuple[str, str, dict, argparse.Namespace, dict]:
    """A ``--model LABEL=REPLAY.json:ARM`` value -> (label, arm, and :func:`read_replay` of the file); refused with
    one line (``parser.error``, exit 2): a malformed value, a file that is not a finished replay, an arm the
    replay did not run or that is not one of ``arms``. Used by ``replay_validation.py`` and ``replay_pair.py``."""
    label, _, rest = item.partition("=")
    path, _, arm = rest.rpartition(":")
    if not label or not path or not arm:
        parser.error(f"--model {item}: expected LABEL=REPLAY.json:ARM")
    doc, args, runs = read_replay(Path(path), parser)
    if arm not in doc.get("arms", []):
        parser.error(f"--model {item}: {path} has no arm {arm} (its arms: {doc.get('arms')})")
    if arm not in arms:
        parser.error(f"--model {item}: this command takes the arms {', '.join(arms)}, not {arm}")
    return label, arm, doc, args, runs


def default_output(replay: Path, suffix: str) -> Path:
    """Where a script that writes a file about ``replay`` writes without ``--output``: beside it (the replay's path
    with ``suffix``), or, when the replay lies under docs/results/, ``runs/`` of the checkout under the same name
    (created): a default never replaces a committed figure."""
    beside = replay.with_suffix(suffix)
    if RESULTS.resolve() not in beside.resolve().parents:
        return beside
    runs = RESULTS.parents[1] / "runs"
    runs.mkdir(exist_ok=True)
    return runs / beside.name


def read_for_output(path: Path, output: Path | None, suffix: str, parser) -> tuple[dict, argparse.Namespace, dict, Path]:
    """:func:`read_replay` for a script that writes a file about the replay: also the output path (``output``,
    default :func:`default_output`), refused with one line (``parser.error``) when it is a folder, lies
    in none, or is one of the replay's own files, and when the replay's log is not where its command says. Used by
    ``replay_popularity.py`` and ``replay_prior.py``."""
    output = output or default_output(path, suffix)
    if output.resolve().is_dir() or not output.resolve().parent.is_dir():
        parser.error(f"--output {output}: a folder, or in a folder that does not exist")
    doc, args, runs = read_replay(path, parser)
    own = {path.resolve(), path.with_suffix(".per_user.json").resolve()}
    if {output.resolve(), output.with_suffix(".per_user.json").resolve()} & own:  # a writer may add .per_user.json
        parser.error(f"--output {output}: one of the replay's own files, or beside it with its per-user name")
    if args.input is not None and not Path(args.input).exists():
        parser.error(f"the replay's log {args.input} is not there: run from the folder the replay ran in")
    return doc, args, runs, output


def read_replay(path: Path, parser) -> tuple[dict, argparse.Namespace, dict]:
    """(the replay's JSON, its recorded command parsed with :func:`build_parser`, its per-user runs); a file
    that is not a finished replay of this script is refused with one line (``parser.error`` of the caller's
    parser, exit 2). Used by ``benchmarks/replay_cold.py``, ``replay_validation.py`` and ``replay_pair.py``."""
    try:
        doc = json.loads(path.read_text())
        runs = json.loads(path.with_suffix(".per_user.json").read_text())
    except (OSError, ValueError, RecursionError) as err:
        parser.error(f"{path}: not a finished replay (its JSON and .per_user.json beside it): {err}")
    command = doc.get("command") if isinstance(doc, dict) else None

    def refuse(message: str):
        raise ValueError(message)

    replay_parser = build_parser()
    replay_parser.error = refuse  # a bad recorded command is this file's fault, not the user's options
    try:
        args = replay_parser.parse_args(shlex.split(command)[2:]) if isinstance(command, str) else None
    except ValueError:
        args = None
    if args is None:
        parser.error(f"{path}: its 'command' is not a benchmarks/replay.py command line")
    return doc, args, runs


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if "warm" not in args.arms:
        parser.error("--arms must include warm (the chain every other arm is compared with)")
    if not 0 < args.start < 1:
        parser.error(f"--start {args.start}: a quantile of the timestamps strictly between 0 and 1")
    if not args.period_days > 0:
        parser.error(f"--period-days {args.period_days}: must be above 0")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps {args.steps}: at least 1 (step 0 alone compares nothing)")
    earlier = reused_runs(args.reuse, args.arms, parser)

    from pipelines.cli import configure_logging
    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.config import ConfigError, load_config, with_overrides
    from recsys_alibi.data.errors import DataError
    from recsys_alibi.tracking import setup_tracking

    configure_logging()
    try:  # a bad config or log: one line, exit 2, before anything is trained or written
        # train.init_from is set per run (the previous warm model, or none for scratch); given here so that the
        # config's train.warm schedule is accepted (it takes effect only with train.init_from)
        config = load_config(args.config, [*args.overrides, "train.init_from=champion"])
        events = read_log(config, args.input or config.data.input, args.format)
    except (ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    bounds = boundaries(events["timestamp"].to_numpy(), args.start, args.period_days)
    last = len(bounds) - 2 if args.steps is None else min(len(bounds) - 2, args.steps)
    if last < 1:
        print(f"error: the log after the --start {args.start} quantile holds no whole period of --period-days "
              f"{args.period_days} before its last event: nothing to compare", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    ts = events["timestamp"].to_numpy()
    empty = [k for k in range(1, last + 1) if not ((ts >= bounds[k]) & (ts < bounds[k + 1])).any()]
    if empty:  # a step with nothing to test (the metrics need one user): said before anything is trained
        print(f"error: step {empty[0]}'s period of --period-days {args.period_days} holds no event "
              f"({len(empty)} of {last} steps are empty): nothing to test there; give longer periods", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    args.workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{args.workdir.resolve() / 'mlflow.db'}")
    try:  # the store is created complete or not at all (a kill here leaves none); a half-made one: one line
        setup_tracking(config.tracking)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    seeds = args.seeds or [config.seed]
    command = command_line("benchmarks/replay.py", argv)
    doc = json.loads(args.output.read_text()) if args.output.exists() else {}
    if "runs" not in doc or doc.get("arms") != args.arms or doc.get("start_quantile") != args.start \
            or doc.get("period_days") != args.period_days or doc.get("gate", False) != args.gate:  # fmt: skip
        doc = {"runs": {}}  # another replay (or the earlier format): start over
    doc.update({
        "command": command, "config": args.config, "overrides": args.overrides, "start_quantile": args.start,
        "period_days": args.period_days, "arms": args.arms, "gate": args.gate, "seeds": seeds, "steps_planned": last,
        "protocol": "next period: each test user's first next-period event with a catalog item not in the history, "
                    "full catalog, seen items excluded; a model that does not know the target counts a miss",
        "machine": machine_line(__import__("torch").get_num_threads()),
    })  # fmt: skip

    def save() -> None:
        doc.update(pooled(doc["runs"]))
        slim = {**doc, "runs": {s: {**r, "steps": [{k: v for k, v in st.items() if k not in ("per_user", "target_kinds")}
                                                   for st in r.get("steps", [])]} for s, r in doc["runs"].items()}}  # fmt: skip
        write_json_atomic(args.output.with_suffix(".per_user.json"), doc["runs"])
        write_json_atomic(args.output, slim)
        plot(doc, args.plot or args.output.with_suffix(".png"), f"{Path(args.config).stem}: next-period NDCG@10")

    per_user_path = args.output.with_suffix(".per_user.json")
    if doc["runs"] and per_user_path.exists():
        doc["runs"] = json.loads(per_user_path.read_text())  # the steps with their per-user values
    handlers = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for seed in seeds:
            state = doc["runs"].setdefault(str(seed), {})
            # a seed the earlier replay lacks trains the arm (more seeds after a change of train.warm)
            reused = {arm: runs[str(seed)]["steps"] for arm, runs in earlier.items() if runs.get(str(seed), {}).get("steps")}
            replay_seed(with_overrides(config, seed=seed), events, bounds, args.workdir / f"seed-{seed}", args.arms,
                        last, state, save, reused, args.gate)  # fmt: skip
        save()
    except Interrupted as stop:
        for sig in handlers:  # a second Ctrl-C while the line is written
            signal.signal(sig, signal.SIG_IGN)
        print(f"interrupted; re-run the same command to {resume_point(doc['runs'], seeds, last, args.arms)}",
              file=sys.stderr, flush=True)  # fmt: skip
        raise SystemExit(stop.exit_code) from None
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    print(f"wrote {args.output}")


class Interrupted(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM (``kill``) during a replay; ``exit_code`` 128 + the signal (130, 143). Not a
    ``KeyboardInterrupt``: Lightning's fit turns that into ``sys.exit(1)`` without a word; this passes through
    it (Lightning calls the SIGTERM handler it found after its own)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.exit_code = 128 + signum


def _interrupt(signum, _frame) -> None:
    raise Interrupted(signum)


def resume_point(runs: dict, seeds: list[int], last: int, arms: list[str]) -> str:
    """Where the same command continues (``resume from step N``, ``of seed S`` with several seeds): the first
    seed whose first model (step 0) or steps 1..``last`` are not all in the JSON. The arms of an unfinished
    step that were trained are kept (its ``partial``), and the arm being trained resumes from its last
    checkpoint."""
    for seed in seeds:
        state = runs.get(str(seed), {})
        if "step0" not in state or ("step0_features" not in state and any(a in FEATURE_ARMS for a in arms)):
            step = 0
        elif len(state.get("steps", [])) < last:
            step = len(state["steps"]) + 1
        else:
            continue
        return f"resume from step {step}" + (f" of seed {seed}" if len(seeds) > 1 else "")
    return "write the results (every step is done)"


if __name__ == "__main__":
    main()
