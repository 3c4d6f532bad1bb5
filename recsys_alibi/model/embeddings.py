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


class ItemEmbeddings(nn.Module):
    """Lookup of item vectors for right-padded item-index rows.

    Args:
        n_items: catalog size N; the table has N + 1 rows (row 0 = padding).
        d_model: embedding width D.
        init_std: standard deviation of the normal initialisation.

    Example:
        >>> emb = ItemEmbeddings(n_items=10, d_model=8)
        >>> emb(torch.tensor([[1, 2, 0]]), torch.tensor([2])).shape   # (B=1, L=3, D=8)
        torch.Size([1, 3, 8])
    """

    def __init__(self, n_items: int, d_model: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.n_items = n_items
        self.d_model = d_model
        table = EmbeddingConfig(
            name=ITEM_TABLE,
            embedding_dim=d_model,
            num_embeddings=n_items + 1,
            feature_names=[ITEM_FEATURE],
            init_fn=partial(nn.init.normal_, std=init_std),  # picklable, unlike a lambda
        )
        self.collection = EmbeddingCollection(tables=[table], device=torch.device("cpu"))

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

    def forward(self, item_idx: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Embed right-padded rows.

        Args:
            item_idx: (B, L) int64 item indices, right-padded with 0.
            lengths: (B,) int64 number of non-padding positions per row.

        Returns:
            (B, L, D) float32; positions ``>= lengths[b]`` are zeros.
        """
        batch, max_len = item_idx.shape
        valid = torch.arange(max_len, device=item_idx.device)[None, :] < lengths[:, None]  # (B, L)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[ITEM_FEATURE], values=item_idx[valid], lengths=lengths.to(torch.int64)
        )
        jagged = self.collection(kjt)[ITEM_FEATURE]
        return jagged.to_padded_dense(desired_length=max_len)  # (B, L, D)
