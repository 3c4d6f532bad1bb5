"""The promotion gate of the scheduled pipeline, and the lineage tags of every training run.

Gate: the new model and the model holding the registry alias ``tracking.champion_alias`` are
evaluated on the same prepared data with the same protocol (the "valid" examples of
``evaluate.protocol``, full catalog) and compared on ``tracking.promotion_metric``. The alias moves to the new version only
when ``new - champion > tracking.promotion_margin`` (a tie keeps the champion); otherwise the new
version is tagged ``rejected`` with the reason. The champion is read again under a lock just before
the alias moves, and the decision made again if it changed (overlapping pipelines); the pipeline scores with the
version the alias held when the lock was released (``GateResult.champion_uri``, ``models:/NAME/VERSION``). No
champion yet (no such alias or registered model; any other error of the store is an error) promotes the new
version; a champion whose MLflow run is deleted is refused with the fix named. A
champion trained on another item vocabulary that can serve none of the validation examples, or no more
than ``score.max_unknown_share`` of them (integer ids of two catalogs overlap by chance), is not compared: the
reason is logged and tagged, and the new version is promoted.

Lineage: tags ``lineage.*`` on the training run (data fingerprint, config hash, project version,
git commit, seed); two runs with the same ``lineage.data.sha256`` and ``lineage.config_sha256``
trained the same config on the same data.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from recsys_alibi.config import JobConfig
from recsys_alibi.data import schema
from recsys_alibi.data.errors import first_line
from recsys_alibi.data.sequences import vocabulary_difference
from recsys_alibi.data.time_gaps import sequences_for
from pipelines.registry_lock import promotion_lock
from recsys_alibi.tracking import metric_key, tracking_uri
from recsys_alibi.tracking_store import ready_store
from serving.inputs import vocabulary_remap

log = logging.getLogger(__name__)

VALID_PREFIX = "valid"  # version tags ``valid.NDCG_at_10`` ...; run metrics ``valid/NDCG_at_10``
REJECTED_TAG = "rejected"
DECISION_TAG = "promotion.decision"
PENDING = "pending"  # DECISION_TAG of a version a pipeline registered and has not gated yet
INCOMPLETE_TAG = "promotion.incomplete"  # why a pending version's gate did not finish (a failure the run saw)
DATA_HASH_TAG = "lineage.data.sha256"
CONFIG_HASH_TAG = "lineage.config_sha256"


# --- lineage -------------------------------------------------------------------------------------


def config_sha256(config: JobConfig) -> str:
    """sha256 of the resolved config without where things go (``output``, ``tracking``) and how a run is
    controlled (``train.resume``: a killed run continued trains the same config).

    Two runs that differ only in their output directory, MLflow store or ``--resume`` hash the same.
    """
    tree = config.model_dump(mode="json", exclude={"output": True, "tracking": True, "train": {"resume"}})
    return hashlib.sha256(json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def git_commit(repo: Path | None = None) -> str:
    """``git rev-parse HEAD`` of the checkout holding this code, or ``"unknown"``."""
    repo = repo or Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else "unknown"


def lineage_tags(config: JobConfig, prepared_dir: Path, prepare_id: str | None = None) -> dict[str, str]:
    """The ``lineage.*`` tags of a training run on ``prepared_dir`` with ``config``.

    ``prepare_id``: the prepare the run trained on (None: the directory's own); another one is a DataError.
    """
    from recsys_alibi import __version__

    from recsys_alibi.data.partition import read_lengths
    from recsys_alibi.data.prepared import check_prepared, data_sha256
    from recsys_alibi.data.sequences import read_items

    prepare_id = check_prepared(prepared_dir, prepare_id)
    lengths = read_lengths(prepared_dir, prepare_id)
    n_items = read_items(prepared_dir, prepare_id).height
    return {
        "lineage.data.events": str(int(lengths.sum())),
        "lineage.data.users": str(lengths.size),
        "lineage.data.items": str(n_items),
        DATA_HASH_TAG: data_sha256(prepared_dir, prepare_id),
        CONFIG_HASH_TAG: config_sha256(config),
        "lineage.project_version": __version__,
        "lineage.git_commit": git_commit(),
        "lineage.seed": str(config.seed),
    }


def tag_lineage(run_id: str, tags: dict[str, str]) -> list[str]:
    """Set ``tags`` on the run; return the ids of earlier runs of its experiment with the same lineage."""
    import mlflow

    client = mlflow.MlflowClient()
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    experiment_id = client.get_run(run_id).info.experiment_id
    query = (
        f"tags.`{DATA_HASH_TAG}` = '{tags[DATA_HASH_TAG]}' and tags.`{CONFIG_HASH_TAG}` = '{tags[CONFIG_HASH_TAG]}'"
    )
    same = client.search_runs([experiment_id], filter_string=query, max_results=50, order_by=["attributes.start_time DESC"])
    return [run.info.run_id for run in same if run.info.run_id != run_id]


# --- gate ----------------------------------------------------------------------------------------


class ChampionUnavailable(RuntimeError):
    """The version holding the champion alias cannot be loaded (its artifacts are missing or unreadable).

    A failure of the store, not of the user's input: ``pipeline`` exits 1 (docs/scheduling.md).
    """


@dataclass(frozen=True)
class Decision:
    """Whether the new version takes the alias, and why (one phrase)."""

    promote: bool
    reason: str


def decide(new: float, champion: float | None, margin: float, metric: str) -> Decision:
    """The gate on one metric: promote when there is no champion or ``new - champion > margin``.

    >>> decide(0.30, 0.25, 0.01, "NDCG@10").promote
    True
    >>> decide(0.25, 0.25, 0.0, "NDCG@10").reason
    'NDCG@10 0.2500 does not beat champion 0.2500 by more than margin 0.0000'
    """
    if champion is None:
        return Decision(True, "no champion yet")
    if math.isnan(new):  # NaN never wins
        return Decision(False, f"{metric} is NaN")
    if new - champion > margin:
        return Decision(True, f"{metric} {new:.4f} beats champion {champion:.4f} by more than margin {margin:.4f}")
    return Decision(False, f"{metric} {new:.4f} does not beat champion {champion:.4f} by more than margin {margin:.4f}")


@dataclass(frozen=True)
class GateResult:
    """What the gate saw and did."""

    decision: Decision
    metric: str
    new_value: float
    new_metrics: dict[str, float]
    version: str
    champion_version: str | None  # the version that held the alias before the gate
    champion_value: float | None  # None: no champion, or not comparable
    champion_uri: str  # models:/NAME/VERSION: the version holding the alias when the gate released the lock

    def line(self) -> str:
        """``promoted``/``rejected`` with both metric values and the reason."""
        word = "promoted" if self.decision.promote else "rejected (champion kept)"
        old = "n/a" if self.champion_value is None else f"{self.champion_value:.4f}"
        held = f"v{self.champion_version}" if self.champion_version else "none"
        return (
            f"version {self.version}; valid {self.metric} new {self.new_value:.4f} vs champion ({held}) {old}; "
            f"decision: {word}: {self.decision.reason}"
        )


def validation_examples(sequences: pl.DataFrame, config: JobConfig | None = None) -> pl.DataFrame:
    """The gate's examples: the "valid" stage of ``evaluate.protocol`` (what training validated on).

    Leave-one-out: the second-to-last event from the events before it; temporal: each user's last
    event before the cutoff. Never a test target (:func:`recsys_alibi.data.splits.fit_split`).
    """
    from recsys_alibi.data.splits import fit_split, resolve_cutoff

    if config is None or config.evaluate.protocol == "leave_one_out":
        return fit_split(sequences, "valid")
    return fit_split(sequences, "valid", "temporal", resolve_cutoff(sequences, config.evaluate.temporal_cutoff))


def validation_metrics(config: JobConfig, model, examples: pl.DataFrame, n_items: int) -> dict[str, float]:
    """Full-catalog metrics of ``model`` on ``examples`` (the configured ks; no context sweep)."""
    from recsys_alibi.evaluation.evaluator import evaluate
    from recsys_alibi.model.scorer import RankerScorer

    cfg = config.evaluate.model_copy(update={"context_lengths": []})
    result = evaluate(RankerScorer(model, name="gate"), examples, n_items, cfg, protocol_name=f"{config.evaluate.protocol}/valid")
    return {name: float(value) for name, value in result.metrics.items()}


def model_validation_metrics(config: JobConfig, model, sequences: pl.DataFrame, n_items: int) -> dict[str, float]:
    """:func:`validation_metrics` of ``model`` on the gate's examples of ``sequences`` (with its time gaps when it
    reads them): the new model's side of the gate (``benchmarks/replay.py --gate`` too)."""
    return validation_metrics(config, model, validation_examples(sequences_for(model, sequences), config), n_items)


