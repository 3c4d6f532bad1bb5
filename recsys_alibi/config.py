"""Typed, frozen job configuration loaded from YAML with ``--set dotted.key=value`` overrides.

One section per component; each component receives its section whole. Unknown keys are an
error (pydantic ``extra="forbid"``), so a typo in a config fails loudly instead of being ignored.
Values are checked when the config is loaded, never later by the library that uses them: types
are strict (``true`` is not a number, ``2.5`` is not an integer), floats are finite, and every
key handed to Lightning or torch (``train.accelerator``, ``train.devices``, ``train.precision``,
``train.strategy``, ``train.limit_train_batches``, ``score.device``) takes only values they accept.
YAML is read with the safe loader (tags such as ``!!python/object`` are refused, never run) and
a key given twice in one mapping is an error. Every problem is one :class:`ConfigError` line
naming the key (or the file, line and column) and the fix. A key that takes effect only with
another setting (``model.slope_floor`` with ``model.learnable_slopes``, ...) is refused when given
away from its default while that setting is off, instead of being accepted and ignored; its default
value stays accepted, so a dumped config loads again. A section written with no keys
(``model:`` alone, i.e. YAML null) means that section's defaults.
"""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from recsys_alibi.config_reader import ConfigError, OverrideGivers, parse_override, read_config_file, read_yaml

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")  # Lightning's, less tpu (needs torch_xla, not installed)
STRATEGIES = (
    "auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_find_unused_parameters_true", "ddp_find_unused_parameters_false",
    "fsdp",
)  # Lightning built-ins that need no extra package (deepspeed and xla do)
# Lightning's names the ranker trains with ("16", "bf16", "32" are its older names of 16-mixed, bf16-mixed,
# 32-true); the "true" half and double precisions (16-true, bf16-true, 64-true, 64) are refused: parts of the
# model stay float32, and on a CPU their first step fails with a dtype mismatch (not tried on a GPU)
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "32", "bf16", "16")


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what torch, numpy and Lightning take as an integer
YAML_WORDS = ((True, "true"), (False, "false"), (None, "null"))


EMPTY_PATH = "an empty path (an unset variable?): give a path, or leave the key out"


def _path_or_none(value: str | None) -> str | None:
    """A path-valued key: an empty text is refused (it would mean the working directory)."""
    if value is not None and not value.strip():
        raise ValueError(EMPTY_PATH)
    return value


def yaml_word(value: Any) -> Any:
    """``value`` as YAML writes it: True / False / None as true / false / null (by identity: ``1 == True``,
    so a dict lookup would show the integer 1 as true); anything else as it is."""
    return next((word for known, word in YAML_WORDS if value is known), value)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _fits_in_64_bits(cls, value: Any) -> Any:
        """Every integer (also inside lists) fits in int64: a larger one would reach torch as an overflow."""
        values = value if isinstance(value, (list, tuple)) else (value,)
        if any(isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX for v in values):
            raise ValueError("integers must fit in a 64-bit integer (at most 9223372036854775807)")
        return value

    def _refuse_ignored(self, prefix: str, rules: tuple[tuple[str, bool, str], ...]) -> None:
        """Refuse a key that takes effect only with another setting, given away from its default
        while that setting is off: it would be accepted and ignored. ``rules``: ``(key, in effect,
        the setting it needs)``. The default value stays accepted (a dumped config repeats every key),
        and the refusal names it as the command line's fix of a key a config file gives."""
        for key, in_effect, needs in rules:
            value, default = getattr(self, key), type(self).model_fields[key].default
            if in_effect or value == default:
                continue
            plain = not isinstance(value, str) or (value.isprintable() and value.strip() == value)
            shown = yaml_word(value) if plain else repr(value)  # a tab as '\t', not a blank
            given = f"{prefix}.{key}" if isinstance(value, _Section) else f"{prefix}.{key}={shown}"
            fix = _default_override(f"{prefix}.{key}", default)
            raise ValueError(f"{given} takes effect only with {needs}: set {needs}, or drop {prefix}.{key}"
                             + (f" (on the command line: --set {fix})" if fix else ""))  # fmt: skip


def _default_override(key: str, default: Any) -> str | None:
    """``key=<default>`` as ``--set`` reads it back (a key of a config file cannot be dropped on the command
    line: given its default, it is accepted); None where the plain word would read as another value."""
    if isinstance(default, (_Section, list, dict, tuple)):
        return None
    text = f"{key}={yaml_word(default)}"
    try:
        parsed = parse_override(text)[1]
    except ConfigError:
        return None
    return text if parsed == default and type(parsed) is type(default) else None


class GenerateConfig(_Section):
    """Synthetic behaviour log (the embedded default data), see ``recsys_alibi.data.synthetic``."""

    enabled: bool = False
    users: int = Field(2000, ge=1)
    items: int = Field(2000, ge=2)  # the default data: a catalog no history exhausts (>= max_events; synthetic.py)
    task: Literal["default", "long-range"] = "default"
    distance: int = Field(64, ge=1)  # long-range probe: an answer comes exactly D events after its cue (D >= 3)
    min_events: int = Field(20, ge=3)  # shortest history generated, events
    max_events: int = Field(2000, ge=3)  # longest history generated, events (<= items: no user exhausts the catalog)
    days: int | None = Field(None, ge=1)  # `generate --days N`: the log as N daily files in a directory (synthetic.split_days)
    # also write the item table of the latent catalog (recsys_alibi.data.synthetic_items): items.parquet beside
    # the events, per day _items/day-NNN.parquet; the pipeline writes it when data.item_features is declared
    item_table: bool = False

    @model_validator(mode="after")
    def _events_range(self) -> "GenerateConfig":
        if self.min_events > self.max_events:
            raise ValueError(f"generate.min_events={self.min_events} is above generate.max_events={self.max_events}")
        self._refuse_ignored("generate", (
            ("distance", self.task == "long-range", "generate.task=long-range"),
            ("item_table", self.task == "default", "generate.task=default"),
        ))  # fmt: skip
        return self


class ColumnMap(_Section):
    """Source column names mapped onto the canonical event schema."""

    user_id: str = "user_id"
    item_id: str = "item_id"
    timestamp: str | None = "timestamp"
    event_type: str | None = None
    value: str | None = None


