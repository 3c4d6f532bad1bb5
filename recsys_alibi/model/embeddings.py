"""Item embedding tables: a torchrec ``EmbeddingCollection``, or plain ``nn.Embedding`` tables.

Two backends behind one interface (``model.embedding_backend``):

- ``torchrec``: the tables live in a torchrec ``EmbeddingCollection`` fed by a
  ``KeyedJaggedTensor``, so a catalog too large for one device can be sharded by torchrec's
  planner (``model.shard_embeddings``, ``recsys_alibi.training.sharding``: torchrec only).
- ``torch``: the same tables as plain ``nn.Embedding`` modules (:class:`PlainEmbeddingCollection`)
  for one process where torchrec or fbgemm-gpu cannot be imported (macOS, ARM Linux, a GPU box
  without the CUDA build of fbgemm-gpu). Its forward pass is one gather per table and a mask:
  no host synchronisation, so it runs inside a CUDA training step unchanged.
- ``auto`` (default): torchrec wherever it imports (and, where CUDA is present, fbgemm has its
  CUDA kernels), else the plain tables.

Both hold the tables under the same names, so state dicts (``collection.embeddings.item_table.
weight``, ``collection.embeddings.time_gap_table.weight``), Lightning checkpoints and pickled
models move between them; both draw the same initial weights from the same seed (the torchrec
recipe: ``nn.Embedding``'s own init, then ``normal_(std)``). A pickled ``ItemEmbeddings`` always
stores the plain tables and is rebuilt on load with the backend its config asks for that the
loading machine has, so a model logged with torchrec loads where torchrec is missing.

Row 0 is padding: padded positions come out as zero vectors, and the padding column is never
ranked.
"""

from __future__ import annotations

import importlib
import logging
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from recsys_alibi.config import ConfigError

log = logging.getLogger(__name__)

ITEM_FEATURE = "item"
ITEM_TABLE = "item_table"
TIME_GAP_FEATURE = "time_gap"
TIME_GAP_TABLE = "time_gap_table"
EMBEDDING_BACKENDS = ("auto", "torchrec", "torch")


def torchrec_unavailable() -> str | None:
    """Why torchrec's embedding modules cannot be used here (one line), or None when they can."""
    try:
        importlib.import_module("torchrec.modules.embedding_modules")
        importlib.import_module("torchrec.sparse.jagged_tensor")
    except (ImportError, OSError, RuntimeError) as err:  # fbgemm's .so may fail to load: OSError/RuntimeError
        text = str(err).strip().splitlines()
        return f"{type(err).__name__}: {text[0] if text else ''}"[:200]
    if torch.cuda.is_available():
        try:
            cuda_kernels = torch._C._dispatch_has_kernel_for_dispatch_key("fbgemm::jagged_to_padded_dense", "CUDA")
        except RuntimeError:  # the op is not registered at all
            cuda_kernels = False
        if not cuda_kernels:
            return "fbgemm-gpu has no CUDA kernels here (the CPU build)"
    return None


def resolve_embedding_backend(requested: str, sharded: bool = False) -> str:
    """The backend that runs here: ``"torchrec"`` or ``"torch"``.

    Args:
        requested: ``model.embedding_backend``, one of ``EMBEDDING_BACKENDS``.
        sharded: ``model.shard_embeddings`` (needs torchrec).

    Raises:
        ConfigError: an unknown name; ``torchrec`` asked for (explicitly or by sharding) where it
            cannot be imported; sharding with the ``torch`` backend.
    """
    if requested not in EMBEDDING_BACKENDS:
        raise ConfigError(f"model.embedding_backend={requested!r}: expected one of {', '.join(EMBEDDING_BACKENDS)}")
    if requested == "torch":
        if sharded:
            raise ConfigError("model.shard_embeddings=true needs model.embedding_backend=torchrec or auto")
        return "torch"
    missing = torchrec_unavailable()
    if missing is None:
        return "torchrec"
    if requested == "torchrec" or sharded:
        what = "model.shard_embeddings=true" if sharded else "model.embedding_backend=torchrec"
        raise ConfigError(
            f"{what} needs torchrec with fbgemm-gpu, which cannot be used here ({missing}); install them "
            "(docs/install.md) or train on one process with model.embedding_backend=torch"
        )
    log.info("torchrec cannot be used here (%s): the item table is a plain nn.Embedding", missing)
    return "torch"


