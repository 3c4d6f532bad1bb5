"""The registered ranker as an MLflow pyfunc: a frame of histories in, rankings in the long format out.

    model = mlflow.pyfunc.load_model("models:/recsys-alibi-ranker@champion")
    rankings = model.predict(df, params={"k": 100, "exclude_seen": True})

``df`` (a pandas or Polars frame, an Arrow table or record batch, or a dict of columns; one row
per user; an empty frame, e.g. an empty Spark partition, or one whose every history is empty
(also once the events of unusable times are dropped) gives empty rankings):

============= ==============================================================================
``user_id``   raw user id (integer or string), not null, one row per user
``item_id``   list of raw item ids (integers or strings, the model's vocabulary type or text
              of it), oldest first; an empty list is allowed: the user gets no rows (skipped,
              reason ``no_events``; see "Users without rows" below)
``timestamp`` list of times, one per item; required only when the model reads time gaps
              (``model.time_gap_buckets`` > 0), ignored otherwise. Read as ``prepare``
              reads raw timestamps (docs/data.md, "Timestamps"): integers are seconds, or
              by size ms (above 1e11), us (1e14), ns (1e17); ISO-8601 strings, datetimes.
              An event whose time is null, unreadable or before the epoch is dropped
              (``prepare`` rejects it as ``bad_timestamp``), with a warning
============= ==============================================================================

Returns a pandas frame of the contract's rankings: ``user_id``, ``rank`` int32 (1 = best),
``item_id`` (raw), ``score`` float32, sorted by (``user_id``, ``rank``).

Same code path as ``recsys-alibi score``: the frame is written as a prepared directory (the
sequences Parquet and its vocabulary of the raw ids seen) and read back with
:func:`serving.inputs.open_input` and ``ScoreInput.read_shard``, then ranked by
:class:`serving.rank.ShardRanker`, so unknown items (dropped, as in ``score``), users left with no
known item (not ranked), seen-item exclusion, top-K ties, long histories (context window with
sinks) and the raw-id mapping follow the same rules and give the same rows.

Users without rows: a user with an empty history (``no_events``), with no item the model knows
(``no_known_item``) or whose every catalog item is seen and excluded (``every_item_seen``) is not
ranked, as in ``score``; the long format has no row to carry that, so such a user is absent from the
returned frame (a Spark ``mapInArrow`` schema stays the rankings'). Each ``predict`` with such users
logs one warning with their count per reason, and ``RankerPyfunc.predict_with_skipped`` (reached with
``mlflow.pyfunc.load_model(URI).get_raw_model()``) returns them as ``score`` lists them in
``_skipped/``: ``user_id``, ``reason``, ``input_events``.

The logged model carries both flavours: ``pytorch`` (what ``score`` loads) and this
``python_function`` flavour (``loader_module = serving.pyfunc``: the project must be importable
where the model loads, as for the pickled PyTorch module). Its signature has no input schema:
with one, MLflow's own check takes pandas-like input only (it refuses Polars frames and Arrow
tables) and rejects a bad frame with a message that prints the whole frame without naming the
column; the columns are checked here instead (:func:`histories_frame`), each problem one line
naming the column. ``k`` (long) and ``exclude_seen`` (boolean) are typed params.

Business rules (``score.allow`` / ``score.deny``, :mod:`serving.rules`) are files the serving side
owns, so they are given when the model is loaded, not with each request:
``mlflow.pyfunc.load_model(URI, model_config={"allow": PATH, "deny": PATH})`` (:func:`rules_config`);
every ``predict`` then applies them as ``score`` does.
"""

from __future__ import annotations

import math
import numbers
import tempfile
from pathlib import Path
from typing import Any

import logging

import numpy as np
import polars as pl
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from recsys_alibi.config import DataConfig, ScoreConfig
from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.timestamps import seconds_of_lists, usable_seconds
from serving.inputs import SKIP_NO_EVENTS, open_input
from serving.rank import ShardRanker

log = logging.getLogger(__name__)