class ItemFeaturesConfig(_Section):
    """``data.item_features``: which columns of the item table (``data.items``) are which, declared, never
    guessed (recsys_alibi.data.item_table, docs/data.md "Item table")."""

    categorical: list[str] = []  # one value or a list of values per item (genres, tags, brand)
    numeric: list[str] = []  # one number per item (year, price); standardised by the model
    id_column: str = "item_id"  # the table's raw item id column (the events' item ids)
    separator: str | None = "|"  # a text categorical value is split on it ("Action|Comedy"); None: never split
    ranges: dict[str, list[float]] = {}  # numeric column -> [low, high]: a value outside is a reject

    @field_validator("separator")
    @classmethod
    def _not_empty(cls, value: str | None) -> str | None:
        if value == "":  # what YAML makes of a bare '|' (a block scalar) given on the command line
            raise ValueError("the separator must not be empty; '|' and ',' need YAML's quotes: --set "
                             "\"data.item_features.separator='|'\" (null: values are never split)")
        return value

    @model_validator(mode="after")
    def _columns_declared_once(self) -> "ItemFeaturesConfig":
        named = [*self.categorical, *self.numeric]
        both = sorted(set(self.categorical) & set(self.numeric))
        if both:
            raise ValueError(f"column '{both[0]}' is in both data.item_features.categorical and .numeric: declare it once")
        repeated = sorted({c for c in named if named.count(c) > 1})
        if repeated:
            raise ValueError(f"column '{repeated[0]}' is declared twice in data.item_features")
        reserved = {self.id_column, "item_idx"} & set(named)
        if reserved:
            raise ValueError(f"'{sorted(reserved)[0]}' is the item id or index, not a feature column")
        if any(not c.strip() for c in [*named, self.id_column]):
            raise ValueError("column names must not be empty")
        for column, bounds in self.ranges.items():
            if column not in self.numeric:
                raise ValueError(f"data.item_features.ranges.{column}: not a column of data.item_features.numeric")
            if len(bounds) != 2 or bounds[0] > bounds[1]:
                raise ValueError(f"data.item_features.ranges.{column} must be [low, high] with low <= high")
        return self

    @property
    def columns(self) -> list[str]:
        """Every declared feature column: the categorical ones, then the numeric ones."""
        return [*self.categorical, *self.numeric]


class DataConfig(_Section):
    """Ingest and cleaning rules for ``prepare``."""

    input: str | None = None
    format: Literal["auto", "parquet", "csv", "ndjson", "movielens", "sasrec", "s3rec"] = "auto"
    columns: ColumnMap = ColumnMap()
    separator: str | None = None  # CSV/TSV delimiter; None: tab for .tsv, else the first of , tab ; | in the header
    has_header: bool = True
    # CSV/TSV quote: a field that starts with it is quoted (may hold separators, newlines); None: quotes are text
    quote_char: str | None = '"'
    timestamp_unit: Literal["auto", "s", "ms"] = "auto"
    min_events_per_user: int = Field(5, ge=1)  # k-core threshold on users
    min_events_per_item: int = Field(5, ge=1)  # k-core threshold on items
    min_value: float | None = None  # keep events with value >= this (e.g. ratings >= 4)
    drop_duplicates: bool = True  # drop exact duplicate (user, item, timestamp, ...) rows
    partition_rows: int = Field(4_000_000, ge=1_000)  # events per user-hash partition (bounds memory)
    id_type: Literal["auto", "int", "str"] = "auto"  # ids of text formats; auto: Int64 only when every value round-trips (docs/data.md)
    append: bool = False  # prepare merges the input into the existing prepared directory (docs/data.md, "Appending")
    # a full prepare may replace a prepared directory that holds events of inputs it does not read (else refused)
    overwrite: bool = False
    items: str | None = None  # item table (Parquet/CSV/NDJSON) keyed by raw item id (`prepare --items`, docs/data.md)
    item_features: ItemFeaturesConfig = ItemFeaturesConfig()  # its declared columns

    _paths = field_validator("input", "items")(_path_or_none)

    @field_validator("separator")
    @classmethod
    def _one_byte(cls, value: str | None) -> str | None:
        """``tab`` and ``\\t`` (a backslash and t, as a shell passes it) are the tab; else one single-byte character."""
        if value in ("tab", "\\t"):
            return "\t"
        if value is not None and (len(value.encode()) != 1 or value in "\n\r\""):
            raise ValueError("the separator is one single-byte character other than a newline or '\"': ';', or tab as "
                             "'tab'; ',' and '|' quoted for YAML: --set \"data.separator='|'\"")
        return value

    @field_validator("quote_char")
    @classmethod
    def _one_quote(cls, value: str | None) -> str | None:
        """One single-byte character other than a newline; ``None`` (YAML ``null``): no quoting."""
        if value is not None and (len(value.encode()) != 1 or value in "\n\r"):
            raise ValueError("the quote character is one single-byte character other than a newline (default '\"'), "
                             "or null to read quotes as plain text: --set data.quote_char=null")
        return value

    @model_validator(mode="after")
    def _quote_not_separator(self) -> "DataConfig":
        if self.quote_char is not None and self.quote_char == self.separator:
            raise ValueError(f"data.quote_char and data.separator are both {self.quote_char!r}; set one of them to "
                             "another character (data.quote_char=null: no quoting)")
        return self

    @model_validator(mode="after")
    def _items_declared(self) -> "DataConfig":
        # an append takes the declaration its directory recorded (recsys_alibi.data.append)
        if self.items is not None and not self.item_features.columns and not self.append:
            raise ValueError(
                "data.items needs its columns declared: set data.item_features.categorical and/or .numeric "
                "(columns are never guessed); to score with an item table, pass score --items PATH, read with the "
                "model's own declaration"
            )
        return self

    @model_validator(mode="after")
    def _format_keys(self) -> "DataConfig":
        """The keys of one reader, refused while ``data.format`` names another (``auto`` may be any)."""
        text = self.format in ("auto", "csv")
        self._refuse_ignored("data", (
            ("separator", text, "data.format=csv or auto"),
            ("has_header", text, "data.format=csv or auto"),
            ("quote_char", text, "data.format=csv or auto"),
            ("timestamp_unit", self.format not in ("sasrec", "s3rec"), "a data.format with timestamps (not sasrec, s3rec)"),
            ("id_type", self.format != "parquet", "a data.format read as text (not parquet)"),
        ))  # fmt: skip
        return self


class ItemFeatureModelConfig(_Section):
    """``model.item_features``: the item feature encoder (recsys_alibi.model.item_features).

    Each item's vector is its id row plus the encoding of its features from the prepared item table;
    items with fewer than ``id_min_events`` training events get no id part (features only); in each
    training step a share ``id_dropout`` of the items, drawn afresh, is scored by its features alone
    (DropoutNet, Volkovs et al., NeurIPS 2017), so that the encoder learns to rank an item it never saw.
    """

    enabled: bool = False  # read the prepared directory's item table (prepare --items)
    id_min_events: int = Field(0, ge=0)  # 0: every item keeps its id row
    id_dropout: float = Field(0.0, ge=0.0, lt=1.0)  # share of items without their id row in a training step

    @model_validator(mode="after")
    def _needs_enabled(self) -> "ItemFeatureModelConfig":
        self._refuse_ignored("model.item_features", (("id_min_events", self.enabled, "model.item_features.enabled=true"),
                                                     ("id_dropout", self.enabled, "model.item_features.enabled=true")))  # fmt: skip
        return self