def check_promotion_metric(config: JobConfig) -> None:
    """Fail before training when ``tracking.promotion_metric`` will not be in the validation report.

    Raises:
        ValueError: not ``MRR`` nor ``HR|NDCG|Recall|Coverage@K`` with K in ``evaluate.ks``.
    """
    metric = config.tracking.promotion_metric
    name, _, k = metric.partition("@")
    if metric == "MRR" or (name in {"HR", "NDCG", "Recall", "Coverage"} and k.isdigit() and int(k) in config.evaluate.ks):
        return
    raise ValueError(
        f"tracking.promotion_metric={metric} is not evaluated; use MRR or HR|NDCG|Recall|Coverage@K with K in "
        f"evaluate.ks={list(config.evaluate.ks)}"
    )


class ChampionLookupError(ValueError):
    """The tracking store failed to answer which version holds the champion alias (not "there is none")."""


def current_champion(name: str, alias: str):
    """The model version holding ``alias`` of registered model ``name``, or None when there is no such alias or
    registered model (no champion yet).

    Raises:
        ChampionLookupError: any other failure of the store (a transient database or server error, a name MLflow
            refuses): one line; never read as "no champion", which would promote without a comparison.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.MlflowClient().get_model_version_by_alias(name, alias)
    except MlflowException as err:
        if _no_such_alias(err):
            return None
        first = first_line(err)
        raise ChampionLookupError(
            f"cannot read the champion models:/{name}@{alias} from the tracking store {mlflow.get_tracking_uri()} "
            f"({first}); nothing was promoted: run again when the store answers"
        ) from None


def _no_such_alias(err) -> bool:
    """Whether an MLflow error of ``get_model_version_by_alias`` says the alias or the registered model does not
    exist (MLflow: ``RESOURCE_DOES_NOT_EXIST`` for the name, ``INVALID_PARAMETER_VALUE`` "... alias X not found.")."""
    code, text = getattr(err, "error_code", ""), str(err)
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "alias" in text
                                                   and "not found" in text)  # fmt: skip


@dataclass(frozen=True)
class Champion:
    """The version holding the champion alias when a pipeline run started, resolved once (:func:`pin_champion`):
    the prior choice and a warm start from ``champion`` use this version, never the alias read again later
    (another pipeline may move it meanwhile). The gate reads the alias itself, under its lock (compare-and-set)."""

    name: str
    alias: str
    version: str | None  # None: no champion yet
    run_id: str | None = None
    source: str | None = None

    @property
    def uri(self) -> str | None:
        """``models:/NAME/VERSION`` of the pinned version (None: no champion)."""
        return None if self.version is None else f"models:/{self.name}/{self.version}"

    def label(self) -> str:
        """``the champion (version 3 of 'NAME', alias 'champion')`` for messages."""
        return f"the champion (version {self.version} of '{self.name}', alias '{self.alias}')"


def pin_champion(config: JobConfig) -> Champion:
    """:class:`Champion` of ``tracking.registered_model`` / ``tracking.champion_alias`` now (MLflow's tracking URI set).

    A SQLite store that does not exist yet is created complete first, a half-made one refused
    (:func:`recsys_alibi.tracking_store.ready_store`): the warm start of ``train`` reads the champion before
    anything else opens the store.

    Raises:
        ChampionLookupError: the store failed to answer (:func:`current_champion`).
        StoreError: the SQLite store is half-made (one line, exit 2).
    """
    import mlflow

    ready_store(mlflow.get_tracking_uri())
    name, alias = config.tracking.registered_model, config.tracking.champion_alias
    held = current_champion(name, alias)
    if held is None:
        return Champion(name, alias, None)
    return Champion(name, alias, _version(held), getattr(held, "run_id", None), getattr(held, "source", None))


def pending_version(config: JobConfig, data_sha: str):
    """The newest version of ``tracking.registered_model`` that an earlier pipeline registered on the same data
    (``lineage.data.sha256`` ``data_sha``) with the same config (``lineage.config_sha256``) and never gated
    (``promotion.decision=pending``: killed, or failed, between registration and the gate), or None.

    A version whose run is deleted is not taken (the gate would refuse it as a champion later).
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    name = config.tracking.registered_model
    client = mlflow.MlflowClient()
    query = f"name='{name}' and tags.`{DECISION_TAG}` = '{PENDING}'"
    try:
        found = client.search_model_versions(query)
    except MlflowException:  # a name the filter cannot quote: nothing to finish
        return None
    want = {DATA_HASH_TAG: data_sha, CONFIG_HASH_TAG: config_sha256(config)}
    for version in sorted(found, key=lambda v: int(v.version), reverse=True):
        if version.status != "READY" or any(version.tags.get(k) != v for k, v in want.items()):
            continue
        try:
            if version.run_id and client.get_run(version.run_id).info.lifecycle_stage == "deleted":
                continue
        except MlflowException:
            continue
        return version
    return None


def pending_tags(config: JobConfig, data_sha: str) -> dict[str, str]:
    """Tags a pipeline puts on its new version as soon as it is registered: ``promotion.decision=pending`` and
    the lineage hashes :func:`pending_version` looks for (the gate replaces the decision)."""
    return {DECISION_TAG: PENDING, DATA_HASH_TAG: data_sha, CONFIG_HASH_TAG: config_sha256(config)}


def tag_incomplete(config: JobConfig, version: str, err: BaseException) -> None:
    """Tag a pending version with why its gate did not finish (best effort: the store may be what failed)."""
    import mlflow

    first = first_line(err) if str(err).strip() else ""
    reason = (f"the gate did not finish ({type(err).__name__}: {first})"[:4900] + "; a pipeline run again with the "
              "same data and config gates this version instead of training another")  # fmt: skip
    try:
        mlflow.MlflowClient().set_model_version_tag(config.tracking.registered_model, version, INCOMPLETE_TAG, reason)
    except Exception:  # noqa: BLE001 - the failure being reported may be the store's
        log.warning("promotion: could not tag version %s as incomplete (%s)", version, reason)


def run_gate(
    config: JobConfig,
    new_model,
    new_version: str,
    items: pl.DataFrame,
    sequences: pl.DataFrame,
    real_timestamps: bool = True,
) -> GateResult:
    """Compare the new version with the champion on the validation examples and move or keep the alias.

    Tags the new version with its validation metrics (``valid.<metric>``), the champion's value,
    ``promotion.decision``, and ``rejected`` (the reason) when it does not take the alias. The
    champion ranks the data by raw item id, as ``score`` serves it: items it does not know (new
    items of an appended day) are dropped from its histories, and a validation example whose
    target (or whole history) it does not know counts as its miss: it cannot recommend that item
    (:func:`examples_in_vocabulary`, :func:`champion_metric`). A champion that cannot be evaluated
    on this data (it can serve none of the validation examples; time gaps while
    ``real_timestamps`` is False, i.e. the data's time came from line order; a training split
    that holds the validation targets) is not comparable: the new version is promoted with that
    reason.

    Compare-and-set: the champion is evaluated first, then, under the registry's promotion lock
    (:mod:`pipelines.registry_lock`), read again; when another gate moved the alias meanwhile, the
    decision is made again against the champion now holding it. Tags and the alias move happen
    under the lock, so overlapping pipelines leave the alias on the best of them.

    The result's ``champion_uri`` is ``models:/NAME/VERSION`` of the version holding the alias when the lock is
    released (the new one when promoted, the kept champion otherwise): the pipeline scores with that version,
    never with the alias read again (another gate may move it after this one).

    Raises:
        ValueError: the promotion metric is not among the evaluated metrics (check ``evaluate.ks``).
        ChampionLookupError: the store failed to say which version holds the alias (:func:`current_champion`).
        ModelUriError: the champion's MLflow run is deleted (:func:`check_champion_run`): refused, not compared.
        ChampionUnavailable: the champion's model cannot be loaded (its artifacts are gone).
        PromotionLockTimeout: another gate held the lock for too long (the alias is untouched).
    """
    import mlflow

    tracking = config.tracking
    name, alias, metric = tracking.registered_model, tracking.champion_alias, tracking.promotion_metric
    client = mlflow.MlflowClient()
    n_items = items.height
    new_metrics = model_validation_metrics(config, new_model, sequences, n_items)
    if metric not in new_metrics:
        raise ValueError(
            f"tracking.promotion_metric={metric} is not evaluated; choose one of {sorted(new_metrics)} or change evaluate.ks"
        )
    held = current_champion(name, alias)
    decision, champion_value = _against(config, held, new_metrics[metric], items, sequences, real_timestamps)
    # compare-and-set: re-read the champion under the lock and decide again if another gate moved it meanwhile
    with promotion_lock(tracking_uri(tracking), name):
        now = current_champion(name, alias)
        if _version(now) != _version(held):
            log.warning("promotion: the champion moved from v%s to v%s while this gate ran; deciding again against v%s",
                        _version(held), _version(now), _version(now))  # fmt: skip
            held = now
            decision, champion_value = _against(config, held, new_metrics[metric], items, sequences, real_timestamps)
        held_version = _version(held)
        _record(client, config, new_version, new_metrics, held_version, champion_value, decision)
        settled = new_version if decision.promote else held_version  # the alias's version as the lock is released
    return GateResult(
        decision=decision,
        metric=metric,
        new_value=new_metrics[metric],
        new_metrics=new_metrics,
        version=new_version,
        champion_version=held_version,
        champion_value=champion_value,
        champion_uri=f"models:/{name}/{settled}",
    )


def _version(model_version) -> str | None:
    """The version number of a registry entry as a string (an int on some stores), or None."""
    return None if model_version is None else str(model_version.version)


def _against(config: JobConfig, held, new_value: float, items: pl.DataFrame, sequences: pl.DataFrame,
             real_timestamps: bool) -> tuple[Decision, float | None]:  # fmt: skip
    """The decision against the champion ``held`` (a model version or None) and its metric value."""
    from recsys_alibi.tracking import ModelUriError, load_ranker

    tracking = config.tracking
    held_version = _version(held)
    if held is None:
        return Decision(True, "no champion yet"), None
    uri = f"models:/{tracking.registered_model}/{held_version}"
    check_champion_run(tracking.registered_model, tracking.champion_alias, held_version, getattr(held, "run_id", None))
    try:
        champion = load_ranker(uri)
    except ModelUriError:
        raise ChampionUnavailable(
            f"the champion (version {held_version} of '{tracking.registered_model}', alias '{tracking.champion_alias}') "
            f"cannot be loaded: its artifacts are missing or unreadable at {getattr(held, 'source', '?')}; restore them, "
            f"or point the alias '{tracking.champion_alias}' at a version that loads, then run again"
        ) from None
    why_not = None
    if champion.model.uses_time_gaps and not real_timestamps:
        why_not = "reads time gaps and this data has no timestamps (time from line order)"
    elif not _split_fits(config, sequences, trained := _training_split(held)):
        why_not = f"was trained on split {trained}, which holds this gate's {config.evaluate.protocol} validation targets"
    if why_not is not None:
        decision = Decision(True, f"champion v{held_version} {why_not}: not comparable, new version promoted")
        log.warning("promotion: %s", decision.reason)
        return decision, None
    return against_loaded(config, champion, f"v{held_version}", new_value, items, sequences)


def check_champion_run(name: str, alias: str, version: str, run_id: str | None) -> None:
    """Refuse the champion (version ``version`` of ``name``, holding ``alias``) when its MLflow run is deleted
    (:func:`recsys_alibi.tracking.check_live_run`): the gate and the pipeline's preflight never compare, replace
    or serve a retired champion.

    Raises:
        ModelUriError: one line naming every fix (:func:`champion_run_deleted`).
    """
    from recsys_alibi.tracking import ModelUriError, check_live_run

    try:
        check_live_run(f"models:/{name}/{version}")
    except ModelUriError:
        raise ModelUriError(champion_run_deleted(name, alias, version, run_id)) from None


def champion_run_deleted(name: str, alias: str, version: str | None, run_id: str | None) -> str:
    """The one line that refuses a champion whose MLflow run is deleted, naming every fix (the gate and the
    pipeline's preflight: a retired champion is never compared, replaced or served)."""
    return (f"the champion (version {version} of '{name}', alias '{alias}'): MLflow run {run_id} is deleted; restore it "
            f"(`mlflow runs restore --run-id {run_id}`), point the alias '{alias}' at another version, or delete the "
            "alias (the next version is then promoted without a comparison), then run again")


def against_loaded(config: JobConfig, champion, label: str, new_value: float, items: pl.DataFrame,
                   sequences: pl.DataFrame) -> tuple[Decision, float | None]:  # fmt: skip
    """The gate's decision against a loaded champion (``load_ranker``'s result; ``label`` names it in the reasons)
    on the validation examples of ``sequences``, ranked by raw item id (its unknown targets its misses; module doc
    of :func:`run_gate`), and its metric value (None: it can serve no example, the new model is promoted).
    ``benchmarks/replay.py --gate`` decides with it as the pipeline does."""
    tracking = config.tracking
    metric = tracking.promotion_metric
    remap, unknown = vocabulary_remap(items, champion.items)
    examples = validation_examples(sequences_for(champion.model, sequences), config)
    unservable = 0
    if remap is not None:  # rank in the champion's numbering, by raw id (its unknown items: module doc of run_gate)
        examples, unservable = examples_in_vocabulary(examples, remap)
    if unknown:
        difference = vocabulary_difference(champion.items.get_column(schema.ITEM_ID), items.get_column(schema.ITEM_ID))
        total, most = unservable + examples.height, config.score.max_unknown_share
        why = None
        if examples.height == 0:  # it can serve none of them: a champion of another catalog
            why = "and can serve none of the validation examples"
        elif unservable > most * total:  # integer ids of two catalogs overlap by chance: the rule of score's input
            why = (f"{unservable} of {total} validation examples ({unservable / total:.0%}) have a target or a "
                   f"history it does not know, more than score.max_unknown_share={most:g}")
        if why is not None:
            sep = " " if examples.height == 0 else ": "
            decision = Decision(True, f"champion {label} has another item vocabulary ({difference}){sep}{why}: not "
                                      "comparable, new version promoted")  # fmt: skip
            log.warning("promotion: %s", decision.reason)
            return decision, None
        log.info("promotion: champion %s has another item vocabulary (%s): %d of %d validation examples have a target "
                 "or a history it does not know and count as its misses", label, difference, unservable,
                 unservable + examples.height)  # fmt: skip
    champion_value = champion_metric(config, champion.model, examples, champion.items.height, unservable)
    return decide(new_value, champion_value, tracking.promotion_margin, metric), champion_value


def examples_in_vocabulary(examples: pl.DataFrame, remap) -> tuple[pl.DataFrame, int]:
    """Validation examples in another model's item numbering, and how many it cannot serve.

    Args:
        examples: ``user_id``, ``history`` list<int>, ``targets`` list<int> (and
            ``history_time_gaps``, aligned with ``history``), in the data's numbering.
        remap: (M + 1,) int64, data ``item_idx`` -> the model's (0: the model does not know it),
            from :func:`serving.inputs.vocabulary_remap`.

    Returns:
        The examples the model can serve, remapped: history events of unknown items dropped (with
        their time-gap buckets, as ``score`` drops them), unknown targets dropped; an example whose
        targets or history are all unknown is removed and counted (second value).
    """
    from recsys_alibi.data.splits import HISTORY, HISTORY_TIME_GAPS, TARGETS

    mapping = pl.DataFrame({"_data": list(range(remap.shape[0])), "_model": remap.tolist()},
                           schema={"_data": pl.Int64, "_model": pl.Int32})  # fmt: skip
    rows = examples.with_row_index("_row")
    history_columns = [c for c in (HISTORY, HISTORY_TIME_GAPS) if c in examples.columns]

    def mapped(columns: list[str]) -> pl.DataFrame:
        long = rows.select("_row", *columns).explode(columns).drop_nulls(columns[0])
        long = long.join(mapping, left_on=pl.col(columns[0]).cast(pl.Int64), right_on="_data", how="left", maintain_order="left")
        long = long.filter(pl.col("_model") > 0).with_columns(pl.col("_model").alias(columns[0])).drop("_model")
        return long.group_by("_row", maintain_order=True).agg(columns)

    history, targets = mapped(history_columns), mapped([TARGETS])
    kept = (rows.drop(*history_columns, TARGETS).join(history, on="_row", how="inner")
            .join(targets, on="_row", how="inner").sort("_row").drop("_row").select(examples.columns))  # fmt: skip
    kept = kept.with_columns(pl.col(c).cast(examples.schema[c]) for c in (*history_columns, TARGETS))
    return kept, examples.height - kept.height


def champion_metric(config: JobConfig, model, examples: pl.DataFrame, n_items: int, unservable: int) -> float:
    """The promotion metric of the champion on ``examples`` plus ``unservable`` examples it cannot serve.

    A per-user metric (HR@K, NDCG@K, Recall@K, MRR) counts each unservable example as a miss (0):
    the mean over every example. ``Coverage@K`` (a catalog share) is that of the served examples.
    """
    metric = config.tracking.promotion_metric
    value = validation_metrics(config, model, examples, n_items)[metric]
    if metric.startswith("Coverage@"):
        return value
    return value * examples.height / (examples.height + unservable)


def _training_split(held) -> str | None:
    """The champion run's ``recsys_alibi.train_split`` tag (None: no run, or a run from before the tag)."""
    import mlflow

    from pipelines.resume import SPLIT_TAG

    run_id = getattr(held, "run_id", None)
    return mlflow.MlflowClient().get_run(run_id).data.tags.get(SPLIT_TAG) if run_id else None


def _split_fits(config: JobConfig, sequences: pl.DataFrame, trained: str | None) -> bool:
    """Whether a model trained on split ``trained`` never saw the gate's validation targets
    (the rule of :func:`pipelines.evaluate.check_training_split`, for the "valid" stage)."""
    from pipelines.evaluate import check_training_split, protocol_cutoff

    try:
        check_training_split(trained, config.evaluate.protocol, protocol_cutoff(config, sequences), "champion")
    except ValueError:
        return False
    return True


def _record(client, config: JobConfig, new_version: str, new_metrics: dict[str, float], held_version: str | None,
            champion_value: float | None, decision: Decision) -> None:  # fmt: skip
    """Tag the new version with what the gate saw, and move the alias to it when it won."""
    tracking = config.tracking
    name, alias, metric = tracking.registered_model, tracking.champion_alias, tracking.promotion_metric
    tags = {f"{VALID_PREFIX}.{metric_key(k)}": f"{v:.6f}" for k, v in new_metrics.items()}
    tags["promotion.metric"] = metric
    tags["promotion.champion_version"] = held_version or "none"
    if champion_value is not None:
        tags[f"promotion.champion.{metric_key(metric)}"] = f"{champion_value:.6f}"
    tags[DECISION_TAG] = "promoted" if decision.promote else "rejected"
    for key, value in tags.items():
        client.set_model_version_tag(name, new_version, key, value)
    if INCOMPLETE_TAG in client.get_model_version(name, new_version).tags:  # an earlier run's gate failed: now done
        client.delete_model_version_tag(name, new_version, INCOMPLETE_TAG)
    if decision.promote:
        client.set_registered_model_alias(name, alias, new_version)
    else:
        client.set_model_version_tag(name, new_version, REJECTED_TAG, decision.reason)
    log.info("promotion: version %s %s (%s)", new_version, tags[DECISION_TAG], decision.reason)


def log_gate_to_run(run_id: str, gate: GateResult) -> None:
    """The gate's validation metrics and decision on the training run too."""
    import mlflow

    client = mlflow.MlflowClient()
    for key, value in gate.new_metrics.items():
        client.log_metric(run_id, metric_key(f"{VALID_PREFIX}/{key}"), value)
    client.set_tag(run_id, DECISION_TAG, "promoted" if gate.decision.promote else "rejected")
    client.set_tag(run_id, "promotion.reason", gate.decision.reason[:5000])