# what a None history is told: [] is accepted, and the user is then skipped (no rows), as score skips it
_EMPTY_HISTORY = "give [] for a user without events (that user gets no rows: skipped as no_events)"

LOADER_MODULE = "serving.pyfunc"
PARAMS = ("k", "exclude_seen")
PARAM_RULES = {"k": "an integer >= 1", "exclude_seen": "true or false"}  # the signature types them long / boolean
PREDICT_INPUT = "the predict input"  # how messages name the frame (never the temporary folder it is staged in)
MODEL_CONFIG = ("allow", "deny", "device", "items", "new_item_slots")  # score settings given when the model is loaded (rules_config)


class PyfuncParamError(MlflowException, DataError):
    """A ``predict`` param refused: one class and one message frame for every bad param.

    MLflow checks the signature's types first (``k`` long, ``exclude_seen`` boolean: ``"10"``, 2.5
    or True for ``k`` never reach the model) and raises ``MlflowException`` with error code
    ``INVALID_PARAMETER_VALUE`` and the message ``Invalid parameters found: {(NAME, PROBLEM)}``; the
    model checks the rest of :data:`PARAM_RULES` (``k`` >= 1; every param when called without MLflow)
    and raises this subclass of it, with that code and that frame, so a caller catches one exception
    (also a ``DataError``) whichever check refused the param.
    """

    def __init__(self, name: str, value: Any) -> None:
        rule = PARAM_RULES.get(name)
        problem = f"must be {rule}, got {value!r}" if rule else f"unknown param; the params are {', '.join(PARAMS)}"
        super().__init__(f"Invalid parameters found: {({(name, problem)})!r}", error_code=INVALID_PARAMETER_VALUE)


def _input_error(column: str, problem: str) -> DataError:
    return DataError(f"pyfunc input column '{column}': {problem}")


def _to_polars(model_input: Any) -> pl.DataFrame:
    """A pandas frame, Polars frame, Arrow table or record batch, or dict of columns as a Polars frame."""
    import pyarrow as pa

    if isinstance(model_input, pl.DataFrame):
        return model_input
    try:
        import pandas as pd

        if isinstance(model_input, pd.DataFrame):  # list cells may be Python lists or numpy arrays
            return pl.DataFrame({str(c): pl.Series(str(c), _cells(model_input[c].tolist()), strict=False)
                                 for c in model_input.columns})  # fmt: skip
        arrow = isinstance(model_input, (pa.Table, pa.RecordBatch))
        frame = pl.from_arrow(model_input) if arrow else pl.DataFrame(model_input)
    except (TypeError, ValueError, pl.exceptions.PolarsError) as err:
        raise DataError(f"pyfunc input: cannot read a {type(model_input).__name__} as a frame ({err})") from None
    if not isinstance(frame, pl.DataFrame):
        raise DataError(f"pyfunc input: expected a frame with user_id and item_id, got {type(model_input).__name__}")
    return frame


def _cells(values: list) -> list:
    """pandas cells as Polars takes them: numpy arrays (how Spark hands array columns) as lists,
    missing values (None, NaN, pandas NA, as pandas 3 stores a missing string) as None."""
    return [v.tolist() if isinstance(v, np.ndarray) else None if _missing(v) else v for v in values]


def _missing(value: Any) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    return type(value).__name__ in ("NAType", "NaTType")


