"""Next-item losses over the catalog, chosen by ``train.loss`` from the ``LOSSES`` registry.

Every loss takes the hidden states at the T supervised positions, their target items and the
tied item table, and returns a scalar:

    loss(hidden (T, D) float, targets (T,) int64 in 0..N, table (N + 1, D) float) -> () float

A target 0 marks a position without a target (padding): it is ignored, and the loss is the mean
over the positions with a target. The training step passes every position of the batch (B * L)
this way instead of selecting the supervised ones, because a boolean selection has a
data-dependent size and would synchronise the host with the GPU at every step.

The sampling losses (``sampled_softmax``, ``bce``, ``gbce``) draw their negatives with
``negative_ids(targets, n_items)`` and index the table only at the targets and those negatives;
``negatives=`` passes the draw in instead (the sharded table looks up exactly those rows first,
``recsys_alibi.training.sharding``), and ``table`` may then be any object with ``shape`` and
``__getitem__`` by an index tensor.

- ``softmax``: full softmax cross-entropy over the catalog (Klenitskiy & Vasilev, "Turning Dross
  Into Gold Loss: is BERT4Rec really better than SASRec?", RecSys 2023).
- ``sampled_softmax``: in-batch plus uniform negatives with logQ correction (Yi et al., "Sampling-
  bias-corrected neural modeling", RecSys 2019); for catalogs too large for a full softmax.
- ``bce``: one uniform negative per position, binary cross-entropy (the original SASRec).
- ``gbce``: generalised BCE with k negatives and calibrated positive probability (Petrov &
  Macdonald, "gSASRec", RecSys 2023).
Column 0 (padding) is never a candidate.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from recsys_alibi.config import TrainConfig


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ table.T`` over items 1..N, gradients computed chunk by chunk.

    The mean is over the positions whose target is not 0; the others add nothing to the loss or
    the gradients. Nothing in it reads a device tensor on the host.

    The (T, N + 1) logits are never held whole: for each chunk of ``chunk`` positions the forward
    pass computes the chunk's logits, its loss and, at once, its gradients
    ``(softmax - onehot) @ table`` and ``(softmax - onehot).T @ hidden``; backward only scales
    them. The logits of a chunk stay in cache, so full softmax training is about 1.7x faster per
    CPU second than ``F.cross_entropy`` over materialised logits (docs/benchmarks.md). The three
    matrix products run in ``compute_dtype`` (float32, or bfloat16 under bf16 autocast: float32
    accumulation inside the GEMM); the softmax, the loss and the summed table gradient are
    always float32. The idea is Liger Kernel's fused linear cross-entropy and Wijmans et al.,
    "Cut Your Losses in Large-Vocabulary Language Models" (2024).
    """

    @staticmethod
    def forward(ctx, hidden, table, targets, chunk, compute_dtype):  # (T, D), (N + 1, D), (T,) int64
        in_dtypes = hidden.dtype, table.dtype
        hidden, table = hidden.to(compute_dtype), table.to(compute_dtype)
        grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
        grad_table = torch.zeros(table.shape, dtype=torch.float32, device=table.device)
        total = torch.zeros((), dtype=torch.float64, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            h, y = hidden[start : start + chunk], targets[start : start + chunk]
            keep = (y > 0)[:, None]  # (C, 1): positions with a target
            logits = (h @ table.T).float()  # (C, N + 1)
            logits[:, 0] = float("-inf")
            target_logits = logits.gather(1, y[:, None])  # (C, 1); -inf where y = 0
            row_max = logits.amax(dim=1, keepdim=True)  # (C, 1)
            exps = logits.sub_(row_max).exp_()  # in place: one exp per logit
            sums = exps.sum(dim=1, keepdim=True)  # (C, 1)
            per_row = torch.where(keep, sums.log() + row_max - target_logits, 0.0)
            total += per_row.sum(dtype=torch.float64)
            probs = exps.div_(sums)  # softmax
            probs[torch.arange(y.numel(), device=y.device), y] -= 1.0  # d loss / d logits (unscaled)
            probs = probs.mul_(keep).to(compute_dtype)  # no gradient from positions without a target
            grad_hidden[start : start + chunk] = probs @ table
            grad_table += probs.T @ h
        count = (targets > 0).sum().clamp(min=1)  # a tensor: no host synchronisation
        ctx.save_for_backward(grad_hidden / count, grad_table / count)
        ctx.in_dtypes = in_dtypes
        return (total / count).float()

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_table = ctx.saved_tensors
        return (
            (grad_hidden * grad_loss).to(ctx.in_dtypes[0]),
            (grad_table * grad_loss).to(ctx.in_dtypes[1]),
            None,
            None,
            None,
        )


class FullSoftmaxLoss(nn.Module):
    """Cross-entropy over all N items (padding column masked).

    With gradients enabled it runs fused and chunked (``_FusedLinearCrossEntropy``, ``chunk``
    positions at a time; its products in bfloat16 under bf16 autocast, else float32); without,
    it is the plain float32 ``F.cross_entropy``.
    """

    def __init__(self, cfg: TrainConfig, item_counts: torch.Tensor, chunk: int = 256) -> None:
        super().__init__()
        self.chunk = chunk

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        device = hidden.device.type
        if torch.is_grad_enabled() and (hidden.requires_grad or table.requires_grad):
            low = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16
            with torch.autocast(device, enabled=False):
                return _FusedLinearCrossEntropy.apply(
                    hidden, table, targets, self.chunk, torch.bfloat16 if low else torch.float32
                )
        with torch.autocast(device, enabled=False):
            logits = hidden.float() @ table.float().T  # (T, N + 1)
        logits[:, 0] = float("-inf")
        return F.cross_entropy(logits, targets, ignore_index=0)


def _mean_over_targets(per_position: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean of (T,) per-position losses over the positions whose target is not 0 (a tensor op)."""
    keep = targets > 0
    return torch.where(keep, per_position, 0.0).sum() / keep.sum().clamp(min=1)


class SampledSoftmaxLoss(nn.Module):
    """Softmax over the positive, the batch's other targets and ``num_negatives`` uniform items.

    Each negative's logit is corrected by ``-log q``, q its expected sampling rate: in-batch
    items are drawn by popularity (``T * count / total``), uniform ones at ``M / N``.
    ``item_counts``: (N + 1,) int64 training-event counts per item.
    """

    def __init__(self, cfg: TrainConfig, item_counts: torch.Tensor) -> None:
        super().__init__()
        self.num_negatives = cfg.num_negatives
        probs = item_counts.double() / item_counts.sum().clamp(min=1)
        self.register_buffer("popularity", probs.float(), persistent=False)  # (N + 1,)

    def negative_ids(self, targets: torch.Tensor, n_items: int) -> torch.Tensor:
        """(M,) int64 uniform negatives in 1..N (M = ``num_negatives``), shared by all positions."""
        return torch.randint(1, n_items + 1, (self.num_negatives,), device=targets.device)

    def forward(
        self, hidden: torch.Tensor, targets: torch.Tensor, table: torch.Tensor, negatives: torch.Tensor | None = None
    ) -> torch.Tensor:
        n_items = table.shape[0] - 1
        uniform = self.negative_ids(targets, n_items) if negatives is None else negatives
        candidates = torch.cat([targets, uniform])  # (T + M,); 0 = no target: never a candidate
        n_targets = (targets > 0).sum()  # in-batch draws: the positions with a target
        rate = n_targets * self.popularity[candidates] + self.num_negatives / n_items
        negatives = hidden @ table[candidates].T - torch.log(rate)  # (T, T + M)
        same = (candidates[None, :] == targets[:, None]) | (candidates == 0)[None, :]
        negatives = negatives.masked_fill(same, float("-inf"))
        positives = (hidden * table[targets]).sum(-1, keepdim=True)  # (T, 1)
        logits = torch.cat([positives, negatives], dim=1).float()
        per_position = F.cross_entropy(logits, torch.zeros_like(targets), reduction="none")  # (T,)
        return _mean_over_targets(per_position, targets)


class BinaryCrossEntropyLoss(nn.Module):
    """BCE with one uniform negative per position (SASRec, Kang & McAuley 2018)."""

    def __init__(self, cfg: TrainConfig, item_counts: torch.Tensor) -> None:
        super().__init__()

    def negative_ids(self, targets: torch.Tensor, n_items: int) -> torch.Tensor:
        """(T,) int64: one uniform negative in 1..N per position."""
        return torch.randint(1, n_items + 1, targets.shape, device=targets.device)

    def forward(
        self, hidden: torch.Tensor, targets: torch.Tensor, table: torch.Tensor, negatives: torch.Tensor | None = None
    ) -> torch.Tensor:
        if negatives is None:
            negatives = self.negative_ids(targets, table.shape[0] - 1)
        pos = (hidden * table[targets]).sum(-1).float()
        neg = (hidden * table[negatives]).sum(-1).float()
        return _mean_over_targets(-(F.logsigmoid(pos) + F.logsigmoid(-neg)), targets)


class GeneralisedBCELoss(nn.Module):
    """gBCE: k uniform negatives; the positive's log-sigmoid is scaled by beta.

    ``beta = alpha * (t * (1 - 1/alpha) + 1/alpha)`` with ``alpha = k / (N - 1)`` the negative
    sampling rate and ``t = train.gbce_t`` the calibration (Petrov & Macdonald 2023, eq. 9).
    """

    def __init__(self, cfg: TrainConfig, item_counts: torch.Tensor) -> None:
        super().__init__()
        self.num_negatives = cfg.num_negatives
        self.t = cfg.gbce_t

    def negative_ids(self, targets: torch.Tensor, n_items: int) -> torch.Tensor:
        """(T, k) int64 uniform negatives in 1..N per position."""
        return torch.randint(1, n_items + 1, (targets.numel(), self.num_negatives), device=targets.device)

    def forward(
        self, hidden: torch.Tensor, targets: torch.Tensor, table: torch.Tensor, negatives: torch.Tensor | None = None
    ) -> torch.Tensor:
        n_items = table.shape[0] - 1
        alpha = min(1.0, self.num_negatives / max(n_items - 1, 1))
        beta = alpha * (self.t * (1 - 1 / alpha) + 1 / alpha)
        if negatives is None:
            negatives = self.negative_ids(targets, n_items)
        pos = (hidden * table[targets]).sum(-1).float()  # (T,)
        neg = torch.einsum("td,tkd->tk", hidden, table[negatives]).float()  # (T, k)
        neg = neg.masked_fill(negatives == targets[:, None], -math.inf)
        return _mean_over_targets(-(beta * F.logsigmoid(pos) + F.logsigmoid(-neg).sum(-1)), targets)


LOSSES: dict[str, type[nn.Module]] = {
    "softmax": FullSoftmaxLoss,
    "sampled_softmax": SampledSoftmaxLoss,
    "bce": BinaryCrossEntropyLoss,
    "gbce": GeneralisedBCELoss,
}


def build_loss(cfg: TrainConfig, item_counts: torch.Tensor) -> nn.Module:
    """Instantiate ``LOSSES[cfg.loss]``; ``item_counts`` (N + 1,) int64 training counts per item."""
    return LOSSES[cfg.loss](cfg, item_counts)
