"""Typed, frozen job configuration loaded from YAML with ``--set dotted.key=value`` overrides.

One section per component; each component receives its section whole. Unknown keys are an
error (pydantic ``extra="forbid"``), so a typo in a config fails loudly instead of being ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the fix."""


class GenerateConfig(_Section):
    """Synthetic behaviour log (the embedded default data), see ``recsys_alibi.data.synthetic``."""

    enabled: bool = False
    users: int = Field(2000, ge=1)
    items: int = Field(1000, ge=2)
    task: Literal["default", "long-range"] = "default"
    distance: int = Field(64, ge=1)  # long-range probe: an answer comes exactly D events after its cue (D >= 3)
    min_events: int = Field(20, ge=3)  # shortest history generated, events
    max_events: int = Field(3000, ge=3)  # longest history generated, events


class ColumnMap(_Section):
    """Source column names mapped onto the canonical event schema."""

    user_id: str = "user_id"
    item_id: str = "item_id"
    timestamp: str | None = "timestamp"
    event_type: str | None = None
    value: str | None = None


class DataConfig(_Section):
    """Ingest and cleaning rules for ``prepare``."""

    input: str | None = None
    format: Literal["auto", "parquet", "csv", "ndjson", "movielens", "sasrec", "s3rec"] = "auto"
    columns: ColumnMap = ColumnMap()
    separator: str | None = None  # CSV/TSV delimiter; None: tab for .tsv, else the first of , tab ; | in the header
    has_header: bool = True
    timestamp_unit: Literal["auto", "s", "ms"] = "auto"
    min_events_per_user: int = Field(5, ge=1)  # k-core threshold on users
    min_events_per_item: int = Field(5, ge=1)  # k-core threshold on items
    min_value: float | None = None  # keep events with value >= this (e.g. ratings >= 4)
    drop_duplicates: bool = True  # drop exact duplicate (user, item, timestamp, ...) rows
    partition_rows: int = Field(4_000_000, ge=1_000)  # events per user-hash partition (bounds memory)
    id_type: Literal["auto", "int", "str"] = "auto"  # ids of text formats; auto: Int64 only when every value round-trips (docs/data.md)


class ModelConfig(_Section):
    """The ranker: embeddings, transformer blocks and attention."""

    d_model: int = Field(64, ge=4)
    n_layers: int = Field(2, ge=1)
    n_heads: int = Field(2, ge=1)
    max_len: int = Field(200, ge=2)  # training context, items
    position: Literal["alibi", "learned", "none"] = "alibi"
    attention_backend: Literal["auto", "flex", "sdpa", "eager"] = "auto"
    dropout: float = Field(0.2, ge=0.0, lt=1.0)
    ffn_mult: int = Field(4, ge=1)
    max_bias: float = Field(8.0, gt=0.0)
    learnable_slopes: bool = False
    bias_clamp: float | None = None  # |bias| clamped to this value (avoids exp underflow)
    window: int | None = Field(None, ge=1)  # sliding attention window, items
    sinks: int = Field(0, ge=0)  # first events always visible (StreamingLLM)
    shard_embeddings: bool = False  # row-wise torchrec sharding of the item table (docs/scaling.md)
    # item table: torchrec EmbeddingCollection or plain nn.Embedding; auto = torchrec where it imports (docs/install.md)
    embedding_backend: Literal["auto", "torchrec", "torch"] = "auto"
    time_gap_buckets: int = Field(0, ge=0)  # 0 = off; else a second table of log2 time-gap buckets (>= 3)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ModelConfig":
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}")
        if 0 < self.time_gap_buckets < 3:
            raise ValueError("model.time_gap_buckets needs at least 3 (padding, first event, one gap bucket); 0 = off")
        if self.shard_embeddings and self.embedding_backend == "torch":
            raise ValueError(
                "model.shard_embeddings=true needs model.embedding_backend=torchrec or auto (torchrec shards the table)"
            )
        if self.time_gap_buckets and self.shard_embeddings:
            raise ValueError("model.time_gap_buckets does not work with model.shard_embeddings yet; use one of them")
        return self