class PlainEmbeddingCollection(nn.Module):
    """Plain ``nn.Embedding`` tables laid out as torchrec's collection (``embeddings.<table>``).

    Args:
        tables: ``(name, rows, width D)`` per table.
        init_std: standard deviation of the normal initialisation (after ``nn.Embedding``'s own,
            as torchrec does, so the same seed gives the same weights).
        weights: optional ``name -> (rows, D)`` Parameters to hold instead (shared, not copied;
            nothing is drawn).
    """

    def __init__(
        self, tables: list[tuple[str, int, int]], init_std: float = 0.02, weights: dict[str, nn.Parameter] | None = None
    ) -> None:
        super().__init__()
        self.embeddings = nn.ModuleDict()
        for name, rows, width in tables:
            if weights is None:
                self.embeddings[name] = nn.Embedding(rows, width)
                nn.init.normal_(self.embeddings[name].weight, std=init_std)
            else:
                self.embeddings[name] = nn.Embedding(rows, width, _weight=weights[name])
                self.embeddings[name].weight = weights[name]  # the same Parameter, not a new wrapper


def _torchrec_collection(tables: list[tuple[str, int, int]], features: dict[str, str], init_std: float) -> nn.Module:
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    init = partial(nn.init.normal_, std=init_std)  # picklable, unlike a lambda
    configs = [
        EmbeddingConfig(
            name=name, embedding_dim=width, num_embeddings=rows, feature_names=[features[name]], init_fn=init
        )
        for name, rows, width in tables
    ]
    return EmbeddingCollection(tables=configs, device=torch.device("cpu"))


