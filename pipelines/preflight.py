"""What the daily ``pipeline`` checks before it touches any data.

The pipeline generates or prepares (with ``data.append``: merges the day into the prepared
directory) before it trains. A setting that would refuse training but needs none of the new data
is checked here first, so a refused run leaves the data as it was: the warm schedule against
``train.context_schedule``, a sharded table with the full softmax, an accelerator this machine
lacks, a tracking URI MLflow cannot use, the item-feature encoder with no table to prepare, and
``train.init_from`` (the model must exist, its run must not be deleted, it must read item features exactly
when the new model does and have the same architecture, from its run's logged config; ``champion``
with no champion yet is a cold start, as in ``train``), and the champion the gate will compare with
(:func:`check_champion`: resolved once for the whole run, its run not deleted, its model's files
present). What needs the data (``model.max_len:
auto``, the architecture of a warm start against the data's vocabulary, the time protocol) is
checked by ``train`` after the prepare.
"""

from __future__ import annotations

from recsys_alibi.config import ConfigError, JobConfig, check_warm_schedule


def check_before_data(config: JobConfig):
    """Every pipeline check that needs no data, run before generate/prepare write anything.

    Returns:
        The champion of this run (:class:`pipelines.promotion.Champion`, resolved once: the prior choice and a
        warm start from ``champion`` use that version).

    Raises:
        ConfigError: a tracking URI MLflow cannot use, the warm schedule never reaches the context schedule's last switch, the feature encoder
            with no item table to prepare, a warm start across item features and none, a sharded
            table with the full softmax, an accelerator this machine lacks.
        ModelUriError: ``train.init_from`` names no model in the tracking store, or a deleted run; the champion's
            run is deleted, or its model's files are missing (:func:`check_champion`).
        ChampionLookupError: the store failed to say which version holds the champion alias.
    """
    from recsys_alibi.tracking import check_tracking_uri, tracking_uri, tracking_uri_origin
    from recsys_alibi.training.fit import check_sharding
    from recsys_alibi.training.launch import check_accelerator

    check_tracking_uri(tracking_uri(config.tracking), tracking_uri_origin())
    check_warm_schedule(config)
    check_feature_table(config)
    check_sharding(config)
    check_accelerator(config.train)
    if config.train.init_from not in (None, "champion"):
        check_model_uri(config, config.train.init_from)
    champion = check_champion(config)
    parent = parent_run(config, champion)  # looked up once for both checks
    check_warm_features(config, parent)
    check_warm_shape(config, parent)
    return champion


def check_champion(config: JobConfig):
    """The version holding ``tracking.champion_alias`` now (:func:`pipelines.promotion.pin_champion`), refused
    before any data work when the gate could not use it: its MLflow run is deleted, or its model's files are gone
    (only the small ``MLmodel`` file is read). A SQLite store that does not exist yet has no champion (and is not
    created here).

    Raises:
        ModelUriError: one line naming the version and the fix (exit 2).
        ChampionLookupError: the store failed to answer (exit 2).
    """
    import tempfile

    import mlflow
    from mlflow.exceptions import MlflowException

    from pipelines.promotion import Champion, check_champion_run, pin_champion
    from recsys_alibi.data.errors import first_line
    from recsys_alibi.tracking import ModelUriError, quiet_artifacts, tracking_uri
    from recsys_alibi.tracking_store import sqlite_store_path

    tracking = config.tracking
    uri = tracking_uri(tracking)
    store = sqlite_store_path(uri)
    if store is not None and not store.exists():
        return Champion(tracking.registered_model, tracking.champion_alias, None)
    mlflow.set_tracking_uri(uri)
    champion = pin_champion(config)
    if champion.version is None:
        return champion
    check_champion_run(champion.name, champion.alias, champion.version, champion.run_id)  # a run gone for good: below
    try:
        with tempfile.TemporaryDirectory() as scratch, quiet_artifacts():
            mlflow.artifacts.download_artifacts(artifact_uri=f"{champion.uri}/MLmodel", dst_path=scratch)
    except (MlflowException, OSError) as err:
        first = first_line(err)
        raise ModelUriError(
            f"{champion.label()} cannot be loaded: its artifacts are missing or unreadable at {champion.source} "
            f"({first}); restore them, or point the alias '{champion.alias}' at a version that loads, then run again"
        ) from None
    return champion


