"""Adapter that lets a trained ``AlibiRanker`` serve as an evaluation/scoring ``Scorer``."""

from __future__ import annotations

import torch

from recsys_alibi.model.transformer import AlibiRanker


class RankerScorer:
    """Scores right-padded histories with a ranker, in inference mode.

    Args:
        model: a trained ranker (put in eval mode here).
        name: label in reports (e.g. ``"alibi"``, ``"sasrec"``).
        device: where to run; inputs are moved there and scores come back on the CPU.

    ``max_context`` is the model's own limit (learned positions: ``max_len``; ALiBi: none).
    ``uses_time_gaps``: the model reads time-gap buckets, which ``score`` then requires.
    """

    def __init__(self, model: AlibiRanker, name: str = "model", device: str | torch.device = "cpu") -> None:
        self.model = model.eval().to(device)
        self.name = name
        self.device = torch.device(device)
        self.max_context = model.max_context
        self.uses_time_gaps = model.uses_time_gaps

    @torch.inference_mode()
    def score(self, history: torch.Tensor, lengths: torch.Tensor, gaps: torch.Tensor | None = None) -> torch.Tensor:
        """history (B, L) int64 right-padded, lengths (B,) int64, gaps (B, L) int64 time-gap
        buckets (time-gap models only) -> (B, N + 1) float32 on the CPU."""
        gaps = gaps.to(self.device) if gaps is not None else None
        scores = self.model.score(history.to(self.device), lengths.to(self.device), gaps)
        return scores.float().cpu()
