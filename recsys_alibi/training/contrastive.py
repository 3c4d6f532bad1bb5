"""An auxiliary contrastive loss between two dropout views of the same batch (``train.contrastive_weight``).

The encoder runs twice on the same inputs; its dropout masks differ, so each supervised position
has two representations, ``a`` and ``b``. The loss pulls a position's two views together and
apart from every other position's, and also pulls together the positions whose next item is the
same: the unsupervised and supervised views of DuoRec (Qiu et al., "Contrastive Learning for
Representation Degeneration Problem in Sequential Recommendation", WSDM 2022), written as one
loss with the positive set of SupCon (Khosla et al., "Supervised Contrastive Learning", NeurIPS
2020). Similarity is the dot product over a temperature, as in DuoRec, or the cosine (SimCLR's
NT-Xent, Chen et al., ICML 2020).
"""

from __future__ import annotations

import torch


def contrastive_loss(
    a: torch.Tensor, b: torch.Tensor, targets: torch.Tensor, temperature: float, cosine: bool = False
) -> torch.Tensor:
    """Mean over the ``2 T`` views of ``-log(sum over positives / sum over all others)``.

    Args:
        a, b: (T, D) float, two views of the same T positions (T >= 1).
        targets: (T,) int64 next item of each position (>= 1).
        temperature: > 0; similarities are ``dot / temperature``.
        cosine: compare unit vectors (the cosine) instead of the raw dot product.

    Returns:
        () float32. For view ``i`` the candidates are the other ``2 T - 1`` views; its positives
        are its other view and every view of a position with the same target.

    Raises:
        ValueError: shapes disagree, T is 0, or the temperature is not positive.
    """
    if a.shape != b.shape or a.dim() != 2 or targets.shape != a.shape[:1] or a.shape[0] == 0:
        raise ValueError(f"contrastive_loss needs a, b (T, D) and targets (T,), T >= 1; got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}, {tuple(targets.shape)}")  # fmt: skip
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = torch.cat([a, b]).float()  # (2T, D)
    if cosine:
        z = torch.nn.functional.normalize(z, dim=1)
    labels = torch.cat([targets, targets])  # (2T,)
    logits = z @ z.T / temperature  # (2T, 2T)
    self_mask = torch.eye(z.shape[0], dtype=torch.bool, device=z.device)
    logits = logits.masked_fill(self_mask, float("-inf"))
    positive = (labels[:, None] == labels[None, :]) & ~self_mask  # includes the other view of each position
    log_all = torch.logsumexp(logits, dim=1)  # (2T,)
    log_pos = torch.logsumexp(logits.masked_fill(~positive, float("-inf")), dim=1)
    return (log_all - log_pos).mean()


def sample_positions(n_positions: int, limit: int, device: torch.device) -> torch.Tensor | None:
    """At most ``limit`` of ``n_positions`` indices drawn uniformly without replacement, (<= limit,) int64,
    or None when all fit (the loss's cost grows with the square of the positions kept)."""
    if n_positions <= limit:
        return None
    return torch.randperm(n_positions, device=device)[:limit]