def check_feature_table(config: JobConfig) -> None:
    """Refuse the item-feature encoder when the pipeline's prepare will store no item table: no declared columns
    and no ``data.append`` (an append keeps the table the prepared directory already has).

    Raises:
        ConfigError: ``model.item_features.enabled`` with no ``data.item_features`` columns, outside an append;
            ``score.new_item_slots`` with a model that reads no item features (it ranks no item it never saw).
    """
    if config.score.new_item_slots and not config.model.item_features.enabled:
        raise ConfigError(f"score.new_item_slots={config.score.new_item_slots} holds places for items the model never "
                          "saw, ranked from their features, and this pipeline trains a model without item features: "
                          "set model.item_features.enabled=true, or drop score.new_item_slots")  # fmt: skip
    if config.model.item_features.enabled and not config.data.item_features.columns and not config.data.append:
        raise ConfigError("model.item_features.enabled=true reads an item table, and this run prepares none "
                          "(data.item_features declares no column): declare the table's columns and data.items, "
                          "or set model.item_features.enabled=false")


def check_warm_features(config: JobConfig, parent: tuple | None) -> None:
    """Refuse a warm start between a model that reads item features and one that does not before the day is
    appended (``train`` refuses it after the prepare): the parent's run logged ``model.item_features.enabled``.
    ``parent``: :func:`parent_run`'s answer. No parent (``champion`` with no champion yet) or a run without that
    param: nothing to check here.

    Raises:
        ConfigError: one line naming the parent and the setting to match.
    """
    from recsys_alibi.training.warm_features import feature_mismatch

    if parent is None:
        return
    source, run = parent
    logged = run.data.params.get("model.item_features.enabled")
    if logged is not None and (mismatch := feature_mismatch(source, logged == "True", config.model.item_features.enabled)):
        raise ConfigError(mismatch)


def check_warm_shape(config: JobConfig, parent: tuple | None) -> None:
    """Refuse a warm start from a model of another architecture before the day is appended (``train`` refuses it
    after the prepare, from the loaded model): the parent run's logged config (``job_config.json``, a few kB)
    against ``model.*`` (:func:`recsys_alibi.training.warm_start.check_same_shape`; ``max_len: auto`` is left to
    ``train``, which resolves it from the data). ``parent``: :func:`parent_run`'s answer; none, or a run without
    a readable config: not checked here.

    Raises:
        WarmStartError: one line naming each differing key.
    """
    import mlflow

    from recsys_alibi.config import ModelConfig
    from recsys_alibi.tracking import CONFIG_ARTIFACT
    from recsys_alibi.training.warm_start import check_same_shape

    if parent is None:
        return
    source, run = parent
    try:
        logged = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/{CONFIG_ARTIFACT}")["model"]
        old = ModelConfig.model_validate({key: value for key, value in logged.items() if key in ModelConfig.model_fields})
    except Exception:  # noqa: BLE001 - an older or missing config: train checks the loaded model itself
        return
    # max_len: train's when auto (resolved from the data); a number is compared now (a learned table's size)
    now_len = old.max_len if config.model.max_len == "auto" else config.model.max_len
    check_same_shape(old, config.model.model_copy(update={"max_len": now_len}), source)


def parent_run(config: JobConfig, champion=None):
    """``(URI, MLflow run)`` of ``train.init_from`` (``champion``: the alias's model; ``champion`` given, a
    :class:`pipelines.promotion.Champion`: that pinned version), or None: no warm start, or no champion yet (a cold
    start)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from recsys_alibi.tracking import model_run_id, setup_tracking

    source = config.train.init_from
    if source is None:
        return None
    setup_tracking(config.tracking)
    if source == "champion" and champion is not None:
        if champion.uri is None:
            return None
        source = champion.uri
    elif source == "champion":
        source = f"models:/{config.tracking.registered_model}@{config.tracking.champion_alias}"
    try:
        return source, mlflow.MlflowClient().get_run(model_run_id(source))
    except MlflowException:  # champion not held yet: a cold start
        return None


def check_model_uri(config: JobConfig, uri: str) -> None:
    """Refuse a ``train.init_from`` URI that names no model in the tracking store, or a deleted run
    (:func:`recsys_alibi.tracking.check_live_run`); reads metadata only, downloads nothing.

    Raises:
        ModelUriError: one line naming the URI and the fix.
    """
    from mlflow.exceptions import MlflowException

    from recsys_alibi.tracking import ModelUriError, check_live_run, model_run_id, setup_tracking

    setup_tracking(config.tracking)
    try:
        model_run_id(uri)  # a registry name, version or alias that does not exist raises
        check_live_run(uri)
    except ModelUriError as err:
        raise ModelUriError(f"train.init_from={uri}: {err}") from None
    except MlflowException as err:
        raise ModelUriError(
            f"train.init_from={uri}: no such model in the tracking store ({str(err).strip().splitlines()[0]}); "
            "use runs:/RUN_ID/model, models:/NAME/VERSION or models:/NAME@ALIAS of a logged model"
        ) from None