class ModelConfig(_Section):
    """The ranker: embeddings, transformer blocks and attention."""

    d_model: int = Field(64, ge=4)
    n_layers: int = Field(2, ge=1)
    n_heads: int = Field(2, ge=1)
    # training context, items; "auto": from the data's history lengths (recsys_alibi.training.data_rules):
    # the max_len_quantile of the users' fit lengths, rounded to a multiple of 50, within [50, max_len_cap]
    max_len: Annotated[int, Field(ge=2)] | Literal["auto"] = 200
    max_len_quantile: float = Field(0.75, gt=0.0, le=1.0)
    max_len_cap: int = Field(200, ge=2)
    position: Literal["alibi", "learned", "none"] = "alibi"
    attention_backend: Literal["auto", "flex", "sdpa", "eager"] = "auto"
    dropout: float = Field(0.2, ge=0.0, lt=1.0)
    ffn_mult: int = Field(4, ge=1)
    max_bias: float = Field(8.0, gt=0.0)
    slopes: Literal["geometric", "wide"] = "geometric"  # slope scheme (recsys_alibi.model.alibi.head_slopes)
    long_context: int = Field(2048, ge=2)  # slopes=wide: the flattest head's bias is -1 nat this far back, items
    free_heads: int = Field(0, ge=0)  # heads with slope 0 (no position bias: content-only), the flattest ones
    # log_beyond: free heads' scores x max(1, log(n) / log(max_len)), n = keys a query sees: unscaled within the
    # training length, their softmax does not flatten as n grows past it (recsys_alibi.model.alibi)
    free_head_scale: Literal["none", "log_beyond"] = "none"
    learnable_slopes: bool = False
    slope_floor: Literal["positive", "zero"] = "positive"  # learnable: softplus (> 0) or relu (may reach 0)
    bias_clamp: float | None = Field(None, gt=0)  # |bias| clamped to this value (avoids exp underflow)
    window: int | None = Field(None, ge=1)  # sliding attention window, items
    sinks: int = Field(0, ge=0)  # first events always visible (StreamingLLM)
    shard_embeddings: bool = False  # row-wise torchrec sharding of the item table (docs/scaling.md)
    # item table: torchrec EmbeddingCollection or plain nn.Embedding; auto = torchrec where it imports (docs/install.md)
    embedding_backend: Literal["auto", "torchrec", "torch"] = "auto"
    time_gap_buckets: int = Field(0, ge=0)  # 0 = off; else a second table of log2 time-gap buckets (>= 3)
    # 0 = off; else each block mixes attention with a causal low-pass / high-pass rescaling over this many
    # events (BSARec, AAAI 2024, made causal: recsys_alibi.model.frequency), weight lowpass_mix on the filter
    lowpass_window: int = Field(0, ge=0)
    lowpass_mix: float = Field(0.7, ge=0.0, le=1.0)
    item_features: ItemFeatureModelConfig = ItemFeatureModelConfig()  # item vector = id row + feature encoder

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ModelConfig":
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}")
        if self.free_heads > self.n_heads:
            raise ValueError(f"model.free_heads={self.free_heads} is more than model.n_heads={self.n_heads}")
        alibi = self.position == "alibi"  # the slope keys shape ALiBi's bias; learned / none positions have none
        self._refuse_ignored("model", (
            ("slopes", alibi, "model.position=alibi"),
            ("max_bias", alibi and self.slopes == "geometric", "model.position=alibi and model.slopes=geometric"),
            ("learnable_slopes", alibi, "model.position=alibi"),
            ("free_heads", alibi, "model.position=alibi"),
            ("bias_clamp", alibi, "model.position=alibi"),
            ("free_head_scale", self.free_heads > 0, "model.free_heads >= 1"),
            ("slope_floor", self.learnable_slopes, "model.learnable_slopes=true"),
            ("long_context", self.slopes == "wide", "model.slopes=wide"),
            ("lowpass_mix", self.lowpass_window > 0, "model.lowpass_window >= 1"),
        ))  # fmt: skip
        if 0 < self.time_gap_buckets < 3:
            raise ValueError("model.time_gap_buckets needs at least 3 (padding, first event, one gap bucket); 0 = off")
        if self.shard_embeddings and self.embedding_backend == "torch":
            raise ValueError(
                "model.shard_embeddings=true needs model.embedding_backend=torchrec or auto (torchrec shards the table)"
            )
        if self.time_gap_buckets and self.shard_embeddings:
            raise ValueError("model.time_gap_buckets does not work with model.shard_embeddings yet; use one of them")
        if self.item_features.enabled and self.shard_embeddings:
            raise ValueError(
                "model.item_features.enabled does not work with model.shard_embeddings yet (the feature encoder "
                "scores the whole catalog); use one of them"
            )
        return self


class WarmConfig(_Section):
    """The schedule of a warm-started run (``train.init_from``): each key replaces its ``train.*`` value.

    None: the rule of :func:`pipelines.init_from.warm_schedule` (a quarter of the epochs, twice the cold run's
    learning rate after its warm-up: re-warmed), measured by the ML-100K replay (docs/scheduling.md).
    ``new_item_rows``: how a new item's row starts (:mod:`recsys_alibi.training.context_rows`; items that
    never occur in the training part, and every new item under ``"noise"``, get mean + std * noise).
    Every other weight is the parent's: shrink-and-perturb of the blocks (``shrink``/``perturb``, the
    default until 2026-12-05) was deleted after the raw ML-1M replay's validation (docs/scheduling.md).
    """

    max_epochs: int | None = Field(None, ge=1)
    lr: float | None = Field(None, gt=0)
    warmup_steps: int | None = Field(None, ge=0)
    patience: int | None = Field(None, ge=1)
    # a new item's first row: "context" (imprinted from the parent's hidden states before its occurrences in
    # the training part, recsys_alibi.training.context_rows; chosen on the ML-100K replay's validation,
    # docs/scheduling.md) or "noise" (mean + std * z of the trained rows, for every new item)
    new_item_rows: Literal["context", "noise"] = "context"


