"""The causal low-pass / high-pass branch (model.lowpass_window): hand-computed means, no leak
across packed sequences or from the future, the identity at its start."""

import pytest
import torch

from recsys_alibi.model.frequency import LowPassRescale, causal_window_mean
from recsys_alibi.model.transformer import query_positions


def test_window_mean_by_hand_restarts_at_each_packed_sequence():
    x = torch.tensor([[1.0, 3.0, 5.0, 10.0, 20.0, 0.0]]).unsqueeze(-1)  # (B=1, L=6, D=1)
    seq_ids = torch.tensor([[1, 1, 1, 2, 2, 0]])
    means = causal_window_mean(x, query_positions(6, seq_ids, x.device), window=2)
    # user 1: 1, (1+3)/2, (3+5)/2; user 2: 10, (10+20)/2; padding: its own value
    assert means[0, :, 0].tolist() == [1.0, 2.0, 4.0, 10.0, 15.0, 0.0]


def test_window_mean_matches_a_loop_on_random_right_padded_rows():
    torch.manual_seed(3)
    x = torch.randn(3, 9, 4)
    window = 4
    means = causal_window_mean(x, query_positions(9, None, x.device), window)
    for t in range(9):
        start = max(0, t - window + 1)
        torch.testing.assert_close(means[:, t], x[:, start : t + 1].mean(1))


def test_window_mean_rejects_an_empty_window():
    with pytest.raises(ValueError, match="at least 1 event"):
        causal_window_mean(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), 0)


def test_rescale_starts_as_the_identity_and_scales_only_the_high_part():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3)
    positions = query_positions(5, None, x.device)
    branch = LowPassRescale(width=3, window=3)
    torch.testing.assert_close(branch(x, positions), x)
    with torch.no_grad():
        branch.sqrt_beta.zero_()  # beta = 0: the low-pass mean alone
    torch.testing.assert_close(branch(x, positions), causal_window_mean(x, positions, 3))
    with torch.no_grad():
        branch.sqrt_beta.fill_(2.0 ** 0.5)  # beta**2 = 2: low + 2 * (x - low)
    low = causal_window_mean(x, positions, 3)
    torch.testing.assert_close(branch(x, positions), 2 * x - low)