class ItemEmbeddings(nn.Module):
    """Lookup of item vectors for right-padded item-index rows.

    Args:
        n_items: catalog size N; the table has N + 1 rows (row 0 = padding).
        d_model: embedding width D.
        init_std: standard deviation of the normal initialisation.
        time_gap_buckets: G > 0 adds a second table of G rows in the same collection, one per
            time-gap bucket (``recsys_alibi.data.time_gaps``); each position's vector is then its
            item row plus its gap row. 0: items only.
        backend: ``model.embedding_backend`` (``auto``, ``torchrec`` or ``torch``, module doc).
        sharded: ``model.shard_embeddings`` (torchrec only).
        check_inputs: also check in ``forward`` that the gap buckets lie in 0..G - 1. It reads
            the tensor (a host synchronisation on a GPU), so it is off by default: the data layer
            makes buckets in range by construction (``recsys_alibi.data.time_gaps``).

    Attributes: ``backend`` (the one in use: ``"torchrec"`` or ``"torch"``), ``requested_backend``.

    Raises:
        ConfigError: see :func:`resolve_embedding_backend`.

    Example:
        >>> emb = ItemEmbeddings(n_items=10, d_model=8, backend="torch")
        >>> emb(torch.tensor([[1, 2, 0]]), torch.tensor([2])).shape   # (B=1, L=3, D=8)
        torch.Size([1, 3, 8])
    """

    # class defaults: models pickled before these attributes existed load unchanged
    time_gap_buckets: int = 0
    init_std: float = 0.02
    backend: str = "torchrec"
    requested_backend: str = "auto"
    check_inputs: bool = False

    def __init__(
        self,
        n_items: int,
        d_model: int,
        init_std: float = 0.02,
        time_gap_buckets: int = 0,
        backend: str = "auto",
        sharded: bool = False,
        check_inputs: bool = False,
    ) -> None:
        super().__init__()
        self.n_items = n_items
        self.d_model = d_model
        self.time_gap_buckets = time_gap_buckets
        self.init_std = init_std
        self.requested_backend = backend
        self.check_inputs = check_inputs
        self.backend = resolve_embedding_backend(backend, sharded)
        self.collection = self._build(self.backend, self._tables())

    def _tables(self) -> list[tuple[str, int, int]]:
        tables = [(ITEM_TABLE, self.n_items + 1, self.d_model)]
        if self.time_gap_buckets:
            tables.append((TIME_GAP_TABLE, self.time_gap_buckets, self.d_model))
        return tables

    def _build(self, backend: str, tables: list[tuple[str, int, int]]) -> nn.Module:
        if backend == "torch":
            return PlainEmbeddingCollection(tables, self.init_std)
        features = {ITEM_TABLE: ITEM_FEATURE, TIME_GAP_TABLE: TIME_GAP_FEATURE}
        return _torchrec_collection(tables, features, self.init_std)

    def __getstate__(self) -> dict:
        """Pickle the tables as plain ``nn.Embedding`` modules (loadable without torchrec)."""
        state = self.__dict__.copy()
        collection = state["_modules"]["collection"]
        if not isinstance(collection, PlainEmbeddingCollection):
            weights = {name: table.weight for name, table in collection.embeddings.items()}
            tables = [(name, *weight.shape) for name, weight in weights.items()]
            state["_modules"] = {**state["_modules"], "collection": PlainEmbeddingCollection(tables, weights=weights)}
        return state

    def __setstate__(self, state: dict) -> None:
        """Rebuild the torchrec collection on load where asked for and available (module doc)."""
        super().__setstate__(state)
        collection = self._modules["collection"]
        if not isinstance(collection, PlainEmbeddingCollection):  # pickled by an older version: torchrec
            self.backend = "torchrec"
            return
        backend = "torch" if self.requested_backend == "torch" or torchrec_unavailable() else "torchrec"
        if backend == "torchrec":
            with torch.random.fork_rng(devices=[]):  # the rebuild's init draws must not move the caller's RNG
                rebuilt = self._build("torchrec", self._tables())
            for name, table in collection.embeddings.items():
                rebuilt.embeddings[name].weight = table.weight  # the unpickled Parameter itself
            self._modules["collection"] = rebuilt
        self.backend = backend

    @property
    def weight(self) -> torch.Tensor:
        """The (N + 1, D) float32 table; used as the tied output layer.

        Once the collection is sharded (``recsys_alibi.training.sharding``) this is only the
        rank's own rows: sharded training never uses it as the output layer.
        """
        return self.collection.embeddings[ITEM_TABLE].weight

    def gap_rows(self, gaps: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 time-gap buckets -> (B, L, D) float32 rows of the time-gap table (unmasked)."""
        return F.embedding(gaps, self.collection.embeddings[TIME_GAP_TABLE].weight).float()

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the given items: (M,) int64 in 0..N -> (M, D) float32.

        torchrec: one call of the collection (a single-sample ``KeyedJaggedTensor``); on a
        sharded table it is one all-to-all, and in training one fused update of those rows in the
        backward pass. Plain tables: one gather.
        """
        if self.backend == "torch":
            return F.embedding(ids, self.weight)
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        keys, lengths = [ITEM_FEATURE], [ids.numel()]
        if self.time_gap_buckets:  # the collection looks up every table: the gap feature is empty
            keys, lengths = keys + [TIME_GAP_FEATURE], lengths + [0]
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=ids, lengths=torch.tensor(lengths, device=ids.device)
        )
        return self.collection(kjt)[ITEM_FEATURE].values()  # (M, D)

    def forward(self, item_idx: torch.Tensor, lengths: torch.Tensor, gaps: torch.Tensor | None = None) -> torch.Tensor:
        """Embed right-padded rows.

        Args:
            item_idx: (B, L) int64 item indices in 0..N, right-padded with 0.
            lengths: (B,) int64 number of non-padding positions per row.
            gaps: (B, L) int64 time-gap buckets aligned with ``item_idx``; required exactly when
                the collection has a time-gap table.

        Returns:
            (B, L, D) float32; positions ``>= lengths[b]`` are zeros.

        Raises:
            ValueError: ``gaps`` missing for a time-gap model, given to one without, or of another
                shape than ``item_idx``; with ``check_inputs``, a bucket outside 0..G - 1.
        """
        if (gaps is None) != (not self.time_gap_buckets):
            raise ValueError(
                "this model was trained with time gaps: pass gaps (B, L)" if gaps is None
                else "this model has no time-gap table (model.time_gap_buckets=0): do not pass gaps"
            )  # fmt: skip
        if gaps is not None and gaps.shape != item_idx.shape:
            raise ValueError(f"gaps {tuple(gaps.shape)} must have the shape of item_idx {tuple(item_idx.shape)}")
        valid = torch.arange(item_idx.shape[1], device=item_idx.device)[None, :] < lengths[:, None]  # (B, L)
        if self.check_inputs and gaps is not None:
            gap_values = gaps[valid]
            if gap_values.numel() and (int(gap_values.min()) < 0 or int(gap_values.max()) >= self.time_gap_buckets):
                raise ValueError(f"time-gap buckets must be in 0..{self.time_gap_buckets - 1}")
        if self.backend == "torch":
            return self._plain_forward(item_idx, valid, gaps)
        return self._torchrec_forward(item_idx, lengths, valid, gaps)

    def _plain_forward(self, item_idx: torch.Tensor, valid: torch.Tensor, gaps: torch.Tensor | None) -> torch.Tensor:
        rows = F.embedding(item_idx, self.weight).float()  # (B, L, D)
        if gaps is not None:
            rows = rows + F.embedding(gaps, self.collection.embeddings[TIME_GAP_TABLE].weight).float()
        return rows.masked_fill(~valid[..., None], 0.0)  # padding: zeros, and no gradient to row 0

    def _torchrec_forward(
        self, item_idx: torch.Tensor, lengths: torch.Tensor, valid: torch.Tensor, gaps: torch.Tensor | None
    ) -> torch.Tensor:
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        keys, values, per_key = [ITEM_FEATURE], [item_idx[valid]], [lengths.to(torch.int64)]
        if gaps is not None:
            keys, values, per_key = keys + [TIME_GAP_FEATURE], values + [gaps[valid]], per_key + per_key
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(per_key))
        out = self.collection(kjt)
        max_len = item_idx.shape[1]
        rows = out[ITEM_FEATURE].to_padded_dense(desired_length=max_len)  # (B, L, D)
        if gaps is not None:
            rows = rows + out[TIME_GAP_FEATURE].to_padded_dense(desired_length=max_len)
        return rows
