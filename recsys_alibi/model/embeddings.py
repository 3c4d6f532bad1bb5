"""Item embedding table held in a torchrec ``EmbeddingCollection``.

Keeping the table in torchrec (fed by a ``KeyedJaggedTensor``) lets a catalog too large for one
device be sharded by torchrec's planner without changing the model. Row 0 is padding: padded
positions come out as zero vectors, and the padding column is never ranked.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

ITEM_FEATURE = "item"
ITEM_TABLE = "item_table"
TIME_GAP_FEATURE = "time_gap"
TIME_GAP_TABLE = "time_gap_table"


class ItemEmbeddings(nn.Module):
    """Lookup of item vectors for right-padded item-index rows.

    Args:
        n_items: catalog size N; the table has N + 1 rows (row 0 = padding).
        d_model: embedding width D.
        init_std: standard deviation of the normal initialisation.
        time_gap_buckets: G > 0 adds a second table of G rows in the same collection, one per
            time-gap bucket (``recsys_alibi.data.time_gaps``); each position's vector is then its
            item row plus its gap row. 0: items only.

    Example:
        >>> emb = ItemEmbeddings(n_items=10, d_model=8)
        >>> emb(torch.tensor([[1, 2, 0]]), torch.tensor([2])).shape   # (B=1, L=3, D=8)
        torch.Size([1, 3, 8])
    """

    time_gap_buckets: int = 0  # class default: models pickled before time gaps existed load unchanged

    def __init__(self, n_items: int, d_model: int, init_std: float = 0.02, time_gap_buckets: int = 0) -> None:
        super().__init__()
        self.n_items = n_items
        self.d_model = d_model
        self.time_gap_buckets = time_gap_buckets
        init = partial(nn.init.normal_, std=init_std)  # picklable, unlike a lambda
        tables = [EmbeddingConfig(name=ITEM_TABLE, embedding_dim=d_model, num_embeddings=n_items + 1,
                                  feature_names=[ITEM_FEATURE], init_fn=init)]  # fmt: skip
        if time_gap_buckets:
            tables.append(EmbeddingConfig(name=TIME_GAP_TABLE, embedding_dim=d_model, num_embeddings=time_gap_buckets,
                                          feature_names=[TIME_GAP_FEATURE], init_fn=init))  # fmt: skip
        self.collection = EmbeddingCollection(tables=tables, device=torch.device("cpu"))

    @property
    def weight(self) -> torch.Tensor:
        """The (N + 1, D) float32 table; used as the tied output layer.

        Once the collection is sharded (``recsys_alibi.training.sharding``) this is only the
        rank's own rows: sharded training never uses it as the output layer.
        """
        return self.collection.embeddings[ITEM_TABLE].weight

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the given items: (M,) int64 in 0..N -> (M, D) float32.

        One call of the collection (a single-sample ``KeyedJaggedTensor``); on a sharded table
        it is one all-to-all, and in training one fused update of those rows in the backward pass.
        """
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[ITEM_FEATURE], values=ids, lengths=torch.tensor([ids.numel()], device=ids.device)
        )
        return self.collection(kjt)[ITEM_FEATURE].values()  # (M, D)

    def forward(self, item_idx: torch.Tensor, lengths: torch.Tensor, gaps: torch.Tensor | None = None) -> torch.Tensor:
        """Embed right-padded rows.

        Args:
            item_idx: (B, L) int64 item indices, right-padded with 0.
            lengths: (B,) int64 number of non-padding positions per row.
            gaps: (B, L) int64 time-gap buckets aligned with ``item_idx``; required exactly when
                the collection has a time-gap table.

        Returns:
            (B, L, D) float32; positions ``>= lengths[b]`` are zeros.

        Raises:
            ValueError: ``gaps`` missing for a time-gap model, given to one without, of another
                shape than ``item_idx``, or holding a bucket outside 0..G - 1.
        """
        batch, max_len = item_idx.shape
        valid = torch.arange(max_len, device=item_idx.device)[None, :] < lengths[:, None]  # (B, L)
        keys, values, per_key = [ITEM_FEATURE], [item_idx[valid]], [lengths.to(torch.int64)]
        if (gaps is None) != (not self.time_gap_buckets):
            raise ValueError(
                "this model was trained with time gaps: pass gaps (B, L)" if gaps is None
                else "this model has no time-gap table (model.time_gap_buckets=0): do not pass gaps"
            )  # fmt: skip
        if gaps is not None:
            if gaps.shape != item_idx.shape:
                raise ValueError(f"gaps {tuple(gaps.shape)} must have the shape of item_idx {tuple(item_idx.shape)}")
            gap_values = gaps[valid]
            if gap_values.numel() and (int(gap_values.min()) < 0 or int(gap_values.max()) >= self.time_gap_buckets):
                raise ValueError(f"time-gap buckets must be in 0..{self.time_gap_buckets - 1}")
            keys, values, per_key = keys + [TIME_GAP_FEATURE], values + [gap_values], per_key + per_key
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(per_key))
        out = self.collection(kjt)
        rows = out[ITEM_FEATURE].to_padded_dense(desired_length=max_len)  # (B, L, D)
        if gaps is not None:
            rows = rows + out[TIME_GAP_FEATURE].to_padded_dense(desired_length=max_len)
        return rows
