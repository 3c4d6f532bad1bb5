"""Rank the users of one shard: context windows, length-sorted batches, chunked top-K, raw ids.

Histories and context (``score.max_context`` = C, ``score.sinks`` = S):

- a history of at most C events is scored whole, even when longer than the training length
  ``model.max_len``: ALiBi has no position table and extrapolates (Press et al. 2022);
- a longer history is scored as its first S events followed by its last C - S events, one
  sequence of C events. This is StreamingLLM's rolling cache with attention sinks (Xiao et al.
  2023): the window slides over the history, the first events stay as sinks, and distances
  (hence the ALiBi bias) are counted inside the kept events. Cost per user is bounded by C
  whatever the history length. With S = 0 it is simply the last C events. A model trained
  with ``model.window`` / ``model.sinks`` applies them inside the C events as in training;
- models with learned positions (the SASRec baseline) cannot extrapolate: C is capped at
  ``model.max_len``.

Seen items are those of the *whole* history, not only of the context window.

Users are sorted by context length inside the shard and cut into batches of at most
``score.batch_size`` users and ``score.batch_tokens`` padded events, so activation memory is
bounded whatever the history lengths. The output is sorted by (``user_id``, ``rank``), so it
does not depend on the batching.

A user's scores are the same bits whichever users share its batch (``score --changed-since``
re-ranks a few users and must equal a full re-score byte for byte): a batch never mixes
padded lengths, and each context is padded to :func:`padded_length` of its own length, not to
its batch's longest; the catalog product runs in fixed blocks of rows
(:func:`serving.topk.chunked_topk`). On the CPU a matrix product's row then does not depend
on the other rows or their number (GEMM kernels pick their blocking by shape: a (B, D) x (D, N)
product with B = 7 or 40 rows gave the same row with 3e-8 differences before).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import polars as pl
import torch

from recsys_alibi.config import ConfigError, ScoreConfig
from recsys_alibi.data import schema
from recsys_alibi.data.buckets import plan_batches
from recsys_alibi.data.ids import same_id_in
from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.loader import FlatSequences, pad_right
from serving.inputs import ScoreInput, join_on_id
from serving.new_items import extended_vocabulary, new_items
from serving.rules import load_rules
from serving.topk import chunked_topk, reserve_new_items

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """``"auto"``: cuda when available, else cpu; any other torch device string as is.

    Raises:
        ConfigError: ``score.device`` names a CUDA device this machine does not have, or mps
            where Apple's Metal backend is missing.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= visible:
        raise ConfigError(f"score.device={name} but this machine has {visible} CUDA device(s); use score.device=auto or cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("score.device=mps needs Apple's Metal backend, not available here; use auto or cpu")
    return device


def device_identity(device: torch.device) -> str:
    """The device a row's bits come from: its type, the CPU's instruction set that torch's kernels
    use (``AVX2``, ``AVX512``, ...) or the GPU's name, and torch's version (kernels change with it).

    >>> device_identity(torch.device("cpu"))  # doctest: +SKIP
    'cpu (AVX2), torch 2.13.0+cpu'
    """
    if device.type == "cuda":
        kind = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        kind = torch.backends.cpu.get_cpu_capability()
    else:
        kind = device.type
    return f"{device.type} ({kind}), torch {torch.__version__}"


def resolve_backend(name: str) -> str | None:
    """Attention backend for scoring; None means the model's own ``model.attention_backend``.

    ``auto`` stays ``"auto"``: the model resolves it per batch with the library's one rule
    (:func:`recsys_alibi.model.attention.choose_backend`: device, length, window, packing,
    gradient), so scoring and the model never disagree.
    """
    if name == "model":
        return None
    return name


def context_window(history: np.ndarray, max_context: int, sinks: int) -> np.ndarray:
    """The events the model sees: all of ``history`` if it fits, else ``sinks`` first + the rest last.

    Args:
        history: (L,) int item indices in time order.
        max_context: C >= 1, longest sequence given to the model.
        sinks: S, 0 <= S < C, first events kept when the history is longer than C.

    Returns:
        (min(L, C),) int64.
    """
    if history.shape[0] <= max_context:
        return history
    return np.concatenate([history[:sinks], history[history.shape[0] - (max_context - sinks) :]])


def padded_length(length: int, context: int) -> int:
    """The padded length a context of ``length`` events is scored at: rounded up to a multiple of
    ``max(8, 2 ** (bit_length(length) - 4))`` (at most 12.5 % padding), capped at ``context``.

    It depends on the user's own length only, so a user's bits do not depend on its batch.

    >>> [padded_length(n, 200) for n in (1, 8, 9, 100, 130, 199, 5000)]
    [8, 8, 16, 104, 144, 200, 200]
    """
    step = max(8, 1 << max(int(length).bit_length() - 4, 0))
    return min(-(-int(length) // step) * step, int(context))


def item_id_lookup(items: pl.DataFrame, n_items: int) -> pl.Series:
    """(N + 1,) raw item ids by item index (position 0, padding, is null).

    Raises:
        DataError: the vocabulary is not exactly the indices 1..N of the model's item table.
    """
    vocab = items.select(schema.ITEM_IDX, schema.ITEM_ID).sort(schema.ITEM_IDX)
    expected = pl.Series(schema.ITEM_IDX, np.arange(1, n_items + 1), dtype=vocab.schema[schema.ITEM_IDX])
    if vocab.height != n_items or not vocab[schema.ITEM_IDX].equals(expected):
        raise DataError(
            f"the model's vocabulary has {vocab.height} items but its item table {n_items}; "
            "log the model again with `recsys-alibi train`"
        )
    ids = vocab.get_column(schema.ITEM_ID)
    return pl.concat([pl.Series(schema.ITEM_ID, [None], dtype=ids.dtype), ids])


class ShardRanker:
    """Top-K rows (contract rankings schema) for shards of users, with one model.

    Args:
        model: an ``AlibiRanker`` (``last_hidden``, ``items.weight`` (N + 1, D), ``max_context``,
            ``cfg.sinks``); put in eval mode and moved to ``cfg.device``.
        items: the model's vocabulary: ``item_idx`` 1..N, ``item_id`` raw.
        cfg: the ``score`` config section (``allow`` / ``deny``: business rules, :mod:`serving.rules`;
            ``items``: an item table whose items the model never saw are ranked from their features
            alone, at indices N + 1 .. N + M, :mod:`serving.new_items`).
        k: items per user.
        popularity: ``item_id``, ``popularity`` (:func:`recsys_alibi.evaluation.popularity_prior.item_popularity`
            of the scored input) when ``score.popularity_prior.weight`` > 0; it may also come later, through
            :meth:`use_popularity`, before :meth:`rank`.

    Raises:
        DataError: the vocabulary does not match the item table; a rule file is unreadable;
            ``score.new_item_slots`` with a model that reads no item features.
        ValueError: ``score.sinks`` not below the context length.
    """

    def __init__(self, model, items: pl.DataFrame, cfg: ScoreConfig, k: int, popularity: pl.DataFrame | None = None) -> None:
        self.cfg = cfg
        self.k = int(k)
        self.device = resolve_device(cfg.device)
        self.backend = resolve_backend(cfg.attention_backend)
        self.model = model.eval().to(self.device)
        with torch.no_grad():
            self.table = model.item_vectors().detach()  # (N + 1, D): the item table, or id rows + features
        # score.items: items the model never saw, ranked from their features alone (serving.new_items)
        self.new_items = new_items(self.model, items, cfg.items) if cfg.items is not None else None
        if cfg.new_item_slots and getattr(model, "features", None) is None:
            raise DataError(f"score.new_item_slots={cfg.new_item_slots}: this model reads no item features, so it ranks "
                            "no item it never saw; train it with model.item_features.enabled=true, or drop "
                            "score.new_item_slots")  # fmt: skip
        if self.new_items is not None and self.new_items.count:
            self.table = torch.cat([self.table, self.new_items.vectors.to(self.table)])  # (N + M + 1, D)
            items = extended_vocabulary(items, self.new_items)
        self.n_items = int(self.table.shape[0]) - 1
        self.first_new_item = self.n_items + 1 - (self.new_items.count if self.new_items is not None else 0)
        # score.new_item_slots as it can apply: at most K places, at most the new items there are
        self.slots = min(cfg.new_item_slots, self.k, self.n_items + 1 - self.first_new_item)
        if self.slots and self.slots >= self.k:
            log.warning("score.new_item_slots=%d holds every place of the top %d: each ranking is new items only "
                        "(those a user may be shown)", cfg.new_item_slots, self.k)  # fmt: skip
        self.item_ids = item_id_lookup(items, self.n_items)
        self.rules = load_rules(cfg.allow, cfg.deny, items)
        self.context = min(cfg.max_context, model.max_context or cfg.max_context)
        self.time_gap_buckets = int(getattr(model.items, "time_gap_buckets", 0))
        model_sinks = int(getattr(model.cfg, "sinks", 0) or 0)
        self.sinks = model_sinks if cfg.sinks is None else int(cfg.sinks)
        if self.sinks >= self.context:
            raise ValueError(
                f"score.sinks={self.sinks} must be below the context of {self.context} events; lower score.sinks"
            )
        self.popularity: pl.DataFrame | None = None
        self.bias: torch.Tensor | None = None  # (N + 1,) score.popularity_prior, on the table's device
        if popularity is not None:
            self.use_popularity(popularity)

    @property
    def new_item_ids(self) -> pl.Series | None:
        """Raw ids of the items ranked from their features alone (``score.items``), None without any: what
        :func:`serving.inputs.open_input` counts as known beside the model's vocabulary."""
        return self.new_items.ids if self.new_items is not None and self.new_items.count else None

    def for_input(self, source: ScoreInput) -> ScoreInput:
        """``source`` with what ranking it needs beyond its histories: ``new_item_remap`` (input item index -> the
        ranker's index of that item when it is a new item of ``score.items``, so a user's events on it exclude it
        like any seen item) and ``withheld`` (every item of the ranker, known or new, whose events the input's
        k-core removed: served to no user, since the histories no longer hold who had it).

        Raises:
            DataError: the input's files are not of one prepare.
        """
        remap, withheld = None, None
        if self.new_items is not None and self.new_items.count:
            new = pl.DataFrame({schema.ITEM_ID: self.new_items.ids,
                                "_rank_idx": np.arange(self.first_new_item, self.n_items + 1, dtype=np.int64)})  # fmt: skip
            # a bare sequences file is in the model's numbering: it holds no new item (the empty frame stands for it)
            input_items = source.vocabulary(pl.DataFrame(schema={schema.ITEM_IDX: pl.Int32, schema.ITEM_ID: self.item_ids.dtype}))
            joined = join_on_id(input_items.select(schema.ITEM_IDX, schema.ITEM_ID), new)  # 104 and "104": one id
            if joined.height:
                remap = np.zeros(int(input_items.get_column(schema.ITEM_IDX).max()) + 1, np.int64)
                remap[joined.get_column(schema.ITEM_IDX).to_numpy()] = joined.get_column("_rank_idx").to_numpy()
        removed = source.removed_item_ids()
        if removed is not None and removed.len():
            ranked = self.item_ids.to_frame().with_row_index("_rank_idx").drop_nulls(schema.ITEM_ID)
            held = join_on_id(ranked, removed.to_frame().drop_nulls(), how="semi").get_column("_rank_idx").to_numpy().astype(np.int64)
            if held.size:
                withheld = held
                new = int((held >= self.first_new_item).sum())
                of_new = f" ({new} of them items of score.items the model never saw)" if new else ""
                log.info("%d items have events that the input's k-core removed (data.min_events_per_item ...)%s: "
                         "served to nobody", held.size, of_new)  # fmt: skip
        return replace(source, new_item_remap=remap, withheld=withheld)

    def use_input_popularity(self, source: ScoreInput, items: pl.DataFrame) -> None:
        """``score.popularity_prior`` from the recent item counts of ``source`` (the staged or prepared input; ``items``
        the model's vocabulary), when its weight is on; what ``score`` and ``export`` rank with."""
        from recsys_alibi.evaluation.popularity_prior import item_popularity

        prior = self.cfg.popularity_prior
        if prior.weight:
            self.use_popularity(item_popularity(source.sequences, source.vocabulary(items), prior.half_life_days,
                                                name=source.name))  # fmt: skip

    def use_popularity(self, popularity: pl.DataFrame) -> None:
        """Add ``score.popularity_prior.weight * log(1 + popularity)`` to every item's score from now on
        (:func:`recsys_alibi.evaluation.popularity_prior.item_bias`; items without a row, such as new items: 0)."""
        from recsys_alibi.evaluation.popularity_prior import item_bias

        source, target = popularity.schema[schema.ITEM_ID], self.item_ids.dtype
        if source != target:  # counts of an input whose ids are text of the model's (or the reverse): one id each
            popularity = popularity.with_columns(same_id_in(pl.col(schema.ITEM_ID), source, target)).drop_nulls(schema.ITEM_ID)
        self.popularity = popularity
        weight = self.cfg.popularity_prior.weight
        self.bias = torch.from_numpy(item_bias(popularity, self.item_ids, weight)).to(self.table.device) if weight else None

    def settings(self) -> dict:
        """Every setting that can change a row's bits: part of the job identity (a resumed job must
        match it) and all of it compared before ``score --changed-since`` reuses a row
        (:mod:`serving.changed`).

        K, seen items, context and sinks, catalog size, rule files; the attention backend (the
        model's own for ``model``), the device with its kernels (:func:`device_identity`), the
        catalog chunk (the width of each product); the model's config (window, sinks, bias clamp
        ... are not in its weights). ``batch_size`` and ``batch_tokens`` are not: a user's bits do
        not depend on its batch (module docstring).
        """
        settings = {"k": self.k, "exclude_seen": self.cfg.exclude_seen, "max_context": self.context,
                    "sinks": self.sinks, "n_items": self.n_items,
                    "attention_backend": self.backend or self.model.cfg.attention_backend,
                    "device": device_identity(self.device), "catalog_chunk": self.cfg.catalog_chunk,
                    "model_config": self.model.cfg.model_dump(mode="json")}  # fmt: skip
        if self.rules is not None:
            settings["rules"] = self.rules.fingerprint()
        if self.cfg.popularity_prior.weight:  # the counts are the input's, which the job fingerprints
            settings["popularity_prior"] = self.cfg.popularity_prior.model_dump(mode="json")
        if self.new_items is not None and self.new_items.count:
            settings["new_items"] = {"count": self.new_items.count, "sha256": self.new_items.digest()}
            if self.slots:
                settings["new_item_slots"] = self.slots
        return settings

    def empty(self, user_dtype: pl.DataType) -> pl.DataFrame:
        """A rankings frame with no rows and the contract schema."""
        return pl.DataFrame(schema={schema.USER_ID: user_dtype, schema.RANK: pl.Int32,
                                    schema.ITEM_ID: self.item_ids.dtype, schema.SCORE: pl.Float32})  # fmt: skip

    def new_item_rows(self, rankings: pl.DataFrame) -> int:
        """How many rows of ``rankings`` (the rankings schema) hold a new item (one the model never saw, ranked
        from its features: ``score.items``)."""
        if self.first_new_item > self.n_items:
            return 0
        fresh = self.item_ids.slice(self.first_new_item, self.n_items + 1 - self.first_new_item)
        return int(rankings.get_column(schema.ITEM_ID).is_in(fresh.implode()).sum())

    @torch.inference_mode()
    def rank(
        self, user_ids: pl.Series, histories: FlatSequences, gaps: FlatSequences | None = None,
        only: np.ndarray | None = None, new_seen: FlatSequences | None = None, withheld: np.ndarray | None = None,
    ) -> tuple[pl.DataFrame, int]:
        """Rank every user with at least one known event (and the business rules, when set).

        Args:
            user_ids: (U,) raw user ids.
            histories: U sequences of model item indices (1..N), time order.
            gaps: their time-gap buckets (same offsets), required by a time-gap model.
            only: (U,) bool, rank only these users (the others get no rows; None: all).
            new_seen: U sequences of new-item indices (N + 1 .. N + M) in each user's input history, excluded
                as seen (``Shard.new_seen``); withheld: (W,) int64 new-item indices no user is served
                (``ScoreInput.withheld``). Both from :meth:`for_input`.

        Returns:
            ``(rankings, skipped_users)``: rows ``user_id``, ``rank`` int32 1..K', ``item_id``,
            ``score`` float32 sorted by (user_id, rank), ``K' = min(K, N - seen)`` rows per user
            (``min(K, N)`` without seen-item exclusion); and the users with an empty history.
        """
        lengths = histories.lengths()
        rules = None if self.rules is None else self.rules.for_users(user_ids)
        bias = self.bias
        if withheld is not None and withheld.size:  # -inf: never ranked, whatever the user
            bias = torch.zeros(self.n_items + 1, dtype=torch.float32, device=self.table.device) if bias is None else bias.clone()
            bias[torch.tensor(withheld, dtype=torch.int64, device=bias.device)] = float("-inf")
        frames = [self._rank_batch(user_ids, histories, rows, gaps, rules, new_seen, bias)
                  for rows in self._batches(lengths, only)]  # fmt: skip
        skipped = int((lengths == 0).sum())
        if not frames:
            return self.empty(user_ids.dtype), skipped
        return pl.concat(frames).sort(schema.USER_ID, schema.RANK), skipped

    def _batches(self, lengths: np.ndarray, only: np.ndarray | None = None) -> list[np.ndarray]:
        """Positions of the users with a history (and in ``only``), sorted by context length and cut into
        batches of at most ``score.batch_size`` users and ``score.batch_tokens`` padded events."""
        keep = lengths > 0 if only is None else (lengths > 0) & only
        scored = np.flatnonzero(keep)
        order = scored[np.argsort(np.minimum(lengths[scored], self.context), kind="stable")]  # similar lengths together
        padded = np.array([padded_length(n, self.context) for n in np.minimum(lengths[order], self.context)], np.int64)
        edges = np.flatnonzero(np.diff(padded)) + 1  # a batch never mixes padded lengths
        batches = []
        for group in np.split(np.arange(order.shape[0]), edges):
            if group.size:
                batches += [order[group[start:end]]
                            for start, end in plan_batches(padded[group], self.cfg.batch_size, self.cfg.batch_tokens)]  # fmt: skip
        return batches

    def _hidden(self, histories: FlatSequences, rows: np.ndarray, gaps: FlatSequences | None) -> torch.Tensor:
        """(B, D) the query vector of the users ``rows``: the model's last hidden state over each context window."""
        windows = [context_window(histories.get(int(u)), self.context, self.sinks) for u in rows]
        width = padded_length(max(len(w) for w in windows), self.context)  # every row of the batch pads to it
        context, lengths = pad_right(windows, width)  # (B, L)
        context_gaps = None  # (B, L) the same events' time-gap buckets
        if gaps is not None:
            context_gaps = pad_right([context_window(gaps.get(int(u)), self.context, self.sinks) for u in rows], width)[0]
            context_gaps = context_gaps.to(self.device)
        hidden = self.model.last_hidden(
            context.to(self.device), lengths.to(self.device), backend=self.backend, gaps=context_gaps
        )  # (B, D)
        return hidden.to(self.table.dtype)

    @torch.inference_mode()
    def user_vectors(self, histories: FlatSequences, gaps: FlatSequences | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The query vectors :meth:`rank` scores the catalog with (same windows and batches).

        Returns:
            positions (U',) int64 of the users with a history, ascending, and their vectors
            (U', D) float32; ``vectors @ table[1:].T`` are the scores of :meth:`rank`.
        """
        batches = self._batches(histories.lengths())
        if not batches:
            return np.zeros(0, np.int64), np.zeros((0, self.table.shape[1]), np.float32)
        rows = np.concatenate(batches)
        vectors = torch.cat([self._hidden(histories, r, gaps).float().cpu() for r in batches]).numpy()
        order = np.argsort(rows, kind="stable")
        return rows[order], vectors[order]

    def _rank_batch(
        self, user_ids: pl.Series, histories: FlatSequences, rows: np.ndarray, gaps: FlatSequences | None, rules=None,
        new_seen: FlatSequences | None = None, bias: torch.Tensor | None = None,
    ) -> pl.DataFrame:
        if self.cfg.exclude_seen:
            own = [histories.get(int(u)) for u in rows]
            if new_seen is not None:  # the new items of the input history: seen too
                own = [np.concatenate([h, new_seen.get(int(u))]) for h, u in zip(own, rows)]
            seen, _ = pad_right(own)  # (B, S) the whole history
        else:
            seen = torch.zeros((len(rows), 0), dtype=torch.int64)
        if self.cfg.popularity_prior.weight and self.bias is None:
            raise ValueError("score.popularity_prior is on but the ranker was given no item popularity (use_popularity)")
        hidden = self._hidden(histories, rows, gaps)  # (B, D)
        mask = None if rules is None else rules.batch(rows)
        values, indices = chunked_topk(
            hidden, self.table, seen, self.k, chunk=self.cfg.catalog_chunk, exclude_seen=self.cfg.exclude_seen, mask=mask,
            bias=bias,
        )  # (B, K'), (B, K')
        slots = self.slots
        if slots:  # score.new_item_slots: the best new items take the last places (serving.topk.reserve_new_items)
            fresh = chunked_topk(hidden, self.table, seen, slots, chunk=self.cfg.catalog_chunk,
                                 exclude_seen=self.cfg.exclude_seen, mask=mask, first_item=self.first_new_item,
                                 bias=bias)  # fmt: skip
            values, indices = reserve_new_items(values, indices, *fresh, slots, self.first_new_item)
        values, indices = values.cpu(), indices.cpu()
        valid = torch.isfinite(values)  # masked tail of users with fewer than K rankable items
        ranks = (torch.arange(1, values.shape[1] + 1, dtype=torch.int32)).expand_as(values)[valid]
        owner = np.repeat(rows, valid.sum(dim=1).numpy())
        return pl.DataFrame(
            {
                schema.USER_ID: user_ids.gather(owner),
                schema.RANK: pl.Series(ranks.numpy(), dtype=pl.Int32),
                schema.ITEM_ID: self.item_ids.gather(indices[valid].numpy()),
                schema.SCORE: pl.Series(values[valid].numpy(), dtype=pl.Float32),
            }
        )
