"""A causal low-pass / high-pass rescaling branch beside attention (``model.lowpass_window``).

BSARec (Shin et al., "An Attentive Inductive Bias for Sequential Recommendation beyond the
Self-Attention", AAAI 2024) adds to each block a branch that splits the hidden sequence into a
low-frequency part (an FFT with all but the lowest ``c`` frequencies zeroed) and the rest, and
rescales the rest by a learnt per-channel ``beta**2``; the block mixes it with attention as
``alpha * branch + (1 - alpha) * attention``. Their FFT runs over the whole sequence, so position
t sees the future; this project trains on every position at once, so the low-pass here is causal:
the mean of the last ``w`` events of the same sequence (fewer at its start). ``w`` plays the part
of ``L / c`` (BSARec's Beauty setting c = 5 at L = 50 is ``w`` = 10). It reads no position
index, so it is the same at any context length.
"""

from __future__ import annotations

import torch
from torch import nn


def causal_window_mean(x: torch.Tensor, positions: torch.Tensor, window: int) -> torch.Tensor:
    """The mean of each position's last ``window`` rows inside its own sequence.

    Args:
        x: (B, L, D) float hidden states.
        positions: (B or 1, L) int64 position of each row inside its sequence (0 at a sequence's
            first event: :func:`recsys_alibi.model.transformer.query_positions`); a packed row holds
            several sequences, and no mean crosses into the previous one.
        window: events averaged, >= 1.

    Returns:
        (B, L, D) float32: row t is ``mean(x[t - n + 1 .. t])`` with ``n = min(window, positions[t] + 1)``.

    Raises:
        ValueError: ``window`` < 1.
    """
    if window < 1:
        raise ValueError(f"the low-pass window must be at least 1 event; got {window}")
    batch, length, width = x.shape
    totals = torch.cumsum(x.float(), dim=1)
    totals = torch.cat([totals.new_zeros(batch, 1, width), totals], dim=1)  # (B, L + 1, D); row t + 1 = sum of 0..t
    counts = torch.clamp(positions + 1, max=window).expand(batch, length)  # (B, L) events in each mean
    ends = torch.arange(1, length + 1, device=x.device).expand(batch, length)
    starts = (ends - counts).unsqueeze(-1).expand(batch, length, width)
    window_sums = totals[:, 1:] - torch.gather(totals, 1, starts)
    return window_sums / counts.unsqueeze(-1).to(window_sums.dtype)


class LowPassRescale(nn.Module):
    """``low + beta**2 * (x - low)``, ``low`` the causal window mean (BSARec's filter branch, made causal).

    Args:
        width: channels D.
        window: events in the low-pass mean (``model.lowpass_window``).

    ``beta`` (D,) starts at 1 (the branch starts as the identity) and is learnt.
    """

    def __init__(self, width: int, window: int) -> None:
        super().__init__()
        self.window = window
        self.sqrt_beta = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, L, D) in ``x``'s dtype; ``positions`` as in :func:`causal_window_mean`."""
        low = causal_window_mean(x, positions, self.window)
        high = x.float() - low
        return (low + self.sqrt_beta.float() ** 2 * high).to(x.dtype)