INIT_FROM = re.compile(r"champion|runs:/[^/\s]+/.*[^/]|models:/[^/@\s]+(/\d+|@[A-Za-z0-9_\-]+)")  # no trailing /


class TrainConfig(_Section):
    """Optimisation and the Lightning trainer."""

    max_epochs: int = Field(20, ge=1)
    # wall-clock training budget (Lightning max_time): a stop, the schedule is not fitted to it (an anneal by
    # the clock was screened and lost: docs/results.md, "Recipe rules"); size max_epochs to fit it
    max_minutes: float | None = Field(None, gt=0)
    batch_size: int = Field(128, ge=1)  # global: each of W processes takes batch_size / W
    loss: Literal["softmax", "sampled_softmax", "bce", "gbce"] = "softmax"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(100, ge=0)
    grad_clip: float | None = Field(1.0, gt=0)  # max gradient norm; None: no clipping
    patience: int = Field(5, ge=1)  # early stopping on validation NDCG@10, epochs
    num_negatives: int = Field(256, ge=1)  # sampled softmax / gBCE
    gbce_t: float = Field(0.75, ge=0, le=1)
    # Lightning's names, or "auto": bf16-mixed where the hardware multiplies bfloat16 natively, else 32-true
    # (recsys_alibi.training.launch.resolve_precision)
    precision: Literal[PRECISIONS] | Literal[16, 32] = "32-true"
    accelerator: Literal[ACCELERATORS] = "auto"  # gpu/cuda/mps also need that device (checked by train)
    devices: Annotated[int, Field(ge=1)] | Literal["auto"] = 1  # processes per node (CPU: e.g. 2 with strategy ddp; docs/scaling.md)
    num_nodes: int = Field(1, ge=1)
    strategy: Literal[STRATEGIES] = "auto"  # "ddp" for several processes (gloo on CPU, NCCL on GPU)
    resume: bool = False  # continue the newest unfinished <output>/checkpoints/<run_id>/last.ckpt (CLI --resume)
    limit_train_batches: int | float | None = None  # batches per epoch (int >= 1) or a fraction in (0, 1]
    val_batch_size: int = Field(256, ge=1)
    val_users: int | None = Field(None, ge=1)  # validate on a fixed random subset of users (None: all)
    packing: bool = False  # pack several users' windows into rows of model.max_len (no padding compute)
    windows: Literal["last", "all"] = "last"  # train on each history's last max_len + 1 events, or on all of it
    batch_tokens: int | None = Field(None, ge=1)  # length-bucketed batches of <= this many padded tokens (recsys_alibi.data.buckets)
    num_workers: int = Field(0, ge=0)  # training-batch worker processes (a GPU outruns one collating process)
    # short-to-long training: [[epoch, window], ...], window = items or "whole", from that epoch (0-based) on; the
    # model's max_len becomes the last window (recsys_alibi.training.context_schedule); None: model.max_len throughout
    context_schedule: list[list[int | Literal["whole"]]] | None = None
    attention_health: bool = True  # log per-head entropy / zero-weight share at each validation (ALiBi)
    zero_share_threshold: float = Field(0.05, ge=0, le=1)  # warn when a head has more exactly-zero weights
    # warm start (recsys_alibi.training.warm_start): runs:/ID/model, models:/NAME/V, models:/NAME@ALIAS, or
    # champion (models:/<tracking.registered_model>@<tracking.champion_alias>; none yet: from scratch)
    init_from: str | None = None
    warm: WarmConfig = WarmConfig()  # the schedule of a warm-started run

    @field_validator("init_from")
    @classmethod
    def _model_uri(cls, value: str | None) -> str | None:
        if value is None or INIT_FROM.fullmatch(value):
            return value
        fix = f" (without the trailing '/': {value.rstrip('/')})" if value.endswith("/") else ""
        raise ValueError(f"must be runs:/RUN_ID/model, models:/NAME/VERSION, models:/NAME@ALIAS or champion{fix}")

    @field_validator("limit_train_batches")
    @classmethod
    def _batches_or_fraction(cls, value: int | float | None) -> int | float | None:
        if value is None or (isinstance(value, int) and value >= 1) or (isinstance(value, float) and 0 < value <= 1):
            return value
        raise ValueError("must be a number of batches (an integer >= 1) or a fraction in (0, 1]")


    @field_validator("context_schedule", mode="before")
    @classmethod
    def _schedule_pairs(cls, value: Any) -> Any:
        """[[epoch, window], ...]: epochs ascending from 0, windows integers >= 2 (int64) or "whole"."""
        if value is None:
            return value
        form = "a list of [epoch, window] pairs such as [[0, 200], [25, 1000]] (window: items >= 2 or 'whole')"
        if not isinstance(value, list) or not value:
            raise ValueError(f"must be {form}, or null for model.max_len throughout")
        for i, entry in enumerate(value):
            if not isinstance(entry, list) or len(entry) != 2:
                raise ValueError(f"entry {i} ({entry!r:.40}) is not [epoch, window]: must be {form}")
            epoch, window = entry
            if type(epoch) is not int or not 0 <= epoch <= INT64_MAX:
                raise ValueError(f"entry {i}: the epoch {epoch!r:.40} must be an integer >= 0")
            if window != "whole" and (type(window) is not int or not 2 <= window <= INT64_MAX):
                raise ValueError(f"entry {i}: the window {window!r:.40} must be an integer >= 2 (items) or 'whole'")
        epochs = [entry[0] for entry in value]
        if epochs[0] != 0:
            raise ValueError(f"the first window must start at epoch 0 (got {epochs[0]})")
        if any(b <= a for a, b in zip(epochs, epochs[1:])):
            raise ValueError(f"the epochs must be strictly ascending (got {epochs})")
        return value

    @model_validator(mode="after")
    def _one_batching(self) -> "TrainConfig":
        if self.packing and self.batch_tokens is not None:
            raise ValueError("train.packing and train.batch_tokens are two ways to batch: set one of them")
        self._refuse_ignored("train", (
            ("gbce_t", self.loss == "gbce", "train.loss=gbce"),
            ("num_negatives", self.loss in ("sampled_softmax", "gbce"), "train.loss=sampled_softmax or gbce"),
            ("zero_share_threshold", self.attention_health, "train.attention_health=true"),
            ("warm", self.init_from is not None, "train.init_from"),
        ))  # fmt: skip
        if isinstance(self.devices, int) and self.devices * self.num_nodes > 1:  # before any process starts
            world = self.devices * self.num_nodes
            if self.batch_size % world:
                raise ValueError(
                    f"train.batch_size={self.batch_size} is the global batch and must be divisible by the {world} "
                    f"training processes (train.devices={self.devices} x train.num_nodes={self.num_nodes})"
                )
            if self.windows == "all":
                raise ValueError(
                    "train.windows=all gives each process a different number of windows (and of steps); "
                    "use it with one training process"
                )
        schedule = self.context_schedule
        if schedule and schedule[-1][0] >= self.max_epochs:
            raise ValueError(
                f"train.context_schedule switches at epoch {schedule[-1][0]} but train.max_epochs={self.max_epochs} "
                f"trains epochs 0..{self.max_epochs - 1}: the switch would never happen"
            )
        return self