def histories_frame(model_input: Any, *, needs_time: bool, timestamp_unit: str = "auto") -> pl.DataFrame:
    """Check the pyfunc input and return it as ``user_id``, ``item_id`` list (and ``timestamp`` list).

    Args:
        model_input: one row per user (see the module docstring).
        needs_time: the model reads time gaps, so ``timestamp`` is required.
        timestamp_unit: ``data.timestamp_unit`` (``auto``, ``s``, ``ms``): how integer times are
            read, as ``prepare`` reads them (:func:`event_times`).

    Returns:
        The frame, ``timestamp`` in int64 seconds with the events of unusable times dropped; with
        no rows (an empty batch), ``user_id`` typed String when the input's type is none of
        integer or string (e.g. an empty pandas object column).

    Raises:
        DataError: one line naming the column: missing, null, repeated user ids, not a list,
            null or float item ids, integer ids beyond 64 bits, timestamps missing, null lists,
            of a type ``prepare`` cannot read, or not one per item.
    """
    frame = _to_polars(model_input)
    columns = [schema.USER_ID, schema.ITEM_ID] + ([schema.TIMESTAMP] if needs_time else [])
    for column in columns:
        if column not in frame.columns:
            why = "the model reads time gaps: give a list of int64 seconds per user" if column == schema.TIMESTAMP else (
                "give one row per user with user_id and item_id (a list of raw item ids, oldest first)")
            raise _input_error(column, f"missing ({why}; got columns {frame.columns})")
    frame = frame.select(columns)
    users = frame.get_column(schema.USER_ID)
    if frame.height == 0:  # an empty batch: no value to check, empty rankings
        return frame if users.dtype.is_integer() or users.dtype == pl.String else frame.cast({schema.USER_ID: pl.String})
    if users.null_count():  # first: pandas holds an integer column with a missing value as floats (NaN)
        raise _input_error(schema.USER_ID, f"{users.null_count()} null id(s) (first: row {int(users.is_null().arg_true()[0])}); "
                                           "every row needs a user id")  # fmt: skip
    if not (users.dtype.is_integer() or users.dtype == pl.String):
        raise _input_error(schema.USER_ID, f"raw user ids must be integers or strings, got {users.dtype}")
    repeated = users.filter(users.is_duplicated())
    if repeated.len():
        raise _input_error(schema.USER_ID, f"{repeated.n_unique()} id(s) on several rows (first: {repeated[0]!r}); "
                                           "give one row per user with the whole history")  # fmt: skip
    frame = frame.with_columns(_int64_ids(users, schema.USER_ID, users.dtype))
    items = frame.get_column(schema.ITEM_ID)
    if items.dtype == pl.Null:  # every cell None
        raise _input_error(schema.ITEM_ID, f"{items.len()} null list(s); {_EMPTY_HISTORY}")
    if not isinstance(items.dtype, pl.List):
        raise _input_error(schema.ITEM_ID, f"must be a list of raw item ids per user, got {items.dtype}")
    inner = items.dtype.inner
    if not (inner.is_integer() or inner in (pl.String, pl.Null)):
        raise _input_error(schema.ITEM_ID, f"raw item ids must be integers or strings, got {inner}")
    if items.null_count():
        raise _input_error(schema.ITEM_ID, f"{items.null_count()} null list(s); {_EMPTY_HISTORY}")
    if items.list.eval(pl.element().is_null().any()).explode().any():
        raise _input_error(schema.ITEM_ID, "null item ids inside lists; drop those events")
    frame = frame.with_columns(_int64_ids(items, schema.ITEM_ID, inner))
    if needs_time:
        frame = event_times(frame, timestamp_unit)
    if inner == pl.Null:  # only empty lists: no type to keep
        frame = frame.with_columns(pl.col(schema.ITEM_ID).cast(pl.List(pl.Int64)))
    return frame