class TrainConfig(_Section):
    """Optimisation and the Lightning trainer."""

    max_epochs: int = Field(20, ge=1)
    max_minutes: float | None = Field(None, gt=0)  # wall-clock training budget (Lightning max_time): a safety stop; size max_epochs to fit it
    batch_size: int = Field(128, ge=1)  # global: each of W processes takes batch_size / W
    loss: Literal["softmax", "sampled_softmax", "bce", "gbce"] = "softmax"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(100, ge=0)
    grad_clip: float | None = 1.0
    patience: int = Field(5, ge=1)  # early stopping on validation NDCG@10, epochs
    num_negatives: int = Field(256, ge=1)  # sampled softmax / gBCE
    gbce_t: float = Field(0.75, ge=0, le=1)
    precision: str = "32-true"
    accelerator: str = "auto"
    devices: int | str = 1  # processes per node (CPU: e.g. 2 with strategy ddp; docs/scaling.md)
    num_nodes: int = 1
    strategy: str = "auto"  # "ddp" for several processes (gloo on CPU, NCCL on GPU)
    resume: bool = False  # continue the newest unfinished <output>/checkpoints/<run_id>/last.ckpt (CLI --resume)
    limit_train_batches: float | int | None = None
    val_batch_size: int = Field(256, ge=1)
    val_users: int | None = None  # validate on a fixed random subset of users (None: all)
    packing: bool = False  # pack several users' windows into rows of model.max_len (no padding compute)
    windows: Literal["last", "all"] = "last"  # train on each history's last max_len + 1 events, or on all of it
    num_workers: int = Field(0, ge=0)  # training-batch worker processes (a GPU outruns one collating process)
    attention_health: bool = True  # log per-head entropy / zero-weight share at each validation (ALiBi)
    zero_share_threshold: float = Field(0.05, ge=0, le=1)  # warn when a head has more exactly-zero weights


class EvaluateConfig(_Section):
    """Offline ranking evaluation."""

    ks: list[int] = [1, 5, 10, 20, 50, 100]
    protocol: Literal["leave_one_out", "temporal"] = "leave_one_out"
    temporal_cutoff: int | None = None  # seconds since epoch; None: the 90% quantile of timestamps
    exclude_seen: bool = True
    batch_size: int = Field(256, ge=1)
    context_lengths: list[int] = []  # extra context-length sweep (items); empty: none
    history_buckets: list[int] = [20, 50, 200, 1000]  # bucket upper edges, items
    ties: Literal["optimistic", "pessimistic"] = "optimistic"  # target tied with items: ahead of / behind them


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
    device: str = "auto"  # "auto": cuda when available, else cpu
    overwrite: bool = False  # replace another job's rankings in --output instead of refusing (same job: resumed)


class TrackingConfig(_Section):
    """MLflow; ``MLFLOW_TRACKING_URI`` overrides ``uri``; None means sqlite under the working dir."""

    uri: str | None = None
    experiment: str = "recsys-alibi"
    registered_model: str = "recsys-alibi-ranker"
    champion_alias: str = "champion"  # registry alias the pipeline moves to a better model; scoring loads it
    promotion_metric: str = "NDCG@10"  # compared on leave-one-out validation examples (a name in evaluate.ks)
    promotion_margin: float = 0.0  # promote only when new - champion > margin (a tie keeps the champion)


class JobConfig(_Section):
    """The whole job: one YAML file, every section optional."""

    seed: int = 42
    output: str = "runs/default"
    generate: GenerateConfig = GenerateConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    score: ScoreConfig = ScoreConfig()
    tracking: TrackingConfig = TrackingConfig()


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: '{key}' is a value, not a section")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``"a.b=value"`` into ``("a.b", parsed value)``; the value is read as YAML.

    Raises:
        ConfigError: when there is no ``=`` or the key is empty.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects dotted.key=value, got '{text}'")
    return key.strip(), yaml.safe_load(raw) if raw.strip() else None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> JobConfig:
    """Read a YAML job config, apply ``dotted.key=value`` overrides and validate.

    Raises:
        ConfigError: missing file, YAML that is not a mapping, unknown keys or invalid values.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        loaded = yaml.safe_load(path.read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a YAML mapping at the top level")
        tree = loaded or {}
    for text in overrides:
        _set_dotted(tree, *parse_override(text))
    try:
        return JobConfig.model_validate(tree)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise ConfigError(f"invalid config at '{where}': {first['msg']}") from None


def with_overrides(config: JobConfig, **sections: dict[str, Any]) -> JobConfig:
    """Return a copy of ``config`` with some section fields replaced (validated again)."""
    tree = config.model_dump()
    for name, fields in sections.items():
        if isinstance(tree.get(name), dict):
            tree[name].update(fields)
        else:
            tree[name] = fields
    return JobConfig.model_validate(tree)