class EvaluateConfig(_Section):
    """Offline ranking evaluation."""

    ks: list[int] = Field([1, 5, 10, 20, 50, 100], min_length=1)  # cut-offs K >= 1, each once
    protocol: Literal["leave_one_out", "temporal"] = "leave_one_out"
    # seconds since epoch, or an ISO-8601 date or time (`1998-03-01`, `1998-03-01T12:00:00+02:00`; UTC when it
    # has no offset), as event timestamps are read; None: the 90% quantile of timestamps
    temporal_cutoff: int | None = None
    exclude_seen: bool = True
    batch_size: int = Field(256, ge=1)  # users per scoring batch, at most
    # and at most this many padded history events per batch (users x longest context): bounds the
    # attention memory of whole-history passes (~ events x longest x heads), as score.batch_tokens
    batch_tokens: int = Field(32_768, ge=1)
    context_lengths: list[int] = []  # extra context-length sweep (items); empty: none
    history_buckets: list[int] = [20, 50, 200, 500, 1000]  # bucket upper edges, items
    min_history: list[int] = [200, 500]  # also slice the users with at least this many events (heavy users)
    ties: Literal["optimistic", "pessimistic"] = "optimistic"  # target tied with items: ahead of / behind them

    @field_validator("ks", "context_lengths", "history_buckets", "min_history")
    @classmethod
    def _positive_and_distinct(cls, values: list[int]) -> list[int]:
        if any(v < 1 for v in values) or len(set(values)) != len(values):
            raise ValueError("must be distinct integers >= 1")
        return values

    @field_validator("temporal_cutoff", mode="before")
    @classmethod
    def _cutoff_seconds(cls, value: Any) -> Any:
        """A date or time (YAML reads `1998-03-01` as a date) or an ISO-8601 text -> whole seconds since the
        epoch (UTC when no offset is given; a date is its midnight UTC); anything else as given."""
        import datetime as dt

        if isinstance(value, str):
            try:
                value = dt.datetime.fromisoformat(value.strip())
            except ValueError:
                raise ValueError("expected seconds since the epoch or an ISO-8601 date or time") from None
        if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            value = dt.datetime(value.year, value.month, value.day)
        if isinstance(value, dt.datetime):
            value = value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
            return int(value.timestamp() // 1)
        return value

    @model_validator(mode="after")
    def _cutoff_needs_temporal(self) -> "EvaluateConfig":
        self._refuse_ignored("evaluate", (("temporal_cutoff", self.protocol == "temporal", "evaluate.protocol=temporal"),))
        return self

    @field_validator("history_buckets")
    @classmethod
    def _ascending(cls, values: list[int]) -> list[int]:
        if values != sorted(values):
            raise ValueError("bucket upper edges must be ascending")
        return values


class RayConfig(_Section):
    """``score --engine ray``: the Ray Data actor pool (serving/ray_job.py, docs/scaling.md)."""

    address: str | None = None  # None: start a local instance (loopback, no dashboard); "auto" or ray://...: join
    actors: int = Field(2, ge=1)  # scoring actors, one model each
    cpus_per_actor: float = Field(1.0, gt=0)  # also the torch threads of each actor (rounded, at least 1)
    gpus_per_actor: float = Field(0.0, ge=0)  # > 0: actors on GPUs (score.device auto then picks cuda)


PRIOR_INF_WEIGHT = 1000.0
"""``score.popularity_prior.weight`` inf as scored (float32): the counts decide wherever log(1 + c) differs by more
than ~0.03, the model's logits (far less than 1000 apart) break the ties."""


class PopularityPriorConfig(_Section):
    """``score.popularity_prior``: ``weight * log(1 + c_i)`` added to every item's score, ``c_i`` the item's events
    in the scored input before its newest event, each weighing ``0.5 ** (age_days / half_life_days)``
    (:mod:`recsys_alibi.evaluation.popularity_prior`). For rankings of the days after the log (the daily job):
    on the MovieLens replays a walk-forward choice gave +0.06 to +0.10 NDCG@10 (docs/results.md, "A recent-
    popularity prior on the next periods"); choose both on your own log with ``benchmarks/replay_prior.py``."""

    weight: float = Field(0.0, ge=0, le=1e6)  # 0: off; at most 1e6, so weight * log(1 + count) stays a float32
    # weight inf (``inf`` or ``.inf``, as the daily pipeline prints its choice): the recent counts first, the model
    # breaks ties; scored as PRIOR_INF_WEIGHT
    half_life_days: float | None = Field(7.0, gt=0)  # None: plain event counts
    # the daily `pipeline` (data.append) chooses weight and half-life walk-forward, on how its champion ranked
    # every appended day so far (pipelines.prior_choice; until a day is recorded, the two above); `score` alone
    # and a pipeline that does not append use the two above
    choose: bool = True

    @model_validator(mode="after")
    def _half_life_needs_weight(self) -> "PopularityPriorConfig":
        """Weight 0 and no choice: no prior is ever added, so a half-life would be logged and never used."""
        needs = "score.popularity_prior.weight > 0 or score.popularity_prior.choose=true"
        self._refuse_ignored("score.popularity_prior", (("half_life_days", self.weight > 0 or self.choose, needs),))
        return self

    @field_validator("weight", mode="before")
    @classmethod
    def _inf_weight(cls, value: Any) -> Any:
        """``inf`` (text, or YAML's ``.inf``) -> :data:`PRIOR_INF_WEIGHT`; anything else as given."""
        text = value.strip().lower().lstrip("+") if isinstance(value, str) else None
        if text in ("inf", ".inf", "infinity") or (isinstance(value, float) and value == float("inf")):
            return PRIOR_INF_WEIGHT
        return value


class ScoreConfig(_Section):
    """Batch scoring."""

    k: int = Field(100, ge=1)
    batch_size: int = Field(256, ge=1)
    shard_users: int = Field(50_000, ge=1)  # users per output part file
    exclude_seen: bool = True
    max_context: int = Field(2048, ge=1)  # longest history scored whole, items
    catalog_chunk: int = Field(65_536, ge=1)  # items scored at once for the running top-K
    sinks: int | None = Field(None, ge=0)  # longer histories: first events kept (None: model.sinks)
    batch_tokens: int = Field(131_072, ge=1)  # history events per batch (bounds activation memory)
    attention_backend: Literal["auto", "model", "flex", "sdpa", "eager"] = "auto"  # auto: sdpa on CPU, flex on GPU
    device: str = "auto"  # auto: cuda when available, else cpu; or cpu, cuda, cuda:N, mps
    overwrite: bool = False  # replace another job's rankings in --output as a whole instead of refusing (README)
    # refused above this share of the input's events on items the model does not know (another catalog); 1: never
    max_unknown_share: float = Field(0.5, ge=0.0, le=1.0)
    engine: Literal["local", "ray"] = "local"  # --engine: this process (or torchrun shards), or a Ray actor pool
    ray: RayConfig = RayConfig()
    # business rules (serving.rules): Parquet (or .csv / .tsv) of item_id (every user) or user_id, item_id (per user)
    allow: str | None = None  # rankings hold only these items (a user absent from a per-user file: none)
    deny: str | None = None  # rankings never hold these items
    changed_since: str | None = None  # a previous output: rank only users whose history changed (serving.changed)
    # `score --items`: an item table (or a prepared dir) whose items the model never saw are ranked from their
    # features alone (serving.new_items); None: the prepared input's item table, when the model reads features
    items: str | None = None
    # places of each top-K held for the best new items of score.items (serving.topk.reserve_new_items); 0: none
    new_item_slots: int = Field(0, ge=0)
    # recent popularity added to the model's scores (needs a prepared or raw-events input with timestamps)
    popularity_prior: PopularityPriorConfig = PopularityPriorConfig()

    _paths = field_validator("allow", "deny", "changed_since", "items")(_path_or_none)

    @field_validator("device")
    @classmethod
    def _torch_device(cls, device: str) -> str:
        if re.fullmatch(r"auto|cpu|mps|cuda(:[0-9]+)?", device):
            return device
        raise ValueError("must be auto, cpu, cuda, cuda:N or mps")


class ExportConfig(_Section):
    """``export``: the vectors for a nearest-neighbour index (serving.export)."""

    index: Literal["none", "faiss"] = "none"  # --index faiss: also a FAISS index over the item vectors
    hnsw_above: int = Field(100_000, ge=0)  # exact inner product (IndexFlatIP) up to this many items, HNSW above
    hnsw_m: int = Field(32, ge=2)  # HNSW graph degree
    ef_construction: int = Field(200, ge=1)
    ef_search: int = Field(256, ge=1)  # search breadth stored with the index
    recall_k: int = Field(100, ge=1)  # recall@k of the index against exact search, measured at export
    recall_queries: int = Field(1_000, ge=0)  # user vectors used as queries for that measurement


MAX_EXPERIMENT_NAME = 500  # MLflow's limits (mlflow.utils.validation), checked at load, not after training
MAX_ALIAS = 255
# the registry's name column (String(256)); on a local store the promotion lock file's name is shorter still
# (pipelines.registry_lock.check_lock_name)
MAX_REGISTERED_NAME = 256


class TrackingConfig(_Section):
    """MLflow; ``MLFLOW_TRACKING_URI`` overrides ``uri``; None means sqlite under the working dir."""

    uri: str | None = None
    experiment: str = "recsys-alibi"
    registered_model: str = "recsys-alibi-ranker"
    champion_alias: str = "champion"  # registry alias the pipeline moves to a better model; scoring loads it
    promotion_metric: str = "NDCG@10"  # compared on leave-one-out validation examples (a name in evaluate.ks)
    # promote only when new - champion > margin (a tie keeps the champion); below 0 a worse model would be promoted
    promotion_margin: float = Field(0.0, ge=0.0)

    @field_validator("experiment")
    @classmethod
    def _experiment_name(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("the experiment name must not be empty or only whitespace")
        if len(name) > MAX_EXPERIMENT_NAME:
            raise ValueError(f"the experiment name has {len(name)} characters; MLflow takes at most "
                             f"{MAX_EXPERIMENT_NAME}")
        return name

    @field_validator("registered_model")
    @classmethod
    def _registry_name(cls, name: str) -> str:
        """What MLflow's registry refuses (after training, with a traceback), and ``@``, which would end the name in
        the ``models:/NAME@ALIAS`` URI the pipeline scores with."""
        if not name.strip():
            raise ValueError("the registered model name must not be empty or only whitespace")
        bad = next((c for c in "/:@" if c in name), None)
        if bad is not None:
            raise ValueError(f"a registered model name cannot hold '{bad}' (MLflow refuses '/' and ':', and '@' would "
                             "end the name in models:/NAME@ALIAS); choose another name")  # fmt: skip
        if name in (".", ".."):
            raise ValueError(f"'{name}' is no registered model name MLflow takes; choose another name")
        if len(name) > MAX_REGISTERED_NAME:
            raise ValueError(f"the registered model name has {len(name)} characters; the registry takes at most "
                             f"{MAX_REGISTERED_NAME}")  # fmt: skip
        return name

    @field_validator("champion_alias")
    @classmethod
    def _alias_not_reserved(cls, alias: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", alias):
            raise ValueError("a registry alias has only letters, digits, '_' and '-'")
        if len(alias) > MAX_ALIAS:
            raise ValueError(f"the alias has {len(alias)} characters; MLflow takes at most {MAX_ALIAS}")
        if alias.lower() == "latest" or (alias[:1] in "vV" and alias[1:].isdigit()):
            raise ValueError(f"'{alias}' is reserved by the MLflow registry (latest, v1, v2 ...); choose another name")
        return alias


SEEN_RULE_SECTIONS = ("evaluate", "score")  # sections whose exclude_seen is one setting (JobConfig)


class JobConfig(_Section):
    """The whole job: one YAML file, every section optional."""

    seed: int = Field(42, ge=0, le=2**32 - 1)  # numpy and Lightning take seeds in [0, 2^32)
    output: str = "runs/default"
    generate: GenerateConfig = GenerateConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    score: ScoreConfig = ScoreConfig()
    export: ExportConfig = ExportConfig()
    tracking: TrackingConfig = TrackingConfig()

    _paths = field_validator("output")(_path_or_none)

    @model_validator(mode="before")
    @classmethod
    def _one_exclude_seen(cls, data: Any) -> Any:
        """``evaluate.exclude_seen`` and ``score.exclude_seen`` are one setting (the seen-item rule of
        ``recsys_alibi.evaluation.ranking``): the one given sets both; both given and different: an error."""
        if not isinstance(data, dict):
            return data
        given = {}
        for name in SEEN_RULE_SECTIONS:
            section = data.get(name)
            if isinstance(section, dict) and "exclude_seen" in section:
                given[name] = section["exclude_seen"]
            elif isinstance(section, _Section) and "exclude_seen" in section.model_fields_set:
                given[name] = section.exclude_seen  # type: ignore[attr-defined]
        values = [v for v in given.values() if isinstance(v, bool)]  # anything else: refused by its own key
        if len(values) == 2 and values[0] != values[1]:
            raise ValueError(
                f"evaluate.exclude_seen={str(values[0]).lower()} and score.exclude_seen={str(values[1]).lower()} differ: "
                "they are one setting "
                "(what is evaluated is what is served); set one of them"
            )
        if len(values) != 1 or len(given) != 1:
            return data
        data = dict(data)
        for name in SEEN_RULE_SECTIONS:
            section = data.get(name)
            if isinstance(section, _Section):
                data[name] = section.model_copy(update={"exclude_seen": values[0]})
            else:
                data[name] = {**(section if isinstance(section, dict) else {}), "exclude_seen": values[0]}
        return data

    @model_validator(mode="after")
    def _item_features_need_table(self) -> "JobConfig":
        """``data.item_features`` describes ``data.items`` (or the table ``generate`` writes, or the table of a
        directory ``data.append`` merges into): declared with none of them it would be ignored."""
        declared = self.data.item_features != ItemFeaturesConfig()
        if declared and self.data.items is None and not self.generate.enabled and not self.data.append:
            raise ValueError(
                "data.item_features takes effect only with data.items (prepare --items PATH): set data.items, "
                "or drop data.item_features (--set 'data.item_features={}' --set model.item_features.enabled=false)"
            )
        return self

    @model_validator(mode="after")
    def _schedule_fits_positions(self) -> "JobConfig":
        """Learned positions: the table has the last window's rows; no earlier window may be longer."""
        schedule = self.train.context_schedule
        if self.model.position != "learned" or not schedule or schedule[-1][1] == "whole":
            return self
        last = schedule[-1][1]
        longer = [window for _, window in schedule if window == "whole" or window > last]
        if longer:
            raise ValueError(
                f"train.context_schedule: model.position=learned has a table of the last window's {last} positions; "
                f"the window {longer[0]} is beyond it (use model.position=alibi, or end on the longest window)"
            )
        return self

    @model_validator(mode="after")
    def _health_needs_alibi(self) -> "JobConfig":
        """Attention health is measured on ALiBi models only (``pipelines.train.training_callbacks``)."""
        alibi = self.model.position == "alibi"
        self.train._refuse_ignored("train", (("zero_share_threshold", alibi, "model.position=alibi"),))
        return self


# model keys that shape ALiBi's bias only: refused with model.position=learned or none (ModelConfig)
ALIBI_KEYS = ("slopes", "max_bias", "learnable_slopes", "free_heads", "bias_clamp", "long_context", "slope_floor",
              "free_head_scale")  # fmt: skip


def sasrec_overrides() -> list[str]:
    """``--set`` texts that make any config its SASRec baseline: ``model.position=learned`` and every
    ALiBi-only key (:data:`ALIBI_KEYS`) at its default, so a config that tunes ALiBi loads as SASRec."""
    defaults = ModelConfig()
    return ["model.position=learned", *(f"model.{key}={yaml_word(getattr(defaults, key))}" for key in ALIBI_KEYS)]


WARM_EPOCHS_DIVISOR = 4  # train.warm.max_epochs unset: a quarter of train.max_epochs, rounded up (docs/scheduling.md)
# train.warm.lr unset: twice train.lr (chosen on the ML-100K replay's returning users, kept on raw ML-1M's;
# docs/scheduling.md)
WARM_LR_FACTOR = 2


def warm_max_epochs(train: TrainConfig) -> tuple[int, str]:
    """The epochs of a warm-started run (``train.init_from``) and where that number comes from, in words."""
    if train.warm.max_epochs is not None:
        return train.warm.max_epochs, f"train.warm.max_epochs={train.warm.max_epochs}"
    epochs = -(-train.max_epochs // WARM_EPOCHS_DIVISOR)
    return epochs, f"train.warm.max_epochs is unset: a quarter of train.max_epochs={train.max_epochs}, rounded up"


def check_warm_schedule(config: JobConfig) -> None:
    """Refuse a warm start whose ``train.context_schedule`` switches after the warm run's last epoch.

    Checked when the config is loaded (a ``champion`` that does not exist yet included: the daily job
    that starts cold today starts warm tomorrow), so a pipeline refuses it before touching any data.

    Raises:
        ConfigError: one line naming ``train.warm.max_epochs``, its value and where the value comes from.
    """
    train = config.train
    if train.init_from is None or not train.context_schedule:
        return
    switch = train.context_schedule[-1][0]
    epochs, origin = warm_max_epochs(train)
    if switch >= epochs:
        raise ConfigError(
            f"invalid config at 'train.warm.max_epochs': a warm start (train.init_from={train.init_from}) trains "
            f"{epochs} epochs ({origin}), but train.context_schedule switches at epoch {switch}: the switch would "
            f"never happen; set train.warm.max_epochs to at least {switch + 1}, or switch earlier"
        )


def check_given_model_keys(config: JobConfig) -> None:
    """Refuse model keys that act only with another, given without it: ``model.sinks`` (first events kept visible
    outside ``model.window``) and ``model.max_len_quantile`` / ``model.max_len_cap`` (the rule of ``model.max_len:
    auto``). Checked on the config as given, not in :class:`ModelConfig`: ``train`` replaces ``auto`` by the
    number it resolves to (:func:`recsys_alibi.training.data_rules.resolve_max_len`) and keeps the rule's keys.

    Raises:
        ConfigError: one line naming the key, the setting it needs and the command line's fix.
    """
    model = config.model
    auto = model.max_len == "auto"
    try:
        model._refuse_ignored("model", (
            ("sinks", model.window is not None, "model.window"),
            ("max_len_quantile", auto, "model.max_len=auto"),
            ("max_len_cap", auto, "model.max_len=auto"),
        ))  # fmt: skip
    except ValueError as err:
        raise ConfigError(f"invalid config at 'model': {err}") from None


def _holds_keys(keys: list[str]) -> bool:
    """Whether the config key ``keys`` may hold sub-keys: a section, a mapping (``data.item_features.ranges``)
    or a key the config does not have (refused by name when validated); False for a single value."""
    model: type[BaseModel] = JobConfig
    for key in keys:
        field = model.model_fields.get(key)
        if field is None:
            return True
        section = _section_type(model, key)
        if section is None:
            return typing.get_origin(field.annotation) is dict
        model = section
    return True


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, origin: str) -> None:
    keys = dotted.split(".")
    if not all(k.strip() for k in keys):
        raise ConfigError(f"{origin}: '{dotted}' is not a dotted key (e.g. model.n_layers)")
    node = tree
    for depth, key in enumerate(keys[:-1]):
        if not _holds_keys(keys[: depth + 1]):  # model.d_model.x: it read "Input should be a valid integer"
            where = ".".join(keys[: depth + 1])
            raise ConfigError(f"{origin}: cannot set {dotted}: a sub-key was set on a single value ('{where}' is "
                              f"one value, not a section of keys); set it as {where}=VALUE")  # fmt: skip
        child = node.get(key)
        if child is None:  # absent, or a section written with no keys (YAML null): its defaults
            child = node[key] = {}
        if not isinstance(child, dict):
            where = ".".join(keys[: depth + 1])
            raise ConfigError(
                f"{origin}: cannot set {dotted} because '{where}' holds the value {child!r} in the config, not a "
                "section of keys"
            )
        node = child
    node[keys[-1]] = value


def _section_type(model: type[BaseModel], name: Any) -> type[_Section] | None:
    field = model.model_fields.get(name) if isinstance(name, str) else None
    annotation = field.annotation if field is not None else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, _Section) else None


def _empty_sections(tree: dict[str, Any], model: type[BaseModel]) -> None:
    """A section written with no keys (YAML null, e.g. ``model:`` with its keys commented out) is ``{}``."""
    for name, value in tree.items():
        section = _section_type(model, name)
        if section is None:
            continue
        if value is None:
            tree[name] = {}
        elif isinstance(value, dict):
            _empty_sections(value, section)


def _key_path(loc: tuple) -> str:
    """The config key of a pydantic error location (drops union-branch names such as ``int``)."""
    keys, model = [], JobConfig
    for part in loc:
        if model is None or not isinstance(part, str):  # past a value: union branches, list indices
            break
        keys.append(part)
        if part not in model.model_fields:  # an unknown key (extra_forbidden)
            break
        model = _section_type(model, part)
    return ".".join(keys) or "config"


def _known_keys(dotted: str) -> list[str]:
    """The keys of the section that holds ``dotted`` (the top level for a top-level key)."""
    model: type[BaseModel] | None = JobConfig
    for part in dotted.split(".")[:-1]:
        model = _section_type(model, part) if model is not None else None
    return sorted(model.model_fields) if model is not None else []


def _validate(tree: dict[str, Any]) -> JobConfig:
    _empty_sections(tree, JobConfig)
    try:
        return JobConfig.model_validate(tree)
    except ValidationError as err:
        errors = err.errors()
        where = _key_path(errors[0]["loc"])
        same = [e for e in errors if _key_path(e["loc"]) == where]  # one per branch of a union
        messages = list(dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in same))
        message = " or ".join([messages[0], *(m.removeprefix("Input should be ") for m in messages[1:])])
        if errors[0]["type"] == "extra_forbidden":
            known = _known_keys(where)
            close = difflib.get_close_matches(where.rsplit(".", 1)[-1], known, n=1)
            message = (f"unknown key{f' (did you mean {close[0]!r}?)' if close else ''}; "
                       f"the keys there are {', '.join(known)}")  # fmt: skip
        value = errors[0]["input"]
        shown = errors[0]["type"] in {"missing", "extra_forbidden"} or isinstance(value, dict)  # a section: named above
        given = "" if shown else f" (got {value!r:.80})"
        if errors[0]["type"] == "string_type" and isinstance(value, (bool, int, float)):  # YAML made text a number
            read_as = "true, false, yes, no, on and off as booleans" if isinstance(value, bool) else "it as a number"
            example = "..." if isinstance(value, bool) else value
            in_list = any(isinstance(part, int) for part in errors[0]["loc"])  # an item of a list: no one-key example
            given = (f" (got {yaml_word(value)}: YAML reads {read_as}; quote the value to give text"
                     + ("" if in_list else f", e.g. --set \"{where}='{example}'\"") + ")")  # fmt: skip
        raise ConfigError(f"invalid config at '{where}': {message}{given}") from None


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    flags: dict[str, tuple[str, Any]] | None = None,
) -> JobConfig:
    """Read a YAML job config, apply ``dotted.key=value`` overrides and flags, and validate.

    Args:
        path: the YAML file (None: every default).
        overrides: ``--set`` texts, values read as YAML, applied in order.
        flags: ``{dotted.key: (flag, value)}`` from command-line flags (``{"model.n_heads":
            ("--heads", 4)}``), applied last, values as given (not read as YAML: ``--output 2024``
            stays a path); errors name the flag.

    Raises:
        ConfigError: missing/unreadable file, invalid YAML, YAML that is not a mapping, unknown
            keys or invalid values (also a warm schedule that never reaches ``train.context_schedule``'s
            last switch: :func:`check_warm_schedule`); one line naming the key (or file, line, column) and the fix.
    """
    tree = read_config_file(Path(path)) if path is not None else {}
    givers = OverrideGivers(tree, path)
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(tree, key, value, origin=f"--set {text}")
        givers.give(key, value, ("set", text))
    for key, (flag, value) in (flags or {}).items():
        _set_dotted(tree, key, value, origin=f"{flag} (sets {key})")
        givers.give(key, value, ("flag", f"{flag} sets {key}={yaml_word(value)}"))
    try:
        config = _validate(tree)
        check_given_model_keys(config)
        check_warm_schedule(config)
        return config
    except ConfigError as err:
        named = [flag for key, (flag, _) in (flags or {}).items() if str(err).startswith(f"invalid config at '{key}'")]
        if named:
            raise ConfigError(f"{err}; it was given by {named[0]}") from None
        raise


def with_overrides(config: JobConfig, **sections: dict[str, Any]) -> JobConfig:
    """Return a copy of ``config`` with some section fields replaced (validated again).

    Raises:
        ConfigError: the replaced values make the config invalid (one line naming the key), as at load.
    """
    tree = config.model_dump()
    for name, fields in sections.items():
        if isinstance(tree.get(name), dict):
            tree[name].update(fields)
        else:
            tree[name] = fields
    seen = [fields["exclude_seen"] for name, fields in sections.items()
            if name in SEEN_RULE_SECTIONS and "exclude_seen" in fields]  # fmt: skip
    if len(seen) == 1:  # one setting: changing it in one section changes it in both
        for name in SEEN_RULE_SECTIONS:
            tree[name]["exclude_seen"] = seen[0]
    return _validate(tree)