def event_times(frame: pl.DataFrame, unit: str) -> pl.DataFrame:
    """``timestamp`` lists as int64 seconds by ``prepare``'s rule; events of unusable times dropped.

    Each time is read by :func:`recsys_alibi.data.timestamps.timestamp_parts` (what ``prepare``
    and so ``score`` apply to raw events; ``unit`` = ``data.timestamp_unit``); an event whose time
    is null, unreadable or before the epoch (:func:`~recsys_alibi.data.timestamps.usable_seconds`
    false) is dropped from both lists, as ``prepare`` rejects it, and the count is logged.

    Args:
        frame: checked ``user_id``, ``item_id`` list and ``timestamp`` columns.
        unit: ``auto``, ``s`` or ``ms``.

    Raises:
        DataError: ``timestamp`` not a list, a null list, a type ``prepare`` cannot read, or a
            list of another length than the user's ``item_id`` list.
    """
    times = frame.get_column(schema.TIMESTAMP)
    if not isinstance(times.dtype, pl.List):
        raise _input_error(schema.TIMESTAMP, f"must be a list of times per user (e.g. int64 seconds), got {times.dtype}")
    if times.null_count():
        raise _input_error(schema.TIMESTAMP, f"{times.null_count()} null list(s); give one time per item")
    differ = times.list.len() != frame.get_column(schema.ITEM_ID).list.len()
    if differ.any():
        raise _input_error(schema.TIMESTAMP, f"{int(differ.sum())} user(s) with a list of another length than "
                                             f"item_id (first: row {int(differ.arg_true()[0])}); give one time per item")  # fmt: skip
    try:
        seconds = seconds_of_lists(pl.col(schema.TIMESTAMP), times.dtype.inner, unit)
    except TypeError:
        raise _input_error(schema.TIMESTAMP, f"times of type {times.dtype.inner}; give integers (seconds, ms, us "
                                             "or ns), ISO-8601 strings or datetimes") from None  # fmt: skip
    frame = frame.with_columns(seconds)
    keep = pl.col(schema.TIMESTAMP).list.eval(usable_seconds(pl.element()).arg_true())
    kept = frame.with_columns(pl.col(schema.ITEM_ID, schema.TIMESTAMP).list.gather(keep))
    dropped = int(times.list.len().sum() - kept.get_column(schema.TIMESTAMP).list.len().sum())
    if dropped:
        log.warning("pyfunc input: %d event(s) with a null, unreadable or pre-epoch time dropped, as prepare "
                    "rejects them (bad_timestamp)", dropped)  # fmt: skip
    return kept


def _int64_ids(ids: pl.Series, column: str, dtype: pl.DataType) -> pl.Series:
    """Integer ids (or lists of them) as Int64, the contract's integer id type; strings as they are.

    Raises:
        DataError: an integer beyond Int64 (e.g. Python's ``2**70``, held as Int128 or UInt64).
    """
    if not dtype.is_integer() or dtype == pl.Int64:
        return ids
    target = pl.List(pl.Int64) if isinstance(ids.dtype, pl.List) else pl.Int64
    try:
        return ids.cast(target, strict=True)
    except pl.exceptions.InvalidOperationError:
        raise _input_error(column, "integer ids beyond 64 bits; give such ids as strings") from None


def write_prepared(frame: pl.DataFrame, directory: Path) -> Path:
    """Write checked histories as a prepared directory (``sequences.parquet`` + ``items.parquet``).

    The vocabulary holds the distinct raw ids of ``frame`` (indices 1..M in order of first
    appearance), so :func:`serving.inputs.open_input` maps it onto the model's by raw id.
    """
    directory.mkdir(parents=True, exist_ok=True)
    raw = frame.get_column(schema.ITEM_ID)
    flat = raw.explode().drop_nulls()
    vocab = flat.unique(maintain_order=True)
    items = pl.DataFrame({schema.ITEM_IDX: pl.Series(np.arange(1, vocab.len() + 1), dtype=pl.Int32),
                          schema.ITEM_ID: vocab, schema.COUNT: pl.Series(np.ones(vocab.len()), dtype=pl.Int64)})  # fmt: skip
    to_index = pl.element().replace_strict(vocab, items.get_column(schema.ITEM_IDX), return_dtype=pl.Int32)
    sequences = frame.select(
        pl.col(schema.USER_ID),
        pl.col(schema.ITEM_ID).list.eval(to_index).cast(pl.List(pl.Int32)).alias(schema.ITEM_IDX),
        raw.list.len().cast(pl.Int32).alias(schema.LENGTH),
    )
    if schema.TIMESTAMP in frame.columns:
        sequences = sequences.with_columns(frame.get_column(schema.TIMESTAMP))
    sequences.write_parquet(directory / schema.SEQUENCES_FILE)
    items.write_parquet(directory / schema.ITEMS_FILE)
    return directory


