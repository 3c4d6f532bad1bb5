"""Item feature encoder: an item's vector from its categorical and numeric features (``model.item_features``).

For an item i with value sets ``S_k(i)`` in the K categorical columns and numbers ``x_i`` (C columns)::

    f(i) = sum_k sum_{v in S_k(i)} E_k[v]  +  W ((x_i - mu) / sigma)        # (D,)

``E_k`` is a (V_k + 1, D) table per column, sum-pooled over the item's values (an item with no value
gets 0 from that column); the numbers are standardised with the mean ``mu`` and population std
``sigma`` of the training catalog (a missing number reads as 0, the mean; ``sigma = 0`` reads as 1) and
projected by ``W`` (D, C) without a bias (a shared bias would add the same term to every item's score
and make the padding row non-zero). The model's item vector is ``keep_i * id_row_i + f(i)``, in the
same tied table as today (inputs and output scores), where ``keep_i = 0`` for items with fewer than
``model.item_features.id_min_events`` training events (their vector is their features alone) and 1
otherwise; an item the model never saw is ranked with ``f(i)`` alone.

Sources: RecTools' item nets (``rectools/models/nn/item_net.py``: ``CatFeaturesItemNet`` sums an
``nn.EmbeddingBag`` over an item's category values, ``SumOfEmbeddingsConstructor`` adds it to the id
embedding of its SASRec/BERT4Rec); content-based item towers that drop the id part for cold items
(DropoutNet, Volkovs, Yu & Poutanen, NeurIPS 2017; the two-tower item tower with content features
of Yi et al., RecSys 2019).

Two backends behind one interface, as :mod:`recsys_alibi.model.embeddings`: a torchrec
``EmbeddingBagCollection`` fed by a ``KeyedJaggedTensor`` (SUM pooling) where torchrec imports, else
plain ``nn.EmbeddingBag`` modules (:class:`PlainEmbeddingBagCollection`). Both keep the tables under
``embedding_bags.<table>.weight`` and draw the same initial weights from the same seed, so state dicts
move between them; a pickled encoder stores the plain tables and is rebuilt with torchrec on load
where it is available.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import nn

from recsys_alibi.config import ItemFeaturesConfig
from recsys_alibi.model.embeddings import resolve_embedding_backend, torchrec_unavailable

TABLE_PREFIX = "feature_"  # table of categorical column c: feature_<c>


@dataclass(frozen=True)
class FeatureRows:
    """The features of M items.

    Attributes:
        names: the categorical columns (K of them), in declaration order.
        values: per column, (T_k,) int64 value indices 1..V_k of all M items, item after item.
        offsets: per column, (M + 1,) int64: item m's values are ``values[k][offsets[k][m]:offsets[k][m + 1]]``.
        numeric: (M, C) float32, NaN where a value is missing.
    """

    names: tuple[str, ...]
    values: tuple[torch.Tensor, ...]
    offsets: tuple[torch.Tensor, ...]
    numeric: torch.Tensor

    @property
    def count(self) -> int:
        """M, the number of items."""
        return int(self.numeric.shape[0])

    def to(self, device: torch.device | str) -> FeatureRows:
        return FeatureRows(self.names, tuple(v.to(device) for v in self.values), tuple(o.to(device) for o in self.offsets),
                           self.numeric.to(device))  # fmt: skip


@dataclass(frozen=True)
class CatalogFeatures:
    """The features of a model's catalog, read from a prepared directory.

    Attributes:
        declaration: ``data.item_features`` of the table.
        vocabularies: ``{categorical column: values by index}``.
        rows: N + 1 rows by item index (row 0, padding, and items without a table row: no value, NaN numbers).
        with_row: (N + 1,) bool, the items that have a table row.
    """

    declaration: ItemFeaturesConfig
    vocabularies: dict[str, list[str]]
    rows: FeatureRows
    with_row: np.ndarray


class PlainEmbeddingBagCollection(nn.Module):
    """Sum-pooled ``nn.EmbeddingBag`` tables laid out as torchrec's collection (``embedding_bags.<table>``).

    Args:
        tables: ``(name, rows, width D)`` per table.
        init_std: std of the normal initialisation, drawn after every table is built (torchrec's order).
        weights: ``name -> (rows, D)`` Parameters to hold instead (shared, nothing drawn).
    """

    def __init__(self, tables: list[tuple[str, int, int]], init_std: float = 0.02,
                 weights: dict[str, nn.Parameter] | None = None) -> None:  # fmt: skip
        super().__init__()
        self.embedding_bags = nn.ModuleDict()
        for name, rows, width in tables:
            self.embedding_bags[name] = nn.EmbeddingBag(rows, width, mode="sum", include_last_offset=True)
            if weights is not None:
                self.embedding_bags[name].weight = weights[name]
        if weights is None:
            for name, _, _ in tables:
                nn.init.normal_(self.embedding_bags[name].weight, std=init_std)


def _torchrec_bags(tables: list[tuple[str, int, int]], features: dict[str, str], init_std: float) -> nn.Module:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(name=name, embedding_dim=width, num_embeddings=rows, feature_names=[features[name]],
                           pooling=PoolingType.SUM, init_fn=partial(nn.init.normal_, std=init_std))  # fmt: skip
        for name, rows, width in tables
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))


class ItemFeatureEncoder(nn.Module):
    """``f``: M items' features (:class:`FeatureRows`) -> (M, D) float32 vectors (module doc).

    Args:
        d_model: width D.
        vocab_sizes: ``{categorical column: V_k}`` (tables of V_k + 1 rows; row 0 unused).
        n_numeric: C numeric columns.
        numeric_mean, numeric_std: (C,) float32 standardisation of the numbers (persistent buffers).
        backend: ``model.embedding_backend`` (``auto``, ``torchrec``, ``torch``).
        init_std: std of the normal initialisation of the tables.

    Raises:
        ConfigError: ``backend="torchrec"`` where torchrec cannot be imported.

    Example:
        >>> enc = ItemFeatureEncoder(8, {"genre": 3}, 1, torch.zeros(1), torch.ones(1), backend="torch")
        >>> rows = FeatureRows(("genre",), (torch.tensor([1, 3, 2]),), (torch.tensor([0, 2, 3]),),
        ...                    torch.tensor([[0.5], [float("nan")]]))
        >>> enc(rows).shape   # (M=2, D=8)
        torch.Size([2, 8])
    """

    requested_backend: str = "auto"

    def __init__(self, d_model: int, vocab_sizes: dict[str, int], n_numeric: int, numeric_mean: torch.Tensor,
                 numeric_std: torch.Tensor, backend: str = "auto", init_std: float = 0.02) -> None:  # fmt: skip
        super().__init__()
        self.d_model, self.init_std, self.requested_backend = d_model, init_std, backend
        self.names = tuple(vocab_sizes)
        self.vocab_sizes = dict(vocab_sizes)
        self.backend = resolve_embedding_backend(backend) if self.names else "torch"
        self.bags = self._build(self.backend) if self.names else None
        self.numeric = nn.Linear(n_numeric, d_model, bias=False) if n_numeric else None
        if self.numeric is not None:  # the scale of the id rows and value rows, not Linear's U(+-1/sqrt(C))
            nn.init.normal_(self.numeric.weight, std=init_std)
        self.register_buffer("numeric_mean", numeric_mean.float().clone())  # (C,)
        self.register_buffer("numeric_std", torch.where(numeric_std > 0, numeric_std, 1.0).float().clone())  # (C,)

    def _tables(self) -> list[tuple[str, int, int]]:
        return [(TABLE_PREFIX + name, size + 1, self.d_model) for name, size in self.vocab_sizes.items()]

    def _build(self, backend: str) -> nn.Module:
        if backend == "torch":
            return PlainEmbeddingBagCollection(self._tables(), self.init_std)
        return _torchrec_bags(self._tables(), {TABLE_PREFIX + n: n for n in self.names}, self.init_std)

    def __getstate__(self) -> dict:
        """Pickle the tables as plain ``nn.EmbeddingBag`` modules (loadable without torchrec)."""
        state = self.__dict__.copy()
        bags = state["_modules"].get("bags")
        if bags is not None and not isinstance(bags, PlainEmbeddingBagCollection):
            weights = {name: bag.weight for name, bag in bags.embedding_bags.items()}
            plain = PlainEmbeddingBagCollection([(n, *w.shape) for n, w in weights.items()], weights=weights)
            state["_modules"] = {**state["_modules"], "bags": plain}
        return state

    def __setstate__(self, state: dict) -> None:
        """Rebuild the torchrec collection on load where asked for and available."""
        super().__setstate__(state)
        bags = self._modules.get("bags")
        if bags is None or self.requested_backend == "torch" or torchrec_unavailable():
            self.backend = "torch"
            return
        with torch.random.fork_rng(devices=[]):  # the rebuild's init draws must not move the caller's RNG
            rebuilt = self._build("torchrec")
        for name, bag in bags.embedding_bags.items():
            rebuilt.embedding_bags[name].weight = bag.weight
        self._modules["bags"] = rebuilt
        self.backend = "torchrec"

    def _pooled(self, rows: FeatureRows) -> list[torch.Tensor]:
        """Per categorical column, (M, D) sums of the items' value rows."""
        if self.backend == "torch":
            return [self.bags.embedding_bags[TABLE_PREFIX + n](v, o) for n, v, o in zip(rows.names, rows.values, rows.offsets)]
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        lengths = torch.cat([o[1:] - o[:-1] for o in rows.offsets])  # (K * M,)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=list(rows.names), values=torch.cat(rows.values), lengths=lengths)
        pooled = self.bags(kjt).to_dict()
        return [pooled[n] for n in rows.names]

    def forward(self, rows: FeatureRows) -> torch.Tensor:
        """(M, D) float32 ``f`` of each item (module doc); an item without any feature gets zeros.

        Raises:
            ValueError: ``rows`` holds other categorical columns than the encoder's, or another number of numbers.
        """
        if rows.names != self.names or rows.numeric.shape[1] != self.numeric_mean.shape[0]:
            raise ValueError(f"feature rows of columns {rows.names} + {rows.numeric.shape[1]} numbers; the encoder reads "
                             f"{self.names} + {self.numeric_mean.shape[0]}")  # fmt: skip
        out = rows.numeric.new_zeros(rows.count, self.d_model)  # (M, D)
        if rows.count == 0:  # no item (a table without new items): torchrec's jagged split needs one
            return out
        for pooled in self._pooled(rows) if self.bags is not None else []:
            out = out + pooled.float()
        if self.numeric is not None:
            z = ((rows.numeric - self.numeric_mean) / self.numeric_std).nan_to_num(nan=0.0)  # (M, C), missing = mean
            out = out + self.numeric(z)
        return out


class ItemFeatures(nn.Module):
    """The features of a model's catalog (items 0..N) and their encoder: what :class:`AlibiRanker` adds.

    Args:
        catalog: the catalog's rows, vocabularies and declaration (``recsys_alibi.data.feature_rows``).
        d_model: width D.
        backend: ``model.embedding_backend``.

    Attributes: ``encoder`` (:class:`ItemFeatureEncoder`); ``vocabularies`` and ``declaration`` (kept in
    the pickled model: ``score`` maps a newer item table onto them); non-persistent buffers (data, not
    weights: a warm-started model has its own catalog) ``id_keep`` (N + 1,) float32 (1: the item keeps
    its id row) and the catalog rows.
    """

    def __init__(self, catalog: CatalogFeatures, d_model: int, backend: str = "auto") -> None:
        super().__init__()
        rows = catalog.rows
        self.declaration = catalog.declaration.model_dump(mode="json")
        self.vocabularies = {name: list(values) for name, values in catalog.vocabularies.items()}
        numbers = rows.numeric[1:]  # (N, C) the catalog's items, padding excluded
        known = ~numbers.isnan()
        count = known.sum(0).clamp(min=1)
        mean = torch.where(known, numbers, 0.0).sum(0) / count  # (C,)
        std = (torch.where(known, numbers - mean, 0.0).square().sum(0) / count).sqrt()  # (C,) population std
        self.encoder = ItemFeatureEncoder(d_model, {n: len(v) for n, v in self.vocabularies.items()},
                                          rows.numeric.shape[1], mean, std, backend)  # fmt: skip
        self.names = rows.names
        for k, (values, offsets) in enumerate(zip(rows.values, rows.offsets)):
            self.register_buffer(f"catalog_values_{k}", values, persistent=False)  # (T_k,)
            self.register_buffer(f"catalog_offsets_{k}", offsets, persistent=False)  # (N + 2,)
        self.register_buffer("catalog_numeric", rows.numeric, persistent=False)  # (N + 1, C)
        self.register_buffer("id_keep", torch.ones(rows.count), persistent=False)  # (N + 1,)
        self._cache: tuple[tuple, torch.Tensor] | None = None

    def catalog_rows(self) -> FeatureRows:
        """The N + 1 rows of the catalog, on the module's device."""
        k = range(len(self.names))
        return FeatureRows(self.names, tuple(getattr(self, f"catalog_values_{i}") for i in k),
                           tuple(getattr(self, f"catalog_offsets_{i}") for i in k), self.catalog_numeric)  # fmt: skip

    def set_id_counts(self, counts: torch.Tensor, min_events: int) -> int:
        """Drop the id part of items with fewer than ``min_events`` training events; returns how many.

        Args:
            counts: (N + 1,) int64 training events per item (index 0 = padding).
            min_events: ``model.item_features.id_min_events`` (0: every item keeps its id row).
        """
        keep = (counts.to(self.id_keep.device) >= min_events).float()
        keep[0] = 1.0
        self.id_keep.copy_(keep)
        return int((keep[1:] == 0).sum())

    def vectors(self) -> torch.Tensor:
        """(N + 1, D) float32 ``f`` of every catalog item (row 0: zeros).

        Without gradients (scoring, evaluation) the result is cached until a weight changes (every
        optimiser step, ``load_state_dict`` and ``.to()`` change a tensor's version or identity).
        """
        if torch.is_grad_enabled():
            self._cache = None
            return self.encoder(self.catalog_rows())
        tensors = (*self.encoder.parameters(), *self.encoder.buffers(), self.catalog_numeric)
        key = tuple((id(t), t.data_ptr(), t.device, t._version) for t in tensors)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self.encoder(self.catalog_rows()))
        return self._cache[1]

    def __getstate__(self) -> dict:
        """Pickled without the cached vectors."""
        return {**self.__dict__, "_cache": None}