class RankerPyfunc:
    """What ``mlflow.pyfunc.load_model`` wraps: one ranker, its vocabulary and ``score`` settings.

    Args:
        model: an ``AlibiRanker`` (kept on ``score.device``, ``auto``: cuda when available).
        items: its vocabulary (``item_idx`` 1..N, ``item_id`` raw).
        score: the ``score`` section (batching, context, device); ``k`` and ``exclude_seen``
            are the defaults of the params.
    """

    def __init__(self, model, items: pl.DataFrame, score: ScoreConfig | None = None) -> None:
        self.model = model
        self.items = items
        self.score = score or ScoreConfig()
        self._rankers: dict[tuple[int, bool], ShardRanker] = {}
        self.rule_stats: dict[str, int] = {}  # score.allow / deny counts (ids the model does not know warned about)

    def _ranker(self, k: int, exclude_seen: bool) -> ShardRanker:
        key = (k, exclude_seen)
        if key not in self._rankers:
            cfg = self.score.model_copy(update={"exclude_seen": exclude_seen})
            self._rankers[key] = ranker = ShardRanker(self.model, self.items, cfg, k)
            if ranker.rules is not None and not self.rule_stats:  # once: unknown ids counted and logged
                self.rule_stats = ranker.rules.stats()
        return self._rankers[key]

    def predict(self, model_input: Any, params: dict[str, Any] | None = None):
        """Top-``k`` rankings of every user with a known item (module docstring for the columns).

        Args:
            model_input: pandas/Polars frame or Arrow table, one row per user.
            params: ``k`` (int >= 1, default ``score.k``), ``exclude_seen`` (bool, default: the
                training config's ``exclude_seen``, logged in the signature: the seen-item rule of
                ``recsys_alibi.evaluation.ranking``, as ``score`` applies it).

        Returns:
            pandas frame ``user_id``, ``rank`` int32, ``item_id``, ``score`` float32 (long format). A
            user with an empty history ``[]`` or no known item gets no rows (logged as a warning;
            :meth:`predict_with_skipped` lists them with the reason).

        Raises:
            DataError: malformed input (one line naming the column), or no item of the input in the
                model's vocabulary.
            PyfuncParamError: a param outside :data:`PARAM_RULES` or unknown (an ``MlflowException``
                with ``INVALID_PARAMETER_VALUE``, as MLflow's own type check, and a ``DataError``).
        """
        return self.predict_polars(model_input, params).to_pandas()

    def predict_polars(self, model_input: Any, params: dict[str, Any] | None = None) -> pl.DataFrame:
        """:meth:`predict` returning a Polars frame (as the part files hold it)."""
        return self.predict_with_skipped(model_input, params)[0]

    def predict_with_skipped(
        self, model_input: Any, params: dict[str, Any] | None = None
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """:meth:`predict_polars` and the users of the input that got no rows, with why.

        The rankings' long format has no place for a user without rows, so the pyfunc, like ``score``,
        leaves them out of the rankings; ``score`` lists them in ``_skipped/``, this returns the same list
        (and :meth:`predict` logs one warning with their count per reason).

        Returns:
            ``(rankings, skipped)``: ``skipped`` has ``user_id``, ``reason`` (``no_events``: an empty
            history ``[]``, also once events of unusable times are dropped; ``no_known_item``: no item of
            the history is in the model's vocabulary; ``every_item_seen``: seen-item exclusion left
            nothing to recommend) and ``input_events`` Int64, as ``score``'s ``_skipped/`` parts.
        """
        k, exclude_seen = self._params(params or {})
        ranker = self._ranker(k, exclude_seen)
        frame = histories_frame(model_input, needs_time=ranker.time_gap_buckets > 0)
        users = frame.get_column(schema.USER_ID)
        if frame.height == 0 or frame.get_column(schema.ITEM_ID).list.len().sum() == 0:  # or only empty histories
            skipped = pl.DataFrame({  # an empty batch's item_id may have no list type: every count is 0 anyway
                schema.USER_ID: users,
                "reason": pl.Series([SKIP_NO_EVENTS] * frame.height, dtype=pl.String),
                "input_events": pl.Series(np.zeros(frame.height, dtype=np.int64), dtype=pl.Int64),
            })  # fmt: skip
            _warn_skipped(skipped, frame.height)
            return ranker.empty(users.dtype), skipped
        with tempfile.TemporaryDirectory(prefix="recsys-alibi-pyfunc-") as tmp:
            source = ranker.for_input(open_input(write_prepared(frame, Path(tmp) / "input"), self.items, DataConfig(),
                                                 Path(tmp) / "_input", time_gap_buckets=ranker.time_gap_buckets,
                                                 name=PREDICT_INPUT, new_item_ids=ranker.new_item_ids))  # fmt: skip
            step = self.score.shard_users
            parts, skips = [], []
            for start in range(0, source.n_users, step):
                shard = source.read_shard(start, step)
                part = ranker.rank(shard.user_ids, shard.histories, shard.gaps, new_seen=shard.new_seen,
                                   withheld=source.withheld)[0]  # fmt: skip
                parts.append(part)
                skips.append(shard.skipped(part.get_column(schema.USER_ID).unique()))
        skipped = pl.concat(skips)
        _warn_skipped(skipped, frame.height)
        return pl.concat(parts).sort(schema.USER_ID, schema.RANK), skipped

    def get_raw_model(self) -> RankerPyfunc:
        """This object (``mlflow.pyfunc.load_model(URI).get_raw_model()``), for :meth:`predict_with_skipped`."""
        return self

    def _params(self, params: dict[str, Any]) -> tuple[int, bool]:
        """``(k, exclude_seen)`` by :data:`PARAM_RULES`; raises :class:`PyfuncParamError`."""
        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            raise PyfuncParamError(unknown[0], params[unknown[0]])
        k, exclude_seen = params.get("k", self.score.k), params.get("exclude_seen", self.score.exclude_seen)
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
            raise PyfuncParamError("k", k)
        if not isinstance(exclude_seen, (bool, np.bool_)):
            raise PyfuncParamError("exclude_seen", exclude_seen)
        return int(k), bool(exclude_seen)


def _warn_skipped(skipped: pl.DataFrame, n_users: int) -> None:
    """One warning per predict with users that got no rows: how many, per reason."""
    if skipped.height == 0:
        return
    counts = skipped.group_by("reason").len().sort("reason")
    why = ", ".join(f"{r}: {n}" for r, n in counts.iter_rows())
    log.warning("pyfunc predict: %d of %d user(s) got no rows (%s), as score lists them in _skipped/; "
                "RankerPyfunc.predict_with_skipped returns them with the reason", skipped.height, n_users, why)  # fmt: skip


def example_input(items: pl.DataFrame, *, with_time: bool, n_events: int = 5):
    """A one-user pandas frame for the logged input example: the ``n_events`` most frequent items."""
    import pandas as pd

    top = items.sort(schema.COUNT, descending=True) if schema.COUNT in items.columns else items
    ids = top.get_column(schema.ITEM_ID).head(n_events).to_list()
    frame = {schema.USER_ID: [1], schema.ITEM_ID: [ids]}
    if with_time:
        frame[schema.TIMESTAMP] = [[1_700_000_000 + 3_600 * i for i in range(len(ids))]]
    return pd.DataFrame(frame)


def pyfunc_signature(items: pl.DataFrame, model, *, k: int, exclude_seen: bool = True):
    """The MLflow signature and input example of the pyfunc flavour.

    No input schema (MLflow would then refuse Polars frames and Arrow tables; the columns are
    checked by :func:`histories_frame`, the example shows them); outputs: ``user_id`` any, ``rank`` integer, ``item_id`` long or
    string (the vocabulary's type), ``score`` float; params ``k`` long (default ``k``) and
    ``exclude_seen`` boolean (default ``exclude_seen``: the training config's, so a call without
    the param serves as ``score`` and ``evaluate`` do). Written out, not inferred: MLflow's inference
    warns about integer columns, noise in ``train``'s output.

    Returns:
        ``(signature, example)``: the example is :func:`example_input` (with ``timestamp`` when
        the model reads time gaps).
    """
    from mlflow.models import ModelSignature
    from mlflow.types.schema import AnyType, ColSpec, ParamSchema, ParamSpec, Schema

    with_time = int(getattr(model.items, "time_gap_buckets", 0)) > 0
    item_type = "string" if items.schema[schema.ITEM_ID] == pl.String else "long"
    outputs = Schema([ColSpec(AnyType(), schema.USER_ID), ColSpec("integer", schema.RANK), ColSpec(item_type, schema.ITEM_ID),
                      ColSpec("float", schema.SCORE)])  # fmt: skip
    params = ParamSchema([ParamSpec("k", "long", int(k)), ParamSpec("exclude_seen", "boolean", bool(exclude_seen))])
    return ModelSignature(inputs=None, outputs=outputs, params=params), example_input(items, with_time=with_time)


def pyfunc_flavour(model, items: pl.DataFrame, *, k: int, exclude_seen: bool = True):
    """The :class:`recsys_alibi.tracking.PyfuncFlavour` that ``log_ranker`` logs beside PyTorch."""
    from recsys_alibi.tracking import PyfuncFlavour

    signature, example = pyfunc_signature(items, model, k=k, exclude_seen=exclude_seen)
    return PyfuncFlavour(loader_module=LOADER_MODULE, signature=signature, input_example=example,
                         model_config=dict.fromkeys(MODEL_CONFIG))


def _load_pyfunc(data_path: str, model_config: dict | None = None) -> RankerPyfunc:
    """MLflow's entry point for the ``python_function`` flavour (``data_path`` = ``<model>/data``)."""
    import logging

    from recsys_alibi.tracking import load_ranker_dir

    # torchrec's import makes torch log an is_fx_tracing notice (a W-line on stderr) that says nothing to a caller
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    loaded = load_ranker_dir(Path(data_path).parent)
    return RankerPyfunc(loaded.model, loaded.items, rules_config(model_config or {}))


def rules_config(model_config: dict[str, Any]) -> ScoreConfig:
    """The ``score`` settings of a loaded pyfunc: business rules from MLflow's ``model_config``.

    ``mlflow.pyfunc.load_model(URI, model_config={"allow": PATH, "deny": PATH})`` (either or
    both; Parquet of ``item_id`` or ``user_id, item_id``, :mod:`serving.rules`) makes every
    ``predict`` of that model apply the rules, as ``score.allow`` / ``score.deny`` do in ``score``.
    ``device`` (MLflow's own key for PyTorch models) is ``score.device``; None keeps the default.
    ``items`` (an item table or a prepared directory, ``score.items``): a model with item features
    also ranks the table's items it never saw, from their features alone (:mod:`serving.new_items`);
    ``new_item_slots`` (an int, ``score.new_item_slots``) holds that many places of each ranking for them.
    The rules are files the serving side owns, read once per model load (per-user rows per call,
    for the users of the call), not data sent with each request.

    Raises:
        DataError: a key not in ``MODEL_CONFIG``, a value that is not a string (``new_item_slots``: not an int >= 0).
    """
    unknown = sorted(set(model_config) - set(MODEL_CONFIG))
    if unknown:
        raise DataError(f"pyfunc model_config: unknown {unknown}; known: {list(MODEL_CONFIG)}")
    slots = model_config.get("new_item_slots")
    if slots is not None and (not isinstance(slots, numbers.Integral) or isinstance(slots, bool) or slots < 0):
        raise DataError(f"pyfunc model_config 'new_item_slots': a whole number >= 0, got {slots!r}")
    if slots and model_config.get("items") is None:
        raise DataError("pyfunc model_config 'new_item_slots' needs 'items' (an item table or a prepared directory): "
                        "the places are held for the table's items the model never saw")  # fmt: skip
    for key, value in model_config.items():
        if value is not None and key != "new_item_slots" and not isinstance(value, (str, Path)):
            raise DataError(f"pyfunc model_config '{key}': a string (a Parquet path or a device), got {value!r}")
    return ScoreConfig(**{key: int(v) if key == "new_item_slots" else str(v) for key, v in model_config.items() if v is not None})
